"""CPU time of klowbit's tiled IQ matmul on one expert's shape (issue #46: the MoE prompt's hot path), split into
the tile decode and kxtile.kx_tile_dot from two activation row counts (T(n) = decode + n * per_row).

Usage: python bench/iq_tile_bench.py [-m /tmp/moe-1b-iq2_xxs.gguf] [--tensor blk.0.ffn_gate_exps.weight]
           [--rows 38] [--reps 20]
The weights are the file's first expert of that tensor; the activation rows are random (their Q8_K quantization is
in the times); one numba thread (NUMBA_NUM_THREADS=1 unless set). Prints ns per (16-row tile, super-block,
activation row) and cycles at --ghz.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # process time would count idle pool threads spinning

import numpy as np  # noqa: E402

from llamactx.ggml.kernels.klowbit import KERNEL_TYPES, matmul_lowbit_vnni, post_of  # noqa: E402


def expert_blocks(path: str, tensor: str) -> tuple[int, np.ndarray]:
    from gguf import GGUFReader

    t = next(t for t in GGUFReader(path).tensors if t.name == tensor)
    data = np.asarray(t.data)
    rows = data.reshape(-1, data.shape[-1]) if data.ndim > 2 else data
    n_rows = int(t.shape[1])  # one expert: ne1 rows
    return int(t.tensor_type), np.ascontiguousarray(rows[:n_rows])


def cpu_time(fn, args: tuple, reps: int) -> float:
    """The least process CPU time of reps calls of fn(*args), in ns."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time_ns()
        fn(*args)
        best = min(best, time.process_time_ns() - t0)
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-m", default="/tmp/moe-1b-iq2_xxs.gguf")
    p.add_argument("--tensor", default="blk.0.ffn_gate_exps.weight")
    p.add_argument("--rows", type=int, default=38)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--ghz", type=float, default=2.4)
    args = p.parse_args()
    t, blocks = expert_blocks(args.m, args.tensor)
    if t not in KERNEL_TYPES:
        raise SystemExit(f"{args.tensor} of {args.m} is ggml type {t}, not one of klowbit's IQ types")
    n_w = blocks.shape[0]
    k = blocks.shape[1] // _type_size(t) * 256
    rng = np.random.default_rng(0)
    res = {}
    for n in (8, args.rows):
        x = rng.standard_normal((n, k)).astype(np.float32)
        out = np.empty((n, n_w), np.float32)
        post = post_of(t)
        matmul_lowbit_vnni(1, t, post, blocks, x, out)  # compile / warm
        res[n] = cpu_time(matmul_lowbit_vnni, (1, t, post, blocks, x, out), args.reps)
    units = n_w // 16 * (k // 256)  # tile super-blocks
    per_row = (res[args.rows] - res[8]) / (args.rows - 8) / units
    decode = res[8] / units - 8 * per_row
    print(f"type {t} {n_w}x{k}: n=8 {res[8] / 1e6:.3f} ms, n={args.rows} {res[args.rows] / 1e6:.3f} ms; per tile "
          f"super-block: decode {decode:.0f} ns ({decode * args.ghz:.0f} cyc), per activation row {per_row:.1f} ns "
          f"({per_row * args.ghz:.0f} cyc)")


def _type_size(t: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType(t)][1]


if __name__ == "__main__":
    main()

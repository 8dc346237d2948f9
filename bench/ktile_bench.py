"""CPU time of ktile's prompt tiles (Q4_K / Q6_K, issue #47's pp512) per weight super-block and activation row.

Usage: python bench/ktile_bench.py [-m /tmp/dense-llama-1b-q4_k_m.gguf] [--tensor blk.0.ffn_gate.weight]
           [--n-rows 512] [--rows 512] [--reps 5] [--ghz 2.6] [--path portable|vnni]
Takes the first --n-rows weight rows of the tensor (Q4_K or Q6_K), packs them as `matmul` does, quantizes random
activation rows and times `ktile.q4k_tile_rows` / `q6k_tile_rows` on one thread (process CPU time, the best of
--reps) at n = 16 and n = --rows activation rows: T(n) = tiles + n * per_row. Prints ns and cycles (at --ghz) per
(weight row, super-block, activation row): the figure to compare with llama.cpp's gemm at 32 products per
`pmaddubsw` (8 for a whole super-block of 256 per row: 8 instructions, or 4 cycles at two a cycle). Run it under
`NUMBA_CPU_NAME=haswell NUMBA_CACHE_DIR=.numba-haswell` for the AVX2 tiles.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # process time would count idle pool threads spinning

import numpy as np  # noqa: E402
from iq_tile_bench import cpu_time  # noqa: E402  (bench/ is the script's directory)
from numba import njit  # noqa: E402

from llamactx.ggml.kernels import ktile  # noqa: E402
from llamactx.ggml.kernels.matmul import _activations  # noqa: E402
from llamactx.ggml.kernels.repack import pack_weight  # noqa: E402
from llamactx.ggml.kernels.simd import PORTABLE, VNNI  # noqa: E402
from llamactx.model import Weight  # noqa: E402

Q4_K, Q6_K = 12, 14


# A Tag cannot cross from Python: one entry per (type, path), the path a global constant as in matmul.py.
@njit(cache=True)
def q4k_portable(W, a, r0, r1, out):
    ktile.q4k_tile_rows(PORTABLE, W, a, r0, r1, out)


@njit(cache=True)
def q6k_portable(W, a, r0, r1, out):
    ktile.q6k_tile_rows(PORTABLE, W, a, r0, r1, out)


@njit(cache=True)
def q4k_vnni(W, a, r0, r1, out):
    ktile.q4k_tile_rows(VNNI, W, a, r0, r1, out)


@njit(cache=True)
def q6k_vnni(W, a, r0, r1, out):
    ktile.q6k_tile_rows(VNNI, W, a, r0, r1, out)


ENTRIES = {(Q4_K, "portable"): q4k_portable, (Q6_K, "portable"): q6k_portable, (Q4_K, "vnni"): q4k_vnni,
           (Q6_K, "vnni"): q6k_vnni}


def first_rows(path: str, tensor: str, n_rows: int) -> Weight:
    """The first n_rows rows of a 2-D tensor of a GGUF file, as a Weight."""
    from gguf import GGUFReader

    t = next((t for t in GGUFReader(path).tensors if t.name == tensor), None)
    if t is None:
        raise SystemExit(f"{path} has no tensor {tensor!r}")
    data = np.asarray(t.data)[:n_rows]
    return Weight(tensor, int(t.tensor_type), (int(t.shape[0]), data.shape[0]), data)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-m", default="/tmp/dense-llama-1b-q4_k_m.gguf")
    p.add_argument("--tensor", default="blk.0.ffn_gate.weight")
    p.add_argument("--n-rows", type=int, default=512)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ghz", type=float, default=2.6)
    p.add_argument("--path", choices=("portable", "vnni"), default="portable")
    args = p.parse_args()
    w = first_rows(args.m, args.tensor, args.n_rows)
    if w.ggml_type not in (Q4_K, Q6_K):
        raise SystemExit(f"{args.tensor}: ggml type {w.ggml_type} is neither Q4_K nor Q6_K")
    pw = pack_weight(w)
    W = (pw.qs, pw.qh, pw.sc, pw.mn, pw.d, pw.m)
    fn = ENTRIES[w.ggml_type, args.path]
    rng = np.random.default_rng(0)
    res = {}
    for n in (16, args.rows):
        a = _activations(w.ggml_type, rng.standard_normal((n, pw.k)).astype(np.float32))
        out = np.empty((n, pw.n_rows), np.float32)
        run = (W, a, 0, pw.n_rows, out)
        fn(*run)  # compile / warm
        res[n] = cpu_time(fn, run, args.reps)
    blocks = pw.n_rows * (pw.k // 256)  # (weight row, super-block) pairs
    per_row = (res[args.rows] - res[16]) / (args.rows - 16) / blocks
    tiles = res[16] / blocks - 16 * per_row
    print(f"{args.tensor} ({'Q4_K' if w.ggml_type == Q4_K else 'Q6_K'}, {pw.n_rows} rows x k {pw.k}), {args.path}, "
          f"load {os.getloadavg()[0]:.2f}: n=16 {res[16] / 1e6:.2f} ms, n={args.rows} {res[args.rows] / 1e6:.2f} ms; "
          f"per (weight row, super-block): tile {tiles:.2f} ns, per activation row {per_row:.3f} ns "
          f"({per_row * args.ghz:.2f} cyc)")


if __name__ == "__main__":
    main()

"""The decode matmul kernels alone: GB/s of weights read for one activation row, in L2 and streamed from DRAM.

A decode step is matrix x vector over every weight, so a kernel either keeps up with memory or is the bound. This
times the single-row kernel of each K-quant decode type (Q4_K: kgemv.q4k_gemv_rows; Q6_K: q6k_gemv.q6k_gemv_rows,
as `matmul` runs them for one row, on the path it picks: VNNI where the target has it) on random blocks, one thread,
twice: a 0.3 MB matrix run many times (in L2: the kernel's own speed, what it could stream at most) and a matrix of
`--mib` MiB (from DRAM: what decode sees). Compare the second with bench/membw.py's 1-thread roof. The calls of a
round run in one compiled loop, as decode's graph calls the kernels: a call from Python (numba's dispatcher unboxing
ten arrays, ~1 us) would be timed with them, 10-20% of a call on the L2 matrix. The clock is the thread's CPU time,
so the L2 figure holds on a machine other processes share (the DRAM one still shares the memory bus); best and
median of `--reps` rounds, and the best as core cycles per super-block (Q6_K: 256 weights of one row; Q4_K: of a
group's eight rows) at `--ghz`. Under NUMBA_CPU_NAME=haswell (and its own NUMBA_CACHE_DIR) it times the AVX2 code.

Usage: python bench/kgemv_bench.py [--mib 256] [--reps 5] [-k 2048] [--ghz 3.7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).parents[1]))

from llamactx.ggml.cpu import cpu_features  # noqa: E402
from llamactx.ggml.kernels.kblocks import Q4K_BYTES, Q6K_BYTES, Q6K_D, interleave_q4k  # noqa: E402
from llamactx.ggml.kernels.kgemv import q4k_gemv_rows  # noqa: E402
from llamactx.ggml.kernels.q6k_gemv import q6k_gemv_rows  # noqa: E402
from llamactx.ggml.kernels.q8 import quantize_q8_K  # noqa: E402
from llamactx.ggml.kernels.simd import PORTABLE, VNNI  # noqa: E402

PATH = VNNI if cpu_features()["vnni"] else PORTABLE  # as matmul picks it


@njit
def _q4k(W, a, out, calls):
    for _ in range(calls):
        q4k_gemv_rows(PATH, W, a, 0, 0, out.shape[1], out)


@njit
def _q6k(W, a, out, calls):
    for _ in range(calls):
        q6k_gemv_rows(PATH, W, a, 0, 0, out.shape[1], out)


def _weights(rows: int, k: int, block: int, d_offsets: tuple[int, ...], rng) -> tuple:
    """Random super-blocks with small positive f16 scales at d_offsets, in repack.py's six slots."""
    nb = k // 256
    qs = rng.integers(0, 256, (rows, nb, block), dtype=np.uint8)
    for off in d_offsets:
        qs[:, :, off : off + 2] = (rng.random((rows, nb, 1)) * 0.01 + 1e-3).astype(np.float16).view(np.uint8)
    if block == Q4K_BYTES:  # eight rows interleaved, as repack.py stores Q4_K
        qs = interleave_q4k(qs)
    e8, ef = np.empty((qs.shape[0], 0), np.uint8), np.empty((qs.shape[0], 0), np.float32)
    return qs.reshape(qs.shape[0], -1), e8, e8, e8, ef, ef


def _activations(k: int, rng) -> tuple:
    x = rng.standard_normal((1, k)).astype(np.float32)
    xq, xd, bsums = np.empty((1, k), np.int8), np.empty((1, k // 256), np.float32), np.empty((1, k // 16), np.int32)
    quantize_q8_K(x, xq, xd, bsums)
    return xq, xd, bsums, np.empty((1, 0), np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="the streamed matrix (far above the last-level cache)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-k", type=int, default=2048, help="row length (a multiple of 256)")
    ap.add_argument("--ghz", type=float, default=3.7, help="the core clock, for cycles per super-block")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    a = _activations(args.k, rng)
    kinds = (("Q4_K", _q4k, Q4K_BYTES, (0, 2), 8), ("Q6_K", _q6k, Q6K_BYTES, (Q6K_D,), 1))  # per: rows a super-block
    for name, fn, block, d_offsets, per in kinds:
        row_bytes = args.k // 256 * block
        for where, rows, calls in (("L2", 256, 200), ("DRAM", (args.mib << 20) // row_bytes // 8 * 8, 1)):
            W = _weights(rows, args.k, block, d_offsets, rng)
            out = np.empty((1, rows), np.float32)
            fn(W, a, out, 1)  # compile, fault in
            rates = []
            for _ in range(args.reps):
                t0 = time.thread_time()
                fn(W, a, out, calls)
                rates.append(W[0].nbytes * calls / (time.thread_time() - t0) / 1e9)
            best = max(rates)
            print(f"{name} {where:4s} {W[0].nbytes / 2**20:7.1f} MiB: best {best:5.1f} GB/s, "
                  f"median {sorted(rates)[len(rates) // 2]:5.1f} ({per * block / best * args.ghz:5.1f} cycles per "
                  f"super-block{' of 8 rows' if per > 1 else ''} at {args.ghz} GHz)", flush=True)


if __name__ == "__main__":
    main()

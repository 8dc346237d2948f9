"""The Q6_K decode kernel alone (issue #47): GB/s of weights read for one activation row, old against new.

Times kquants.q6k_rows' single-row lanes (ggml_vec_dot_q6_K_q8_K one quarter at a time, as decode ran before
q6k_gemv.py) and q6k_gemv.q6k_gemv_rows on the same random super-blocks, one thread, alternating, twice: a 0.4 MB
matrix run many times (in L2: the kernel's own speed; a round's calls in one compiled loop, as decode's graph makes
them, not dispatched from Python) and a `--rows` x `-k` matrix (default the 128256 x 2048
token_embd / output head of a Llama-3.2-1B-shaped Q4_K_M file, 539 MB: streamed from DRAM, what decode sees).
The clock is the thread's CPU time, so the figures hold on a machine other processes share (the DRAM one still
shares the memory bus); best and median of `--reps` rounds. Also prints cycles per super-block at `--ghz`.

With `-m MODEL.gguf` it times instead every Q6_K matrix of the model once per round, as a decoded token meets
them (the token_embd / output head and the attn_v / ffn_down layers Q4_K_M keeps in Q6_K): the CPU time per token
its Q6_K weights cost with each kernel.

Usage: python bench/q6k_gemv_bench.py [--rows 128256] [-k 2048] [--reps 5] [--ghz 3.7] [-m MODEL.gguf]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path.cwd()))  # the checkout run from, before an installed llamactx

from llamactx.ggml.cpu import cpu_features  # noqa: E402
from llamactx.ggml.kernels.kblocks import Q6K_BYTES, Q6K_D  # noqa: E402
from llamactx.ggml.kernels.kquants import _q6k_close, _q6k_lanes1  # noqa: E402
from llamactx.ggml.kernels.q6k_gemv import q6k_gemv_rows  # noqa: E402
from llamactx.ggml.kernels.q8 import quantize_q8_K  # noqa: E402
from llamactx.ggml.kernels.simd import PORTABLE, VNNI, fsum, fzero, load_f16  # noqa: E402

PATH = VNNI if cpu_features()["vnni"] else PORTABLE  # as matmul picks it


@njit
def _old(W, a, out, calls=1):
    """kquants' single-row lanes (what q6k_rows ran for activation rows past the last group of four), `calls`
    times (in one compiled loop: no dispatch from Python in the time)."""
    qs = W[0]
    xq, xd, bsums, _ = a
    for _ in range(calls):
        for r in range(out.shape[1]):
            acc = fzero()
            for b in range(qs.shape[1] // Q6K_BYTES):
                isum = _q6k_lanes1(PATH, qs, xq, r, b, 0)
                acc = _q6k_close(acc, isum, qs, r, bsums, xd, 0, b, load_f16(qs, r, b * Q6K_BYTES + Q6K_D))
            out[0, r] = fsum(acc)


@njit
def _new(W, a, out, calls=1):
    for _ in range(calls):
        q6k_gemv_rows(PATH, W, a, 0, 0, out.shape[1], out)


def _weights(rows: int, k: int, rng) -> tuple:
    """Random super-blocks with small positive f16 scales, in repack.py's six slots."""
    nb = k // 256
    qs = rng.integers(0, 256, (rows, nb, Q6K_BYTES), dtype=np.uint8)
    qs[:, :, Q6K_D : Q6K_D + 2] = (rng.random((rows, nb, 1)) * 0.01 + 1e-3).astype(np.float16).view(np.uint8)
    e8, ef = np.empty((rows, 0), np.uint8), np.empty((rows, 0), np.float32)
    return qs.reshape(rows, -1), e8, e8, e8, ef, ef


def _activations(k: int, rng) -> tuple:
    x = rng.standard_normal((1, k)).astype(np.float32)
    xq, xd, bsums = np.empty((1, k), np.int8), np.empty((1, k // 256), np.float32), np.empty((1, k // 16), np.int32)
    quantize_q8_K(x, xq, xd, bsums)
    return xq, xd, bsums, np.empty((1, 0), np.float32)


def _model(path: str, reps: int) -> None:
    """CPU time per token of the model's Q6_K matrices, old and new kernel alternating (one thread)."""
    from gguf import GGMLQuantizationType, GGUFReader

    rng = np.random.default_rng(0)
    mats = []
    for t in GGUFReader(path).tensors:
        if t.tensor_type == GGMLQuantizationType.Q6_K:
            k, rows = int(t.shape[0]), int(t.shape[1])
            e8, ef = np.empty((rows, 0), np.uint8), np.empty((rows, 0), np.float32)
            mats.append(((np.array(t.data).reshape(rows, -1), e8, e8, e8, ef, ef), _activations(k, rng)))
    total = sum(W[0].nbytes for W, _ in mats)
    times: dict[str, list[float]] = {"old": [], "new": []}
    for W, a in mats:
        out = np.empty((1, W[0].shape[0]), np.float32)
        _old(W, a, out)
        _new(W, a, out)
    for _ in range(reps):
        for name, fn in (("old", _old), ("new", _new)):
            t0 = time.thread_time()
            for W, a in mats:
                fn(W, a, np.empty((1, W[0].shape[0]), np.float32))
            times[name].append(time.thread_time() - t0)
    print(f"{len(mats)} Q6_K matrices, {total / 1e6:.0f} MB per token")
    for name, t in times.items():
        best = min(t)
        print(f"Q6_K {name}: best {best * 1e3:6.1f} ms CPU per token ({total / best / 1e9:4.1f} GB/s), median "
              f"{sorted(t)[len(t) // 2] * 1e3:6.1f} ms", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=128256, help="rows of the streamed matrix")
    ap.add_argument("-k", type=int, default=2048, help="row length (a multiple of 256)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ghz", type=float, default=3.7, help="the core clock, for cycles per super-block")
    ap.add_argument("-m", "--model", help="time this GGUF's Q6_K matrices instead")
    args = ap.parse_args()
    if args.model:
        _model(args.model, args.reps)
        return
    rng = np.random.default_rng(0)
    a = _activations(args.k, rng)
    for where, rows, calls in (("L2", 192, 300), ("DRAM", args.rows, 1)):
        W = _weights(rows, args.k, rng)
        out, ref = np.empty((1, rows), np.float32), np.empty((1, rows), np.float32)
        _old(W, a, ref)
        _new(W, a, out)  # compile, fault in
        if not np.array_equal(out.view(np.int32), ref.view(np.int32)):
            raise SystemExit("q6k_gemv_rows differs from kquants' lanes")
        rates: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.reps):
            for name, fn in (("old", _old), ("new", _new)):
                t0 = time.thread_time()
                fn(W, a, out, calls)
                rates[name].append(W[0].nbytes * calls / (time.thread_time() - t0) / 1e9)
        for name, r in rates.items():
            best = max(r)
            print(f"Q6_K {name} {where:4s} {W[0].nbytes / 2**20:7.1f} MiB: best {best:5.1f} GB/s, median "
                  f"{sorted(r)[len(r) // 2]:5.1f} ({Q6K_BYTES / best * args.ghz:4.1f} cycles/super-block at "
                  f"{args.ghz} GHz)", flush=True)


if __name__ == "__main__":
    main()

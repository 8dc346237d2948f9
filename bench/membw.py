"""The memory roof decode runs under: read bandwidth from DRAM with the threads decode uses (issue #47).

Decode of a model larger than the last-level cache streams every weight once per token, so tokens/s can never exceed
bandwidth / bytes read per token. This measures that bandwidth as decode would see it: a numba `prange` over the
threads (the kernels' own thread pool and share of rows), each summing its contiguous share of a buffer far larger
than the caches (the best of `--reps` passes, 64 bytes a step as the matmul kernels read). It prints GB/s for each
thread count and, with `-m MODEL`, the model's bytes read per token and the tokens/s roof that implies; `decode
--tg T` turns a measured tokens/s into the fraction of the roof (what docs report beside every decode number).

Usage: python bench/membw.py [-t 1,2] [--mib 1024] [--reps 5] [-m FILE.gguf] [--tg TOKENS_PER_S]
The machine must be otherwise idle: another process's reads share the same memory controllers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).parents[1]))


@njit(parallel=True, cache=True)
def _read(buf, n_tasks):
    """Sum of every 16th float32 (one per 64-byte line, every line read), each task a contiguous share."""
    n = buf.shape[0]
    part = np.zeros(n_tasks, np.float32)
    for t in prange(n_tasks):
        lo, hi = t * n // n_tasks, (t + 1) * n // n_tasks
        acc = np.float32(0.0)
        for j in range(lo, hi, 16):
            acc += buf[j]
        part[t] = acc
    return part.sum()


def bandwidth(buf: np.ndarray, threads: int, reps: int) -> float:
    """Best GB/s of `reps` full reads of buf with `threads` threads."""
    numba.set_num_threads(threads)
    _read(buf, threads)  # compile, fault in
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        _read(buf, threads)
        best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best / 1e9


def model_bytes_per_token(path: str) -> int:
    """Bytes a decode step reads: every tensor's stored bytes (embeddings are read one row a token; when they are
    tied, the output head reads them whole)."""
    from llamactx.gguf.reader import GGUFFile

    tensors = GGUFFile(path).tensors
    return sum(int(t.nbytes) for name, t in tensors.items()
               if not (name == "token_embd.weight" and "output.weight" in tensors))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--mib", type=int, default=1024, help="buffer size (far above the last-level cache)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-m", "--model", default=None, help="a GGUF file: its bytes per token and tokens/s roof")
    ap.add_argument("--tg", type=float, default=None, help="a measured decode tokens/s: its fraction of the roof")
    args = ap.parse_args()
    buf = np.ones(args.mib << 18, np.float32)  # MiB -> float32 count
    per_token = model_bytes_per_token(args.model) if args.model else None
    if per_token:
        print(f"{Path(args.model).name}: {per_token / 1e9:.3f} GB read per token")
    for threads in (int(t) for t in args.threads.split(",")):
        gbs = bandwidth(buf, threads, args.reps)
        line = f"{threads} thread(s): {gbs:6.1f} GB/s"
        if per_token:
            roof = gbs * 1e9 / per_token
            line += f"  -> decode roof {roof:6.1f} tokens/s"
            if args.tg:
                line += f"; {args.tg:.1f} t/s is {args.tg / roof:.0%} of it"
        print(line, flush=True)


if __name__ == "__main__":
    main()

"""The memory roof decode runs under: read bandwidth from DRAM with the threads decode uses (issue #47).

Decode of a model larger than the last-level cache streams every weight once per token, so tokens/s can never exceed
bandwidth / bytes read per token. This measures that bandwidth as decode would see it: a numba `prange` over the
threads (the kernels' own thread pool and share of rows), each summing its contiguous share of a buffer far larger
than the caches (the best of `--reps` passes, every 64-byte line read, four independent sums so that no add chain
limits the loads). It prints GB/s for each thread count and, with `-m MODEL`, the model's bytes read per token and
the tokens/s roof that implies; `--tg T` turns a measured tokens/s into the fraction of the roof (what docs report
beside every decode number).

The buffer is what decode reads: with `-m` as many bytes as the model reads per token (at least 256 MiB), allocated
as numpy allocates the repacked weights, i.e. in 2 MiB transparent huge pages where the kernel has them free
(numpy madvises large arrays). The share that got huge pages is printed, because it can move the roof: on a KVM
guest a buffer in 4 KiB pages pays a TLB miss and a two-level page walk per page, and the stream prefetcher stops at
every page boundary (a loaded Zen 4 guest, 1 thread, alternating: 4.2 vs 3.3 GB/s), and a buffer as large as an
8B-shaped model's 4.9 GB, written while the file's pages and the weights fill most of RAM, can get few huge pages
where 1 GiB gets them all (the kernel falls back to 4 KiB pages when no 2 MiB ones are free).
`--pages 4k` measures a buffer without huge pages (llama.cpp's weights: the file's mmap, page-cache pages).

Usage: python bench/membw.py [-t 1,2] [--mib N] [--reps 5] [-m FILE.gguf] [--tg TOKENS_PER_S] [--pages thp|4k]
The machine must be otherwise idle: another process's reads share the same memory controllers.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).parents[1]))


@njit(parallel=True, cache=True)
def _read(buf, n_tasks):
    """Sum of every 16th float32 (one per 64-byte line, every line read), each task a contiguous share, in four
    independent sums (n a multiple of 64 * n_tasks: `roof_buffer`)."""
    n = buf.shape[0]
    part = np.zeros(n_tasks, np.float32)
    for t in prange(n_tasks):
        lo, hi = t * n // n_tasks, (t + 1) * n // n_tasks
        a0, a1, a2, a3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
        for j in range(lo, hi, 64):
            a0 += buf[j]
            a1 += buf[j + 16]
            a2 += buf[j + 32]
            a3 += buf[j + 48]
        part[t] = (a0 + a1) + (a2 + a3)
    return part.sum()


def roof_buffer(nbytes: int, huge_pages: bool = True) -> np.ndarray:
    """A float32 buffer of at least nbytes (and 256 MiB), every page written, allocated as numpy allocates the
    weights (huge_pages=False: with numpy's huge-page madvise off, so in 4 KiB pages)."""
    from numpy._core import multiarray

    n = max(int(nbytes), 256 << 20) // 4
    n -= n % (64 * 64)  # whole 64-float steps for up to 64 threads
    before = multiarray._get_madvise_hugepage()
    multiarray._set_madvise_hugepage(huge_pages)
    try:
        return np.ones(n, np.float32)
    finally:
        multiarray._set_madvise_hugepage(before)


def huge_page_share(buf: np.ndarray) -> float | None:
    """The fraction of buf's resident bytes in transparent huge pages, from the mappings it spans in
    /proc/self/smaps (a madvised array is split into several); None where unreadable."""
    lo = buf.__array_interface__["data"][0]
    hi = lo + buf.nbytes
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    rss = huge = 0
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        start, end = (int(v, 16) for v in block.split(" ", 1)[0].split("-"))
        if start < hi and lo < end:
            rss += sum(int(v) for v in re.findall(r"^Rss:\s+(\d+)", block, re.M))
            huge += sum(int(v) for v in re.findall(r"^AnonHugePages:\s+(\d+)", block, re.M))
    return huge / rss if rss else None


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
    ap.add_argument("--mib", type=int, default=None,
                    help="buffer size (default: the model's bytes per token with -m, else 1024)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-m", "--model", default=None, help="a GGUF file: its bytes per token and tokens/s roof")
    ap.add_argument("--tg", type=float, default=None, help="a measured decode tokens/s: its fraction of the roof")
    ap.add_argument("--pages", choices=("thp", "4k"), default="thp",
                    help="thp: as numpy allocates the weights (huge pages where free); 4k: no huge pages")
    args = ap.parse_args()
    per_token = model_bytes_per_token(args.model) if args.model else None
    buf = roof_buffer(args.mib << 20 if args.mib else per_token or 1 << 30, args.pages == "thp")
    share = huge_page_share(buf)
    print(f"buffer {buf.nbytes / 2**20:.0f} MiB" + (f", {share:.0%} in huge pages" if share is not None else ""))
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

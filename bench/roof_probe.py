"""Why the memory roof moves: one buffer read many ways, with the share of the time the threads actually ran.

The investigation behind bench/membw.py's roof (issue #47): a model-sized buffer in huge pages and in 4 KiB pages,
read with 1 and 2 threads by
- `line`: membw's reader, one float per 64-byte line into four sums (the hardware prefetcher alone);
- `line+pfN`: the same with a software prefetch (`prefetcht0`, llamactx.ggml.kernels.simd.prefetch) N lines on,
  the decode kernels' habit;
- `xor.reduce` (1 thread): numpy's np.bitwise_xor.reduce over int64, every byte loaded in full vectors;
- `memcpy` (1 thread): np.copyto into a 64 MiB buffer, the read side of a copy (it also writes).
Each is timed `--reps` times; a row prints the wall GB/s (max and median), the CPU share of the threads (process CPU
time / (wall x threads): under 1 where other processes took the cores), the hypervisor's steal share (/proc/stat),
and the GB/s per CPU-second (wall GB/s / CPU share), which is what the threads saw while they ran. No llama.cpp
counterpart (ggml has none; llama-bench reports only tokens/s).

`--series N` instead re-reads the same huge-page buffer with membw's reader N times `--every` seconds apart with
1 and 2 threads (the "does it hold still" test). `perf stat` cannot help on a KVM guest that exposes no hardware
counters (`perf stat -e cycles` says <not supported>), hence the CPU-time accounting.

Usage: python bench/roof_probe.py [--mib 800] [--reps 5] [--series N --every 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

from membw import _pass, _read, huge_page_share, measure, roof_buffer  # noqa: E402

from llamactx.ggml.kernels.simd import prefetch  # noqa: E402


@njit(parallel=True, cache=True)
def _read_ahead(lines, n_tasks, ahead):
    """membw's `_read` over lines (n_lines, 16) float32, prefetching line i + ahead as it reads line i."""
    n = lines.shape[0]
    part = np.zeros(n_tasks, np.float32)
    raw = lines.view(np.uint8)  # (n_lines, 64)
    for t in prange(n_tasks):
        lo, hi = t * n // n_tasks, (t + 1) * n // n_tasks
        a0, a1, a2, a3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
        for i in range(lo, hi, 4):
            prefetch(raw, min(i + ahead, hi - 1), 0)
            prefetch(raw, min(i + ahead + 1, hi - 1), 0)
            prefetch(raw, min(i + ahead + 2, hi - 1), 0)
            prefetch(raw, min(i + ahead + 3, hi - 1), 0)
            a0 += lines[i, 0]
            a1 += lines[i + 1, 0]
            a2 += lines[i + 2, 0]
            a3 += lines[i + 3, 0]
        part[t] = (a0 + a1) + (a2 + a3)
    return part.sum()


def _readers(buf: np.ndarray, threads: int) -> dict:
    """name -> a callable reading all of buf with `threads` threads."""
    lines = buf.reshape(-1, 16)  # (n_lines, 16)
    out = {"line": lambda: _read(buf, threads)}
    for ahead in (16, 64, 256):
        out[f"line+pf{ahead}"] = lambda ahead=ahead: _read_ahead(lines, threads, ahead)
    if threads == 1:
        words = buf.view(np.int64)
        out["xor.reduce"] = lambda: np.bitwise_xor.reduce(words)
        src, dst = buf.view(np.uint8), np.empty(64 << 20, np.uint8)

        def copy():
            for o in range(0, src.size - dst.size + 1, dst.size):
                np.copyto(dst, src[o:o + dst.size])
        out["memcpy"] = copy
    return out


def _row(label: str, readings) -> str:
    gbs, per_cpu = [r.gbs for r in readings], [r.gbs_per_cpu for r in readings]
    return (f"| {label} | {max(gbs):.1f} | {statistics.median(gbs):.1f} | {max(r.cpu_share for r in readings):.2f} | "
            f"{max(r.steal for r in readings):.2f} | {max(per_cpu):.1f} | {statistics.median(per_cpu):.1f} |")


def matrix(mib: int, reps: int) -> None:
    print("| pages, threads, reader | wall GB/s max | median | CPU share | steal | GB/s per CPU-s max | median |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for pages in ("thp", "4k"):
        buf = roof_buffer(mib << 20, pages == "thp")
        share = huge_page_share(buf)
        for threads in (1, 2):
            numba.set_num_threads(threads)
            for name, fn in _readers(buf, threads).items():
                fn()
                rows = [_pass(fn, buf.nbytes, threads, name) for _ in range(reps)]
                print(_row(f"{pages} ({share:.0%} huge), {threads}t, {name}", rows), flush=True)
        del buf


def series(mib: int, reps: int, count: int, every: float) -> None:
    import time

    buf = roof_buffer(mib << 20)
    print(f"{count} readings {every:g} s apart, {buf.nbytes >> 20} MiB, {huge_page_share(buf):.0%} in huge pages")
    print("| threads | wall GB/s min | median | max | GB/s per CPU-s min | median | max |\n| --- |" + " ---: |" * 6)
    got: dict[int, list] = {1: [], 2: []}
    for _ in range(count):
        t0 = time.perf_counter()
        for threads in got:
            got[threads].append(measure(buf, threads, reps))
        time.sleep(max(0.0, every - (time.perf_counter() - t0)))
    for threads, rs in got.items():
        cols = []
        for vals in ([r.gbs for r in rs], [r.gbs_per_cpu for r in rs]):
            cols += [min(vals), statistics.median(vals), max(vals)]
        print(f"| {threads} | " + " | ".join(f"{v:.1f}" for v in cols) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=800, help="buffer size (default: about the dense 1B's bytes/token)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--series", type=int, default=0, help="re-read the same buffer this many times instead")
    ap.add_argument("--every", type=float, default=3.0, help="seconds between --series readings")
    args = ap.parse_args()
    if args.series:
        series(args.mib, args.reps, args.series, args.every)
    else:
        matrix(args.mib, args.reps)


if __name__ == "__main__":
    main()

"""The memory roof decode runs under: read bandwidth from DRAM with the threads decode uses (issue #47).

Decode of a model larger than the last-level cache streams every weight once per token, so tokens/s can never exceed
bandwidth / bytes read per token. This measures that bandwidth as decode would see it: a numba `prange` over the
threads (the kernels' own thread pool and share of rows), each reading its contiguous share of a buffer far larger
than the caches, one float per 64-byte line into four independent sums (every line read; the hardware prefetcher
alone). The best of `--reps` passes counts: a pass can only be slowed down (another process's reads, a descheduled
thread), never sped up. It prints GB/s for each thread count and, with `-m MODEL`, the model's bytes read per token
and the tokens/s roof that implies; `--tg T` turns a measured tokens/s into the fraction of the roof.

Why a roof measured on a shared machine moves (a 2-vCPU KVM guest, Zen 4, 2026-12-05, `bench/roof_probe.py`):
- other processes: with 8 people's tests running (load average 5-9 on 2 vCPUs) a pass's threads ran 27-52% of its
  wall time (process CPU time / (wall x threads)), so wall GB/s fell to 6-16 where quiet moments gave 35-65. The
  steal time in /proc/stat stayed ~0: the guest's own tenants took the cores, not the hypervisor (`perf stat` has
  no hardware counters on this guest). Each reading therefore prints the CPU share of its best pass and the GB/s
  per CPU-second (bytes / (CPU time / threads)), which holds still under load (1 thread: 28-34 GB/s while wall
  GB/s went 6-16); that is the figure to set against a CPU-time profile (profile_forward.py -t 1). With 2 threads
  it overstates the roof where the two threads did not run at the same time;
- pages: a buffer in 4 KiB pages reads at 60-85% of one in huge pages (1 thread 20-24 against 28-34 GB/s per
  CPU-second: a nested page walk per 4 KiB on a KVM guest, and the prefetcher stops at page boundaries). numpy
  madvises big arrays for transparent huge pages (`--pages thp`, our repacked weights); an mmap of the file does
  not (`--pages 4k`, llama.cpp's weights). The share that got huge pages is printed: a buffer written while RAM is
  full can get few;
- reading pattern: a software prefetch 16-256 lines ahead and full-vector loads of every byte
  (np.bitwise_xor.reduce) read within a few GB/s of this reader, either way; a copy (memcpy) reads at 13;
- NUMA: one node on this guest (lscpu), so placement does not move it.
Hence a roof is only good for the moment it was read: compare_llamacpp.py --roof reads it right before and after
each run it bounds, with the same threads, both page kinds, and says BROKEN ROOF where a run reads faster.

Usage: python bench/membw.py [-t 1,2] [--mib N] [--reps 5] [-m FILE.gguf] [--tg TOKENS_PER_S] [--pages thp|4k]
                             [--series N --every SECONDS]
`--series 20 --every 3` re-measures the same buffer 20 times a minute and prints min / median / max.
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import sys
import time
from dataclasses import dataclass
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


@dataclass(slots=True, frozen=True)
class Reading:
    """The best pass of a roof measurement: wall GB/s, which reader gave it, and how much of the wall time the
    threads actually ran (cpu_share: CPU time / (wall x threads); steal: the hypervisor's share of the vCPUs)."""

    gbs: float
    reader: str
    cpu_share: float
    steal: float

    @property
    def gbs_per_cpu(self) -> float:
        """Bytes per second of the threads' own CPU time (bytes / (CPU time / threads)): the roof as the threads
        saw it while they ran; with 2 threads an upper bound where they did not run at the same time."""
        return self.gbs / min(1.0, max(self.cpu_share, 1e-9))

    def describe(self) -> str:
        return (f"{self.gbs:6.1f} GB/s ({self.reader}; the threads ran {self.cpu_share:.0%} of it, steal "
                f"{self.steal:.0%}: {self.gbs_per_cpu:.1f} GB/s per CPU-second)")


def _steal_ticks() -> int:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pass(fn, nbytes: int, threads: int, reader: str) -> Reading:
    s0, c0, t0 = _steal_ticks(), _cpu_seconds(), time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    n_cpu = numba.config.NUMBA_NUM_THREADS
    return Reading(nbytes / dt / 1e9, reader, (_cpu_seconds() - c0) / (dt * threads),
                   (_steal_ticks() - s0) / 100 / (dt * n_cpu))


def bandwidth(buf: np.ndarray, threads: int, reps: int) -> float:
    """Best GB/s of `reps` full reads of buf with `threads` threads (`measure`)."""
    return measure(buf, threads, reps).gbs


def measure(buf: np.ndarray, threads: int, reps: int, read=None) -> Reading:
    """The best of `reps` passes over buf with `threads` threads (a first pass, which compiles and faults in, not
    counted); read(buf, threads) is the reader (default `_read`)."""
    numba.set_num_threads(threads)
    read = read or _read
    read(buf, threads)
    return max((_pass(lambda: read(buf, threads), buf.nbytes, threads, read.__name__.lstrip("_"))
                for _ in range(reps)), key=lambda r: r.gbs)


def model_bytes_per_token(path: str) -> int:
    """Bytes a decode step reads: every tensor's stored bytes (embeddings are read one row a token; when they are
    tied, the output head reads them whole), of a mixture of experts' stacked expert tensors (`*_exps`) only the
    share of the experts a token uses (expert_used_count of expert_count)."""
    from llamactx.gguf.reader import GGUFFile

    g = GGUFFile(path)
    arch = g.meta.get("general.architecture", "")
    n_expert, n_used = g.meta.get(f"{arch}.expert_count", 0), g.meta.get(f"{arch}.expert_used_count", 0)
    total = 0.0
    for name, t in g.tensors.items():
        if name == "token_embd.weight" and "output.weight" in g.tensors:
            continue
        share = n_used / n_expert if n_expert and "_exps." in name else 1.0
        total += int(t.nbytes) * share
    return int(total)


def _series(buf: np.ndarray, threads: int, reps: int, count: int, every: float) -> None:
    """`count` readings of the same buffer `every` seconds apart: how far the roof moves at this moment."""
    got = []
    for _ in range(count):
        t0 = time.perf_counter()
        got.append(measure(buf, threads, reps))
        time.sleep(max(0.0, every - (time.perf_counter() - t0)))
    for label, vals in (("GB/s", [r.gbs for r in got]), ("GB/s per CPU-s", [r.gbs_per_cpu for r in got]),
                        ("CPU share", [r.cpu_share for r in got])):
        print(f"  {threads} thread(s) {label:15s} min {min(vals):6.2f} median {statistics.median(vals):6.2f} "
              f"max {max(vals):6.2f}  ({count} readings, {every:g} s apart)", flush=True)


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
    ap.add_argument("--series", type=int, default=0, help="re-measure this many times and print the spread")
    ap.add_argument("--every", type=float, default=3.0, help="seconds between --series readings")
    args = ap.parse_args()
    per_token = model_bytes_per_token(args.model) if args.model else None
    buf = roof_buffer(args.mib << 20 if args.mib else per_token or 1 << 30, args.pages == "thp")
    share = huge_page_share(buf)
    print(f"buffer {buf.nbytes / 2**20:.0f} MiB" + (f", {share:.0%} in huge pages" if share is not None else ""))
    if per_token:
        print(f"{Path(args.model).name}: {per_token / 1e9:.3f} GB read per token")
    for threads in (int(t) for t in args.threads.split(",")):
        if args.series:
            _series(buf, threads, args.reps, args.series, args.every)
            continue
        r = measure(buf, threads, args.reps)
        line = f"{threads} thread(s): {r.describe()}"
        if per_token:
            roof = r.gbs * 1e9 / per_token
            line += f"\n  -> decode roof {roof:6.1f} tokens/s"
            if args.tg:
                line += f"; {args.tg:.1f} t/s is {args.tg / roof:.0%} of it"
        print(line, flush=True)


if __name__ == "__main__":
    main()

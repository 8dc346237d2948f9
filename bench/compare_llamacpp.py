"""Ours vs llama.cpp on this machine: pp and tg tokens/s, measured alternately, with ratios.

llama.cpp is the native `llama-bench` built by ../shared/tools/build_llamacpp.sh from the tree behind the
references (never llama-cpp-python, whose Python layer slows the anchor down). Each round runs llama-bench's test,
then `llamactx bench` with the same options, each in a fresh process; the table reports medians over rounds.

Usage: python bench/compare_llamacpp.py [-m smollm2|gemma3|FILE.gguf] [-p 512] [-n 128] [-d 0] [-r 3] [-t 2]
           [--fa off|on] [--llamacpp DIR (default $LLAMACPP or ~/.cache/llamactx-llamacpp)] [--pythonpath CHECKOUT]
           [--target CPU --llama-bench PATH]
`--target haswell` compiles ours for that CPU (NUMBA_CPU_NAME, its own NUMBA_CACHE_DIR .numba-<CPU>), against the
llama-bench of `--llama-bench` (llama.cpp built for that CPU, e.g. `-DGGML_NATIVE=OFF -DGGML_AVX2=ON ...`).
`-d` starts every test from that many tokens in the cache (llama-bench's --n-depth), e.g. `-p 0 -n 32 -d 4096`.
`--pythonpath` runs ours from another checkout (e.g. a worktree of an earlier commit) for before/after numbers.

The models people run on CPUs, as rows (issue #47): `-m dense-1b` (Llama-3.2-1B's shape, Q4_K_M, 0.80 GB),
`-m dense-8b` (Llama-3.1-8B's, Q4_K_M, ~4.9 GB: check `free -g` first, delete the file after), `-m dense-4b`
(Qwen3-4B's), each written once by bench/make_dense_model.py to /tmp/dense-<shape>-q4_k_m.gguf (random weights: only
the bytes read per token matter). `--roof` reads the memory roof (bench/membw.py, the same threads; a buffer in huge
pages as our weights are, one in 4 KiB pages as llama.cpp's mmap is) right before and after every tg run, and prints
each run's GB/s (tokens/s x bytes read per token) as a fraction of the best reading beside it, with how much of its
wall time each side's process and the roof's threads actually ran (other processes on a shared machine), and
BROKEN ROOF where a run read faster than its roof (a roof read at a busier moment bounds nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def llama_bench(binary: Path, model: str, n_prompt: int, n_gen: int, n_depth: int, threads: int, fa: str) -> float:
    """tokens/s of one llama-bench test (-r 1 after its own warm-up)."""
    out = subprocess.run([str(binary), "-m", model, "-p", str(n_prompt), "-n", str(n_gen), "-d", str(n_depth),
                          "-r", "1", "-t", str(threads), "-fa", fa, "-o", "json"],
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def ours(model: str, n_prompt: int, n_gen: int, n_depth: int, threads: int, fa: str,
         pythonpath: str | None, target: str | None = None) -> float:
    env = dict(os.environ)
    if target:
        env["NUMBA_CPU_NAME"] = target
        env["NUMBA_CACHE_DIR"] = str(Path(pythonpath or ".").resolve() / f".numba-{target}")
    if pythonpath:  # `python -m` puts the working directory first on sys.path: run from the checkout
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-m", "llamactx", "bench", "-m", model, "-p", str(n_prompt),
                          "-n", str(n_gen), *(["-d", str(n_depth)] if n_depth else []), "-r", "1", "-t", str(threads),
                          "-fa", fa, "-o", "json"],
                         capture_output=True, text=True, check=True, env=env, cwd=pythonpath)
    return float(json.loads(out.stdout)[0]["avg_ts"])


DENSE_MODELS = {"dense-1b": "llama-1b", "dense-8b": "llama-8b", "dense-4b": "qwen3-4b"}  # make_dense_model shapes


def dense_model(name: str) -> str:
    """The Q4_K_M file of a DENSE_MODELS row, written by make_dense_model.py unless it is there already."""
    shape = DENSE_MODELS[name]
    path = Path(f"/tmp/dense-{shape}-q4_k_m.gguf")
    if not path.exists():
        subprocess.run([sys.executable, str(Path(__file__).with_name("make_dense_model.py")), "--shape", shape,
                        "--type", "q4_k_m", str(path)], check=True)
    return str(path)


ROOF_MAX_BYTES = 768 << 20  # a roof buffer larger than this reads no faster (the L3 is 32 MiB): spare the RAM


class RoofMeter:
    """membw.py's read roof, measured right before and after each timed decode run with the run's threads, on a
    buffer in huge pages (as numpy holds our repacked weights) and one in 4 KiB pages (as llama.cpp's mmap of the
    file holds its weights): on a shared machine the roof moves by 2x within minutes, so only a reading taken beside
    a run bounds it. The roof of a run is the best reading before and after it, of either page kind."""

    def __init__(self, model: str, threads: int, reps: int = 3) -> None:
        sys.path.insert(0, str(Path(__file__).parent))
        from membw import huge_page_share, model_bytes_per_token, roof_buffer

        self.threads, self.reps = threads, reps
        self.per_token = model_bytes_per_token(model)
        nbytes = min(self.per_token, ROOF_MAX_BYTES)
        self.bufs = {"thp": roof_buffer(nbytes, True), "4k": roof_buffer(nbytes, False)}
        self.huge_share = huge_page_share(self.bufs["thp"])

    def read(self) -> dict:
        """page kind -> membw.Reading, now."""
        from membw import measure

        return {kind: measure(buf, self.threads, self.reps) for kind, buf in self.bufs.items()}

    def describe(self) -> str:
        pages = f", {self.huge_share:.0%} of it in huge pages" if self.huge_share is not None else ""
        nbytes = self.bufs["thp"].nbytes
        return (f"roof: membw.py's reader, {self.threads} thread(s), a {nbytes >> 20} MiB buffer{pages} and one in "
                f"4 KiB pages, best of {self.reps} passes right before and after each run; "
                f"{self.per_token / 1e9:.3f} GB read per token")


def child_cpu_seconds() -> float:
    """CPU seconds of the finished child processes so far (their user + system time)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def roof_round(meter: RoofMeter, runs: list[tuple[str, float, float, float]], readings: list[dict]) -> list[float]:
    """Print one alternated round against its roof: runs are (side, tokens/s, wall s, CPU s) in the order they ran,
    readings the roof readings around them (len(runs) + 1). Returns each side's fraction of its roof."""
    fractions = []
    for i, (side, ts, wall, cpu) in enumerate(runs):
        around = [r for reading in readings[i:i + 2] for r in reading.values()]
        best = max(around, key=lambda r: r.gbs)
        gbs = ts * meter.per_token / 1e9
        fractions.append(gbs / best.gbs)
        kinds = " / ".join(f"{kind} {r.gbs:.1f}" for reading in readings[i:i + 2] for kind, r in reading.items())
        print(f"  {side}: {ts:.1f} t/s = {gbs:.1f} GB/s, {gbs / best.gbs:.0%} of the roof {best.gbs:.1f} GB/s "
              f"(before / after: {kinds}; the roof's threads ran {best.cpu_share:.0%} of its wall time, the run's "
              f"process {cpu / (wall * meter.threads):.0%} of its own)", flush=True)
        if gbs > best.gbs:
            print(f"  BROKEN ROOF: {side} read {gbs:.1f} GB/s, more than the roof measured beside it: the roof was "
                  f"read at a busier moment than the run (compare the CPU shares); this round bounds nothing")
    return fractions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_dir = os.environ.get("LLAMACPP", str(Path.home() / ".cache/llamactx-llamacpp"))
    ap.add_argument("--llamacpp", default=default_dir, help="where build_llamacpp.sh put bin/llama-bench")
    ap.add_argument("--pythonpath", default=None, help="run llamactx from this checkout instead")
    ap.add_argument("-m", "--model", default="smollm2", help="smollm2, gemma3 or a GGUF file (both sides load it)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-d", "--n-depth", type=int, default=0)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--fa", choices=("off", "on"), default="off",
                    help="flash attention on both sides (default off; both programs default to on)")
    ap.add_argument("--target", default=None, help="the CPU ours compiles for (NUMBA_CPU_NAME), e.g. haswell")
    ap.add_argument("--llama-bench", default=None, help="llama-bench built for --target (default: DIR/bin's)")
    ap.add_argument("--roof", action="store_true", help="tg as a fraction of the measured memory roof (membw.py)")
    args = ap.parse_args()
    binary = Path(args.llama_bench) if args.llama_bench else Path(args.llamacpp) / "bin" / "llama-bench"
    if not binary.exists():
        sys.exit(f"{binary} not found: build it with ../shared/tools/build_llamacpp.sh")

    from llamactx.embedded import resolve_model_path

    path = dense_model(args.model) if args.model in DENSE_MODELS else str(resolve_model_path(args.model))
    print(f"{Path(path).name}, {args.threads} threads, {args.repetitions} alternating rounds, "
          f"-fa {args.fa} on both sides" + (f", ours for {args.target}, {binary}" if args.target else ""))
    print("| test | llama.cpp t/s | llamactx t/s | ratio |\n| --- | ---: | ---: | ---: |")
    for n_prompt, n_gen in ((args.n_prompt, 0), (0, args.n_gen)):
        if not (n_prompt or n_gen):
            continue
        meter = RoofMeter(path, args.threads) if args.roof and n_gen else None
        test = (path, n_prompt, n_gen, args.n_depth, args.threads, args.fa)
        runs = {"llama.cpp": lambda test=test: llama_bench(binary, *test),
                "llamactx": lambda test=test: ours(*test, args.pythonpath, args.target)}
        got: dict[str, list[float]] = {side: [] for side in runs}
        fractions: dict[str, list[float]] = {side: [] for side in runs}
        for r in range(args.repetitions):
            readings, timed = [meter.read()] if meter else [], []
            for side, run in runs.items():
                c0, t0 = child_cpu_seconds(), time.perf_counter()
                got[side].append(run())
                timed.append((side, got[side][-1], time.perf_counter() - t0, child_cpu_seconds() - c0))
                if meter:
                    readings.append(meter.read())
            if meter:
                print(f"round {r + 1}, {meter.describe() if r == 0 else 'roof as above'}:")
                for side, frac in zip(runs, roof_round(meter, timed, readings), strict=True):
                    fractions[side].append(frac)
        t_ts, o_ts = statistics.median(got["llama.cpp"]), statistics.median(got["llamactx"])
        name = (f"pp{n_prompt}" if n_prompt else f"tg{n_gen}") + (f" @ d{args.n_depth}" if args.n_depth else "")
        print(f"| {name} | {t_ts:.1f} | {o_ts:.1f} | {o_ts / t_ts:.2f}x |")
        if meter:
            medians = {side: statistics.median(f) for side, f in fractions.items()}
            print(f"decode at the measured roof (median over rounds): llama.cpp {medians['llama.cpp']:.0%}, "
                  f"llamactx {medians['llamactx']:.0%}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

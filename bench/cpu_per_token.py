"""Decode CPU time per token, ours vs llama.cpp's llama-bench, on a machine other processes share (issue 47).

Wall-clock tokens/s mean little while other processes take the cores; the CPU time a one-thread decode spends per
token is what the program itself costs (memory stalls included). llama.cpp's side runs llama-bench twice per
round, in fresh processes, with -n N0 and -n N1 generated tokens (-p 0, -r 1, -t 1): the difference of the two
processes' CPU seconds (user + system, getrusage of the children) over N1 - N0 tokens cancels its load and setup.
Ours runs in one fresh process that decodes N0 tokens (warm-up; numba's cache loads, or compiles when another
session's edit invalidated it) and then times N1 - N0 more single-token decodes by its own CPU time.
Rounds alternate the sides; the table gives each side's median ms per token and the ratio (llama.cpp / ours:
above 1 means ours costs less). llama.cpp is ~/.cache/llamactx-llamacpp/bin/llama-bench (as compare_llamacpp.py).

Usage: python bench/cpu_per_token.py -m /tmp/moe-1b-q8_0.gguf [--n0 16] [--n1 80] [-r 3] [--fa on]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str], env: dict | None = None) -> float:
    c0 = _cpu()
    subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return _cpu() - c0


OURS = """
import sys, time
import numpy as np
from llamactx import Batch, Context, ContextParams, Model
path, n0, n1, fa = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "on"
m = Model.load(path)
ctx = Context(m, ContextParams(n_ctx=max(256, n1 + 8), n_threads=1, n_threads_batch=1, flash_attn=fa))
toks = np.random.default_rng(0).integers(0, m.hparams.n_vocab, n1)
for i, t in enumerate(toks):
    if i == n0:
        c0 = time.process_time()
    if ctx.decode(Batch.get_one([int(t)])) != 0:
        raise SystemExit("decode failed")
print(time.process_time() - c0)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--n0", type=int, default=16)
    ap.add_argument("--n1", type=int, default=80)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--fa", choices=("on", "off"), default="on")
    ap.add_argument("--llama-bench", default=str(Path.home() / ".cache/llamactx-llamacpp/bin/llama-bench"))
    args = ap.parse_args()
    if args.n1 <= args.n0:
        sys.exit(f"--n1 {args.n1} must exceed --n0 {args.n0}")

    def cmd(side: str, n: int) -> list[str]:
        return [args.llama_bench, "-m", args.model, "-p", "0", "-n", str(n), "-r", "1", "-t", "1", "-fa", args.fa,
                "-o", "json"]

    env = dict(os.environ)
    per: dict[str, list[float]] = {"llama.cpp": [], "llamactx": []}
    n = args.n1 - args.n0
    for r in range(args.rounds):
        lo, hi = _run(cmd("llama.cpp", args.n0), env), _run(cmd("llama.cpp", args.n1), env)
        per["llama.cpp"].append((hi - lo) / n * 1e3)
        out = subprocess.run([sys.executable, "-c", OURS, args.model, str(args.n0), str(args.n1), args.fa],
                             capture_output=True, text=True, check=True, env=env)
        per["llamactx"].append(float(out.stdout.split()[-1]) / n * 1e3)
        print(f"round {r + 1}: llama.cpp {per['llama.cpp'][-1]:.2f} ms, llamactx {per['llamactx'][-1]:.2f} ms "
              f"CPU per token; load {os.getloadavg()[0]:.2f}", flush=True)
    t, o = statistics.median(per["llama.cpp"]), statistics.median(per["llamactx"])
    print(f"{Path(args.model).name}: CPU ms per token (1 thread, median of {args.rounds}): llama.cpp {t:.2f}, "
          f"llamactx {o:.2f}, ratio {t / o:.2f}x")


if __name__ == "__main__":
    main()

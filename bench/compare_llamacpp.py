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
the bytes read per token matter). `--roof` adds what fraction of the measured memory roof (bench/membw.py, the
same threads, a buffer of the model's bytes per token allocated as the weights are; the line says how much of it
got huge pages, which moves the roof) each side's tg reaches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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


def decode_roof(model: str, threads: int) -> tuple[float, float, float | None]:
    """(read GB/s with `threads` threads, the tokens/s roof of `model`, the share of the buffer in huge pages) from
    bench/membw.py, reading as many bytes as the model's decode step, allocated as the weights are."""
    sys.path.insert(0, str(Path(__file__).parent))
    from membw import bandwidth, huge_page_share, model_bytes_per_token, roof_buffer

    per_token = model_bytes_per_token(model)
    buf = roof_buffer(per_token)
    share = huge_page_share(buf)
    gbs = bandwidth(buf, threads, 5)
    return gbs, gbs * 1e9 / per_token, share


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
        theirs, mine = [], []
        for _ in range(args.repetitions):
            theirs.append(llama_bench(binary, path, n_prompt, n_gen, args.n_depth, args.threads, args.fa))
            mine.append(ours(path, n_prompt, n_gen, args.n_depth, args.threads, args.fa, args.pythonpath,
                             args.target))
        t_ts, o_ts = statistics.median(theirs), statistics.median(mine)
        name = (f"pp{n_prompt}" if n_prompt else f"tg{n_gen}") + (f" @ d{args.n_depth}" if args.n_depth else "")
        print(f"| {name} | {t_ts:.1f} | {o_ts:.1f} | {o_ts / t_ts:.2f}x |")
        sys.stdout.flush()
        if args.roof and n_gen:
            gbs, roof, share = decode_roof(path, args.threads)
            pages = f", {share:.0%} of it in huge pages" if share is not None else ""
            print(f"memory roof: {gbs:.1f} GB/s with {args.threads} threads (a model-sized buffer{pages}) -> "
                  f"{roof:.1f} t/s; llama.cpp at {t_ts / roof:.0%} of it, llamactx at {o_ts / roof:.0%}")


if __name__ == "__main__":
    main()

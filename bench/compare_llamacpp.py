"""Ours vs llama.cpp on this machine: pp and tg tokens/s, measured alternately in one run, with ratios.

llama.cpp is llama-cpp-python built natively in a *separate* virtual environment (never a dependency of llamactx,
never in CI), e.g.:

    python3 -m venv /tmp/lcpp/venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/lcpp/venv/bin/pip install --no-deps --no-binary :all: llama-cpp-python==0.3.36
    /tmp/lcpp/venv/bin/pip install numpy typing_extensions diskcache jinja2

Usage: python bench/compare_llamacpp.py [--llamacpp-python /tmp/lcpp/venv/bin/python] [-m smollm2|gemma3]
                                        [-p 512] [-n 128] [-r 3] [-t 2]
Each round runs llama.cpp's test in a fresh subprocess, then ours in this process, for every test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, numpy as np, llama_cpp
path = sys.argv[1]
n_prompt, n_gen, threads, seed = (int(a) for a in sys.argv[2:6])
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
cp = llama_cpp.llama_context_default_params()
cp.n_ctx = max(n_prompt, n_gen, 256) + 256; cp.n_batch = 512; cp.n_ubatch = 512
cp.n_threads = threads; cp.n_threads_batch = threads
cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx = llama_cpp.llama_init_from_model(model, cp)
n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
rng = np.random.default_rng(seed)
def run():
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    toks = rng.integers(0, n_vocab, n_prompt or n_gen).tolist()
    t0 = time.perf_counter()
    if n_prompt:
        for s in range(0, n_prompt, 512):
            part = toks[s:s + 512]
            arr = (llama_cpp.llama_token * len(part))(*part)
            llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(part)))
    else:
        for t in toks:
            arr = (llama_cpp.llama_token * 1)(t)
            llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, 1))
    llama_cpp.llama_synchronize(ctx)
    return time.perf_counter() - t0
run()
print(json.dumps([run()]))
"""


def llamacpp_seconds(python: str, path: str, n_prompt: int, n_gen: int, threads: int, seed: int) -> float:
    out = subprocess.run([python, "-c", CHILD, path, str(n_prompt), str(n_gen), str(threads), str(seed)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp-python", default="/tmp/lcpp/venv/bin/python")
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    from llamactx import Context, ContextParams, Model
    from llamactx.cli.bench import run_test
    from llamactx.embedded import resolve_model_path

    path = resolve_model_path(args.model)
    model = Model.load(path)
    ctx = Context(model, ContextParams(n_ctx=max(args.n_prompt, args.n_gen, 256) + 256, n_batch=512, n_ubatch=512,
                                       n_threads=args.threads, n_threads_batch=args.threads))
    print(f"{model.desc}, {args.threads} threads, {args.repetitions} alternating rounds")
    print("| test | llama.cpp t/s | llamactx t/s | ratio |\n| --- | ---: | ---: | ---: |")
    for n_prompt, n_gen in ((args.n_prompt, 0), (0, args.n_gen)):
        theirs, ours = [], []
        for r in range(args.repetitions):
            theirs.append(llamacpp_seconds(args.llamacpp_python, str(path), n_prompt, n_gen, args.threads, r))
            ours.extend(run_test(ctx, n_prompt, n_gen, 1, seed=r))
        n = n_prompt or n_gen
        t_ts, o_ts = n / statistics.median(theirs), n / statistics.median(ours)
        name = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
        print(f"| {name} | {t_ts:.1f} | {o_ts:.1f} | {o_ts / t_ts:.2f}x |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

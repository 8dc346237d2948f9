"""`import llama_cpp` speed: llama-cpp-python (its ctypes bindings on the native llama.cpp build) against this
repository's llama_cpp package on llamactx, on the embedded SmolLM2, alternating runs in separate processes:
Llama.create_completion (greedy, 64 tokens) and a Llama.generate loop (64 tokens).

    .venv/bin/python bench/llama_cpp_speed.py --rounds 3 --real-path /path/to/llama_cpp_python-0.3.36 \
        --lib ~/.cache/llamactx-llamacpp/bin [--extra-path /dir/with/diskcache]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
N = 64

CHILD = r"""
import json, sys, time
import llama_cpp
from llamactx.embedded import smollm2_path
llm = llama_cpp.Llama(str(smollm2_path()), n_ctx=512, n_threads=2, n_threads_batch=2, verbose=False)
prompt, n = sys.argv[1], int(sys.argv[2])
llm.create_completion(prompt, max_tokens=4, temperature=0.0)  # warm up (kernels, first decode)
llm.reset()
t0 = time.perf_counter()
out = llm.create_completion(prompt, max_tokens=n, temperature=0.0)
t1 = time.perf_counter()
llm.reset()
toks = llm.tokenize(prompt.encode())
t2 = time.perf_counter()
got = []
for tok in llm.generate(toks, temp=0.0, reset=True):
    got.append(tok)
    if len(got) == n:
        break
t3 = time.perf_counter()
print(json.dumps({"backend": getattr(llama_cpp, "__backend__", "llama-cpp-python"),
                  "completion_s": t1 - t0, "completion_tokens": out["usage"]["completion_tokens"],
                  "generate_s": t3 - t2, "text": out["choices"][0]["text"][:40]}))
"""


def run(env: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as cwd:  # not the repository root: PYTHONPATH decides the llama_cpp
        out = subprocess.run([sys.executable, "-c", CHILD, PROMPT, str(N)], env=env, cwd=cwd, capture_output=True,
                             text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--real-path", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--extra-path", default="")
    a = ap.parse_args()
    ours = dict(os.environ)
    real = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (a.real_path, a.extra_path) if p),
            "LLAMA_CPP_LIB_PATH": os.path.expanduser(a.lib)}
    for _ in range(a.rounds):
        for env in (real, ours):
            print(json.dumps(run(env)), flush=True)


if __name__ == "__main__":
    main()

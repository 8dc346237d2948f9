"""`import llama_cpp` speed: llama-cpp-python 0.3.36 (its ctypes bindings on the native llama.cpp build) against this
repository's llama_cpp package on llamactx, on the embedded SmolLM2, alternating runs in separate processes (real,
ours, real, ours, ...): Llama.create_completion (greedy, 64 tokens, the prompt evaluated each time) and a
Llama.generate loop (64 tokens). Prints each run as a JSON line, then the medians and the ratios real / ours of the
times (above 1: ours is faster).

    .venv/bin/python bench/llama_cpp_speed.py [--rounds 3] [--real-path /path/to/llama_cpp_python-0.3.36] \
        [--lib ~/.cache/llamactx-llamacpp/bin] [--threads 2]

llama-cpp-python imports `diskcache` at import time only for LlamaDiskCache; when it is not installed a stub
module is put on the real run's path. See bench/llama_cpp_server_speed.py for the servers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
N = 64
SDIST = "/work/sdist/llama_cpp_python-0.3.36"
LIB = "~/.cache/llamactx-llamacpp/bin"

CHILD = r"""
import json, sys, time
import llama_cpp
model, prompt, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model, n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
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
                  "generate_s": t3 - t2, "generate_tokens": len(got), "text": out["choices"][0]["text"][:40]}))
"""


def smollm2() -> str:
    from llamactx.embedded import smollm2_path

    return str(smollm2_path())


def diskcache_path(tmp: str) -> str:
    """A directory that makes `import diskcache` work for llama-cpp-python (a stub when it is not installed)."""
    try:
        import diskcache  # noqa: F401

        return ""
    except ImportError:
        Path(tmp, "diskcache.py").write_text("class Cache:\n    pass\n")
        return tmp


def run(env: dict[str, str], model: str, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as cwd:  # not the repository root: PYTHONPATH decides the llama_cpp
        out = subprocess.run([sys.executable, "-c", CHILD, model, PROMPT, str(N), str(threads)], env=env, cwd=cwd,
                             capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"a benchmark run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    real = [r for r in runs if r["backend"] != "llamactx"]
    ours = [r for r in runs if r["backend"] == "llamactx"]
    out = {}
    for key, n_key in (("completion_s", "completion_tokens"), ("generate_s", "generate_tokens")):
        r, o = statistics.median(x[key] for x in real), statistics.median(x[key] for x in ours)
        out[key.removesuffix("_s")] = {"real_s": round(r, 4), "ours_s": round(o, 4),
                                       "real_tok_s": round(real[0][n_key] / r, 1),
                                       "ours_tok_s": round(ours[0][n_key] / o, 1), "real_over_ours": round(r / o, 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--real-path", default=SDIST)
    ap.add_argument("--lib", default=LIB)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    model = smollm2()
    with tempfile.TemporaryDirectory() as stub:
        ours = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LLAMA_CPP_LIB_PATH")}
        real = {**ours, "PYTHONPATH": os.pathsep.join(p for p in (a.real_path, diskcache_path(stub)) if p),
                "LLAMA_CPP_LIB_PATH": os.path.expanduser(a.lib)}
        runs = []
        for _ in range(a.rounds):
            for env in (real, ours):
                runs.append(run(env, model, a.threads))
                print(json.dumps(runs[-1]), flush=True)
    texts = {backend: {r["text"] for r in runs if (r["backend"] == "llamactx") == backend} for backend in (0, 1)}
    if texts[0] != texts[1]:
        print("note: the two packages' greedy texts differ", flush=True)
    print(json.dumps({"summary": summary(runs)}, indent=1))


if __name__ == "__main__":
    main()

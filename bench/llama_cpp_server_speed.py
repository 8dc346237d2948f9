"""`python -m llama_cpp.server` speed: llama-cpp-python 0.3.36's server (FastAPI on its ctypes bindings and the
native llama.cpp build) against this repository's (llamactx's server behind llama-cpp-python's settings), on the
embedded SmolLM2, with 4 clients each sending greedy /v1/completions one after another (distinct prompts, so no
prompt cache helps). The servers run alternately (real, ours, real, ours, ...), one at a time, each started fresh.
Prints each run as a JSON line, then the medians and the ratios real / ours (above 1: ours is faster).

    .venv/bin/python bench/llama_cpp_server_speed.py [--rounds 2] [--clients 4] [--requests 2] [--max-tokens 32] \
        [--real-python /tmp/lcpp-venv/bin/python] [--real-path /path/to/llama_cpp_python-0.3.36] \
        [--lib ~/.cache/llamactx-llamacpp/bin] [--threads 2]

Both servers get this process's environment: ours sets OMP_WAIT_POLICY=PASSIVE unless it is set (llama_cpp.server
.app.passive_omp_wait); export OMP_WAIT_POLICY=PASSIVE to give llama-cpp-python's OpenMP build the same.

The real server needs fastapi, uvicorn, sse_starlette, starlette_context, pydantic_settings, jinja2, numpy and
diskcache; install them into a separate venv (--real-python), not this project's:

    python3 -m venv /tmp/lcpp-venv && /tmp/lcpp-venv/bin/pip install numpy jinja2 diskcache fastapi uvicorn \
        sse_starlette starlette_context pydantic_settings
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

PROMPT = "The quick brown fox jumps over the lazy dog. Story number {i}: once upon a time"
SDIST = "/work/sdist/llama_cpp_python-0.3.36"
LIB = "~/.cache/llamactx-llamacpp/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], env: dict[str, str], url: str, log) -> subprocess.Popen:
    with tempfile.TemporaryDirectory() as cwd:  # not the repository root: PYTHONPATH decides the llama_cpp
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=log)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[:3]} exited with {proc.returncode} (see {log.name})")
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{cmd[:3]} did not start (see {log.name})")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def load(url: str, clients: int, requests: int, max_tokens: int) -> dict:
    """`clients` threads, each sending `requests` completions one after another; wall time, tokens, latencies."""
    latencies: list[float] = []
    tokens: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(timeout=1200) as http:
            for r in range(requests):
                body = {"prompt": PROMPT.format(i=c * 1000 + r), "max_tokens": max_tokens, "temperature": 0.0}
                t0 = time.perf_counter()
                resp = http.post(url + "/v1/completions", json=body)
                dt = time.perf_counter() - t0
                with lock:
                    if resp.status_code != 200:
                        errors.append(f"{resp.status_code} {resp.text[:200]}")
                    else:
                        latencies.append(dt)
                        tokens.append(resp.json()["usage"]["completion_tokens"])

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"requests failed: {errors[:3]}")
    return {"wall_s": wall, "completion_tokens": sum(tokens), "tok_s": sum(tokens) / wall,
            "mean_latency_s": statistics.mean(latencies), "max_latency_s": max(latencies)}


def run(backend: str, a: argparse.Namespace, model: str, log) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flags = ["--model", model, "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048",
             "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads), "--verbose", "false"]
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LLAMA_CPP_LIB_PATH")}
    if backend == "llama-cpp-python":
        cmd = [a.real_python, "-m", "llama_cpp.server", *flags]
        env = {**base, "PYTHONPATH": a.real_path, "LLAMA_CPP_LIB_PATH": os.path.expanduser(a.lib)}
    else:
        cmd = [sys.executable, "-m", "llama_cpp.server", *flags, "--n_parallel", str(a.clients)]
        env = base
    proc = start(cmd, env, url, log)
    try:
        httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "temperature": 0.0},
                   timeout=600).raise_for_status()  # warm up
        return {"backend": backend, **load(url, a.clients, a.requests, a.max_tokens)}
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="completions per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--real-python", default="/tmp/lcpp-venv/bin/python")
    ap.add_argument("--real-path", default=SDIST)
    ap.add_argument("--lib", default=LIB)
    a = ap.parse_args()
    from llamactx.embedded import smollm2_path

    model = str(smollm2_path())
    runs = []
    with tempfile.NamedTemporaryFile("w", prefix="llama_cpp_server_speed.", suffix=".log", delete=False) as log:
        for _ in range(a.rounds):
            for backend in ("llama-cpp-python", "llamactx"):
                runs.append(run(backend, a, model, log))
                print(json.dumps(runs[-1]), flush=True)
    out = {}
    for key in ("tok_s", "mean_latency_s"):
        real = statistics.median(r[key] for r in runs if r["backend"] == "llama-cpp-python")
        ours = statistics.median(r[key] for r in runs if r["backend"] == "llamactx")
        out[key] = {"real": round(real, 3), "ours": round(ours, 3),
                    "ours_over_real" if key == "tok_s" else "real_over_ours":
                    round(ours / real if key == "tok_s" else real / ours, 3)}
    print(json.dumps({"summary": out, "clients": a.clients, "requests_per_client": a.requests,
                      "max_tokens": a.max_tokens}, indent=1))


if __name__ == "__main__":
    main()

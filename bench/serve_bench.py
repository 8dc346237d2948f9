"""Serving throughput: N concurrent clients streaming completions, against `llamactx serve` and the native
`llama-server` (built by ../shared/tools/build_llamacpp.sh), alternately, with the same model, slots and threads.

Each client sends `--requests` completions in a row (a short prompt of its own, `-n` tokens with ignore_eos,
streamed); reported per server and client count: aggregate generated tokens/s over the whole run, and time to first
token p50 / p95. Both servers are started here, on 127.0.0.1 and a free port, and stopped at the end.

Usage: python bench/serve_bench.py [-m smollm2] [-c 1,4,8,16] [-np 8] [-n 64] [--requests 3] [-t 2] [-r 2]
           [--llamacpp DIR (default $LLAMACPP or ~/.cache/llamactx-llamacpp)] [--only llamactx|llama-server]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

TOPICS = ["the sea", "a small robot", "the history of bread", "mountains", "a lost key", "the moon", "coffee",
          "a library", "winter", "a fast train", "music", "an old map", "gardens", "the desert", "a storm",
          "clocks"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kind: str, model: str, n_slots: int, n_ctx: int, threads: int, llamacpp: Path) -> tuple:
    port = free_port()
    if kind == "llamactx":
        cmd = [sys.executable, "-m", "llamactx", "serve", "-m", model, "--port", str(port), "-np", str(n_slots),
               "-c", str(n_ctx), "-t", str(threads), "--no-webui"]
    else:
        cmd = [str(llamacpp / "bin" / "llama-server"), "-m", model, "--port", str(port), "--host", "127.0.0.1",
               "-np", str(n_slots), "-c", str(n_ctx), "-t", str(threads), "-tb", str(threads), "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, cmd)
    return proc, url


def wait_ready(proc: subprocess.Popen, url: str, cmd: list[str]) -> None:
    """Return once the server `proc` answers url/health with 200; kill it and raise where it exits first or has not
    answered within 300 s."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server did not start: {' '.join(cmd)}")


class Client:
    """One client's keep-alive HTTP/1.1 connection (http.client), reading the stream as raw lines and parsing only
    the events it needs: the first with text (time to first token) and the last (the token count). The clients
    share the two cores with the server they measure, so the less CPU they take the less they slow it: one
    httpx.Client per request and a JSON parse per event took ~4.4 ms of CPU per 8-row step (bench/serve_profile.py),
    time taken from the faster server's decode more than from the slower's."""

    def __init__(self, url: str):
        u = urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.conn: http.client.HTTPConnection | None = None

    def _post(self, path: str, body: bytes, retry: bool = True) -> http.client.HTTPResponse:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        try:
            self.conn.request("POST", path, body, {"Content-Type": "application/json"})
            return self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):
            self.close()
            if not retry:
                raise
            return self._post(path, body, retry=False)  # the server closed the kept-alive connection meanwhile

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, prompt: str, n_gen: int) -> tuple[float, int]:
        """Streams one completion; returns (seconds to the first token, tokens generated)."""
        body = json.dumps({"prompt": prompt, "max_tokens": n_gen, "n_predict": n_gen, "ignore_eos": True,
                           "stream": True, "temperature": 0.8, "cache_prompt": True}).encode()
        t0 = time.perf_counter()
        res = self._post("/v1/completions", body)
        if res.status != 200:
            raise RuntimeError(f"HTTP {res.status}: {res.read()[:200]!r}")
        ttft, n = None, 0
        while line := res.readline():
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            if ttft is not None and b'"completion_tokens"' not in line and b'"predicted_n"' not in line:
                continue
            obj = json.loads(line[6:])
            if ttft is None and "".join(c.get("text") or "" for c in obj.get("choices", [])):
                ttft = time.perf_counter() - t0
            if obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
            n = max(n, (obj.get("timings") or {}).get("predicted_n", 0))
        if res.will_close:
            self.close()
        return (ttft if ttft is not None else time.perf_counter() - t0), n or n_gen


def run_clients(url: str, n_clients: int, n_requests: int, n_gen: int) -> dict:
    def client(i: int) -> list[tuple[float, int]]:
        c = Client(url)
        try:
            return [c.request(f"Write a short story about {TOPICS[(i + j) % len(TOPICS)]}.", n_gen)
                    for j in range(n_requests)]
        finally:
            c.close()

    t0, cpu0 = time.perf_counter(), time.process_time()
    with cf.ThreadPoolExecutor(n_clients) as pool:
        results = [r for rs in pool.map(client, range(n_clients)) for r in rs]
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    ttfts = sorted(t for t, _ in results)
    n_tokens = sum(n for _, n in results)
    return {"tps": n_tokens / wall, "ttft_p50": statistics.median(ttfts),
            "ttft_p95": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], "client_cpu": cpu / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-c", "--clients", default="1,4,8,16")
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("--ctx-size", type=int, default=8192)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=2, help="alternating rounds")
    ap.add_argument("--only", choices=("llamactx", "llama-server"), default=None)
    ap.add_argument("--llamacpp", default=os.environ.get("LLAMACPP", str(Path.home() / ".cache/llamactx-llamacpp")))
    args = ap.parse_args()
    from llamactx.embedded import resolve_model_path

    model = str(resolve_model_path(args.model))
    kinds = [args.only] if args.only else ["llama-server", "llamactx"]
    clients = [int(c) for c in args.clients.split(",")]
    rows: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.rounds):
        for kind in kinds:
            proc, url = start(kind, model, args.parallel, args.ctx_size, args.threads, Path(args.llamacpp))
            try:
                run_clients(url, 2, 1, 8)  # warm up
                for n in clients:
                    rows.setdefault((kind, n), []).append(run_clients(url, n, args.requests, args.n_gen))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print(f"{Path(model).name}, -np {args.parallel}, -c {args.ctx_size}, {args.threads} threads, {args.n_gen} tokens "
          f"per request, {args.requests} requests per client, median of {args.rounds} alternating rounds")
    print("| clients | " + " | ".join(f"{k} t/s | {k} TTFT p50 / p95 s | clients' CPU" for k in kinds) +
          (" | ratio |" if len(kinds) == 2 else " |"))
    print("|" + " ---: |" * (1 + 3 * len(kinds) + (len(kinds) == 2)))
    for n in clients:
        cells, tps = [], []
        for kind in kinds:
            rs = rows[kind, n]
            t = statistics.median(r["tps"] for r in rs)
            tps.append(t)
            cells += [f"{t:.1f}", f"{statistics.median(r['ttft_p50'] for r in rs):.2f} / "
                                  f"{statistics.median(r['ttft_p95'] for r in rs):.2f}",
                      f"{statistics.median(r['client_cpu'] for r in rs):.2f}"]
        ratio = [f"{tps[1] / tps[0]:.2f}x"] if len(kinds) == 2 else []
        print(f"| {n} | " + " | ".join(cells + ratio) + " |")


if __name__ == "__main__":
    main()

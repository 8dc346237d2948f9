"""Soak: mixed requests with random cancels against `llamactx serve` for a long time (not part of the suite).

Clients send completions and chats, streamed or not, some cancelled mid-way (the connection is dropped), some
malformed, plus embeddings and tokenize calls. Every `--every` seconds the server's RSS is sampled. At the end:
RSS over time, requests served, errors by type, and the slots busy once the clients stop (must be 0).

Usage: python bench/soak.py [--minutes 20] [--clients 8] [-np 4] [-c 4096] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil

WORDS = "the sea a robot bread mountains key moon coffee library winter train music map garden desert storm".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(http: httpx.Client, rng: random.Random, counts: collections.Counter, lock: threading.Lock) -> None:
    kind = rng.choices(["complete", "chat", "stream", "cancel", "bad", "embed", "tokenize"],
                       [4, 3, 4, 2, 1, 1, 1])[0]
    prompt = " ".join(rng.choices(WORDS, k=rng.randint(3, 40)))
    body = {"max_tokens": rng.randint(1, 96), "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randint(0, 99)}
    try:
        if kind == "complete":
            res = http.post("/v1/completions", json={"prompt": prompt, **body})
        elif kind == "chat":
            res = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}], **body})
        elif kind in ("stream", "cancel"):
            n_keep = rng.randint(1, 8) if kind == "cancel" else 10**9
            with http.stream("POST", "/v1/completions", json={"prompt": prompt, "stream": True, **body}) as res:
                for i, _ in enumerate(res.iter_lines()):
                    if i >= n_keep:
                        break
        elif kind == "bad":
            res = http.post("/v1/completions", content=rng.choice([b"{", b'{"prompt": 5}', b'{"prompt": "x", '
                                                                    b'"top_p": 9}', b"[]"]))
        elif kind == "embed":
            res = http.post("/v1/embeddings", json={"input": prompt})
        else:
            res = http.post("/tokenize", json={"content": prompt})
        key = f"{kind} {res.status_code}"
    except httpx.HTTPError as e:
        key = f"{kind} {type(e).__name__}"
    with lock:
        counts[key] += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--every", type=float, default=30, help="seconds between RSS samples")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "llamactx", "serve", "--port", str(port), "-np",
                               str(args.parallel), "-c", str(args.ctx_size), "--max-queue", "16", "--no-webui"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not _up(url):
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit("the server did not start")
            time.sleep(0.2)
        proc = psutil.Process(server.pid)
        counts: collections.Counter = collections.Counter()
        lock = threading.Lock()
        stop = time.monotonic() + args.minutes * 60

        def client(i: int) -> None:
            rng = random.Random(args.seed * 1000 + i)
            with httpx.Client(base_url=url, timeout=120) as http:
                while time.monotonic() < stop:
                    one(http, rng, counts, lock)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        rss = [(0.0, proc.memory_info().rss)]
        while any(t.is_alive() for t in threads):
            time.sleep(0.5)
            if time.monotonic() - t0 - rss[-1][0] >= args.every:
                rss.append((time.monotonic() - t0, proc.memory_info().rss))
        rss.append((time.monotonic() - t0, proc.memory_info().rss))
        time.sleep(1)
        busy = sum(s["is_processing"] for s in httpx.get(url + "/slots", timeout=30).json())
        print(f"{args.minutes} min, {args.clients} clients, -np {args.parallel}, -c {args.ctx_size}")
        print("RSS (MiB) over time: " + ", ".join(f"{t:.0f}s {r / 2**20:.0f}" for t, r in rss))
        print(f"requests: {sum(counts.values())}; by kind and status: {json.dumps(dict(sorted(counts.items())))}")
        print(f"slots busy after the clients stopped: {busy}")
        if busy:
            sys.exit(1)
    finally:
        server.terminate()
        server.wait(timeout=30)


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


if __name__ == "__main__":
    main()

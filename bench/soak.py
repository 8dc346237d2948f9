"""Soak: mixed requests with random cancels against `llamactx serve` for a long time (not part of the suite).

Clients send completions and chats, streamed or not, some cancelled mid-way (the connection is dropped), some
malformed, plus embeddings (one input or a batch), tokenize calls and slot save / restore / erase. Every `--every`
seconds the server's RSS is sampled. At the end: RSS over time (printed, and plotted to `--plot` as a PNG),
requests served, statuses by kind, and the slots busy once the clients stop. It fails (exit 1) on any 5xx, a
transport error, a busy slot left behind, or RSS over the last third more than 100 MB above its first third.
The server binds 127.0.0.1 on a free port; the run ends after `--minutes`.

Usage: python bench/soak.py [--minutes 20] [--clients 8] [-np 4] [-c 4096] [--seed 0] [--plot soak.png]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import httpx
import psutil

WORDS = "the sea a robot bread mountains key moon coffee library winter train music map garden desert storm".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(http: httpx.Client, rng: random.Random, counts: collections.Counter, lock: threading.Lock) -> None:
    kind = rng.choices(["complete", "chat", "stream", "cancel", "bad", "embed", "embed-batch", "tokenize", "slot"],
                       [4, 3, 4, 2, 1, 1, 1, 1, 1])[0]
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
        elif kind == "embed-batch":
            # a batch shares the engine with the generation steps (about half of it with every slot busy), so it
            # gets a longer client timeout than the rest
            res = http.post("/v1/embeddings", json={"input": [prompt] * rng.randint(2, 64)}, timeout=600)
        elif kind == "slot":  # a slot may be busy (409) or the file not saved yet (404): both are answers
            action = rng.choice(["save", "restore", "erase"])
            body = {} if action == "erase" else {"filename": f"soak{rng.randint(0, 3)}.bin"}
            res = http.post(f"/slots/{rng.randint(0, 3)}?action={action}", json=body)
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
    ap.add_argument("--plot", default="soak.png", help="RSS over time as a PNG")
    args = ap.parse_args()
    slot_dir = tempfile.TemporaryDirectory(prefix="soak-slots-")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "llamactx", "serve", "--port", str(port), "-np",
                               str(args.parallel), "-c", str(args.ctx_size), "--max-queue", "16", "--no-webui",
                               "--slot-save-path", slot_dir.name],
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
        third = max(1, len(rss) // 3)
        first, last = [r for _, r in rss[:third]], [r for _, r in rss[-third:]]
        drift = (sum(last) / len(last) - sum(first) / len(first)) / 2**20
        print(f"RSS drift (mean of the last third - mean of the first third): {drift:+.0f} MiB")
        write_plot(args.plot, rss)
        print(f"plot: {args.plot}")
        failures = [k for k in counts if k.split()[1][0] == "5" or not k.split()[1].isdigit()]
        if busy or failures or drift > 100:
            sys.exit(f"FAIL: busy slots {busy}, 5xx or transport errors {failures}, RSS drift {drift:+.0f} MiB")
        print("pass: no 5xx, no busy slot, flat RSS")
    finally:
        server.terminate()
        server.wait(timeout=30)
        slot_dir.cleanup()


def write_plot(path: str, points: list[tuple[float, int]], w: int = 640, h: int = 320) -> None:
    """RSS (MiB, y from 0 to 1.2x the largest) over seconds as a line on white, with a grid line every 100 MiB: a
    PNG written with zlib alone."""
    img = [[255] * w for _ in range(h)]
    top = max(r for _, r in points) / 2**20 * 1.2
    t_max = max(points[-1][0], 1.0)
    for mib in range(100, int(top), 100):
        y = h - 1 - int(mib / top * (h - 1))
        img[y] = [200] * w
    xy = [(int(t / t_max * (w - 1)), h - 1 - int(r / 2**20 / top * (h - 1))) for t, r in points]
    for (x0, y0), (x1, y1) in zip(xy, xy[1:], strict=False):
        for i in range(max(abs(x1 - x0), abs(y1 - y0), 1) + 1):
            x = x0 + (x1 - x0) * i // max(abs(x1 - x0), abs(y1 - y0), 1)
            y = y0 + (y1 - y0) * i // max(abs(x1 - x0), abs(y1 - y0), 1)
            for dy in (0, 1):
                img[min(h - 1, y + dy)][x] = 0
    raw = b"".join(b"\0" + bytes(row) for row in img)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


if __name__ == "__main__":
    main()

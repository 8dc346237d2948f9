"""Speculative decoding through a server: `llamactx serve` and llama-server (0c1e570, native build), each with and
without `--spec-type`, C concurrent clients on spec_bench.py's tasks (a: copy a given code text, the same for
every client; b: free generation at temperature 1, a seed per client). Reports per server, setting and
client count the aggregate generated tokens/s (every request's tokens over the wall time of the round, prompts
cached by a warm-up round) and the drafted / accepted tokens from the responses' timings.

Both servers get the same flags (llamactx serve takes llama-server's), bind 127.0.0.1 on a free port and are
stopped after their rounds. Run with nothing else on the machine: a 2-vCPU box shared with anything is noise.

Usage: python bench/spec_serve.py [--server llamactx,llama-server] [-c 1,8] [--task a] [-n 256] [-t 2] [--rounds 2]
           [--spec-type ngram-simple] [--llama-server ~/.cache/llamactx-llamacpp/bin/llama-server]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from spec_bench import task_prompt  # noqa: E402

from llamactx.embedded import smollm2_path  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def client_body(task: str, i: int, n: int) -> dict:
    prompt = task_prompt(None, task)
    if task == "a":  # the same text for every client: a variation can turn the copy into free text on one server
        return {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True}
    return {"prompt": prompt, "n_predict": n, "temperature": 1.0, "seed": 1000 + i, "ignore_eos": True}


def one_round(port: int, bodies: list[dict]) -> tuple[float, list[dict]]:
    """Every body posted at once, one thread per client: (wall seconds, the responses' timings)."""
    out: list[dict | None] = [None] * len(bodies)

    def run(i: int) -> None:
        out[i] = post(port, bodies[i])["timings"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    wall = time.perf_counter() - t0
    if any(o is None for o in out):
        raise RuntimeError("a client got no answer")
    return wall, out


def serve(cmd: list[str], clients: list[int], args) -> dict[int, tuple[float, int, int]]:
    """Start one server, run the rounds for each client count: {C: (aggregate t/s, drafted, accepted)}."""
    port = free_port()
    proc = subprocess.Popen([*cmd, "-m", str(smollm2_path()), "-c", str(2048 * max(clients)), "-np",
                             str(max(clients)), "-t", str(args.threads), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"{cmd[0]} did not come up")
        result = {}
        for c in clients:
            bodies = [client_body(args.task, i, args.n_predict) for i in range(c)]
            one_round(port, [{**b, "n_predict": 8} for b in bodies])  # warm-up: prompts into the slots' caches
            best = None
            for _ in range(args.rounds):
                wall, timings = one_round(port, bodies)
                tps = sum(t["predicted_n"] for t in timings) / wall
                row = (tps, sum(t.get("draft_n", 0) for t in timings), sum(t.get("draft_n_accepted", 0)
                                                                            for t in timings))
                best = row if best is None or row[0] > best[0] else best
            result[c] = best
        return result
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default="llamactx,llama-server")
    p.add_argument("-c", "--clients", default="1,8")
    p.add_argument("--task", default="a", choices=["a", "b"])
    p.add_argument("-n", "--n-predict", type=int, default=256)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="measured rounds per setting (the best is reported)")
    p.add_argument("--spec-type", default="ngram-simple")
    p.add_argument("--llama-server", default=str(Path.home() / ".cache/llamactx-llamacpp/bin/llama-server"))
    args = p.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    binaries = {"llamactx": [sys.executable, "-m", "llamactx", "serve"], "llama-server": [args.llama_server]}
    for name in args.server.split(","):
        for flags in ([], ["--spec-type", args.spec_type]):
            for c, (tps, drafted, accepted) in serve(binaries[name] + flags, clients, args).items():
                print(f"{name:12s} {' '.join(flags) or 'no speculation':26s} task {args.task} clients {c:2d}: "
                      f"{tps:7.1f} t/s aggregate, drafted {drafted}, accepted {accepted}", flush=True)


if __name__ == "__main__":
    main()

"""llama-server's own speculative decoding on spec_bench.py's task (a), to report beside ours: one stream, greedy,
the same prompt string through POST /completion, with and without `--spec-type` (llama-server's timings:
predicted_per_second, draft_n, draft_n_accepted). Binds 127.0.0.1 on a free port; each server is stopped after
its runs.

Usage: python bench/spec_llama_server.py [--llama-server ~/.cache/llamactx-llamacpp/bin/llama-server] [-t 2]
           [-n 256] [--runs 3] [--spec-type ngram-simple]
Ours on the same task: python bench/spec_bench.py -t 2 --task a.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
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
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def run_server(binary: str, flags: list[str], args) -> list[dict]:
    port = free_port()
    cmd = [binary, "-m", str(smollm2_path()), "-c", "2048", "-t", str(args.threads), "-np", "1",
           "--host", "127.0.0.1", "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        body = {"prompt": task_prompt(None, "a"), "n_predict": args.n_predict, "temperature": 0,
                "ignore_eos": True, "cache_prompt": False}
        return [post(port, body)["timings"] for _ in range(args.runs + 1)][1:]  # run 0 warms up
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-server", default=str(Path.home() / ".cache/llamactx-llamacpp/bin/llama-server"))
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", "--n-predict", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--spec-type", default="ngram-simple")
    args = p.parse_args()
    for flags in ([], ["--spec-type", args.spec_type]):
        timings = run_server(args.llama_server, flags, args)
        tps = statistics.median(t["predicted_per_second"] for t in timings)
        last = timings[-1]
        print(f"llama-server {' '.join(flags) or '(no speculation)'}: {tps:.2f} t/s (median of {len(timings)}), "
              f"drafted {last.get('draft_n', 0)}, accepted {last.get('draft_n_accepted', 0)}")


if __name__ == "__main__":
    main()

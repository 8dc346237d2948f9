"""Does an embeddings flood stall generation? A 256-token stream alone, then the same stream while one
`--inputs`-input embeddings request runs, against `llamactx serve` (issue 23's check: the largest gap between
tokens at most 3x the median gap). Not part of the suite.

Usage: python bench/embd_fairness.py [--inputs 5000] [-n 256] [-np 4] [-t 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from bench.serve_bench import start  # noqa: E402


def stream_gaps(url: str, n: int) -> list[float]:
    """Seconds between consecutive streamed tokens of one greedy completion (ignore_eos)."""
    body = {"prompt": "Once upon a time", "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    times = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as res:
        for line in res.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"] is not None:
                times.append(time.monotonic())
    return [b - a for a, b in zip(times[1:], times[2:], strict=False)]  # from the 2nd token: no prompt in it


def report(name: str, gaps: list[float]) -> float:
    med, top = statistics.median(gaps), max(gaps)
    print(f"{name:>24}: {len(gaps) + 1} tokens, gap median {med * 1000:.1f} ms, p99 "
          f"{sorted(gaps)[int(0.99 * len(gaps))] * 1000:.1f} ms, max {top * 1000:.1f} ms, max/median {top / med:.2f}")
    return top / med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=5000)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    server, url = start("llamactx", "smollm2", args.parallel, 4096, args.threads, Path())
    try:
        report("stream alone", stream_gaps(url, args.n))
        with cf.ThreadPoolExecutor(1) as pool:
            t0 = time.monotonic()
            flood = pool.submit(httpx.post, url + "/v1/embeddings", json={"input": ["hi"] * args.inputs},
                                timeout=3600)
            time.sleep(1.0)  # the request is read, tokenized and queued
            ratio = report(f"beside {args.inputs} embeddings", stream_gaps(url, args.n))
            during = not flood.done()
            res = flood.result()
            print(f"embeddings: {res.status_code}, {len(res.json()['data'])} vectors in "
                  f"{time.monotonic() - t0:.1f} s; still running when the stream ended: {during}")
        print(f"check (max gap <= 3x median, the whole stream beside the flood): "
              f"{'pass' if ratio <= 3 and during else 'FAIL'}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()

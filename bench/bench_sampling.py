"""Per-sample cost of llama-server's default sampler chain on a SmolLM2-sized vocabulary.

    PYTHONPATH=. .venv/bin/python bench/bench_sampling.py [--n-vocab 49152] [--iters 2000] [--runs 7] [--rows 64]

Builds SamplerChain.default(SamplingParams(), n_vocab) (top-k 40 -> top-p 0.95 -> min-p 0.05 -> temp-ext 0.8
-> dist) and samples `rows` random float32 rows of realistic logits (randn * 3) round-robin; prints the best of
`runs` timings of `iters` samples as microseconds per sample, plus a few other common chains. The machine is
noisy: the best of several runs is the number to compare.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from llamactx.sampling import SamplerChain, SamplingParams

CHAINS = {
    "default": SamplingParams(),
    "greedy (temp 0)": SamplingParams(temperature=0.0),
    "top-k 0 (top-p over all)": SamplingParams(top_k=0),
}


def us_per_sample(chain: SamplerChain, rows: np.ndarray, iters: int, runs: int) -> float:
    """Best over `runs` of the mean time of one `sample_logits` over `iters` samples, in microseconds."""
    for t in range(min(iters, 200)):  # warm up (numba compile / cache load)
        chain.sample_logits(rows[t % rows.shape[0]])
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        for t in range(iters):
            chain.sample_logits(rows[t % rows.shape[0]])
        best = min(best, (time.perf_counter() - t0) / iters)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-vocab", type=int, default=49152)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--only-default", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((args.rows, args.n_vocab)) * 3).astype(np.float32)  # (rows, n_vocab)
    for name, params in CHAINS.items():
        chain = SamplerChain.default(params, args.n_vocab)
        iters = args.iters if name == "default" else max(args.iters // 10, 20)
        print(f"{name:28s} {us_per_sample(chain, rows, iters, args.runs):8.1f} us/sample")
        if args.only_default:
            break


if __name__ == "__main__":
    main()

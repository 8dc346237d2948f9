"""Batched decode: aggregate generated tokens/s when B sequences decode together, one token each per step.

One decode step over B sequences reads every weight once (the matmuls get B rows), so aggregate throughput should
grow with B while each sequence attends over its own KV cells.

Usage: python bench/bench_batched.py [-m smollm2] [-B 1,2,4,8,16] [-n 64] [-p 32] [-t 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from llamactx import Batch, Context, ContextParams, Model
from llamactx.embedded import resolve_model_path


def aggregate_tps(model: Model, n_seq: int, n_prompt: int, n_gen: int, threads: int) -> float:
    ctx = Context(model, ContextParams(n_ctx=n_seq * (n_prompt + n_gen) + 256, n_batch=2048, n_seq_max=n_seq,
                                       n_threads=threads, n_threads_batch=threads, kv_unified=True))
    rng = np.random.default_rng(0)
    prompt = Batch(n_seq * n_prompt, n_seq_max=1)
    for s in range(n_seq):
        for i, t in enumerate(rng.integers(0, model.hparams.n_vocab, n_prompt)):
            prompt.add(int(t), i, (s,), i == n_prompt - 1)
    ctx.decode(prompt)
    step = Batch(n_seq)
    t0 = time.perf_counter()
    for j in range(n_gen):
        step.clear()
        for s in range(n_seq):
            step.add(int(rng.integers(0, model.hparams.n_vocab)), n_prompt + j, (s,), True)
        if ctx.decode(step) != 0:
            raise RuntimeError("decode failed")
    return n_seq * n_gen / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-B", "--batches", default="1,2,4,8,16")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-p", "--n-prompt", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    model = Model.load(resolve_model_path(args.model))
    aggregate_tps(model, 1, 8, 4, args.threads)  # warm up / compile
    print(f"{model.desc}, {args.threads} threads, prompt {args.n_prompt}, {args.n_gen} steps")
    print("| B | aggregate t/s | per sequence t/s | vs B=1 |\n| ---: | ---: | ---: | ---: |")
    base = None
    for b in (int(x) for x in args.batches.split(",")):
        tps = aggregate_tps(model, b, args.n_prompt, args.n_gen, args.threads)
        base = base or tps
        print(f"| {b} | {tps:.1f} | {tps / b:.1f} | {tps / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()

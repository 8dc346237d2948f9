"""`llamactx bench`: llama-bench's two tests (tools/llama-bench): pp = prompt processing, tg = text generation.

pp<N>: N random tokens decoded in n_batch chunks into an empty cache; tg<N>: N single-token decodes from an empty
cache. Each test runs once to warm up, then `-r` times; t/s is reported as mean +/- standard deviation.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from llamactx.batch import Batch
from llamactx.context import Context
from llamactx.cparams import ContextParams


def _pp(ctx: Context, tokens: np.ndarray, n_batch: int) -> None:
    for start in range(0, len(tokens), n_batch):
        part = tokens[start : start + n_batch]
        batch = Batch(len(part))
        for i, t in enumerate(part):
            batch.add(int(t), start + i, (0,), i == len(part) - 1)
        if ctx.decode(batch) != 0:
            raise RuntimeError("bench: decode failed (context too small?)")


def _tg(ctx: Context, tokens: np.ndarray) -> None:
    for t in tokens:
        if ctx.decode(Batch.get_one([int(t)])) != 0:
            raise RuntimeError("bench: decode failed (context too small?)")


def run_test(ctx: Context, n_prompt: int, n_gen: int, reps: int, seed: int = 0) -> list[float]:
    """Seconds of each repetition of one test (pp when n_prompt > 0, else tg), after one warm-up run."""
    rng = np.random.default_rng(seed)
    n_vocab = ctx.model.hparams.n_vocab
    samples = []
    for rep in range(reps + 1):
        ctx.memory.clear(data=False)
        tokens = rng.integers(0, n_vocab, n_prompt or n_gen)
        t0 = time.perf_counter()
        if n_prompt:
            _pp(ctx, tokens, ctx.params.n_batch)
        else:
            _tg(ctx, tokens)
        if rep:
            samples.append(time.perf_counter() - t0)
    return samples


def run_bench(model, args) -> int:
    n_ctx = max(args.n_prompt, args.n_gen, 256)
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                                       n_threads=args.threads, n_threads_batch=args.threads_batch or args.threads,
                                       type_k=args.cache_type_k, type_v=args.cache_type_v,
                                       swa_full=args.swa_full))
    rows = []
    for n_prompt, n_gen in ((args.n_prompt, 0), (0, args.n_gen)):
        if not (n_prompt or n_gen):
            continue
        secs = run_test(ctx, n_prompt, n_gen, args.repetitions)
        ts = [(n_prompt or n_gen) / s for s in secs]
        rows.append(_row(model, ctx, args, n_prompt, n_gen, secs, ts))
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows)
    return 0


def _row(model, ctx, args, n_prompt, n_gen, secs, ts) -> dict:
    return {
        "model_filename": str(model.path), "model_type": model.desc, "model_size": model.size,
        "model_n_params": model.n_params, "backend": "CPU", "n_batch": ctx.params.n_batch,
        "n_ubatch": ctx.params.n_ubatch, "n_threads": args.threads, "type_k": ctx.params.type_k,
        "type_v": ctx.params.type_v, "n_prompt": n_prompt, "n_gen": n_gen,
        "avg_ns": int(statistics.mean(secs) * 1e9), "stddev_ns": int(_std(secs) * 1e9),
        "avg_ts": statistics.mean(ts), "stddev_ts": _std(ts),
        "samples_ns": [int(s * 1e9) for s in secs], "samples_ts": ts,
    }


def _std(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def _print_table(rows: list[dict]) -> None:
    head = ["model", "size", "params", "backend", "threads", "test", "t/s"]
    lines = []
    for r in rows:
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        lines.append([r["model_type"], f"{r['model_size'] / 2**20:.2f} MiB", f"{r['model_n_params'] / 1e6:.2f} M",
                      r["backend"], str(r["n_threads"]), test, f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    fmt = "| " + " | ".join(f"{{:{'>' if i >= 4 else '<'}{w}}}" for i, w in enumerate(widths)) + " |"
    print(fmt.format(*head))
    print("| " + " | ".join("-" * (w - 1) + (":" if i >= 4 else "-") for i, w in enumerate(widths)) + " |")
    for line in lines:
        print(fmt.format(*line))
    sys.stdout.flush()

"""Batched decode: aggregate generated tokens/s when B sequences decode together, one token each per step, and a
server step that mixes them with a prompt chunk.

One decode step over B sequences reads every weight once (the matmuls get B rows), so aggregate throughput should
grow with B while each sequence attends over its own KV cells. The mixed row is what a server runs all day: one
ubatch of 8 sequences' next tokens plus a 64-token chunk of a ninth sequence's prompt; it should cost about what
its 72-row matmuls cost, less than the decode step and the chunk run one after the other (the last column).

Usage: python bench/bench_batched.py [-m smollm2] [-B 1,2,4,8,16] [-n 64] [-p 32] [-t 2] [--mixed 8,64] [--fa on|off]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from llamactx import Batch, Context, ContextParams, Model
from llamactx.embedded import resolve_model_path

FLASH = "auto"  # --fa


def _context(model: Model, n_seq: int, n_ctx: int, threads: int) -> Context:
    return Context(model, ContextParams(n_ctx=n_ctx, n_batch=2048, n_seq_max=n_seq, n_threads=threads,
                                        n_threads_batch=threads, kv_unified=True, flash_attn=FLASH))


def _prompts(ctx: Context, n_seq: int, n_prompt: int, rng) -> None:
    """n_prompt random tokens for each of sequences 0..n_seq-1, one batch."""
    prompt = Batch(n_seq * n_prompt, n_seq_max=1)
    for s in range(n_seq):
        for i, t in enumerate(rng.integers(0, ctx.model.hparams.n_vocab, n_prompt)):
            prompt.add(int(t), i, (s,), i == n_prompt - 1)
    if ctx.decode(prompt) != 0:
        raise RuntimeError("prompt decode failed")


def _step(ctx: Context, batch: Batch, n_seq: int, pos: int, rng, chunk: np.ndarray | None = None,
          chunk_pos: int = 0) -> float:
    """One decode of a token for each of sequences 0..n_seq-1 at `pos`, plus `chunk` of sequence n_seq from
    `chunk_pos` (only its last token an output). -> seconds"""
    batch.clear()
    for s in range(n_seq):
        batch.add(int(rng.integers(0, ctx.model.hparams.n_vocab)), pos, (s,), True)
    if chunk is not None:
        for i, t in enumerate(chunk):
            batch.add(int(t), chunk_pos + i, (n_seq,), i == len(chunk) - 1)
    t0 = time.perf_counter()
    if ctx.decode(batch) != 0:
        raise RuntimeError("decode failed")
    return time.perf_counter() - t0


def aggregate_tps(model: Model, n_seq: int, n_prompt: int, n_gen: int, threads: int) -> float:
    ctx = _context(model, n_seq, n_seq * (n_prompt + n_gen) + 256, threads)
    rng = np.random.default_rng(0)
    _prompts(ctx, n_seq, n_prompt, rng)
    step = Batch(n_seq)
    seconds = sum(_step(ctx, step, n_seq, n_prompt + j, rng) for j in range(n_gen))
    return n_seq * n_gen / seconds


def mixed_step_ms(model: Model, n_seq: int, n_chunk: int, n_prompt: int, n_steps: int, threads: int):
    """Milliseconds per step of (n_seq single tokens + an n_chunk-token chunk of another sequence) in one ubatch,
    and of the same work as two decodes (the n_seq tokens, then the chunk): medians over n_steps."""
    n_ctx = (n_seq + 1) * (n_prompt + 2 * n_steps * n_chunk) + 256
    ctx = _context(model, n_seq + 1, n_ctx, threads)
    rng = np.random.default_rng(0)
    _prompts(ctx, n_seq, n_prompt, rng)
    chunks = rng.integers(0, model.hparams.n_vocab, (2 * n_steps + 1, n_chunk))
    mixed, split = [], []
    one, alone = Batch(n_seq + n_chunk), Batch(n_chunk)
    _step(ctx, one, n_seq, n_prompt, rng, chunks[0], 0)  # warm up: plans for these shapes
    _step(ctx, one, n_seq, n_prompt + 1, rng)
    pos, cpos = n_prompt + 2, n_chunk
    for j in range(n_steps):
        mixed.append(_step(ctx, one, n_seq, pos, rng, chunks[1 + 2 * j], cpos))
        pos, cpos = pos + 1, cpos + n_chunk
        t = _step(ctx, one, n_seq, pos, rng)
        alone.clear()
        for i, tok in enumerate(chunks[2 + 2 * j]):
            alone.add(int(tok), cpos + i, (n_seq,), i == n_chunk - 1)
        t0 = time.perf_counter()
        if ctx.decode(alone) != 0:
            raise RuntimeError("decode failed")
        split.append(t + time.perf_counter() - t0)
        pos, cpos = pos + 1, cpos + n_chunk
    return float(np.median(mixed)) * 1e3, float(np.median(split)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-B", "--batches", default="1,2,4,8,16")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-p", "--n-prompt", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--mixed", default="8,64", help="sequences, chunk tokens of the mixed row ('' for none)")
    ap.add_argument("--fa", choices=("on", "off", "auto"), default="auto", help="flash attention (default auto: on)")
    args = ap.parse_args()
    global FLASH
    FLASH = {"on": "enabled", "off": "disabled", "auto": "auto"}[args.fa]
    model = Model.load(resolve_model_path(args.model))
    aggregate_tps(model, 1, 8, 4, args.threads)  # warm up / compile
    print(f"{model.desc}, {args.threads} threads, prompt {args.n_prompt}, {args.n_gen} steps")
    print("| B | aggregate t/s | per sequence t/s | vs B=1 |\n| ---: | ---: | ---: | ---: |")
    base = None
    for b in (int(x) for x in args.batches.split(",")):
        tps = aggregate_tps(model, b, args.n_prompt, args.n_gen, args.threads)
        base = base or tps
        print(f"| {b} | {tps:.1f} | {tps / b:.1f} | {tps / base:.2f}x |", flush=True)
    if args.mixed:
        n_seq, n_chunk = (int(x) for x in args.mixed.split(","))
        ms, split = mixed_step_ms(model, n_seq, n_chunk, args.n_prompt, 8, args.threads)
        print(f"\nmixed ubatch, {n_seq} tokens + a {n_chunk}-token chunk: {ms:.1f} ms per step "
              f"({(n_seq + n_chunk) / ms * 1e3:.0f} t/s); as two decodes: {split:.1f} ms ({ms / split:.2f}x)")


if __name__ == "__main__":
    main()

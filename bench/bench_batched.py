"""Batched decode: aggregate generated tokens/s when B sequences decode together, one token each per step, and a
server step that mixes them with a prompt chunk.

One decode step over B sequences reads every weight once (the matmuls get B rows), so aggregate throughput should
grow with B while each sequence attends over its own KV cells. The mixed row is what a server runs all day: one
ubatch of 8 sequences' next tokens plus a 64-token chunk of a ninth sequence's prompt; it should cost about what
its 72-row matmuls cost, less than the decode step and the chunk run one after the other (the last column).

With `--llamacpp`, each row first runs llama.cpp's native `llama-batched-bench` on the same model, sequences,
prompt and steps (its S_TG column: the generation phase's aggregate tokens/s), then ours, and adds a ratio.
../shared/tools/build_llamacpp.sh builds llama-bench, llama-server and llama-perplexity; build this one from the same
tree with `cmake --build $LLAMACPP/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/build --target llama-batched-bench`
and copy build/bin/llama-batched-bench and build/bin/libllama-batched-bench-impl.so into $LLAMACPP/bin.

Usage: python bench/bench_batched.py [-m smollm2] [-B 1,2,4,8,16] [-n 64] [-p 32] [-t 2] [--mixed 8,64] [--fa on|off]
           [--llamacpp [DIR] (default $LLAMACPP or ~/.cache/llamactx-llamacpp)]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

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
    ctx = _context(model, n_seq, n_seq * (n_prompt + n_gen + 1) + 256, threads)
    rng = np.random.default_rng(0)
    _prompts(ctx, n_seq, n_prompt, rng)
    step = Batch(n_seq)
    _step(ctx, step, n_seq, n_prompt, rng)  # warm-up, untimed (as llama-bench's): the plan for this shape
    seconds = sum(_step(ctx, step, n_seq, n_prompt + 1 + j, rng) for j in range(n_gen))
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


def llama_batched_tps(binary: Path, model_path: str, n_seq: int, n_prompt: int, n_gen: int, threads: int,
                      fa: str) -> float:
    """llama-batched-bench's aggregate generation tokens/s (speed_tg) for n_seq sequences of n_prompt + n_gen."""
    out = subprocess.run([str(binary), "-m", model_path, "-c", str(n_seq * (n_prompt + n_gen) + 256),
                          "-npp", str(n_prompt), "-ntg", str(n_gen), "-npl", str(n_seq), "-t", str(threads),
                          "-fa", fa, "--output-format", "jsonl"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "LD_LIBRARY_PATH": str(binary.parent)})
    rows = [json.loads(line) for line in out.stdout.splitlines() + out.stderr.splitlines() if line.startswith("{")]
    return float(rows[-1]["speed_tg"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-B", "--batches", default="1,2,4,8,16")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-p", "--n-prompt", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--mixed", default="8,64", help="sequences, chunk tokens of the mixed row ('' for none)")
    ap.add_argument("--fa", choices=("on", "off", "auto"), default="auto", help="flash attention (default auto: on)")
    llamacpp = os.environ.get("LLAMACPP", str(Path.home() / ".cache/llamactx-llamacpp"))
    ap.add_argument("--llamacpp", nargs="?", const=llamacpp,
                    help="also run llama.cpp's llama-batched-bench from DIR/bin, alternately")
    args = ap.parse_args()
    binary = None
    if args.llamacpp:
        binary = Path(args.llamacpp) / "bin" / "llama-batched-bench"
        if not binary.exists():
            ap.error(f"{binary} not found: build it as the module docstring says")
    global FLASH
    FLASH = {"on": "enabled", "off": "disabled", "auto": "auto"}[args.fa]
    model = Model.load(resolve_model_path(args.model))
    aggregate_tps(model, 1, 8, 4, args.threads)  # warm up / compile
    print(f"{model.desc}, {args.threads} threads, prompt {args.n_prompt}, {args.n_gen} steps")
    extra = " llama.cpp t/s | its vs B=1 | ours / llama.cpp |" if binary else ""
    print(f"| B | aggregate t/s | per sequence t/s | vs B=1 |{extra}\n| ---: | ---: | ---: | ---: |"
          + " ---: | ---: | ---: |" * bool(binary))
    base = ref_base = None
    for b in (int(x) for x in args.batches.split(",")):
        ref = None
        if binary:
            ref = llama_batched_tps(binary, str(model.path), b, args.n_prompt, args.n_gen, args.threads, args.fa)
            ref_base = ref_base or ref
        tps = aggregate_tps(model, b, args.n_prompt, args.n_gen, args.threads)
        base = base or tps
        cells = f" {ref:.1f} | {ref / ref_base:.2f}x | {tps / ref:.2f}x |" if ref else ""
        print(f"| {b} | {tps:.1f} | {tps / b:.1f} | {tps / base:.2f}x |{cells}", flush=True)
    if args.mixed:
        n_seq, n_chunk = (int(x) for x in args.mixed.split(","))
        ms, split = mixed_step_ms(model, n_seq, n_chunk, args.n_prompt, 8, args.threads)
        print(f"\nmixed ubatch, {n_seq} tokens + a {n_chunk}-token chunk: {ms:.1f} ms per step "
              f"({(n_seq + n_chunk) / ms * 1e3:.0f} t/s); as two decodes: {split:.1f} ms ({ms / split:.2f}x)")


if __name__ == "__main__":
    main()

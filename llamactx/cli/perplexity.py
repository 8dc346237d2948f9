"""`llamactx perplexity`: llama-perplexity's method (tools/perplexity/perplexity.cpp `perplexity`).

The text is tokenized with add_special (BOS per the model) and cut into chunks of n_ctx tokens; each chunk is
evaluated from an empty cache, its first token replaced by BOS when the model adds one, and only the second half
is scored (each position predicts the next token). Prints `[i]ppl` after each chunk and
`Final estimate: PPL = X +/- Y`, Y being the standard error of the mean log-likelihood times PPL.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from llamactx.batch import Batch
from llamactx.cli.args import CommandError, read_text
from llamactx.context import Context
from llamactx.cparams import ContextParams


def chunk_nll(ctx: Context, chunk: list[int], n_batch: int) -> np.ndarray:
    """Negative log-likelihoods of the second half of `chunk` (positions n_ctx/2 .. n_ctx-2 predicting the next
    token), computed with the float64 log-softmax of llama-perplexity's `log_softmax`."""
    n_ctx = len(chunk)
    first = n_ctx // 2
    ctx.memory.clear(data=False)
    rows = []
    for start in range(0, n_ctx, n_batch):
        part = chunk[start : start + n_batch]
        batch = Batch(len(part))
        for i, t in enumerate(part):
            batch.add(t, start + i, (0,), start + i >= first)
        if ctx.decode(batch) != 0:
            raise RuntimeError("perplexity: decode failed")
        if start + len(part) > first:
            rows.append(np.array(ctx.get_logits()))
    logits = np.concatenate(rows)[: n_ctx - 1 - first].astype(np.float64)  # (n_scored, n_vocab)
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    targets = np.asarray(chunk[first + 1 :])
    return lse - logits[np.arange(len(targets)), targets]


def perplexity(model, text: str, n_ctx: int, n_batch: int, n_threads: int, n_chunks: int = -1, out=None,
               flash_attn: str = "auto", lora=(), swa_full: bool = False) -> tuple[float, float]:
    """(PPL, its +/- uncertainty) of `text` with chunks of `n_ctx` tokens, printing llama-perplexity's lines to
    `out` (default stdout). `lora`: (LoraAdapter, scale) pairs applied to the context."""
    out = out or sys.stdout

    vocab = model.vocab
    n_ctx = n_ctx or model.hparams.n_ctx_train  # -c 0: the model's training context, as llama.cpp
    if n_ctx < 4:
        raise CommandError(f"perplexity: -c {n_ctx} is too small: a chunk needs at least 4 tokens (half of it is "
                           "scored)")
    tokens = vocab.tokenize(text, add_special=True, parse_special=False)
    if len(tokens) < 2 * n_ctx:  # llama-perplexity refuses the same way
        raise CommandError(f"perplexity: you need at least {2 * n_ctx} tokens to evaluate perplexity with a "
                           f"context of {n_ctx}; the text tokenizes to only {len(tokens)} tokens")
    n_chunk = len(tokens) // n_ctx if n_chunks < 0 else min(n_chunks, len(tokens) // n_ctx)
    if n_chunk < 1:
        raise CommandError(f"perplexity: --chunks {n_chunks} leaves nothing to evaluate")
    n_batch = min(n_batch, n_ctx)
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(512, n_batch),
                                       n_threads=n_threads, n_threads_batch=n_threads, kv_unified=True,
                                       flash_attn=flash_attn, swa_full=swa_full))
    ctx.set_adapters_lora([a for a, _ in lora], [s for _, s in lora])
    print(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}",
          file=out)
    nll_all = []
    for i in range(n_chunk):
        chunk = tokens[i * n_ctx : (i + 1) * n_ctx]
        if vocab.add_bos:
            chunk = [vocab.bos] + chunk[1:]
        nll_all.append(chunk_nll(ctx, chunk, n_batch))
        seen = np.concatenate(nll_all)
        print(f"[{i + 1}]{math.exp(seen.mean()):.4f},", end="", file=out, flush=True)
    nll = np.concatenate(nll_all)
    mean = float(nll.mean())
    ppl = math.exp(mean)
    var = float((nll * nll).mean() - mean * mean)
    err = math.sqrt(var / (len(nll) - 1)) * ppl
    print(f"\nFinal estimate: PPL = {ppl:.4f} +/- {err:.5f}", file=out)
    return ppl, err


def run_perplexity(model, args) -> int:
    from llamactx.lora import load_adapters

    text = read_text(args.file, "text file")
    perplexity(model, text, args.ctx_size, args.batch_size, args.threads, args.chunks, flash_attn=args.flash_attn,
               lora=load_adapters(model, args.lora), swa_full=args.swa_full)
    return 0

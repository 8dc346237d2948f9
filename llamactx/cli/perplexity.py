"""`llamactx perplexity`: llama-perplexity's method (tools/perplexity/perplexity.cpp `perplexity`).

The text is tokenized with add_special (BOS per the model) and cut into chunks of n_ctx tokens; each chunk is
evaluated from an empty cache, its first token replaced by BOS when the model adds one, and only the second half
is scored (each position predicts the next token). Prints `[i]ppl` after each chunk and
`Final estimate: PPL = X +/- Y`, Y being the standard error of the mean log-likelihood times PPL.

`--kl-divergence-base FILE` saves every scored row's log-probs (llamactx.cli.kld's format) while computing the
perplexity; with `--kl-divergence` too, the chunks and tokens are read back from FILE and this model's logits are
compared with them (`kl_divergence`).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from llamactx.batch import Batch
from llamactx.cli import kld
from llamactx.cli.args import CommandError, read_text
from llamactx.context import Context
from llamactx.cparams import ContextParams


def chunk_logits(ctx: Context, chunk: list[int], n_batch: int) -> np.ndarray:
    """Logits (n_ctx - 1 - n_ctx/2, n_vocab) float32 of the scored positions n_ctx/2 .. n_ctx-2 of `chunk`,
    evaluated from an empty cache in batches of n_batch."""
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
    return np.concatenate(rows)[: n_ctx - 1 - first]


def chunk_nll(ctx: Context, chunk: list[int], n_batch: int) -> np.ndarray:
    """Negative log-likelihoods of the second half of `chunk` (positions n_ctx/2 .. n_ctx-2 predicting the next
    token), computed with the float64 log-softmax of llama-perplexity's `log_softmax`."""
    first = len(chunk) // 2
    logits = chunk_logits(ctx, chunk, n_batch).astype(np.float64)  # (n_scored, n_vocab)
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    targets = np.asarray(chunk[first + 1 :])
    return lse - logits[np.arange(len(targets)), targets]


def perplexity(model, text: str, n_ctx: int, n_batch: int, n_threads: int, n_chunks: int = -1, out=None,
               flash_attn: str = "auto", lora=(), swa_full: bool = False, logits_file: str | None = None,
               type_k: str = "f16", type_v: str = "f16") -> tuple[float, float]:
    """(PPL, its +/- uncertainty) of `text` with chunks of `n_ctx` tokens, printing llama-perplexity's lines to
    `out` (default stdout). `lora`: (LoraAdapter, scale) pairs applied to the context. `logits_file`: save the
    scored log-probs there (--kl-divergence-base), the nll then taken from the same float arithmetic."""
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
    ctx = _context(model, n_ctx, n_batch, n_threads, flash_attn, swa_full, lora, type_k, type_v)
    print(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}",
          file=out)
    saved = _open_base(logits_file, n_ctx, vocab.n_tokens, n_chunk, tokens) if logits_file else None
    nll_all = []
    try:
        for i in range(n_chunk):
            chunk = tokens[i * n_ctx : (i + 1) * n_ctx]
            if vocab.add_bos:
                chunk = [vocab.bos] + chunk[1:]
            if saved is None:
                nll_all.append(chunk_nll(ctx, chunk, n_batch))
            else:
                rows, nll = kld.compress_log_probs(chunk_logits(ctx, chunk, n_batch), chunk[n_ctx // 2 + 1 :])
                saved.write(rows.astype("<u2").tobytes())
                nll_all.append(nll)
            seen = np.concatenate(nll_all)
            print(f"[{i + 1}]{math.exp(seen.mean()):.4f},", end="", file=out, flush=True)
    finally:
        if saved is not None:
            saved.close()
    nll = np.concatenate(nll_all)
    mean = float(nll.mean())
    ppl = math.exp(mean)
    var = float((nll * nll).mean() - mean * mean)
    err = math.sqrt(var / (len(nll) - 1)) * ppl
    print(f"\nFinal estimate: PPL = {ppl:.4f} +/- {err:.5f}", file=out)
    return ppl, err


def _context(model, n_ctx, n_batch, n_threads, flash_attn, swa_full, lora, type_k, type_v) -> Context:
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(512, n_batch),
                                       n_threads=n_threads, n_threads_batch=n_threads, kv_unified=True,
                                       flash_attn=flash_attn, swa_full=swa_full, type_k=type_k, type_v=type_v))
    ctx.set_adapters_lora([a for a, _ in lora], [s for _, s in lora])
    return ctx


def _open_base(path: str, n_ctx: int, n_vocab: int, n_chunk: int, tokens: list[int]):
    try:
        f = open(path, "wb")
    except OSError as e:
        raise CommandError(f"perplexity: --kl-divergence-base {path}: cannot write it: {e.strerror}") from None
    print(f"perplexity: saving all logits to {path}", file=sys.stderr)
    kld.write_header(f, n_ctx, n_vocab, n_chunk, tokens)
    return f


def kl_divergence(model, logits_file: str, n_ctx: int, n_batch: int, n_threads: int, out=None,
                  flash_attn: str = "auto", lora=(), swa_full: bool = False, type_k: str = "f16",
                  type_v: str = "f16") -> kld.KLDivergence:
    """llama-perplexity --kl-divergence: evaluate the chunks saved in `logits_file` (a --kl-divergence-base run's
    file) and print, per chunk and at the end, how this model's token distributions differ from the base's."""
    out = out or sys.stdout
    vocab = model.vocab
    base = kld.BaseFile.open(logits_file, vocab.n_tokens)
    try:
        n_ctx = n_ctx or model.hparams.n_ctx_train
        if base.n_ctx > n_ctx:
            raise CommandError(f"perplexity: {logits_file} has been computed with n_ctx {base.n_ctx}, while the "
                               f"current context is {n_ctx}: increase it with -c and retry")
        n_batch = min(n_batch, base.n_ctx)
        ctx = _context(model, n_ctx, n_batch, n_threads, flash_attn, swa_full, lora, type_k, type_v)
        print(f"kl_divergence: computing over {base.n_chunk} chunks, n_ctx={base.n_ctx}, batch_size={n_batch}",
              file=out)
        first = base.n_ctx // 2
        result = kld.KLDivergence()
        for i in range(base.n_chunk):
            chunk = [int(t) for t in base.tokens[i * base.n_ctx : (i + 1) * base.n_ctx]]
            targets = chunk[first + 1 :]
            if vocab.add_bos:
                chunk = [vocab.bos] + chunk[1:]
            logits = chunk_logits(ctx, chunk, n_batch)
            if i == 0:
                print(f"\n{kld.CHUNK_HEADER}", file=out)
            result.add(logits, base.read_chunk(i), np.asarray(targets))
            print(kld.chunk_line(i + 1, result), file=out, flush=True)
    finally:
        base.close()
    print("", file=out)
    for line in kld.report(result):
        print(line, file=out)
    return result


def add_arguments(p) -> None:
    """perplexity's own flags beyond the context ones (commands.py's subparser)."""
    p.add_argument("--kl-divergence-base", metavar="FILE", default=None,
                   help="save the log-probs of every scored token to FILE (with --kl-divergence: read them)")
    p.add_argument("--kl-divergence", action="store_true",
                   help="compare this model's token distributions with the --kl-divergence-base FILE's")


def run_perplexity(model, args) -> int:
    from llamactx.lora import load_adapters

    base = getattr(args, "kl_divergence_base", None)
    common = dict(flash_attn=args.flash_attn, lora=load_adapters(model, args.lora), swa_full=args.swa_full,
                  type_k=args.cache_type_k, type_v=args.cache_type_v)
    if getattr(args, "kl_divergence", False):
        if not base:
            raise CommandError("perplexity: --kl-divergence needs --kl-divergence-base FILE: the name of a file "
                               "containing the log probabilities of the base model")
        kl_divergence(model, base, args.ctx_size, args.batch_size, args.threads, **common)
        return 0
    if not args.file:
        raise CommandError("perplexity: -f FILE (the text to evaluate) is required")
    text = read_text(args.file, "text file")
    perplexity(model, text, args.ctx_size, args.batch_size, args.threads, args.chunks, logits_file=base, **common)
    return 0

"""Sentence embeddings: pooled (mean by default, or last / cls), L2-normalised final hidden states
(llama-server's /v1/embeddings with embd_normalize 2; llama.cpp's tools/embedding). With pooling "rank" the output
is instead each input's rerank score, unnormalised (LLAMA_POOLING_TYPE_RANK: see Context._pool; llama-server's
/rerank reads it as `embd[0]` in send_rerank).

An `Embedder` owns a context with `embeddings=True` over a shared model; each text is decoded alone from an empty
memory, so its vector does not depend on the others. Its command-line front end is cli/embedding.py
(`llamactx embedding`, llama-embedding).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np

from llamactx.batch import Batch
from llamactx.context import N_CLS_OUT, Context, DecodeStatus
from llamactx.cparams import ContextParams
from llamactx.errors import LlamactxError
from llamactx.model import Model


class EmbeddingError(LlamactxError, ValueError):
    """An input that cannot be embedded (empty, or longer than the context)."""


class Embedder:
    """Embeddings of token lists with one `n_ctx`-token context (created on first use)."""

    def __init__(self, model: Model, n_ctx: int = 2048, lora=(), pooling: str = "mean", **context_params):
        if pooling not in ("mean", "last", "cls", "rank"):
            raise EmbeddingError(f"pooling {pooling!r} is not one of mean, last, cls, rank")
        self.model = model
        self.pooling = pooling
        self.lora = tuple(lora)  # (LoraAdapter, scale) pairs applied to the context
        self.n_ctx = n_ctx
        self._params = dict(context_params)
        self._ctx: Context | None = None

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One normalised vector per token list. -> (len(inputs), n_embd) float32; with pooling "rank" one score
        per token list: (len(inputs), 1), not normalised. Raises EmbeddingError for an empty input or one longer
        than n_ctx (naming its index)."""
        steps = self.steps(inputs)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def check(self, inputs: Sequence[Sequence[int]]) -> None:
        """Raise EmbeddingError for an empty input or one longer than n_ctx (naming its index)."""
        for i, tokens in enumerate(inputs):
            if not len(tokens):
                raise EmbeddingError(f"input[{i}] is empty")
            if len(tokens) > self.n_ctx:
                raise EmbeddingError(f"input[{i}] has {len(tokens)} tokens, more than the embedding context's "
                                     f"n_ctx = {self.n_ctx}")

    def steps(self, inputs: Sequence[Sequence[int]]) -> Generator[None, None, np.ndarray]:
        """`embed` one input at a time: yields after each input's decode, returns the (len(inputs), n_embd)
        vectors (the server runs it in slices between generation steps)."""
        self.check(inputs)
        ctx = self._context()
        rank = self.pooling == "rank"
        out = np.zeros((len(inputs), N_CLS_OUT if rank else self.model.hparams.n_embd), np.float32)  # (n, n_out)
        for i, tokens in enumerate(inputs):
            ctx.memory.clear(data=False)
            batch = Batch(len(tokens))
            for p, t in enumerate(tokens):
                batch.add(int(t), p, (0,), True)
            if ctx.decode(batch) != DecodeStatus.OK:
                raise EmbeddingError(f"input[{i}] could not be decoded")
            vec = ctx.get_embeddings_seq(0)  # (n_embd,), or (1,) for rank
            out[i] = vec if rank else vec / max(float(np.linalg.norm(vec)), 1e-12)
            yield
        return out

    def _context(self) -> Context:
        if self._ctx is None:
            params = ContextParams(n_ctx=self.n_ctx, n_batch=self.n_ctx, embeddings=True, pooling_type=self.pooling,
                                   **self._params)
            self._ctx = Context(self.model, params)
            self.n_ctx = self._ctx.params.n_ctx
        if self._ctx.adapters_lora != self.lora:  # the adapters may have changed since (the server's)
            self._ctx.set_adapters_lora([a for a, _ in self.lora], [s for _, s in self.lora])
        return self._ctx

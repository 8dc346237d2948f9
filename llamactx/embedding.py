"""Sentence embeddings: pooled (the model's own pooling type, `<arch>.pooling_type`, else mean; or last / cls),
L2-normalised final hidden states as common_embd_normalize(embd_norm = 2) does it (llama-server's /v1/embeddings;
llama.cpp's tools/embedding). Pooling "none" gives each token's normalised vector (`embed_tokens`). With pooling
"rank" the output is instead each input's rerank score, unnormalised (LLAMA_POOLING_TYPE_RANK: see Context._pool;
llama-server's /rerank reads it as `embd[0]` in send_rerank).

An `Embedder` owns a context with `embeddings=True` over a shared model; each text is decoded alone from an empty
memory, so its vector does not depend on the others. Its command-line front end is cli/embedding.py
(`llamactx embedding`, llama-embedding).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence

import numpy as np

from llamactx.batch import Batch
from llamactx.context import Context, DecodeStatus
from llamactx.cparams import ContextParams
from llamactx.errors import LlamactxError
from llamactx.model import Model


class EmbeddingError(LlamactxError, ValueError):
    """An input that cannot be embedded (empty, or longer than the context)."""


class Embedder:
    """Embeddings of token lists with one `n_ctx`-token context (created on first use)."""

    def __init__(self, model: Model, n_ctx: int = 2048, lora=(), pooling: str | None = None, **context_params):
        """pooling: mean, last, cls, rank or none (token level: `embed_tokens`); None takes the model's
        (`default_pooling`)."""
        pooling = default_pooling(model) if pooling is None else pooling
        if pooling not in ("mean", "last", "cls", "rank", "none"):
            raise EmbeddingError(f"pooling {pooling!r} is not one of none, mean, last, cls, rank")
        self.model = model
        self.pooling = pooling
        self.lora = tuple(lora)  # (LoraAdapter, scale) pairs applied to the context
        if model.is_embedding_only:  # an encoder sees a whole input in one ubatch, within its position embeddings
            n_ctx = min(n_ctx, model.hparams.n_ctx_train)
            context_params.setdefault("n_ubatch", n_ctx)
        self.n_ctx = n_ctx
        self._params = dict(context_params)
        self._ctx: Context | None = None

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One normalised vector per token list. -> (len(inputs), n_embd) float32; with pooling "rank" the scores
        of each token list: (len(inputs), n_cls_out), not normalised. Raises EmbeddingError for an empty input or
        one longer than n_ctx (naming its index)."""
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
        if self.pooling == "none":
            raise EmbeddingError("pooling 'none' gives one vector per token: use embed_tokens")
        self.check(inputs)
        rank = self.pooling == "rank"
        hp = self.model.hparams
        out = np.zeros((len(inputs), hp.n_cls_out if rank else hp.n_embd), np.float32)  # (n, n_out)
        for i, tokens in enumerate(inputs):
            ctx = self._decode(tokens, i)
            vec = ctx.get_embeddings_seq(0)  # (n_embd,), or (n_cls_out,) for rank
            out[i] = vec if rank else embd_normalize(vec)
            yield
        return out

    def embed_tokens(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Pooling "none": each input's per-token vectors, normalised. -> [(len(input), n_embd) float32]"""
        self.check(inputs)
        out = []
        for i, tokens in enumerate(inputs):
            embd = self._decode(tokens, i).get_embeddings()  # (n_tokens, n_embd)
            out.append(np.stack([embd_normalize(row) for row in embd]))
        return out

    def _decode(self, tokens: Sequence[int], i: int) -> Context:
        """One input, alone from an empty memory (an encoder keeps none), every token an output."""
        ctx = self._context()
        if ctx.memory is not None:
            ctx.memory.clear(data=False)
        batch = Batch(len(tokens))
        for p, t in enumerate(tokens):
            batch.add(int(t), p, (0,), True)
        if ctx.decode(batch) != DecodeStatus.OK:
            raise EmbeddingError(f"input[{i}] could not be decoded")
        return ctx

    def _context(self) -> Context:
        if self._ctx is None:
            params = ContextParams(n_ctx=self.n_ctx, n_batch=self.n_ctx, embeddings=True, pooling_type=self.pooling,
                                   **self._params)
            self._ctx = Context(self.model, params)
            if not self.model.is_embedding_only:  # an encoder stays within its position embeddings
                self.n_ctx = self._ctx.params.n_ctx
        if self._ctx.adapters_lora != self.lora:  # the adapters may have changed since (the server's)
            self._ctx.set_adapters_lora([a for a, _ in self.lora], [s for _, s in self.lora])
        return self._ctx


def default_pooling(model: Model) -> str:
    """The pooling an embedding takes when none is asked for: the model's `<arch>.pooling_type` (llama.cpp's
    LLAMA_POOLING_TYPE_UNSPECIFIED), mean for a model that has none (a decoder)."""
    pooling = model.hparams.pooling_type
    return "mean" if pooling == "none" else pooling


def embd_normalize(vec: np.ndarray) -> np.ndarray:
    """common_embd_normalize(embd_norm = 2): the float squares summed in order in double, norm = (float)(1 /
    sqrt(sum)), each value times it in float (0 for a zero vector). (n,) float32 -> (n,) float32"""
    v = np.asarray(vec, np.float32)
    total = float(np.cumsum((v * v).astype(np.float64))[-1]) if v.size else 0.0  # in order, as the C loop
    norm = np.float32(1.0 / math.sqrt(total)) if total > 0.0 else np.float32(0.0)
    return v * norm

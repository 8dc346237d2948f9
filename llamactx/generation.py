"""The decode loop for one sequence of one context: prompt in n_batch chunks, then one sampled token per step
(llama.cpp's tools/main loop and llama-server's slot loop, for one `Sequence`).

`generate` yields a `Chunk` per sampled token with the text that became printable, and leaves the summary in
`Generation.result`. Text is streamed by bytes: a chunk never holds part of a UTF-8 character, and text that could
be the start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq

from llamactx.batch import Batch
from llamactx.context import Context, DecodeStatus
from llamactx.engine.sequence import Chunk, Completion, Limits, Sequence, SequenceStatus, Timings
from llamactx.errors import LlamactxError
from llamactx.sampling import SamplerChain

__all__ = ["Chunk", "Completion", "Generation", "GenerationError", "Timings"]


class GenerationError(LlamactxError, RuntimeError):
    """Generation could not go on (a decode failed, or the grammar reached a dead end)."""


class Generation:
    """One sequence of a context, continued token by token. `tokens` lists what the context sequence holds in
    memory (reused when a new prompt starts with them, as llama-server's cache_prompt)."""

    def __init__(self, ctx: Context, seq_id: int = 0):
        self.ctx = ctx
        self.seq_id = seq_id
        self.tokens: list[int] = []  # what the sequence holds in memory
        self.result: Completion | None = None

    def reset(self) -> None:
        self.ctx.memory.seq_rm(self.seq_id)
        self.tokens = []

    def prefill(self, seq: Sequence) -> None:
        """Make the context sequence hold exactly `seq`'s prompt, decoding only what is not cached. The last
        prompt token is always decoded so that its logits exist."""
        prompt = seq.tokens
        if len(prompt) > self.ctx.params.n_ctx_seq:
            raise ValueError(f"prompt has {len(prompt)} tokens, more than the context's n_ctx_seq = "
                             f"{self.ctx.params.n_ctx_seq}")
        n_keep = 0
        while n_keep < min(len(prompt) - 1, len(self.tokens)) and prompt[n_keep] == self.tokens[n_keep]:
            n_keep += 1
        self.ctx.memory.seq_rm(self.seq_id, n_keep, -1)
        self.tokens = self.tokens[:n_keep]
        seq.n_past = seq.n_cached = n_keep
        while seq.pending:
            self._decode(seq, self.ctx.params.n_batch)

    def _decode(self, seq: Sequence, n_max: int) -> None:
        tokens = seq.pending[:n_max]
        batch = Batch(len(tokens))
        for i, t in enumerate(tokens):
            batch.add(t, seq.n_past + i, (self.seq_id,), i == len(tokens) - 1)
        rc = self.ctx.decode(batch)
        if rc != DecodeStatus.OK:
            raise GenerationError(f"decode failed with code {int(rc)} at position {seq.n_past}"
                                  + (" (no free KV cells)" if rc == DecodeStatus.NO_SLOT else " (aborted)"))
        seq.n_past += len(tokens)
        self.tokens = seq.tokens[: seq.n_past]

    def generate(self, prompt: Seq[int], sampler: SamplerChain, max_tokens: int = -1, stop: Seq[str] = (),
                 context_shift: bool = False, n_keep: int = 0) -> Iterator[Chunk]:
        """Decode `prompt` (reusing the cached prefix), then sample until an EOG token, a stop string,
        `max_tokens` (-1 = no limit) or a full context (`finish_reason` "length", or with `context_shift`, drop
        half of the tokens after the first `n_keep` and go on, as llama.cpp's context shift)."""
        seq = Sequence(prompt, sampler, Limits(max_tokens, tuple(stop), context_shift=context_shift, n_keep=n_keep))
        seq.seq_id, seq.status = self.seq_id, SequenceStatus.RUNNING
        t0 = time.perf_counter()
        self.prefill(seq)
        seq.timings.cached_n = seq.n_cached
        seq.timings.prompt_n = seq.n_prompt - seq.n_cached
        seq.timings.prompt_ms = (time.perf_counter() - t0) * 1000
        t1 = time.perf_counter()
        try:
            if max_tokens == 0:
                yield from seq.finish("length")
            while not seq.is_finished:
                yield from seq.append(self._sample(sampler), self.ctx.model.vocab)
                if seq.is_finished:
                    break
                if seq.n_past >= self.ctx.params.n_ctx_seq:
                    if not context_shift:
                        yield from seq.finish("length")
                        break
                    self._shift(seq)
                self._decode(seq, 1)
        finally:
            seq.finish("abort")  # no-op unless the caller closed the stream early
            seq.timings.predicted_n = seq.n_output
            seq.timings.predicted_ms = (time.perf_counter() - t1) * 1000
            self.result = seq.result()

    def _sample(self, sampler: SamplerChain) -> int:
        try:
            return sampler.sample(self.ctx, -1)
        except Exception as e:  # a grammar dead end or an empty candidate set ends this generation only
            raise GenerationError(f"sampling failed: {e}") from e

    def _shift(self, seq: Sequence) -> None:
        """llama.cpp's context shift: keep the first n_keep tokens, discard half of the rest."""
        n_past = seq.n_past
        n_keep, n_discard = seq.shift(seq.limits.n_keep)
        mem = self.ctx.memory
        mem.seq_rm(self.seq_id, n_keep, n_keep + n_discard)
        mem.seq_add(self.seq_id, n_keep + n_discard, n_past, -n_discard)
        self.tokens = seq.tokens[: seq.n_past]

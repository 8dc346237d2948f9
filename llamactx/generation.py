"""The decode loop: prompt in n_batch chunks, then one sampled token per step (llama.cpp's tools/main loop and
llama-server's slot loop, for one sequence of one context).

`generate` yields a `Chunk` per sampled token with the text that became printable, and leaves the summary in
`Generation.result`. Text is streamed by bytes: a chunk never holds part of a UTF-8 character, and text that could
be the start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from llamactx.batch import Batch
from llamactx.context import DECODE_OK, Context
from llamactx.sampling import SamplerChain


class GenerationError(RuntimeError):
    """Generation could not go on (a decode failed, or the grammar reached a dead end)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    token: int | None  # None for the final flush of held-back text
    text: str  # the text this token completed ("" while a character or a possible stop string is pending)


@dataclass(slots=True)
class Timings:
    """Like llama-server's `timings`: prompt (prefill) and generation."""

    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cached_n: int = 0

    @property
    def prompt_per_second(self) -> float:
        return 1000.0 * self.prompt_n / self.prompt_ms if self.prompt_ms else 0.0

    @property
    def predicted_per_second(self) -> float:
        return 1000.0 * self.predicted_n / self.predicted_ms if self.predicted_ms else 0.0


@dataclass(slots=True)
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (EOG token or stop string) | "length" (max tokens or context full)
    timings: Timings = field(default_factory=Timings)
    stop_word: str | None = None


class TextStream:
    """Bytes in, printable text out: holds back an incomplete UTF-8 sequence and any tail that could begin a stop
    string; reports the first stop string found."""

    def __init__(self, stop: Sequence[str] = ()):
        self.stop = [s for s in stop if s]
        self.pending = b""  # bytes not yet decodable
        self.held = ""  # decoded text not yet emitted (could start a stop string)
        self.text = ""  # everything emitted
        self.stop_word: str | None = None

    def push(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to emit."""
        self.pending += piece
        cut = _complete_utf8_prefix(self.pending)
        self.held += self.pending[:cut].decode("utf-8", "replace")
        self.pending = self.pending[cut:]
        for s in self.stop:
            at = self.held.find(s)
            if at >= 0:
                self.stop_word = s
                return self._emit(self.held[:at], keep="")
        keep = max((_overlap(self.held, s) for s in self.stop), default=0)
        return self._emit(self.held[: len(self.held) - keep], keep=self.held[len(self.held) - keep :])

    def flush(self) -> str:
        """The end of generation: emit what is held (an incomplete character becomes U+FFFD)."""
        if self.stop_word is not None:
            return ""
        tail = self.held + self.pending.decode("utf-8", "replace")
        self.pending = b""
        return self._emit(tail, keep="")

    def _emit(self, out: str, keep: str) -> str:
        self.held = keep
        self.text += out
        return out


def _complete_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 sequence."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit?
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return n if back >= need else n - back
    return n


def _overlap(text: str, stop: str) -> int:
    """Longest suffix of `text` that is a proper prefix of `stop`."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


class Generation:
    """One sequence of a context, continued token by token. `cached` lists the tokens the sequence already holds
    in memory (reused when a new prompt starts with them, as llama-server's cache_prompt)."""

    def __init__(self, ctx: Context, seq_id: int = 0):
        self.ctx = ctx
        self.seq_id = seq_id
        self.tokens: list[int] = []  # what the sequence holds in memory
        self.result: Completion | None = None

    def reset(self) -> None:
        self.ctx.memory.seq_rm(self.seq_id)
        self.tokens = []

    def prefill(self, prompt: Sequence[int]) -> int:
        """Make the sequence hold exactly `prompt`, decoding only what is not cached; returns the number of
        prompt tokens reused. The last prompt token is always decoded so that its logits exist."""
        prompt = list(prompt)
        if not prompt:
            raise ValueError("prompt is empty: at least one token is needed to generate")
        if len(prompt) > self.ctx.params.n_ctx_seq:
            raise ValueError(f"prompt has {len(prompt)} tokens, more than the context's n_ctx_seq = "
                             f"{self.ctx.params.n_ctx_seq}")
        n_keep = 0
        while n_keep < min(len(prompt) - 1, len(self.tokens)) and prompt[n_keep] == self.tokens[n_keep]:
            n_keep += 1
        self.ctx.memory.seq_rm(self.seq_id, n_keep, -1)
        self.tokens = self.tokens[:n_keep]
        n_batch = self.ctx.params.n_batch
        for start in range(n_keep, len(prompt), n_batch):
            part = prompt[start : start + n_batch]
            self._decode(part, start)
        return n_keep

    def _decode(self, tokens: Sequence[int], pos0: int) -> None:
        batch = Batch(len(tokens))
        for i, t in enumerate(tokens):
            batch.add(t, pos0 + i, (self.seq_id,), i == len(tokens) - 1)
        rc = self.ctx.decode(batch)
        if rc != DECODE_OK:
            raise GenerationError(f"decode failed with code {rc} at position {pos0}"
                                  + (" (no free KV cells)" if rc == 1 else " (aborted)"))
        self.tokens.extend(tokens)

    def generate(self, prompt: Sequence[int], sampler: SamplerChain, max_tokens: int = -1,
                 stop: Sequence[str] = (), context_shift: bool = False, n_keep: int = 0) -> Iterator[Chunk]:
        """Decode `prompt` (reusing the cached prefix), then sample until an EOG token, a stop string,
        `max_tokens` (-1 = no limit) or a full context (`finish_reason` "length", or with `context_shift`, drop
        half of the tokens after the first `n_keep` and go on, as llama.cpp's context shift)."""
        vocab = self.ctx.model.vocab
        timings = Timings()
        t0 = time.perf_counter()
        timings.cached_n = self.prefill(prompt)
        timings.prompt_n = len(prompt) - timings.cached_n
        timings.prompt_ms = (time.perf_counter() - t0) * 1000
        stream = TextStream(stop)
        out_tokens: list[int] = []
        finish = "length"
        t1 = time.perf_counter()
        try:
            while max_tokens < 0 or len(out_tokens) < max_tokens:
                token = self._sample(sampler)
                if vocab.is_eog(token):
                    finish = "stop"
                    break
                out_tokens.append(token)
                text = stream.push(vocab.token_to_piece(token))
                if text or stream.stop_word is None:
                    yield Chunk(token, text)
                if stream.stop_word is not None:
                    finish = "stop"
                    break
                if max_tokens >= 0 and len(out_tokens) >= max_tokens:
                    break
                if len(self.tokens) >= self.ctx.params.n_ctx_seq:
                    if not context_shift:
                        break
                    self._shift(n_keep)
                self._decode([token], len(self.tokens))
        finally:
            timings.predicted_n = len(out_tokens)
            timings.predicted_ms = (time.perf_counter() - t1) * 1000
            tail = stream.flush()
            self.result = Completion(stream.text, out_tokens, finish, timings, stream.stop_word)
        if tail:
            yield Chunk(None, tail)

    def _sample(self, sampler: SamplerChain) -> int:
        try:
            return sampler.sample(self.ctx, -1)
        except Exception as e:  # a grammar dead end or an empty candidate set ends this generation only
            raise GenerationError(f"sampling failed: {e}") from e

    def _shift(self, n_keep: int) -> None:
        """llama.cpp's context shift: keep the first n_keep tokens, discard half of the rest."""
        n_past = len(self.tokens)
        n_keep = max(0, min(n_keep, n_past - 2))
        n_discard = (n_past - n_keep) // 2
        mem = self.ctx.memory
        mem.seq_rm(self.seq_id, n_keep, n_keep + n_discard)
        mem.seq_add(self.seq_id, n_keep + n_discard, n_past, -n_discard)
        self.tokens = self.tokens[:n_keep] + self.tokens[n_keep + n_discard :]


"""One request's generation state: what it asked for, what memory holds of it, what it has produced and why it
ended (llama-server's `server_slot` task state, nano-vllm's `Sequence`).

`tokens` are the sequence's positions: its prompt followed by its output (less what a context shift dropped);
`n_past` of them are in the context's memory. What the next decode must feed is `tokens[n_past:]`: the rest of the
prompt while prefilling (in chunks), then the one token sampled last. A scheduler decides which sequences feed
how much; the sequence only keeps count and turns sampled tokens into text (`append`), deciding when it is
finished.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from enum import Enum

from llamactx.engine.text_stream import TextStream
from llamactx.errors import LlamactxError
from llamactx.sampling import SamplerChain

_ids = itertools.count()


class EngineError(LlamactxError, ValueError):
    """A request the engine cannot take: an empty prompt, a prompt longer than a slot's context, a token outside
    the vocab, a slot that does not exist."""


class GenerationError(LlamactxError, RuntimeError):
    """Generation could not go on (the grammar reached a dead end, the sampler selected nothing)."""


class SequenceStatus(Enum):
    WAITING = "waiting"  # queued: no slot yet, or preempted
    RUNNING = "running"  # holds a slot (a seq_id of the context)
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class Limits:
    """When a sequence stops besides an end-of-generation token (llama-server's n_predict, stop, ignore_eos,
    context shift with n_keep and n_discard, t_max_predict_ms)."""

    max_tokens: int = -1  # -1: no limit
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    context_shift: bool = False
    n_keep: int = 0
    n_discard: int = 0  # tokens a context shift drops (0: half of those after n_keep)
    max_predict_ms: float = 0.0  # > 0: past this much generation time, stop at the next newline ("length")


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What a request asks of the engine besides its prompt, sampler and limits (llama-server's `slot_params` and
    the task's `id_slot`), typed and frozen: it travels unchanged from the front end that reads it off a request
    (api/protocol.GenerationRequest, LLM, Llama) through the server's worker and `Engine.add_request` to the
    `Sequence`, whose readers (the scheduler, the engine's sampling step) take it from `seq.options`. A new option
    is a field here and the line that reads it."""

    id_slot: int = -1  # the slot it must run in (-1: any)
    cache_prompt: bool = True  # reuse what memory holds of its prompt
    n_probs: int = -1  # -1: no logprobs; >= 0: the sampled token's logprob and the top n_probs
    # the probabilities after the sampler chain instead (llama-server's post_sampling_probs): Chunk's logprob and
    # top_logprobs then hold probabilities, of the candidates the chain left (none at 0)
    post_sampling_probs: bool = False
    return_progress: bool = False  # report the prompt's progress before and after each prefill step


@dataclass(frozen=True, slots=True)
class Chunk:
    token: int | None  # None for the final flush of held-back text
    text: str  # the text this token completed ("" while a character or a possible stop string is pending)
    logprob: float | None = None  # the token's log-probability under the model (when n_probs >= 0)
    top_logprobs: tuple[tuple[int, float], ...] = ()  # the n_probs most likely tokens and their logprobs
    # a prompt-progress report instead of text (return_progress): (total, cached, processed, ms since admitted)
    progress: tuple[int, int, int, float] | None = None


@dataclass(slots=True)
class Timings:
    """Like llama-server's `timings`: prompt (prefill) and generation."""

    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cached_n: int = 0
    draft_n: int = 0  # draft tokens verified (speculative decoding; llama-server's timings.draft_n)
    draft_n_accepted: int = 0  # of which accepted (timings.draft_n_accepted)

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


class Sequence:
    """A prompt, its sampler chain, limits and options, and the state of its generation."""

    def __init__(self, prompt: Seq[int], sampler: SamplerChain, limits: Limits = Limits(),
                 options: RequestOptions = RequestOptions(), user_starts: Seq[int] = ()):
        prompt = list(prompt)
        if not prompt:
            raise EngineError("prompt is empty: at least one token is needed to generate")
        self.id = next(_ids)
        self.status = SequenceStatus.WAITING
        self.seq_id = -1  # the context sequence (slot) it runs in
        self.tokens: list[int] = prompt  # its positions: prompt + output, less what a context shift dropped
        self.output: list[int] = []  # every generated token
        self.n_prompt = len(prompt)
        self.n_past = 0  # tokens[:n_past] are in memory
        self.n_cached = 0  # prompt tokens found in memory instead of decoded
        self.sampler = sampler
        self.limits = limits
        self.options = options
        # where the prompt's user messages start (llama-server's message spans): prompt chunks end there, so that
        # a context checkpoint holds the conversation up to each message (engine/checkpoints.py)
        self.user_starts: tuple[int, ...] = tuple(sorted(p for p in user_starts if 0 < p < len(prompt)))
        self.stream = TextStream(limits.stop)
        self.finish_reason: str | None = None
        self.error: str | None = None  # why it finished with "error"
        self.error_internal = False  # True: a bug in the engine, not the request's own doing (a grammar dead end)
        self.timings = Timings()
        self.t_queued = time.perf_counter()
        self.t_admitted: float | None = None  # when it got a slot (the scheduler sets it)
        self.t_first_token: float | None = None

    @property
    def n_output(self) -> int:
        return len(self.output)

    @property
    def pending(self) -> list[int]:
        """What the next decodes must feed: the rest of the prompt, or the last sampled token."""
        return self.tokens[self.n_past :]

    @property
    def is_generating(self) -> bool:
        """All but the last sampled token are in memory: the next decode feeds one token."""
        return len(self.tokens) - self.n_past <= 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append(self, token: int, vocab, logprob: float | None = None,
               top_logprobs: tuple[tuple[int, float], ...] = ()) -> list[Chunk]:
        """Take a sampled token: an end-of-generation token (unless ignore_eos) finishes with "stop" and is not
        kept; otherwise the token is kept and its text pushed through the stream, and a stop string or
        max_tokens finishes the sequence. Returns the chunks to emit: the token's text (unless a stop string
        swallowed it) and, when this token finished the sequence, the held-back tail."""
        if self.t_first_token is None:
            self.t_first_token = time.perf_counter()
        if self.limits.max_tokens == 0:  # n_predict 0: the prompt is processed, nothing is generated
            return self.finish("length")
        if vocab.is_eog(token) and not self.limits.ignore_eos:
            return self.finish("stop")
        self.tokens.append(token)
        self.output.append(token)
        text = self.stream.push(vocab.token_to_piece(token))
        chunks = [Chunk(token, text, logprob, top_logprobs)] if text or self.stream.stop_word is None else []
        if self.stream.stop_word is not None:
            chunks += self.finish("stop")
        elif 0 <= self.limits.max_tokens <= self.n_output or self._out_of_time():
            chunks += self.finish("length")
        return chunks

    def _out_of_time(self) -> bool:
        """llama-server's t_max_predict_ms: over the time, the generation stops once its text has a newline."""
        limit = self.limits.max_predict_ms
        return limit > 0 and "\n" in self.stream.text and (time.perf_counter() - self.t_first_token) * 1000 > limit

    def progress(self) -> Chunk:
        """A report of how much of the prompt is in memory (llama-server's prompt_progress)."""
        ms = (time.perf_counter() - self.t_admitted) * 1000 if self.t_admitted is not None else 0.0
        return Chunk(None, "", progress=(self.n_prompt, self.n_cached, min(self.n_past, self.n_prompt), ms))

    def finish(self, reason: str) -> list[Chunk]:
        """End the sequence ("stop" | "length" | "abort" | "error"); returns the held-back text as a last chunk
        (none after a stop string, which is never emitted)."""
        if self.status is SequenceStatus.FINISHED:
            return []
        self.finish_reason = reason
        self.status = SequenceStatus.FINISHED
        self._time()
        tail = self.stream.flush()
        return [Chunk(None, tail)] if tail else []

    def _time(self) -> None:
        """llama-server's timings: prompt = admission to the first sampled token, predicted = the rest."""
        now = time.perf_counter()
        t0 = self.t_admitted if self.t_admitted is not None else now
        t1 = self.t_first_token if self.t_first_token is not None else now
        t = self.timings
        t.cached_n = self.n_cached
        t.prompt_n = self.n_prompt - self.n_cached
        t.prompt_ms = (t1 - t0) * 1000
        t.predicted_n = self.n_output
        t.predicted_ms = (now - t1) * 1000

    def shift(self, n_keep: int, n_discard: int = 0) -> tuple[int, int]:
        """llama.cpp's context shift on the positions: keep the first n_keep tokens, drop n_discard of the rest
        (0: half of them). Returns (start, n_discard) for the memory to do the same (seq_rm + seq_add)."""
        n_keep = max(0, min(n_keep, self.n_past - 2))
        n_left = self.n_past - n_keep
        n_discard = min(n_discard, n_left - 1) if n_discard > 0 else n_left // 2
        del self.tokens[n_keep : n_keep + n_discard]
        self.n_past -= n_discard
        return n_keep, n_discard

    def result(self) -> Completion:
        return Completion(self.stream.text, self.output, self.finish_reason or "length", self.timings,
                          self.stream.stop_word)

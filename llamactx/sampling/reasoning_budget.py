"""A token budget for thinking: after N tokens inside a thinking block the end-of-thinking tag is forced, token by
token (llama.cpp counterpart: common/reasoning-budget.cpp, common_reasoning_budget_init, and its place at the head
of common_sampler_sample; tools/server/server-common.cpp passes --reasoning-budget / reasoning_budget_tokens and
the template's thinking tags).

States, as upstream: IDLE (until a start tag) -> COUNTING (each generated token spends one, an end tag ends the
block) -> WAITING_UTF8 (the budget is spent but the last token ended inside a UTF-8 character) -> FORCING (every
logit but the next forced token's is -inf) -> DONE (passthrough; a new start tag arms it again). The forced tokens
are `reasoning_budget_message` (if any) then the first end tag. The generation prompt's tokens are fed first, so
a template whose assistant turn opens the block starts COUNTING.

`ReasoningBudgetSampler.from_tags(vocab, ...)` builds it from the tags' text; it goes first in a SamplerChain
(`SamplerChain.samplers.insert(0, ...)`): the engine feeds only generated tokens to a chain, as llama.cpp feeds
only generated tokens to its budget sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from llamactx.sampling.token_data import TokenDataArray
from llamactx.vocab import Vocab


class BudgetState(IntEnum):
    IDLE = 0
    COUNTING = 1
    FORCING = 2
    WAITING_UTF8 = 3
    DONE = 4


@dataclass(slots=True)
class TokenMatcher:
    """Which of `seqs` ends at the token just fed (common/reasoning-budget.cpp token_matcher: the longest match,
    then it starts over)."""

    seqs: tuple[tuple[int, ...], ...]
    recent: list[int] = field(default_factory=list)

    def advance(self, token: int) -> int:
        self.recent.append(token)
        longest = max((len(s) for s in self.seqs), default=0)
        del self.recent[:-longest or None]
        best = -1
        for i, seq in enumerate(self.seqs):
            if len(seq) <= len(self.recent) and tuple(self.recent[-len(seq):]) == seq:
                if best < 0 or len(seq) > len(self.seqs[best]):
                    best = i
        if best >= 0:
            self.recent.clear()
        return best

    def reset(self) -> None:
        self.recent.clear()


def _unique(seqs: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    for s in seqs:
        if s and tuple(s) not in out:
            out.append(tuple(s))
    return tuple(out)


def utf8_is_complete(piece: bytes) -> bool:
    """Whether `piece` does not end inside a UTF-8 sequence (common_utf8_is_complete)."""
    if not piece:
        return True
    for back in range(1, min(4, len(piece)) + 1):
        b = piece[-back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII): the sequence it starts needs this many bytes
            return back >= (4 if b >= 0xF0 else 3 if b >= 0xE0 else 2 if b >= 0xC0 else 1)
    return False


class ReasoningBudgetSampler:
    """The budget sampler (common_reasoning_budget_ctx). `vocab` is only read for UTF-8 boundaries."""

    __slots__ = ("vocab", "start", "end", "forced", "budget", "remaining", "state", "force_pos", "end_match")

    def __init__(self, vocab: Vocab | None, start_seqs: Sequence[Sequence[int]], end_seqs: Sequence[Sequence[int]],
                 forced: Sequence[int], budget: int, state: BudgetState = BudgetState.IDLE) -> None:
        if state == BudgetState.COUNTING and budget <= 0:
            state = BudgetState.FORCING
        self.vocab = vocab
        self.start, self.end = TokenMatcher(_unique(start_seqs)), TokenMatcher(_unique(end_seqs))
        self.forced = tuple(int(t) for t in forced)
        self.budget = self.remaining = int(budget)
        self.state = state
        self.force_pos = 0
        self.end_match = -1

    @classmethod
    def from_tags(cls, vocab: Vocab, start_tag: str, end_tags: Sequence[str], budget: int, message: str = "",
                  generation_prompt: str = "") -> ReasoningBudgetSampler:
        """From the template's thinking tags (server-schema.cpp's reasoning_budget_* fields): `budget` < 0 is no
        limit (INT_MAX, as common_sampler_init), the forced tokens are `message` + the first end tag, and the
        generation prompt's tokens are accepted first (common_sampler_init's prefill, without a leading space
        token the tokenizer may add)."""
        def tok(text: str) -> list[int]:
            return vocab.tokenize(text, add_special=False, parse_special=True) if text else []

        ends = [tok(t) for t in end_tags if t]
        forced = tok(message) + (ends[0] if ends else [])
        out = cls(vocab, [tok(start_tag)], ends, forced, budget if budget >= 0 else 2**31 - 1)
        prefill = tok(generation_prompt)
        if prefill and vocab.token_to_piece(prefill[0], special=True)[:1].isspace() \
                and not generation_prompt[:1].isspace():
            prefill = prefill[1:]
        for t in prefill:
            out.accept(t)
        return out

    @property
    def name(self) -> str:
        return "reasoning-budget"

    def accept(self, token: int) -> None:
        token = int(token)
        s = self.state
        if s in (BudgetState.IDLE, BudgetState.DONE):
            if self.start.advance(token) >= 0:
                self.state, self.remaining = BudgetState.COUNTING, self.budget
                self.end.reset()
                self.end_match = -1
                if self.remaining <= 0:
                    self.state, self.force_pos = BudgetState.FORCING, 0
        elif s in (BudgetState.COUNTING, BudgetState.WAITING_UTF8):
            match = self.end.advance(token)
            if match >= 0:
                self.state, self.end_match = BudgetState.DONE, match
                return
            complete = self.vocab is None or utf8_is_complete(self.vocab.token_to_piece(token))
            if s == BudgetState.WAITING_UTF8:
                if complete:
                    self._force()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if complete:
                        self._force()
                    else:
                        self.state = BudgetState.WAITING_UTF8
                        self.end.reset()
        elif s == BudgetState.FORCING:
            match = self.end.advance(token)
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.state, self.end_match = BudgetState.DONE, match

    def _force(self) -> None:
        self.state, self.force_pos = BudgetState.FORCING, 0
        self.end.reset()

    def force(self) -> bool:
        """End the thinking now (common_reasoning_budget_force): only while counting; True if it did."""
        if self.state != BudgetState.COUNTING:
            return False
        self._force()
        return True

    def apply(self, cur: TokenDataArray) -> None:
        if self.state != BudgetState.FORCING or self.force_pos >= len(self.forced):
            return
        cur.logits[cur.ids != self.forced[self.force_pos]] = -np.inf

    def reset(self) -> None:
        self.state, self.remaining, self.force_pos, self.end_match = BudgetState.IDLE, self.budget, 0, -1
        self.start.reset()
        self.end.reset()

    def clone(self) -> ReasoningBudgetSampler:
        out = ReasoningBudgetSampler.__new__(ReasoningBudgetSampler)
        out.vocab, out.forced, out.budget, out.remaining = self.vocab, self.forced, self.budget, self.remaining
        out.start = TokenMatcher(self.start.seqs, list(self.start.recent))
        out.end = TokenMatcher(self.end.seqs, list(self.end.recent))
        out.state, out.force_pos, out.end_match = self.state, self.force_pos, self.end_match
        return out

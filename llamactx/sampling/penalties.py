"""Repetition, frequency and presence penalties (src/llama-sampler.cpp llama_sampler_init_penalties)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from llamactx.sampling.samplers import F32, SamplerBase, f32_param, int_param
from llamactx.sampling.token_data import TokenDataArray, find_tokens


@dataclass(slots=True)
class PenaltiesSampler(SamplerBase):
    """Penalise tokens seen among the last `penalty_last_n` accepted tokens.

    A seen token's logit is divided by `penalty_repeat` (multiplied when <= 0, so the penalty always lowers
    it), then `count * penalty_freq + penalty_present` is subtracted. Off when `penalty_last_n == 0` or all
    three penalties are neutral (1, 0, 0). `penalty_last_n` must already be resolved (-1 = "context size" is
    the caller's to turn into a number, see SamplerChain.default).
    """

    n_vocab: int
    penalty_last_n: int
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    prev: deque[int] = field(init=False, repr=False)
    token_count: dict[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.n_vocab = int_param("n_vocab", self.n_vocab, 1)
        self.penalty_last_n = int_param("penalty_last_n", self.penalty_last_n, 0)
        self.penalty_repeat = f32_param("repeat_penalty", self.penalty_repeat)
        self.penalty_freq = f32_param("frequency_penalty", self.penalty_freq)
        self.penalty_present = f32_param("presence_penalty", self.penalty_present)
        self.prev = deque(maxlen=max(self.penalty_last_n, 1))
        self.token_count = {}

    @property
    def disabled(self) -> bool:
        return self.penalty_last_n == 0 or (
            self.penalty_repeat == 1.0 and self.penalty_freq == 0.0 and self.penalty_present == 0.0
        )

    @property
    def name(self) -> str:
        return "?penalties" if self.disabled else "penalties"

    def accept(self, token: int) -> None:
        if self.penalty_last_n == 0:
            return
        token = int(token)
        self.token_count[token] = self.token_count.get(token, 0) + 1
        if len(self.prev) >= self.penalty_last_n:  # the ring is full: the oldest token leaves the window
            old = self.prev[0]
            self.token_count[old] -= 1
            if self.token_count[old] == 0:
                del self.token_count[old]
        self.prev.append(token)

    def reset(self) -> None:
        self.prev.clear()
        self.token_count.clear()

    def apply(self, cur: TokenDataArray) -> None:
        if self.disabled:
            return
        if self.token_count:
            tokens = np.fromiter(self.token_count.keys(), dtype=np.int64, count=len(self.token_count))
            counts = np.fromiter(self.token_count.values(), dtype=F32, count=len(self.token_count))
            pos, which = find_tokens(cur, tokens)
            logits = cur.logits[pos]  # (m,)
            repeat = F32(self.penalty_repeat)
            logits = np.where(logits <= 0, logits * repeat, logits / repeat)
            logits -= counts[which] * F32(self.penalty_freq) + F32(self.penalty_present)
            cur.logits[pos] = logits
        cur.sorted = False

"""DRY ("Don't Repeat Yourself"), src/llama-sampler.cpp llama_sampler_init_dry (ported there from koboldcpp).

A token that would extend a sequence already seen in the last `penalty_last_n` tokens by more than
`allowed_length` gets `multiplier * base ** (length - allowed_length)` subtracted from its logit. Sequence
breakers (strings such as "\\n" or ":") cut the look-back: a repetition never spans one. Breakers are matched
as token sequences; a breaker string becomes a head token plus tail tokens for every vocabulary token that
contains it or ends with a prefix of it (get_overlapping_token_sequences). That preprocessing walks the whole
vocabulary, so `DryBreakers` is a separate, immutable value that callers may build once per model and breaker
set and share between samplers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numba import njit

from llamactx.ggml import cpu as _target  # noqa: F401  (numba compiles for the checked target)
from llamactx.sampling.samplers import F32, SamplerBase, f32_param, int_param
from llamactx.sampling.token_data import SamplingParamsError, TokenDataArray, find_tokens

MAX_CHAR_LEN = 40  # breaker strings are cut to this many bytes
MAX_SEQ_LEN = 20  # and their tails to this many tokens
FLOAT_MAX_LOG = F32(88.7228391)  # ~log(FLT_MAX): caps the exponent so base ** exp stays finite


class DryVocab(Protocol):
    """What DRY needs from a vocabulary to turn breaker strings into token sequences."""

    def token_to_piece(self, token: int, special: bool = ...) -> bytes | str: ...

    def tokenize(self, text: str, add_special: bool = ..., parse_special: bool = ...) -> Sequence[int]: ...


@dataclass(frozen=True, slots=True)
class DryBreakers:
    """Processed sequence breakers: head token -> the tails (possibly empty) that complete a breaker after
    it."""

    seqs: Mapping[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)

    @classmethod
    def from_token_seqs(cls, breakers: Iterable[Sequence[int]]) -> DryBreakers:
        """Breakers given directly as token sequences (llama_sampler_init_dry_testing); empty ones are
        skipped."""
        seqs: dict[int, list[tuple[int, ...]]] = {}
        for seq in breakers:
            if len(seq) > 0:
                _add(seqs, int(seq[0]), tuple(int(t) for t in seq[1:]))
        return cls({head: tuple(tails) for head, tails in seqs.items()})

    @classmethod
    def from_strings(cls, breakers: Sequence[str], vocab: DryVocab, n_vocab: int) -> DryBreakers:
        """Tokenise breaker strings against `vocab` (llama_sampler_init_dry +
        get_overlapping_token_sequences).

        Each token's text is `vocab.token_to_piece(token, special=True)`; tails are
        `vocab.tokenize(text, add_special=False, parse_special=False)`. Empty breakers are skipped; raises
        ValueError for a breaker that is not a string.
        """
        pieces = [_as_bytes(vocab.token_to_piece(t, special=True)) for t in range(n_vocab)]

        def tokenize(tail: bytes) -> tuple[int, ...]:
            text = tail.decode("utf-8", errors="ignore")
            return tuple(vocab.tokenize(text, add_special=False, parse_special=False))[:MAX_SEQ_LEN]

        seqs: dict[int, list[tuple[int, ...]]] = {}
        for i, breaker in enumerate(breakers):
            if not isinstance(breaker, str):
                raise SamplingParamsError(f"dry_sequence_breakers[{i}]: expected a string, got {breaker!r}")
            if breaker:
                _overlapping_token_sequences(breaker.encode("utf-8")[:MAX_CHAR_LEN], pieces, tokenize, seqs)
        return cls({head: tuple(tails) for head, tails in seqs.items()})

    def __deepcopy__(self, memo: dict) -> DryBreakers:
        return self  # immutable: clones share it


def _as_bytes(piece: bytes | str) -> bytes:
    return piece.encode("utf-8") if isinstance(piece, str) else bytes(piece)


def _add(seqs: dict[int, list[tuple[int, ...]]], head: int, tail: tuple[int, ...]) -> None:
    tails = seqs.setdefault(head, [])
    if tail not in tails:
        tails.append(tail)


def _overlapping_token_sequences(s: bytes, pieces: list[bytes], tokenize, seqs: dict) -> None:
    """Every token containing `s` is a breaker head with an empty tail; a token that ends with a prefix of `s`
    is a head whose tail is the tokenisation of the rest of `s` (get_overlapping_token_sequences).
    """
    first = s[:1]
    for token, word in enumerate(pieces):
        if first not in word:
            continue
        if s in word:
            _add(seqs, token, ())
            continue
        pos = word.find(first)
        while pos != -1:
            overlap = len(word) - pos  # < len(s): the whole of s would have been found above
            if s.startswith(word[pos:]):
                _add(seqs, token, tokenize(s[overlap:]))
            pos = word.find(first, pos + 1)


class TokenRing:
    """The last `capacity` accepted tokens in a numpy ring buffer (common/sampling.cpp ring_buffer).

    The buffer grows up to `capacity` as tokens arrive, so a look-back of "the whole context" costs memory
    only for the tokens actually seen.
    """

    __slots__ = ("capacity", "buf", "pos", "size")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.buf = np.zeros(min(capacity, 256), dtype=np.int32)  # (allocated,)
        self.pos = 0
        self.size = 0

    def push(self, token: int) -> None:
        if self.capacity == 0:
            return
        if self.size == self.buf.shape[0] < self.capacity:
            grown = np.zeros(min(self.capacity, 2 * self.size), dtype=np.int32)
            grown[: self.size] = self.latest_first(self.size)[::-1]  # oldest first
            self.buf, self.pos = grown, self.size
        self.buf[self.pos] = token
        self.pos = (self.pos + 1) % self.buf.shape[0]
        self.size = min(self.size + 1, self.buf.shape[0])

    def clear(self) -> None:
        self.pos = 0
        self.size = 0

    def latest_first(self, n: int) -> np.ndarray:
        """The last `n` tokens, newest first: element i is ring_buffer::rat(i)."""
        idx = (self.pos - 1 - np.arange(n)) % max(self.buf.shape[0], 1)
        return self.buf[idx]  # (n,)


@njit(cache=True)
def _repeat_counts(rev: np.ndarray, rep_limit: int) -> np.ndarray:  # pragma: no cover - compiled
    """Step 2 of llama_sampler_dry_apply: the reverse Z-algorithm. `rev[i]` is the i-th newest token; the
    result at `last - k` is how many of the newest tokens reappear ending k tokens back, capped at `rep_limit`
    (the capped values are reused inside the Z-box exactly as llama.cpp does).
    """
    n_last = rev.shape[0]
    counts = np.zeros(n_last, dtype=np.int32)  # (n_last,)
    last = n_last - 1
    rt = 0
    lt = 0
    for k in range(1, n_last):
        if k > rt:
            n = 0
            while n + k < n_last and rev[n] == rev[n + k]:
                n += 1
            counts[last - k] = min(n, rep_limit)
            if n > 0:
                lt = k
                rt = k + n - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if counts[last - p] < right_part_len:
                counts[last - k] = min(counts[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n_last and rev[i] == rev[i - k]:
                    i += 1
                counts[last - k] = min(i - k, rep_limit)
                lt = k
                rt = i - 1
    return counts


@dataclass(slots=True)
class DrySampler(SamplerBase):
    """DRY repetition penalty (llama_sampler_init_dry). Off when `multiplier == 0`, `base < 1` or the
    look-back is 0.

    `penalty_last_n == -1` looks back over `n_ctx_train` tokens (the older llama.cpp API this follows);
    `seq_breakers` comes from `DryBreakers.from_strings` (or `.from_token_seqs`).
    """

    n_ctx_train: int
    multiplier: float
    base: float
    allowed_length: int
    penalty_last_n: int
    seq_breakers: DryBreakers = field(default_factory=DryBreakers)
    last_tokens: TokenRing = field(init=False, repr=False)
    _heads: np.ndarray = field(init=False, repr=False)  # (h,) int64 breaker head tokens
    # (s,) int64 heads that are whole breakers by themselves: never penalised
    _single_heads: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.n_ctx_train = int_param("n_ctx_train", self.n_ctx_train, 0)
        self.multiplier = f32_param("dry_multiplier", self.multiplier)
        self.base = f32_param("dry_base", self.base)
        self.allowed_length = int_param("dry_allowed_length", self.allowed_length, 0)
        last_n = int_param("dry_penalty_last_n", self.penalty_last_n, -1)
        self.penalty_last_n = self.n_ctx_train if last_n == -1 else last_n
        if not isinstance(self.seq_breakers, DryBreakers):
            raise SamplingParamsError(f"seq_breakers: expected DryBreakers, got {type(self.seq_breakers).__name__}")
        seqs = self.seq_breakers.seqs
        self._heads = np.fromiter(seqs.keys(), dtype=np.int64, count=len(seqs))
        self._single_heads = np.array([h for h, tails in seqs.items() if () in tails], dtype=np.int64)
        self.last_tokens = TokenRing(self.penalty_last_n if self.enabled else 0)

    @property
    def enabled(self) -> bool:
        return self.multiplier != 0.0 and self.base >= 1.0 and self.penalty_last_n != 0

    @property
    def name(self) -> str:
        return "dry" if self.enabled else "?dry"

    def accept(self, token: int) -> None:
        if self.enabled:
            self.last_tokens.push(token)

    def reset(self) -> None:
        self.last_tokens.clear()

    def apply(self, cur: TokenDataArray) -> None:
        if not self.enabled:
            return
        n_last = min(self.last_tokens.size, self.penalty_last_n)
        if n_last <= self.allowed_length:
            return
        rev = self.last_tokens.latest_first(n_last)  # (n_last,) newest first
        rep_limit = self._rep_limit(rev)
        if rep_limit < self.allowed_length:
            return
        counts = _repeat_counts(rev, rep_limit)  # (n_last,)
        tokens, lengths = self._max_repeat_per_token(rev, counts)
        self._penalize(cur, tokens, lengths)
        cur.sorted = False

    def _rep_limit(self, rev: np.ndarray) -> int:
        """Step 1: the newest complete breaker limits how far back a repetition may reach."""
        seqs = self.seq_breakers.seqs
        for i in np.flatnonzero(np.isin(rev, self._heads)).tolist():
            longest = -1
            for tail in seqs[int(rev[i])]:
                n = len(tail)
                if longest < n <= i and all(tail[o] == rev[i - o - 1] for o in range(n)):
                    longest = n
            if longest >= 0:
                return i - longest
        return rev.shape[0]

    def _max_repeat_per_token(self, rev: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step 3: for each token that would continue a long-enough repeat, the longest such repeat."""
        n_last = rev.shape[0]
        idx = np.flatnonzero(counts[: n_last - 1] >= self.allowed_length)
        toks = rev[n_last - 2 - idx].astype(np.int64)  # (r,) the token that followed each repeat
        lens = counts[idx]  # (r,)
        if toks.shape[0] == 0:
            return toks, lens
        order = np.argsort(toks, kind="stable")
        toks, lens = toks[order], lens[order]
        starts = np.flatnonzero(np.r_[True, toks[1:] != toks[:-1]])
        return toks[starts], np.maximum.reduceat(lens, starts)

    def _penalize(self, cur: TokenDataArray, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Step 4: subtract multiplier * base ** (length - allowed_length), except from single-token
        breakers."""
        keep = ~np.isin(tokens, self._single_heads)
        tokens, lengths = tokens[keep], lengths[keep]
        pos, which = find_tokens(cur, tokens)
        if pos.shape[0] == 0:
            return
        exp = lengths[which].astype(np.int64) - self.allowed_length  # (m,)
        if self.base > 1.000001:
            max_exp = int(FLOAT_MAX_LOG / F32(math.log(self.base)))
            if max_exp > 0:
                exp = np.minimum(exp, max_exp)
        penalty = (self.multiplier * np.power(float(self.base), exp.astype(np.float64))).astype(F32)
        cur.logits[pos] -= penalty

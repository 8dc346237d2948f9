"""Batch (`llama_batch`) and its validation + splitting into ubatches (`llama_batch_allocr`, src/llama-batch.cpp).

A `Batch` is what the caller fills; `BatchAllocator.init` checks it against the vocab, the context and the memory,
fills in what the caller left out (positions, sequence ids, output flags) and returns an `AllocatedBatch`, a private
copy that `split_simple` cuts into `UBatch`es of at most `n_ubatch` tokens, in batch order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llamactx.errors import LlamactxError

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class DecodeError(LlamactxError, ValueError):
    """An invalid batch (`llama_decode` returning -1). The message names the token index and the rule broken."""

    code = -1


class Batch:
    """Input tokens (or embeddings, when `embd > 0`) with their positions, sequence ids and output flags.

    `Batch(n_tokens_max, embd=0, n_seq_max=1)` allocates the arrays (`llama_batch_init`); fill them with `add`.
    `Batch.get_one(tokens)` leaves positions, sequence ids and output flags unset (`llama_batch_get_one`): the
    context then continues sequence 0 from its last position and outputs the last token only.
    """

    def __init__(self, n_tokens_max: int, embd: int = 0, n_seq_max: int = 1):
        if n_tokens_max < 1 or embd < 0 or n_seq_max < 1:
            raise DecodeError(f"Batch(n_tokens_max={n_tokens_max}, embd={embd}, n_seq_max={n_seq_max}): "
                             "n_tokens_max and n_seq_max must be >= 1, embd >= 0")
        self.n_tokens = 0
        self.n_tokens_max = n_tokens_max
        self.token: np.ndarray | None = None if embd else np.zeros(n_tokens_max, np.int32)  # (n_tokens_max,)
        self.embd: np.ndarray | None = np.zeros((n_tokens_max, embd), np.float32) if embd else None  # (n, embd)
        self.pos: np.ndarray | None = np.zeros(n_tokens_max, np.int32)  # (n_tokens_max,)
        self.n_seq_id: np.ndarray | None = np.zeros(n_tokens_max, np.int32)  # (n_tokens_max,)
        self.seq_id: np.ndarray | None = np.zeros((n_tokens_max, n_seq_max), np.int32)  # (n_tokens_max, n_seq_max)
        self.logits: np.ndarray | None = np.zeros(n_tokens_max, np.int8)  # (n_tokens_max,) output flags

    @classmethod
    def get_one(cls, tokens: Sequence[int] | np.ndarray) -> Batch:
        """A batch of `tokens` for sequence 0, positions and output flags left to the context."""
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise DecodeError(f"Batch.get_one expects a 1-D sequence of token ids, got shape {arr.shape}")
        batch = cls.__new__(cls)
        batch.n_tokens = batch.n_tokens_max = int(arr.size)
        batch.token = arr.copy()
        batch.embd = batch.pos = batch.n_seq_id = batch.seq_id = batch.logits = None
        return batch

    def add(self, token: int | np.ndarray, pos: int, seq_ids: Sequence[int] = (0,), logits: bool = False) -> None:
        """Append one token (`common_batch_add`); with `embd > 0`, `token` is the embedding row."""
        if self.pos is None or self.seq_id is None or self.n_seq_id is None or self.logits is None:
            raise DecodeError("a batch made by Batch.get_one cannot be extended with add(); use Batch(n)")
        i = self.n_tokens
        if i >= self.n_tokens_max:
            raise DecodeError(f"batch is full: n_tokens_max = {self.n_tokens_max}")
        if not 1 <= len(seq_ids) <= self.seq_id.shape[1]:
            raise DecodeError(f"token {i}: {len(seq_ids)} seq_ids, allowed 1..{self.seq_id.shape[1]} (n_seq_max)")
        for name, value in (("pos", pos), ("token", None if self.embd is not None else token)):
            if value is not None and not _INT32_MIN <= int(value) <= _INT32_MAX:
                raise DecodeError(f"token {i}: {name} {int(value)} does not fit llama_pos / llama_token (int32)")
        if self.embd is not None:
            self.embd[i] = token
        else:
            self.token[i] = int(token)  # type: ignore[index]
        self.pos[i] = pos
        self.n_seq_id[i] = len(seq_ids)
        self.seq_id[i, : len(seq_ids)] = seq_ids
        self.logits[i] = bool(logits)
        self.n_tokens = i + 1

    def clear(self) -> None:
        self.n_tokens = 0


@dataclass(slots=True)
class UBatch:
    """One physical step (`llama_ubatch`): a slice of the allocated batch, in batch order."""

    token: np.ndarray | None  # (n,) int32
    embd: np.ndarray | None  # (n, n_embd) float32
    pos: np.ndarray  # (n,) int32
    seq_ids: list[tuple[int, ...]]  # the sequence set of each token
    seq_id0: np.ndarray  # (n,) int32: first sequence id of each token (what the attention mask uses)
    output: np.ndarray  # (n,) bool
    batch_index: np.ndarray  # (n,) int32: index of each token in the caller's batch

    @property
    def n_tokens(self) -> int:
        return int(self.pos.size)


@dataclass(slots=True)
class AllocatedBatch:
    """A validated, completed private copy of the caller's batch (`llama_batch_allocr` after `init`)."""

    token: np.ndarray | None  # (n,) int32
    embd: np.ndarray | None  # (n, n_embd) float32
    pos: np.ndarray  # (n,) int32
    seq_ids: list[tuple[int, ...]]
    output: np.ndarray  # (n,) bool
    seq_pos_min: dict[int, int]  # first position of each sequence present in the batch

    @property
    def n_tokens(self) -> int:
        return int(self.pos.size)

    @property
    def n_outputs(self) -> int:
        return int(self.output.sum())

    def split_simple(self, n_ubatch: int) -> list[UBatch]:
        """Consecutive chunks of at most `n_ubatch` tokens (`llama_batch_allocr::split_simple`)."""
        seq_id0 = np.array([s[0] for s in self.seq_ids], np.int32)  # (n,)
        ubatches = []
        for start in range(0, self.n_tokens, n_ubatch):
            sl = slice(start, min(start + n_ubatch, self.n_tokens))
            ubatches.append(UBatch(
                token=None if self.token is None else self.token[sl],
                embd=None if self.embd is None else self.embd[sl],
                pos=self.pos[sl],
                seq_ids=self.seq_ids[sl],
                seq_id0=seq_id0[sl],
                output=self.output[sl],
                batch_index=np.arange(sl.start, sl.stop, dtype=np.int32),
            ))
        return ubatches


class BatchAllocator:
    """Validates a `Batch` and fills its defaults (`llama_batch_allocr::init`). Nothing here touches memory."""

    def __init__(self, n_vocab: int, n_embd: int, n_seq_max: int, n_batch: int):
        self.n_vocab = n_vocab
        self.n_embd = n_embd
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch

    def init(self, batch: Batch, seq_pos_max, output_all: bool) -> AllocatedBatch:
        """Check `batch` and complete it. `seq_pos_max(s)` is the memory's last position of sequence s (-1 if
        empty). `output_all` (embeddings mode) requires every token to be an output. Raises `DecodeError`."""
        n = batch.n_tokens
        if n <= 0:
            raise DecodeError("batch is empty: n_tokens = 0")
        if n > self.n_batch:
            raise DecodeError(f"batch has {n} tokens, more than n_batch = {self.n_batch}")
        token, embd = self._inputs(batch, n)
        seq_ids = self._seq_ids(batch, n)
        pos = self._positions(batch, n, seq_ids, seq_pos_max)
        output = self._outputs(batch, n, output_all)
        seq_pos_min = self._check_positions(pos, seq_ids, seq_pos_max)
        return AllocatedBatch(token, embd, pos, seq_ids, output, seq_pos_min)

    def _inputs(self, batch: Batch, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        if batch.embd is not None:
            embd = np.ascontiguousarray(batch.embd[:n], dtype=np.float32)
            if embd.shape[1] != self.n_embd:
                raise DecodeError(f"embd row width {embd.shape[1]} does not match the model's n_embd = {self.n_embd}")
            if not np.isfinite(embd).all():
                i = int(np.argwhere(~np.isfinite(embd))[0, 0])
                raise DecodeError(f"token {i}: input embedding is not finite")
            return None, embd
        if batch.token is None:
            raise DecodeError("batch has neither token ids nor embeddings")
        raw = np.asarray(batch.token[:n])
        if raw.dtype.kind not in "iu":
            raise DecodeError(f"token ids must be integers, got dtype {raw.dtype}")
        bad = np.flatnonzero((raw < 0) | (raw >= self.n_vocab))
        if bad.size:
            i = int(bad[0])
            raise DecodeError(f"token {i}: id {int(raw[i])} is outside the vocab [0, {self.n_vocab})")
        return raw.astype(np.int32), None

    def _seq_ids(self, batch: Batch, n: int) -> list[tuple[int, ...]]:
        if batch.seq_id is None or batch.n_seq_id is None:
            return [(0,)] * n
        seq_ids = []
        for i in range(n):
            k = int(batch.n_seq_id[i])
            if not 1 <= k <= batch.seq_id.shape[1]:
                raise DecodeError(f"token {i}: n_seq_id = {k} is outside [1, {batch.seq_id.shape[1]}]")
            ids = tuple(int(s) for s in batch.seq_id[i, :k])
            for s in ids:
                if not 0 <= s < self.n_seq_max:
                    raise DecodeError(f"token {i}: seq_id {s} is outside [0, n_seq_max = {self.n_seq_max})")
            if len(set(ids)) != len(ids):
                raise DecodeError(f"token {i}: duplicate seq_id in {ids}")
            seq_ids.append(ids)
        return seq_ids

    @staticmethod
    def _positions(batch: Batch, n: int, seq_ids: list[tuple[int, ...]], seq_pos_max) -> np.ndarray:
        if batch.pos is not None:
            pos = np.asarray(batch.pos[:n], dtype=np.int64)
            bad = np.flatnonzero(pos < 0)
            if bad.size:
                raise DecodeError(f"token {int(bad[0])}: position {int(pos[bad[0]])} is negative")
            return pos.astype(np.int32)
        # llama_batch_allocr::init: each sequence continues from its last position in memory
        next_pos: dict[int, int] = {}
        pos = np.empty(n, np.int32)
        for i, ids in enumerate(seq_ids):
            s = ids[0]
            if s not in next_pos:
                next_pos[s] = seq_pos_max(s) + 1
            if next_pos[s] > np.iinfo(np.int32).max:  # llama_pos is int32_t
                raise DecodeError(f"token {i}: seq_id {s} would continue at position {next_pos[s]}, past the "
                                  f"largest position {np.iinfo(np.int32).max}")
            pos[i] = next_pos[s]
            next_pos[s] += 1
        return pos

    @staticmethod
    def _outputs(batch: Batch, n: int, output_all: bool) -> np.ndarray:
        if batch.logits is None:
            output = np.zeros(n, bool)
            output[-1] = True
            return np.ones(n, bool) if output_all else output
        output = np.asarray(batch.logits[:n]) != 0
        if output_all and not output.all():
            i = int(np.flatnonzero(~output)[0])
            raise DecodeError(f"token {i}: embeddings mode requires every token to be an output (logits[{i}] = 0)")
        return output.copy()

    def _check_positions(self, pos: np.ndarray, seq_ids: list[tuple[int, ...]], seq_pos_max) -> dict[int, int]:
        """The consistency checks of llama_batch_allocr::init: each sequence continues its memory at pos_max + 1,
        its positions in the batch are non-decreasing and without gaps, and coupled sequences agree."""
        seen: dict[int, list[int]] = {}
        last: dict[int, int] = {}
        for i, ids in enumerate(seq_ids):
            p = int(pos[i])
            for s in ids:
                if p < last.get(s, -1):
                    raise DecodeError(f"token {i}: position {p} of sequence {s} is lower than the previous one "
                                      f"{last[s]} (positions must not decrease)")
                last[s] = p
                seen.setdefault(s, []).append(p)
        seq_pos_min = {}
        for s, ps in seen.items():
            lo, hi = min(ps), max(ps)
            p0 = seq_pos_max(s)
            if p0 >= 0 and lo != p0 + 1:
                i = next(i for i, ids in enumerate(seq_ids) if s in ids and pos[i] == lo)
                raise DecodeError(f"token {i}: sequence {s} starts at position {lo} but its last position in memory "
                                  f"is {p0}; positions must continue at {p0 + 1}")
            if hi - lo + 1 > len(set(ps)):
                i = next(i for i, ids in enumerate(seq_ids) if s in ids)
                raise DecodeError(f"token {i}: positions of sequence {s} are not continuous ({lo}..{hi} with gaps)")
            seq_pos_min[s] = lo
        return seq_pos_min

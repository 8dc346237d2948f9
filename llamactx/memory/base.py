"""Memory: what a context remembers of its sequences (`llama_memory_i`, src/llama-memory.h).

A context's memory holds what it remembers of its sequences between `decode` calls. Its implementations: the KV
cache (kv_cache.py), the sliding-window pair of caches (kv_cache_iswa.py), the recurrent states (recurrent.py) and
the hybrid of a KV cache and recurrent states (hybrid.py); the model picks one (llama_model::create_memory).
Sequence ids are `0 <= seq_id < n_seq_max`; `seq_id < 0` means "every sequence" where llama.cpp allows it.
Positions `p0 < 0` mean 0 and `p1 < 0` mean infinity.

A decode asks its memory, in this order: `update` (pending work such as a K-shift), `prepare(ubatches)` (a
placement for every ubatch, or None when they do not fit: decode returns 1), per ubatch `apply(ubatch, slot)`
(the view the forward attends through), and on failure `rollback(placement)`. The ubatches come from
`split(batch, n_ubatch)`. A scheduler asks `can_fit` / `room` first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from llamactx.errors import LlamactxError


class MemoryOpError(LlamactxError, ValueError):
    """A memory operation with an invalid argument (a seq_id outside [0, n_seq_max), a divisor below 1, a shift
    on a memory that cannot shift); memory is unchanged."""


class Memory(ABC):
    """Per-sequence memory of a context. Sequence operations never touch the model's weights."""

    n_seq_max: int
    # Whether a sequence's first n positions can be kept (seq_rm of the rest) or shared (seq_cp of [0, n)) without
    # the others: True for KV caches; False for a recurrent state, which only exists for the whole sequence. The
    # engine's prompt cache reuses only whole cached sequences when it is False.
    partial_prefix: bool = True

    def check_seq(self, seq_id: int, allow_all: bool = False) -> None:
        """Raise MemoryOpError unless 0 <= seq_id < n_seq_max (or seq_id = -1, "every sequence", with allow_all)."""
        lo = -1 if allow_all else 0
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or not lo <= seq_id < self.n_seq_max:
            raise MemoryOpError(f"seq_id {seq_id!r} is outside [{lo}, n_seq_max = {self.n_seq_max})")

    def check_coupled(self, seq_ids: Sequence[tuple[int, ...]]) -> str | None:
        """Sequences that share a token of a batch must have the same history in memory
        (llama_batch_allocr::init). Returns the broken rule as a message, or None."""
        for i, ids in enumerate(seq_ids):
            a = ids[0]
            for b in ids[1:]:
                if (self.seq_pos_min(a), self.seq_pos_max(a)) != (self.seq_pos_min(b), self.seq_pos_max(b)):
                    return f"token {i}: sequences {a} and {b} are coupled in the batch but have diverged in memory"
        return None

    # -- placement ----------------------------------------------------------------------------------------------

    def split(self, alloc, n_ubatch: int) -> list:
        """Cut a validated batch into ubatches (the split of llama.cpp's `init_batch`): consecutive chunks of at
        most n_ubatch tokens here; a recurrent memory also keeps each sequence set apart."""
        return alloc.split_simple(n_ubatch)

    @abstractmethod
    def room(self, seq_id: int) -> int:
        """How many new tokens of `seq_id` would find room now, without decoding."""

    def can_fit(self, n_tokens: int, seq_id: int) -> bool:
        """Whether `n_tokens` new tokens of `seq_id` would find room now, without decoding (a scheduler's
        question before it admits or schedules work)."""
        return n_tokens <= self.room(seq_id)

    @abstractmethod
    def update(self, rope_shift) -> None:
        """Pending work before a decode (a K-shift after seq_add / seq_div)."""

    @abstractmethod
    def prepare(self, ubatches):
        """A placement for every ubatch of one decode, or None when they do not all fit; memory unchanged."""

    @abstractmethod
    def apply(self, ubatch, slot):
        """Occupy `slot` (from `prepare`) with `ubatch`; return the view its forward attends through."""

    @abstractmethod
    def rollback(self, placement) -> None:
        """Undo the `apply`s of a decode that failed: memory as before `prepare`."""

    # -- sequences ----------------------------------------------------------------------------------------------

    @abstractmethod
    def clear(self, data: bool = True) -> None:
        """Forget every sequence; with `data`, also zero the stored tensors."""

    @abstractmethod
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of `seq_id` (all sequences when < 0). False if it cannot be done partially."""

    def can_continue(self, seq_id: int, n_past: int) -> bool:
        """Whether `seq_id` cut to positions [0, n_past) (seq_rm of the rest) would still hold everything a token
        at `n_past` attends to. True for a KV cache; an iSWA cache may have dropped the start of that token's
        window, and then the prefix must be reprocessed (llama-server checks `seq_pos_min` for this)."""
        return True

    @abstractmethod
    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make positions [p0, p1) of `seq_id_src` belong to `seq_id_dst` too (shared, not copied)."""

    @abstractmethod
    def seq_keep(self, seq_id: int) -> None:
        """Remove every sequence but `seq_id`."""

    @abstractmethod
    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions [p0, p1) of `seq_id` by `delta` (cells falling below 0 are removed)."""

    @abstractmethod
    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Integer-divide positions [p0, p1) of `seq_id` by `d`."""

    @abstractmethod
    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of `seq_id` in memory, -1 if it is empty."""

    @abstractmethod
    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of `seq_id` in memory, -1 if it is empty."""

    @property
    @abstractmethod
    def can_shift(self) -> bool:
        """Whether `seq_add` / `seq_div` are supported (`get_can_shift`)."""

    @abstractmethod
    def memory_breakdown(self) -> dict[str, int]:
        """Bytes held, by buffer name."""

    # -- state --------------------------------------------------------------------------------------------------

    @property
    def needs_checkpoints(self) -> bool:
        """Whether a sequence can lose what a shorter prefix of it needs, so that context checkpoints let it be
        continued there: a memory without partial prefixes (recurrent, hybrid), or an iSWA cache whose
        sliding-window part is smaller than the context (llama-server checkpoints these, server-context.cpp)."""
        return not self.partial_prefix

    def checkpoint_write(self, seq_id: int) -> bytes | None:
        """The part of `seq_id`'s state that `seq_rm` cannot roll back, as a blob for `checkpoint_load` (llama.cpp's
        state_seq_get_data with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, what llama-server's context checkpoints hold);
        None when there is no such part (a KV cache keeps a record per token)."""
        return None

    def checkpoint_load(self, seq_id: int, data: bytes, n_past: int) -> None:
        """Put `seq_id` back to where `checkpoint_write` saw it, holding positions [0, n_past). Raises StateError
        (memory unchanged) for a blob that does not fit, MemoryOpError for a memory without checkpoints."""
        raise MemoryOpError(f"{type(self).__name__} has no checkpoints (seq_rm rolls it back)")

    @abstractmethod
    def state_write(self, seq_id: int | None) -> bytes:
        """This memory's section of a state blob: every sequence (None) or one."""

    @abstractmethod
    def state_read(self, reader, whole: bool):
        """Parse and check a section from `reader`; nothing is written yet."""

    @abstractmethod
    def state_check_fits(self, state, dest_seq_id: int | None) -> None:
        """Raise StateError if a parsed section cannot be loaded here."""

    @abstractmethod
    def state_apply(self, state, dest_seq_id: int | None) -> None:
        """Load a parsed, checked section."""

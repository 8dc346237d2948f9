"""The memory interface of a context (`llama_memory_i`, src/llama-memory.h).

A context's memory holds what it remembers of its sequences between `decode` calls. The KV cache is one
implementation; recurrent or sliding-window memories would be others. Sequence ids are `0 <= seq_id < n_seq_max`;
`seq_id < 0` means "every sequence" where llama.cpp allows it. Positions `p0 < 0` mean 0 and `p1 < 0` mean infinity.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class Memory(ABC):
    """Per-sequence memory of a context. Sequence operations never touch the model's weights."""

    @abstractmethod
    def clear(self, data: bool = True) -> None:
        """Forget every sequence; with `data`, also zero the stored tensors."""

    @abstractmethod
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of `seq_id` (all sequences when < 0). False if it cannot be done partially."""

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

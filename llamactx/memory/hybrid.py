"""Hybrid memory: a KV cache for the attention layers and recurrent states for the others, behind one `Memory`
(`llama_memory_hybrid`, src/llama-memory-hybrid.cpp).

Every operation goes to both halves, and the answers combine as llama.cpp's do: `seq_rm` asks the recurrent
half first and stops there when it refuses (so a refused removal changes nothing), `seq_pos_min` is the larger
of the two minima and `seq_pos_max` the smaller of the two maxima (a position is in memory only if both halves
have it), `can_shift` is the KV cache's. A decode's ubatches keep each sequence set apart (the recurrent rule);
placement is prepared in both, and a failed decode rolls both back. Like a recurrent memory it cannot keep a
partial prefix (`partial_prefix` False).

The KV cache holds only the attention layers (llama.cpp's layer filter): `attn_layers[i]` is the model layer of
KV layer i, and the forward's attention input maps one to the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llamactx.batch import AllocatedBatch, UBatch
from llamactx.memory.base import Memory
from llamactx.memory.kv_cache import KVCache, KVView, Placement
from llamactx.memory.recurrent import RecurrentMemory, RecurrentPlacement, RecurrentView, split_by_sequence_sets
from llamactx.state_io import StateError


@dataclass(frozen=True, slots=True)
class HybridPlacement:
    kv: Placement
    rs: RecurrentPlacement

    @property
    def slots(self) -> tuple:
        return tuple(zip(self.kv.slots, self.rs.slots, strict=True))


@dataclass(frozen=True, slots=True)
class HybridView:
    """What one ubatch's forward sees (llama_memory_hybrid_context): the KV view and the recurrent view."""

    kv: KVView
    rs: RecurrentView


class HybridMemory(Memory):
    """`kv` for the layers `attn_layers`, `rs` for the recurrent ones."""

    partial_prefix = False

    def __init__(self, kv: KVCache, rs: RecurrentMemory, attn_layers: Sequence[int]):
        self.kv, self.rs = kv, rs
        self.attn_layers = tuple(attn_layers)
        self.n_seq_max = kv.n_seq_max

    # -- placement ----------------------------------------------------------------------------------------------

    def split(self, alloc: AllocatedBatch, n_ubatch: int) -> list[UBatch]:
        return split_by_sequence_sets(alloc.split_simple(n_ubatch))

    def room(self, seq_id: int) -> int:
        return min(self.kv.room(seq_id), self.rs.room(seq_id))

    def update(self, rope_shift) -> None:
        self.kv.update(rope_shift)

    def prepare(self, ubatches: Sequence[UBatch]) -> HybridPlacement | None:
        rs = self.rs.prepare(ubatches)
        kv = self.kv.prepare(ubatches)
        return None if kv is None else HybridPlacement(kv, rs)

    def apply(self, ub: UBatch, slot) -> HybridView:
        kv_slot, rs_slot = slot
        return HybridView(self.kv.apply(ub, kv_slot), self.rs.apply(ub, rs_slot))

    def rollback(self, placement: HybridPlacement) -> None:
        self.kv.rollback(placement.kv)
        self.rs.rollback(placement.rs)

    # -- sequences ----------------------------------------------------------------------------------------------

    def clear(self, data: bool = True) -> None:
        self.kv.clear(data)
        self.rs.clear(data)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """The recurrent half first: if it refuses, nothing was changed (llama_memory_hybrid::seq_rm)."""
        if not self.rs.seq_rm(seq_id, p0, p1):
            return False
        return self.kv.seq_rm(seq_id, p0, p1)

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.kv.seq_cp(seq_id_src, seq_id_dst, p0, p1)
        self.rs.seq_cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.kv.seq_keep(seq_id)
        self.rs.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.kv.seq_add(seq_id, p0, p1, delta)
        self.rs.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.kv.seq_div(seq_id, p0, p1, d)
        self.rs.seq_div(seq_id, p0, p1, d)

    def seq_pos_min(self, seq_id: int) -> int:
        return max(self.kv.seq_pos_min(seq_id), self.rs.seq_pos_min(seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        return min(self.kv.seq_pos_max(seq_id), self.rs.seq_pos_max(seq_id))

    @property
    def can_shift(self) -> bool:
        return self.kv.can_shift

    @property
    def used(self) -> int:
        return self.kv.used

    @property
    def size(self) -> int:
        return self.kv.size

    def memory_breakdown(self) -> dict[str, int]:
        return {**self.kv.memory_breakdown(), **self.rs.memory_breakdown()}

    # -- checkpoints: the recurrent half only (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY skips the attention cache) ------

    def checkpoint_write(self, seq_id: int) -> bytes:
        return self.rs.checkpoint_write(seq_id)

    def checkpoint_load(self, seq_id: int, data: bytes, n_past: int) -> None:
        """The recurrent state from the blob, and the KV cells of [0, n_past), which `seq_id` still holds, kept
        (the rest removed). Raises StateError, memory unchanged, unless the KV half holds all of [0, n_past)."""
        if self.kv.seq_pos_max(seq_id) < n_past - 1:
            raise StateError(f"seq {seq_id}: the KV cache ends at {self.kv.seq_pos_max(seq_id)}, before the "
                             f"checkpoint's position {n_past - 1}")
        self.rs.checkpoint_load(seq_id, data, n_past)
        self.kv.seq_rm(seq_id, n_past, -1)

    # -- state: the KV section, then the recurrent one -------------------------------------------------------------

    def state_write(self, seq_id: int | None) -> bytes:
        return self.kv.state_write(seq_id) + self.rs.state_write(seq_id)

    def state_read(self, reader, whole: bool):
        return self.kv.state_read(reader, whole), self.rs.state_read(reader, whole)

    def state_check_fits(self, state, dest_seq_id: int | None) -> None:
        self.kv.state_check_fits(state[0], dest_seq_id)
        self.rs.state_check_fits(state[1], dest_seq_id)

    def state_apply(self, state, dest_seq_id: int | None) -> None:
        self.kv.state_apply(state[0], dest_seq_id)
        self.rs.state_apply(state[1], dest_seq_id)

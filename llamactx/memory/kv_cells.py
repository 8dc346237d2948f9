"""KV cells: which position and which sequences each slot of the KV cache holds (src/llama-kv-cells.h).

A cell is empty (pos = -1) or holds one position shared by a set of sequences, so after `seq_cp` a common prefix
is stored once. `shift` accumulates position changes from `seq_add` / `seq_div` until the cache re-rotates the
keys (the K-shift). All bookkeeping is vectorized numpy over the cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class CellsSnapshot:
    pos: np.ndarray
    seq: np.ndarray
    shift: np.ndarray
    has_shift: bool


class KVCells:
    """Positions, sequence sets and pending shifts of `size` cells for up to `n_seq_max` sequences."""

    def __init__(self, size: int, n_seq_max: int):
        self.size = size
        self.n_seq_max = n_seq_max
        self.pos = np.full(size, -1, np.int32)  # (size,) -1 = empty
        self.seq = np.zeros((size, n_seq_max), bool)  # (size, n_seq_max)
        self.shift = np.zeros(size, np.int32)  # (size,) pending K-shift of each cell
        self.has_shift = False

    # -- queries ----------------------------------------------------------------------------------------------

    @property
    def used(self) -> int:
        """Number of non-empty cells."""
        return int(np.count_nonzero(self.pos >= 0))

    @property
    def n_free(self) -> int:
        """Number of empty cells."""
        return self.size - self.used

    @property
    def nbytes(self) -> int:
        return self.pos.nbytes + self.seq.nbytes + self.shift.nbytes

    def n_seq(self, seq_id: int) -> int:
        """Number of cells that hold `seq_id` (shared or not)."""
        return int(np.count_nonzero(self.seq[:, seq_id]))

    def n_only(self, seq_id: int) -> int:
        """Number of cells that hold `seq_id` and no other sequence (what removing it would free)."""
        return int(np.count_nonzero(self.seq[:, seq_id] & (self.seq.sum(axis=1) == 1)))

    @property
    def used_max_p1(self) -> int:
        """One past the last non-empty cell: attention only needs to read cells [0, used_max_p1)."""
        nz = np.flatnonzero(self.pos >= 0)
        return int(nz[-1]) + 1 if nz.size else 0

    def seq_pos_min(self, seq_id: int) -> int:
        ps = self.pos[self.seq[:, seq_id]]
        return int(ps.min()) if ps.size else -1

    def seq_pos_max(self, seq_id: int) -> int:
        ps = self.pos[self.seq[:, seq_id]]
        return int(ps.max()) if ps.size else -1

    def seq_cells(self, seq_id: int) -> np.ndarray:
        """Indices of the cells that hold `seq_id` (all non-empty cells when seq_id < 0), in position order."""
        idx = np.flatnonzero(self.pos >= 0) if seq_id < 0 else np.flatnonzero(self.seq[:, seq_id])
        return idx[np.argsort(self.pos[idx], kind="stable")]

    def range_mask(self, seq_id: int, p0: int, p1: int) -> np.ndarray:
        """(size,) bool: cells of `seq_id` (any sequence when < 0) with p0 <= pos < p1 (p0 < 0 = 0, p1 < 0 = inf)."""
        p0 = 0 if p0 < 0 else p0
        p1 = np.iinfo(np.int32).max if p1 < 0 else p1
        in_seq = (self.pos >= 0) if seq_id < 0 else self.seq[:, seq_id]
        return in_seq & (self.pos >= p0) & (self.pos < p1)

    # -- slots ------------------------------------------------------------------------------------------------

    def find_slot(self, n_tokens: int) -> np.ndarray | None:
        """The first `n_tokens` empty cells (need not be contiguous), or None when there are not enough
        (`llama_kv_cache::find_slot`; scanning from cell 0 makes a re-decode reuse the same cells)."""
        free = np.flatnonzero(self.pos < 0)
        return free[:n_tokens] if free.size >= n_tokens else None

    def apply(self, idx: np.ndarray, pos: np.ndarray, seq_ids: list[tuple[int, ...]]) -> None:
        """Occupy cells `idx` with the ubatch's positions and sequence sets (`apply_ubatch`)."""
        self.pos[idx] = pos
        self.seq[idx] = False
        for cell, ids in zip(idx, seq_ids, strict=True):
            self.seq[cell, list(ids)] = True
        self.shift[idx] = 0

    def load(self, idx: np.ndarray, pos: np.ndarray, seq: np.ndarray) -> None:
        """Occupy cells `idx` with positions and whole sequence sets (n, n_seq_max) (a state load)."""
        self.pos[idx] = pos
        self.seq[idx] = seq
        self.shift[idx] = 0

    def take_shifts(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The occupied cells with a pending shift and their shifts, forgetting them; None when nothing is
        pending (the K-shift applies them to the keys)."""
        if not self.has_shift:
            return None
        idx = np.flatnonzero((self.shift != 0) & (self.pos >= 0))
        shift = self.shift[idx].copy()
        self.shift[:] = 0
        self.has_shift = False
        return (idx, shift) if idx.size else None

    # -- sequence operations ------------------------------------------------------------------------------------

    def clear(self) -> None:
        self.pos[:] = -1
        self.seq[:] = False
        self.shift[:] = 0
        self.has_shift = False

    def rm(self, seq_id: int, p0: int, p1: int) -> None:
        mask = self.range_mask(seq_id, p0, p1)
        if seq_id < 0:
            self.seq[mask] = False
        else:
            self.seq[mask, seq_id] = False
        self._free_orphans()

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.seq[self.range_mask(src, p0, p1), dst] = True

    def keep(self, seq_id: int) -> None:
        keep = self.seq[:, seq_id].copy()
        self.seq[:] = False
        self.seq[keep, seq_id] = True
        self._free_orphans()

    def add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions; a cell that falls below position 0 is freed (`llama_kv_cells::pos_add`)."""
        mask = self.range_mask(seq_id, p0, p1)
        self.pos[mask] += delta
        self.shift[mask] += delta
        self.has_shift |= bool(mask.any()) and delta != 0
        gone = mask & (self.pos < 0)
        self.seq[gone] = False
        self._free_orphans()

    def div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        mask = self.range_mask(seq_id, p0, p1)
        old = self.pos[mask]
        new = old // d
        self.pos[mask] = new
        self.shift[mask] += new - old
        self.has_shift |= bool((new != old).any())

    def split_shared(self, seq_id: int, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Copy-on-write before a position change: the cells of `mask` that `seq_id` shares with another
        sequence are given to `seq_id` alone in new cells (same positions and pending shifts), and the old cells
        stay with the others. Returns (old, new) cell indices for the cache to copy K/V, None when nothing is
        shared; raises ValueError when there are not enough free cells."""
        old = np.flatnonzero(mask & self.seq[:, seq_id] & (self.seq.sum(axis=1) > 1))
        if not old.size:
            return None
        new = self.find_slot(old.size)
        if new is None:
            raise ValueError(f"{old.size} cells shared by seq_id {seq_id} must be copied before their positions "
                             f"change, but only {self.n_free} are free")
        self.pos[new] = self.pos[old]
        self.shift[new] = self.shift[old]
        self.seq[new] = False
        self.seq[new, seq_id] = True
        self.seq[old, seq_id] = False
        return old, new

    def _free_orphans(self) -> None:
        orphan = (self.pos >= 0) & ~self.seq.any(axis=1)
        self.pos[orphan] = -1
        self.shift[orphan] = 0

    # -- rollback -----------------------------------------------------------------------------------------------

    def snapshot(self) -> CellsSnapshot:
        return CellsSnapshot(self.pos.copy(), self.seq.copy(), self.shift.copy(), self.has_shift)

    def restore(self, snap: CellsSnapshot) -> None:
        self.pos[:] = snap.pos
        self.seq[:] = snap.seq
        self.shift[:] = snap.shift
        self.has_shift = snap.has_shift

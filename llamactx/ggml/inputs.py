"""Plain-data inputs of the ggml ops that the graph builds per ubatch: RoPE parameters and the visible cells of a
mask. numpy only, so that building a graph input compiles nothing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RopeParams:
    """Arguments of ggml_rope_ext for one layer."""

    n_rot: int
    mode: int
    freq_base: float
    freq_scale: float
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0
    freq_factors: np.ndarray | None = None  # (n_rot/2,) float32: rope_freqs.weight (Llama 3), divides theta


@dataclass(frozen=True, slots=True)
class VisibleCells:
    """Each token's visible KV cells in position order (the ranks the kernel's lanes follow), from a 0 / -inf mask.

    ggml sums attention over cells in cell order. For a sequence that fills the cache from cell 0 (every
    llama.cpp reference run) cell order is position order, so ordering by position reproduces ggml; and it keeps
    a token's result independent of where its cells sit among other sequences' (batch invariance: a request
    decoded beside others, in reused cells, gives the bits it gives alone)."""

    cells: np.ndarray  # (n, max visible) int64, padded with 0
    n_cells: np.ndarray  # (n,) int64
    mask_add: np.ndarray  # (n, max visible) float32: the mask's value at each visible cell

    @classmethod
    def from_mask(cls, mask: np.ndarray, cell_pos: np.ndarray | None = None) -> VisibleCells:
        """mask: (n, n_kv) float32, -inf where a cell is not visible; cell_pos: (n_kv,) the cells' positions
        (None: the cells are in position order, e.g. a ubatch's own tokens)."""
        visible = mask > -np.inf  # (n, n_kv)
        n_cells = visible.sum(axis=1).astype(np.int64)  # (n,)
        if cell_pos is None:
            order = np.argsort(~visible, axis=1, kind="stable")  # visible cells first, in cell order
        else:
            key = np.where(visible, cell_pos[None, :].astype(np.int64), np.iinfo(np.int64).max)  # (n, n_kv)
            order = np.argsort(key, axis=1, kind="stable")  # visible cells first, by position
        cells = np.ascontiguousarray(order[:, : max(int(n_cells.max(initial=0)), 1)], np.int64)  # (n, max visible)
        mask_add = np.ascontiguousarray(np.take_along_axis(mask, cells, axis=1), np.float32)  # (n, max visible)
        return cls(cells, n_cells, mask_add)

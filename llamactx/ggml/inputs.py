"""Plain-data inputs of the ggml ops that the graph builds per ubatch: RoPE parameters and the visible cells of a
mask. numpy only, so that building a graph input compiles nothing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROPE_TYPE_NORM = 0  # GGML_ROPE_TYPE_NORM: rotate pairs (2i, 2i + 1)
ROPE_TYPE_NEOX = 2  # GGML_ROPE_TYPE_NEOX: rotate pairs (i, i + n_dims / 2)


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


MAX_LANE_GAP = 4096  # VisibleCells.on_lanes: the largest span of empty slots a token's lanes may hold


@dataclass(frozen=True, slots=True)
class VisibleCells:
    """Each token's KV cells in the slots the attention kernel sums over: slot r is on lane r % 16 (r % 64 for one
    row) and in softmax group r // 16; a slot with mask_add -inf adds an exact zero.

    ggml sums attention over cells in cell order. `on_lanes` puts a cell on the slot of its position (or, layout
    exact, of its cell index); `from_mask` on ranks in position order. For a sequence that fills the cache from
    cell 0 (every llama.cpp reference run) all three are ggml's order; by position a token's result does not
    depend on where its cells sit among other sequences' (a request decoded beside others, in reused cells, gives
    the bits it gives alone). docs/numerics.md"""

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

    @classmethod
    def on_lanes(cls, mask: np.ndarray, lane_index: np.ndarray) -> VisibleCells | None:
        """Visible cells placed where ggml's lanes would put them: a cell of lane index i goes to slot
        i - lo, lo being the token's smallest visible index rounded down to 64, so that a slot's lane (r % 16,
        r % 64 for one row) and softmax group (r // 16) are the index's. Slots without a visible cell hold
        -inf (an exact zero in every sum) and a neighbouring cell, so consecutive cells stay consecutive.
        lane_index: (n_kv,) the cells' absolute indices (ggml's own order) or their positions (the same for a
        sequence that fills the cache from cell 0, and independent of placement). None when two visible cells
        of a token share an index (positions after seq_div), or when a token's indices span more than
        MAX_LANE_GAP slots beyond 64 per visible cell (positions thousands apart, e.g. from a restored state):
        the slots would take memory in proportion to the span, not to the cells."""
        n, n_kv = mask.shape
        visible = mask > -np.inf  # (n, n_kv)
        t, c = np.nonzero(visible)  # (nnz,) each: token-major, the visible cells
        counts = np.bincount(t, minlength=n)  # (n,)
        has = counts > 0
        key = lane_index.astype(np.int64)[c]  # (nnz,)
        starts = (np.cumsum(counts) - counts)[has]
        lo = np.zeros(n, np.int64)  # (n,) the first slot's index, a multiple of 64
        hi = np.full(n, -1, np.int64)  # (n,)
        if starts.size:
            lo[has] = np.minimum.reduceat(key, starts) // 64 * 64
            hi[has] = np.maximum.reduceat(key, starts)
        n_cells = np.where(has, hi - lo + 1, 0).astype(np.int64)  # (n,)
        if (n_cells > 64 * counts + MAX_LANE_GAP).any():
            return None
        width = max(int(n_cells.max(initial=0)), 1)
        slot = key - lo[t]  # (nnz,)
        filled = np.zeros((n, width), bool)  # (n, width)
        filled[t, slot] = True
        if (np.count_nonzero(filled, axis=1) != counts).any():  # two visible cells on one slot
            return None
        cells = np.zeros((n, width), np.int64)  # (n, width)
        mask_add = np.full((n, width), -np.inf, np.float32)  # (n, width)
        cells[t, slot] = c
        mask_add[t, slot] = mask[visible]
        first = np.argmax(filled, axis=1)  # (n,) the first filled slot, the anchor of the fillers
        anchor = cells[np.arange(n), first]
        filler = np.clip(anchor[:, None] + (np.arange(width)[None, :] - first[:, None]), 0, max(n_kv - 1, 0))
        cells = np.where(filled, cells, filler)
        return cls(np.ascontiguousarray(cells), n_cells, np.ascontiguousarray(mask_add))

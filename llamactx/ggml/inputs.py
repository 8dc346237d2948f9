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


@dataclass(frozen=True, slots=True)
class VisibleCells:
    """Each token's visible KV cells in cell order (the ranks the kernel's lanes follow), from a 0 / -inf mask."""

    cells: np.ndarray  # (n, max visible) int64, padded with 0
    n_cells: np.ndarray  # (n,) int64
    mask_add: np.ndarray  # (n, max visible) float32: the mask's value at each visible cell

    @classmethod
    def from_mask(cls, mask: np.ndarray) -> VisibleCells:
        """mask: (n, n_kv) float32, -inf where a cell is not visible."""
        visible = mask > -np.inf  # (n, n_kv)
        n_cells = visible.sum(axis=1).astype(np.int64)  # (n,)
        order = np.argsort(~visible, axis=1, kind="stable")  # visible cells first, in cell order
        cells = np.ascontiguousarray(order[:, : max(int(n_cells.max(initial=0)), 1)], np.int64)  # (n, max visible)
        mask_add = np.ascontiguousarray(np.take_along_axis(mask, cells, axis=1), np.float32)  # (n, max visible)
        return cls(cells, n_cells, mask_add)

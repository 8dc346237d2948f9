"""VisibleCells.on_lanes: the slots of the attention sums follow a lane index (a cell's position by default, its
absolute index layout-exact), so that the result does not depend on where cells sit (docs/numerics.md)."""

from __future__ import annotations

import numpy as np

from llamactx.ggml.attention import attention_f16_cells
from llamactx.ggml.inputs import VisibleCells


def window_mask(cell_pos: np.ndarray, tok_pos: np.ndarray, n_swa: int) -> np.ndarray:
    """(n, n_kv) 0 / -inf: causal sliding window over cells holding positions cell_pos (-1 = empty)."""
    vis = (cell_pos[None] >= 0) & (cell_pos[None] <= tok_pos[:, None]) & (tok_pos[:, None] - cell_pos[None] < n_swa)
    return np.where(vis, 0, -np.inf).astype(np.float32)


def test_slots_start_at_the_lane_index_rounded_down_to_64():
    pos = np.arange(1000)
    v = VisibleCells.on_lanes(window_mask(pos, np.array([900]), 200), pos)  # visible 701..900
    assert v.n_cells.tolist() == [900 - 640 + 1]
    assert v.cells[0, : v.n_cells[0]].tolist() == list(range(640, 901))  # fillers keep the cells consecutive
    assert np.isneginf(v.mask_add[0, : 701 - 640]).all() and (v.mask_add[0, 701 - 640 : 261] == 0).all()


def test_repeated_positions_have_no_lanes():
    pos = np.array([0, 1, 1, 2])
    assert VisibleCells.on_lanes(np.zeros((1, 4), np.float32), pos) is None


def test_position_lanes_give_the_same_bits_wherever_the_cells_are():
    rng = np.random.default_rng(0)
    n_pos, d = 300, 64
    k = rng.standard_normal((n_pos, d)).astype(np.float16).astype(np.float32)  # (n_pos, d) by position
    v = rng.standard_normal((n_pos, d)).astype(np.float16).astype(np.float32)
    q = rng.standard_normal((3, 2, d)).astype(np.float32)  # (n, n_head, d)
    tok = np.array([297, 298, 299])
    outs = []
    for layout in range(3):  # cell = position; a ring rotated by 37; spread out among empty cells
        cells = {0: np.arange(n_pos), 1: (np.arange(n_pos) + 37) % n_pos, 2: rng.permutation(2 * n_pos)[:n_pos]}
        c = cells[layout]
        n_kv = int(c.max()) + 1
        cell_pos = np.full(n_kv, -1)
        cell_pos[c] = np.arange(n_pos)
        kc, vc = np.zeros((n_kv, d), np.float32), np.zeros((n_kv, d), np.float32)
        kc[c], vc[c] = k, v
        vis = VisibleCells.on_lanes(window_mask(cell_pos, tok, 100), cell_pos)
        outs.append(attention_f16_cells(q, kc, vc, 1, vis, 0.125))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_lanes_of_positions_far_apart_fall_back_to_ranks():
    """Positions 100 million apart (a restored state may hold them) would need a slot per position: on_lanes
    declines, and the ranks in position order take bounded memory."""
    mask = np.zeros((1, 3), np.float32)  # one token sees three cells
    pos = np.array([0, 1, 100_663_303])
    assert VisibleCells.on_lanes(mask, pos) is None
    vis = VisibleCells.from_mask(mask, pos)
    assert vis.cells.shape == (1, 3) and vis.cells.tolist() == [[0, 1, 2]]

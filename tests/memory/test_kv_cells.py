"""KVCells on its own: slots, sequence sets, sharing, shifts and rollback (model-free)."""

from __future__ import annotations

import numpy as np

from llamactx.memory.kv_cells import KVCells


def filled(n_cells: int = 8, n_seq: int = 3) -> KVCells:
    cells = KVCells(n_cells, n_seq)
    idx = cells.find_slot(4)
    cells.apply(idx, np.arange(4, dtype=np.int32), [(0,)] * 4)
    return cells


def test_find_slot_takes_the_first_free_cells_and_fails_when_full():
    cells = filled()
    assert cells.used == 4 and cells.n_free == 4 and cells.used_max_p1 == 4
    assert cells.find_slot(4).tolist() == [4, 5, 6, 7]
    assert cells.find_slot(5) is None
    cells.rm(0, 1, 3)  # a hole: the next slot reuses it first
    assert cells.find_slot(3).tolist() == [1, 2, 4]


def test_cp_shares_cells_and_rm_frees_only_orphans():
    cells = filled()
    cells.cp(0, 1, -1, -1)
    assert cells.used == 4 and cells.seq_pos_max(1) == 3 and cells.n_only(0) == 0
    cells.rm(0, -1, -1)
    assert cells.used == 4 and cells.seq_pos_min(0) == -1  # still held by sequence 1
    assert cells.n_only(1) == 4
    cells.keep(2)
    assert cells.used == 0 and cells.used_max_p1 == 0


def test_add_moves_positions_records_the_shift_and_frees_cells_below_zero():
    cells = filled()
    cells.rm(0, 0, 2)
    cells.add(0, 2, -1, -2)  # a context shift: positions 2, 3 move to 0, 1
    assert cells.pos[:4].tolist() == [-1, -1, 0, 1] and cells.used == 2
    cells.add(0, 0, 1, -1)  # position 0 falls below 0: its cell is freed
    assert cells.pos[:4].tolist() == [-1, -1, -1, 1] and cells.used == 1
    idx, shift = cells.take_shifts()
    assert idx.tolist() == [3] and shift.tolist() == [-2]  # the freed cell's shift is dropped
    assert cells.take_shifts() is None


def test_div_and_snapshot_restore():
    cells = filled()
    snap = cells.snapshot()
    cells.div(0, -1, -1, 2)
    assert cells.pos[:4].tolist() == [0, 0, 1, 1]
    cells.restore(snap)
    assert cells.pos[:4].tolist() == [0, 1, 2, 3] and not cells.has_shift


def test_range_mask_and_seq_cells_in_position_order():
    cells = KVCells(6, 2)
    cells.apply(np.array([3, 1, 5]), np.array([0, 1, 2], np.int32), [(1,), (1,), (1,)])
    assert cells.seq_cells(1).tolist() == [3, 1, 5]
    assert np.flatnonzero(cells.range_mask(1, 1, 2)).tolist() == [1]
    assert np.flatnonzero(cells.range_mask(-1, 2, -1)).tolist() == [5]

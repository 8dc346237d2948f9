"""KVCache placement and state on its own (model-free): prepare / apply / rollback, can_fit, seq ops, K-shift,
state sections, and the rule that nothing outside memory/ touches the cells."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from llamactx.batch import Batch, BatchAllocator
from llamactx.memory import KVCache, KVCacheAllocError, MemoryOpError
from llamactx.state_io import StateError, StateReader

N_EMBD = 64


def cache(size: int = 16, n_seq: int = 4, type_k: str = "f16") -> KVCache:
    return KVCache(2, size, n_seq, N_EMBD, N_EMBD, type_k, "f16")


def ubatches(kv: KVCache, runs: list[tuple[int, int]], n_ubatch: int = 512):
    """(seq_id, n_tokens) runs continuing each sequence -> the allocated batch's ubatches."""
    batch = Batch(sum(n for _, n in runs), n_seq_max=1)
    for s, n in runs:
        p0 = kv.seq_pos_max(s) + 1
        for j in range(n):
            batch.add(7, p0 + j, (s,), j == n - 1)
    alloc = BatchAllocator(100, N_EMBD, kv.n_seq_max, 512).init(batch, kv.seq_pos_max, False)
    return alloc.split_simple(n_ubatch)


def decode_stub(kv: KVCache, runs, n_ubatch: int = 512) -> bool:
    """What Context.decode does with the memory, with a fake forward that stores K = V = position."""
    ubs = ubatches(kv, runs, n_ubatch)
    placement = kv.prepare(ubs)
    if placement is None:
        return False
    for ub, slot in zip(ubs, placement.slots, strict=True):
        view = kv.apply(ub, slot)
        for il in range(kv.n_layer):
            rows = np.repeat(ub.pos[:, None], N_EMBD, axis=1).astype(np.float32)
            view.store(il, rows, rows)
    return True


def test_prepare_places_every_ubatch_without_changing_memory():
    kv = cache()
    ubs = ubatches(kv, [(0, 5), (1, 6)], n_ubatch=4)
    placement = kv.prepare(ubs)
    assert [s.tolist() for s in placement.slots] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert kv.used == 0  # prepare only plans
    assert kv.prepare(ubatches(kv, [(0, 17)])) is None


def test_apply_hands_a_view_of_the_visible_cells_and_rollback_undoes():
    kv = cache()
    assert decode_stub(kv, [(0, 3)])
    ubs = ubatches(kv, [(1, 2)])
    placement = kv.prepare(ubs)
    view = kv.apply(ubs[0], placement.slots[0])
    assert view.n_kv == 5 and view.cell_pos.tolist() == [0, 1, 2, 0, 1]
    assert view.has_seq(ubs[0].seq_id0).tolist() == [[False] * 3 + [True] * 2] * 2
    view.store(0, np.ones((2, N_EMBD), np.float32), np.ones((2, N_EMBD), np.float32))
    np.testing.assert_array_equal(view.k_rows(0)[3:], 1.0)
    kv.rollback(placement)
    assert kv.used == 3 and kv.seq_pos_max(1) == -1


def test_can_fit_counts_free_cells_and_checks_the_sequence():
    kv = cache(size=16)
    assert kv.can_fit(16, 0) and not kv.can_fit(17, 0)
    assert decode_stub(kv, [(0, 10)])
    assert kv.can_fit(6, 3) and not kv.can_fit(7, 3)
    kv.seq_cp(0, 1)  # sharing takes no cells
    assert kv.can_fit(6, 1)
    with pytest.raises(MemoryOpError, match="seq_id 4 is outside"):
        kv.can_fit(1, 4)


def test_seq_ops_validate_their_arguments():
    kv = cache()
    for call, msg in [(lambda: kv.seq_rm(9), "seq_id 9"), (lambda: kv.seq_cp(0, -1), "seq_id -1"),
                      (lambda: kv.seq_div(0, 0, 4, 0), "d = 0"), (lambda: kv.seq_pos_max(True), "True")]:
        with pytest.raises(MemoryOpError, match=msg):
            call()
    assert isinstance(MemoryOpError("x"), ValueError)


def test_coupled_sequences_must_share_their_history():
    kv = cache()
    assert decode_stub(kv, [(0, 3)])
    assert kv.check_coupled([(0,), (1,)]) is None
    assert "diverged" in kv.check_coupled([(0, 1)])
    kv.seq_cp(0, 1)
    assert kv.check_coupled([(0, 1)]) is None


def test_update_rotates_the_keys_of_shifted_cells_once():
    kv = cache()
    assert decode_stub(kv, [(0, 4)])
    kv.seq_add(0, 2, -1, -2)
    calls = []

    def rope_shift(rows, shift, il):
        calls.append((il, shift.tolist()))
        return rows + 100

    kv.update(rope_shift)
    kv.update(rope_shift)  # nothing pending the second time
    assert calls == [(0, [-2, -2]), (1, [-2, -2])]
    assert kv.k[0, 2:4, 0].tolist() == [102, 103]


def test_state_sections_round_trip_and_are_checked_before_any_write():
    src = cache()
    assert decode_stub(src, [(0, 3), (1, 2)])
    blob = src.state_write(None)
    dst = cache()
    state = dst.state_read(StateReader(blob), whole=True)
    dst.state_check_fits(state, None)
    dst.state_apply(state, None)
    assert dst.seq_pos_max(0) == 2 and dst.seq_pos_max(1) == 1
    for s in (0, 1):  # the blob lists cells in position order: compare each sequence's rows
        np.testing.assert_array_equal(dst.k[:, dst.cells.seq_cells(s)], src.k[:, src.cells.seq_cells(s)])
    one = src.state_write(1)
    full = cache(size=4)
    assert decode_stub(full, [(2, 3)])
    state = full.state_read(StateReader(one), whole=False)
    with pytest.raises(StateError, match="needs 2 cells, only 1 are free"):
        full.state_check_fits(state, 0)
    with pytest.raises(StateError, match="this context.s f32/f16"):
        cache(type_k="f32").state_read(StateReader(blob), whole=True)


def test_no_module_outside_memory_touches_the_cells():
    root = Path(__file__).parents[2] / "llamactx"
    pattern = re.compile(r"\b(memory|kv|cache)\.cells\b|\bcells\.(pos|seq|shift)\b|\b(kv|memory)\.(k|v)\[")
    offenders = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.parent.name != "memory"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_shifting_a_shared_prefix_copies_it_first():
    kv = cache(size=16)
    assert decode_stub(kv, [(0, 6)])
    kv.seq_cp(0, 1)
    kv.seq_rm(0, 0, 2)
    kv.seq_add(0, 2, -1, -2)  # sequence 0's context shift must not move sequence 1's positions
    assert kv.seq_pos_min(1) == 0 and kv.seq_pos_max(1) == 5
    assert kv.seq_pos_min(0) == 0 and kv.seq_pos_max(0) == 3
    assert kv.used == 6 + 4
    for s, first in ((0, 2), (1, 0)):  # each sequence's cells still hold the K rows of their original tokens
        np.testing.assert_array_equal(kv.k[0, kv.cells.seq_cells(s), 0], np.arange(first, 6))
    full = cache(size=6)
    assert decode_stub(full, [(0, 6)])
    full.seq_cp(0, 1)
    with pytest.raises(MemoryOpError, match="only 0 are free"):
        full.seq_add(0, 2, -1, -2)


# -- hostile input (issue 12) ---------------------------------------------------------------------------------------


def snapshot(kv: KVCache) -> tuple:
    return kv.cells.pos.copy(), kv.cells.seq.copy(), kv.k.copy(), kv.v.copy()


def assert_unchanged(kv: KVCache, before: tuple) -> None:
    for a, b in zip(before, snapshot(kv), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_sequence_cannot_take_more_than_n_ctx_seq_cells():
    # kv_unified=False: llama.cpp gives each sequence a stream of n_ctx_seq cells; one sequence could take them all
    kv = KVCache(2, 16, 2, N_EMBD, N_EMBD, n_ctx_seq=8)
    assert decode_stub(kv, [(0, 6)])
    assert (kv.room(0), kv.room(1)) == (2, 8)
    assert kv.can_fit(2, 0) and not kv.can_fit(3, 0) and kv.can_fit(8, 1)
    before = snapshot(kv)
    assert not decode_stub(kv, [(0, 3)])  # decode returns 1 (no slot): memory unchanged
    assert not decode_stub(kv, [(1, 2), (0, 3)])
    assert_unchanged(kv, before)
    assert decode_stub(kv, [(0, 2), (1, 8)])
    assert (kv.room(0), kv.room(1)) == (0, 0) and kv.used == 16


def test_seq_cp_cannot_push_a_sequence_over_n_ctx_seq():
    kv = KVCache(2, 16, 3, N_EMBD, N_EMBD, n_ctx_seq=8)
    assert decode_stub(kv, [(0, 6), (1, 4)])
    kv.seq_cp(0, 2)  # 6 shared cells: fine
    before = snapshot(kv)
    with pytest.raises(MemoryOpError, match="seq_cp: seq_id 1 would hold 10 cells, more than n_ctx_seq = 8"):
        kv.seq_cp(0, 1)
    assert_unchanged(kv, before)
    kv.seq_cp(0, 1, 0, 4)  # four of them still fit
    assert kv.cells.n_seq(1) == 8


def test_states_over_n_ctx_seq_rejected():
    src = cache(size=16)
    assert decode_stub(src, [(0, 9)])
    dst = KVCache(2, 16, 4, N_EMBD, N_EMBD, n_ctx_seq=8)
    whole = dst.state_read(StateReader(src.state_write(None)), whole=True)
    with pytest.raises(StateError, match="state gives seq_id 0 9 cells, more than this context's n_ctx_seq = 8"):
        dst.state_check_fits(whole, None)
    one = dst.state_read(StateReader(src.state_write(0)), whole=False)
    with pytest.raises(StateError, match="sequence state holds 9 cells, more than this context's n_ctx_seq = 8"):
        dst.state_check_fits(one, 1)


def positions_offset(blob: bytes) -> int:
    """Where the i32 positions start in a KV section."""
    r = StateReader(blob)
    r.string("type_k"), r.string("type_v"), r.take(20, "dimensions")
    return r.off


def test_positions_out_of_the_written_order_rejected():
    src = cache()
    assert decode_stub(src, [(0, 4)])
    for seq_id, whole in ((None, True), (0, False)):
        blob = bytearray(src.state_write(seq_id))
        at = positions_offset(blob)
        blob[at + 4 : at + 8] = (7).to_bytes(4, "little")  # positions 0 7 2 3
        with pytest.raises(StateError, match="state cell 2 has position 2 after 7: cells must be in position order"):
            cache().state_read(StateReader(bytes(blob)), whole=whole)


def test_duplicate_and_gapped_positions_are_states_the_cache_reaches_itself():
    # seq_div groups positions (self-extend) and seq_rm of a middle range leaves a gap: both round-trip
    src = cache()
    assert decode_stub(src, [(0, 6), (1, 6)])
    src.seq_div(0, 0, -1, 2)  # sequence 0: 0 0 1 1 2 2
    src.seq_rm(1, 2, 4)  # sequence 1: 0 1 4 5
    for seq_id, whole, dest in ((None, True, None), (0, False, 2), (1, False, 3)):
        dst = cache()
        state = dst.state_read(StateReader(src.state_write(seq_id)), whole=whole)
        dst.state_check_fits(state, dest)
        dst.state_apply(state, dest)
        for s_src, s_dst in ((0, 0), (1, 1)) if whole else ((seq_id, dest),):
            assert (dst.cells.pos[dst.cells.seq_cells(s_dst)].tolist()
                    == src.cells.pos[src.cells.seq_cells(s_src)].tolist())


def test_seq_add_keeps_positions_inside_int32():
    # positions are int32 (llama_pos): a shift past 2^31 - 1 wrapped around, one below -2^31 raised OverflowError
    kv = cache()
    assert decode_stub(kv, [(0, 4)])
    before = snapshot(kv)
    with pytest.raises(MemoryOpError, match=r"seq_add: position 3 \+ 2147483645 is past the largest position "
                                            r"2147483647"):
        kv.seq_add(0, 0, -1, 2**31 - 3)
    assert_unchanged(kv, before)
    kv.seq_add(0, 2, -1, -(2**40))  # far below 0: those cells are freed, as with any shift below 0
    assert kv.cells.pos[kv.cells.seq_cells(0)].tolist() == [0, 1]


def test_a_cache_too_big_to_allocate_says_how_big():
    # 2^49 bytes: more than any 64-bit process can map, whatever the overcommit policy
    with pytest.raises(KVCacheAllocError, match=r"1 layers x 1099511627776 cells of f32 K / f32 V = 1048576.0 GiB "
                                                r"could not be allocated; use a smaller n_ctx") as err:
        KVCache(1, 2**40, 1, 128, 128, "f32", "f32")
    assert isinstance(err.value, MemoryError)

"""KVCacheISWA on its own (model-free, K = V = position): llama.cpp's SWA cell search and reuse, its answers to the
memory API past the window (tests/data/probe_iswa_memory_api.py), state of both caches, sizes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from llamactx.batch import Batch, BatchAllocator
from llamactx.memory import MemoryOpError
from llamactx.memory.kv_cache_iswa import KVCacheISWA, RotatedKVView, swa_cache_size
from llamactx.state_io import StateError, StateReader

N_EMBD = 16
PROBE = Path(__file__).parents[1] / "data" / "gemma3-270m-q4_k_m" / "iswa_memory_api.json"


def hparams(n_layer: int = 6, n_swa: int = 512):
    """Gemma 3's layer pattern: every sixth layer global."""
    swa = tuple((il + 1) % 6 != 0 for il in range(n_layer))
    return SimpleNamespace(n_layer=n_layer, n_swa=n_swa, swa_layers=swa, is_swa=lambda il: swa[il],
                           n_embd_k_gqa=N_EMBD, n_embd_v_gqa=N_EMBD)


def iswa(n_ctx: int = 2048, n_seq: int = 2, n_ubatch: int = 256, n_swa: int = 512) -> KVCacheISWA:
    return KVCacheISWA(hparams(n_swa=n_swa), n_ctx, n_seq, n_ubatch)


def decode(mem: KVCacheISWA, runs, n_ubatch: int = 256, views: list | None = None) -> int:
    """What Context.decode does with the memory, with a fake forward storing K = V = position: 0, or 1 (no
    slot; memory unchanged). runs: (seq_ids, n_tokens) continuing each sequence; `views` collects the views."""
    batch = Batch(sum(n for _, n in runs), n_seq_max=mem.n_seq_max)
    for seq_ids, n in runs:
        p0 = mem.seq_pos_max(seq_ids[0]) + 1
        for j in range(n):
            batch.add(7, p0 + j, tuple(seq_ids), j == n - 1)
    alloc = BatchAllocator(100, N_EMBD, mem.n_seq_max, 4096).init(batch, mem.seq_pos_max, False)
    ubs = alloc.split_simple(n_ubatch)
    placement = mem.prepare(ubs)
    if placement is None:
        return 1
    for ub, slot in zip(ubs, placement.slots, strict=True):
        view = mem.apply(ub, slot)
        if views is not None:
            views.append(view)
        rows = np.repeat(ub.pos[:, None], N_EMBD, axis=1).astype(np.float32)  # (n, N_EMBD)
        for il in range(6):
            view.views()[hparams().is_swa(il)].store(il, rows, rows)
    return 0


def test_swa_cache_sized_as_llama_cpp():
    assert swa_cache_size(2048, 512, 2, 256) == 1280
    assert swa_cache_size(32768, 512, 1, 512) == 1024
    assert swa_cache_size(512, 512, 1, 512) == 512  # never more than the base cache
    assert swa_cache_size(4096, 512, 4, 100) == 2304  # padded to 256
    mem = iswa()
    assert (mem.base.size, mem.swa.size) == (2048, 1280)
    assert mem.base.layers == (5,) and mem.swa.layers == (0, 1, 2, 3, 4)


def test_memory_api_answers_as_llama_cpp():
    """Replays the probe's script: every result and every [seq_pos_min, seq_pos_max] equal llama.cpp's."""
    probe = json.loads(PROBE.read_text())
    mem = iswa(probe["n_ctx"], probe["n_seq_max"], probe["n_ubatch"])
    for op, expected, positions in probe["ops"]:
        kind, *args = op
        if kind == "can_shift":
            got = mem.can_shift
        elif kind == "decode":
            got = decode(mem, args[0], probe["n_ubatch"])
        else:
            got = getattr(mem, kind)(*args)
        assert got == expected, op
        assert [[mem.seq_pos_min(s), mem.seq_pos_max(s)] for s in range(mem.n_seq_max)] == positions, op


def test_swa_cells_are_reused_in_llama_cpps_order():
    mem = iswa(n_seq=1, n_ubatch=512)  # 2048 base cells, 1024 SWA cells
    assert decode(mem, [([0], 1000)]) == 0
    assert decode(mem, [([0], 100)]) == 0  # 24 empty cells, then from cell 0: positions 0..75 are masked
    swa = mem.swa.cells
    assert swa.pos[1000:1024].tolist() == list(range(1000, 1024))
    assert swa.pos[:76].tolist() == list(range(1024, 1100))
    assert mem.seq_pos_min(0) == 76 and mem.base.seq_pos_min(0) == 0
    assert mem.swa.head == 76
    # each sequence keeps one contiguous range, whose K/V are its own positions
    held = np.sort(swa.pos[swa.pos >= 0])
    assert held.tolist() == list(range(76, 1100))
    view_rows = mem.swa.k[0, swa.pos >= 0, 0].astype(np.float32)
    assert (view_rows == swa.pos[swa.pos >= 0]).all()


def test_a_window_never_loses_a_visible_cell():
    """Token by token past the window: the SWA cache holds at least the last n_swa positions."""
    mem = iswa(n_ctx=1024, n_seq=1, n_ubatch=64, n_swa=128)  # 256 SWA cells
    for _ in range(40):
        assert decode(mem, [([0], 13)], n_ubatch=64) == 0
        p_max = mem.seq_pos_max(0)
        assert mem.seq_pos_min(0) <= max(0, p_max - 127)
        assert mem.swa.cells.n_seq(0) == p_max - mem.seq_pos_min(0) + 1


def test_can_continue_says_when_a_prefix_must_be_reprocessed():
    mem = iswa(n_seq=1, n_ubatch=512)
    decode(mem, [([0], 1100)])  # the SWA cache (1024 cells) holds 76..1099
    assert mem.can_continue(0, 1100) and mem.can_continue(0, 600)  # window start 89, >= 76
    assert not mem.can_continue(0, 500)  # its window starts at 0, dropped
    assert mem.can_continue(0, 0)
    assert mem.seq_rm(0, 500, -1)  # llama.cpp answers True all the same


def test_shifts_need_caches_of_one_size():
    mem = iswa()
    assert not mem.can_shift
    with pytest.raises(MemoryOpError, match="can_shift"):
        mem.seq_add(0, 0, -1, 5)
    with pytest.raises(MemoryOpError, match="can_shift"):
        mem.seq_div(0, 0, -1, 2)
    small = iswa(n_ctx=512, n_seq=1, n_ubatch=512)  # min(512, 1024): both 512 cells
    assert small.can_shift
    decode(small, [([0], 10)])
    small.seq_add(0, 5, -1, 3)
    assert small.seq_pos_max(0) == 12 and small.base.seq_pos_max(0) == 12


def test_state_covers_both_caches_and_is_checked_whole():
    mem = iswa(n_seq=2, n_ubatch=256)
    decode(mem, [([0], 1300)])
    decode(mem, [([1], 30)])
    blob = mem.state_write(None)
    other = iswa(n_seq=2, n_ubatch=256)
    state = other.state_read(StateReader(blob), whole=True)
    other.state_check_fits(state, None)
    other.state_apply(state, None)
    for s in (0, 1):
        assert other.seq_pos_min(s) == mem.seq_pos_min(s) and other.seq_pos_max(s) == mem.seq_pos_max(s)
        assert other.base.seq_pos_min(s) == mem.base.seq_pos_min(s)
    seq_blob = mem.state_write(1)
    other.state_apply(other.state_read(StateReader(seq_blob), whole=False), 1)
    assert other.seq_pos_max(1) == 29
    # a state of the single full-size cache is not an iSWA state
    with pytest.raises(StateError):
        iswa().state_read(StateReader(blob[: len(blob) // 2]), whole=True)


def test_memory_breakdown_shows_both_caches():
    mem = iswa(n_ctx=32768, n_seq=1, n_ubatch=512)
    mb = mem.memory_breakdown()
    assert set(mb) == {"base.k", "base.v", "base.cells", "swa.k", "swa.v", "swa.cells"}
    assert mb["base.k"] == 1 * 32768 * N_EMBD * 2 and mb["swa.k"] == 5 * 1024 * N_EMBD * 2


@pytest.mark.parametrize("layout_exact", [False, True])
def test_a_wrapped_sequence_is_shown_in_consecutive_cells(layout_exact):
    """For attention that follows positions the SWA view starts at the sequence's first cell, so its cells are
    consecutive; layout-exact attention sees the real cells."""
    mem = KVCacheISWA(hparams(), 2048, 1, 512, layout_exact=layout_exact)  # 1024 SWA cells
    decode(mem, [([0], 1000)])
    views = []
    decode(mem, [([0], 100)], views=views)  # cells 1000..1023, then 0..75
    swa = views[0].views()[1]
    assert isinstance(swa, RotatedKVView) != layout_exact
    held = swa.cell_pos >= 0
    if layout_exact:
        assert swa.cell_pos[:76].tolist() == list(range(1024, 1100))
    else:
        assert swa.cell_pos[held].tolist() == list(range(76, 1100))  # consecutive cells, in position order
    k = swa.k_stored(0).astype(np.float32)[:, 0]  # (n_kv,) K = position in the stub
    assert (k[held] == swa.cell_pos[held]).all()
    one = []
    decode(mem, [([0], 1)], views=one)  # one token: the kernel reads cells one by one, no copy
    assert not isinstance(one[0].views()[1], RotatedKVView)

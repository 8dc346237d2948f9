"""Recurrent (and hybrid) memory against llama.cpp's answers to the same memory-API script
(tests/data/tiny/memory_api.json, recorded by probe_memory_api.py), and its own rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams, Model
from llamactx.batch import DecodeError
from llamactx.memory import MemoryOpError
from llamactx.memory.recurrent import RecurrentMemory
from llamactx.models import ARCHITECTURES
from llamactx.state_io import StateError

TINY = Path(__file__).parent.parent / "data" / "tiny"
API = json.loads((TINY / "memory_api.json").read_text())
NAMES = [name for name in API["models"] if name in ARCHITECTURES]


def _decode(ctx: Context, entries, tokens) -> int:
    """One batch as the probe builds it: each entry continues its sequences after their last position."""
    n = sum(k for _, k in entries)
    batch = Batch(n, n_seq_max=API["n_seq_max"])
    for seq_ids, k in entries:
        p0 = ctx.memory.seq_pos_max(seq_ids[0]) + 1
        for j in range(k):
            batch.add(tokens[(p0 + j) % len(tokens)], p0 + j, seq_ids, logits=j == k - 1)
    try:
        return int(ctx.decode(batch))
    except DecodeError:
        return -1


def _apply(ctx: Context, op, tokens):
    kind, *args = op
    mem = ctx.memory
    if kind == "can_shift":
        return mem.can_shift
    if kind == "decode":
        return _decode(ctx, args[0], tokens)
    result = getattr(mem, kind)(*args)
    return bool(result) if kind == "seq_rm" else None


@pytest.mark.parametrize("name", NAMES)
def test_memory_api_script_answers_as_llama_cpp(name):
    """Every op of the script returns what llama.cpp returned, and leaves the same seq_pos_min / seq_pos_max for
    every sequence: seq_rm in the middle (True, nothing removed) or of a tail (False), seq_id -1 (False),
    seq_cp of a partial range (the whole state), seq_add / seq_div, coupled sequences that diverged (-1)."""
    model = Model.load(TINY / f"tiny-{name}.gguf")
    tokens = json.loads((TINY / f"{name}.json").read_text())["prompts"][0]["tokens"]
    ctx = Context(model, ContextParams(n_ctx=API["n_ctx"], n_batch=256, n_ubatch=256, n_seq_max=API["n_seq_max"],
                                       n_threads=2, kv_unified=API["kv_unified"][name]))
    for step, (op, want, positions) in enumerate(API["models"][name]):
        got = _apply(ctx, op, tokens)
        assert got == want, f"step {step} {op}: {got} != llama.cpp's {want}"
        got_pos = [[ctx.memory.seq_pos_min(s), ctx.memory.seq_pos_max(s)] for s in range(API["n_seq_max"])]
        assert got_pos == positions, f"step {step} {op}: positions {got_pos} != llama.cpp's {positions}"


def _memory() -> RecurrentMemory:
    mem = RecurrentMemory(range(2), n_seq_max=3, n_embd_r=6, n_embd_s=4)
    mem.r[:] = np.arange(mem.r.size, dtype=np.float32).reshape(mem.r.shape)
    mem.s[:] = -np.arange(mem.s.size, dtype=np.float32).reshape(mem.s.shape)
    mem.pos[:] = [7, -1, 3]
    return mem


def test_seq_rm_only_forgets_whole_sequences():
    mem = _memory()
    assert mem.seq_rm(0, 2, 5) and mem.seq_pos_max(0) == 7  # misses the last position: nothing to remove
    assert not mem.seq_rm(0, 3, -1) and mem.seq_pos_max(0) == 7  # a tail: would need a rollback
    assert not mem.seq_rm(-1, -1, -1)  # llama.cpp rejects seq_id -1 before anything else
    assert mem.seq_rm(0, 0, -1) and mem.seq_pos_max(0) == -1 and mem.seq_pos_min(0) == -1
    with pytest.raises(MemoryOpError, match="seq_id 3"):
        mem.seq_rm(3)


def test_seq_cp_copies_the_state_and_the_copy_is_independent():
    mem = _memory()
    mem.seq_cp(2, 1, 0, 1)  # the range does not matter: a state is whole
    assert mem.seq_pos_max(1) == 3
    np.testing.assert_array_equal(mem.r[:, 1], mem.r[:, 2])
    np.testing.assert_array_equal(mem.s[:, 1], mem.s[:, 2])
    mem.r[:, 2] = 0
    assert mem.r[:, 1].any()
    mem.seq_add(1, 0, -1, 10)
    assert (mem.seq_pos_max(1), mem.seq_pos_max(2)) == (13, 3)


def test_room_is_not_limited_by_the_state():
    mem = _memory()
    assert mem.can_fit(10**6, 0) and mem.room(1) > 2**30
    assert mem.partial_prefix is False and mem.can_shift


def test_state_blob_checked_before_anything_changes(tmp_path):
    model = Model.load(TINY / "tiny-mamba2.gguf")
    ctx = Context(model, ContextParams(n_ctx=64, n_seq_max=2, n_threads=2))
    ctx.decode(Batch.get_one([1, 2, 3]))
    blob = ctx.state_get_data()
    before = (ctx.memory.pos.copy(), ctx.memory.r.copy(), ctx.memory.s.copy())
    for bad in (blob[:-7], blob[:40]):
        with pytest.raises(StateError):
            ctx.state_set_data(bad)
    np.testing.assert_array_equal(ctx.memory.pos, before[0])
    np.testing.assert_array_equal(ctx.memory.r, before[1])
    np.testing.assert_array_equal(ctx.memory.s, before[2])
    other = Context(model, ContextParams(n_ctx=64, n_seq_max=2, n_threads=2))
    other.state_set_data(blob)
    np.testing.assert_array_equal(other.memory.s, ctx.memory.s)
    assert ctx.memory_breakdown()["rs"] == ctx.memory.r.nbytes + ctx.memory.s.nbytes


@pytest.mark.skipif("lfm2" not in ARCHITECTURES, reason="lfm2 not registered")
def test_hybrid_asks_the_recurrent_half_first():
    """llama_memory_hybrid::seq_rm: a removal the recurrent half refuses leaves the KV half untouched; one it
    accepts (a middle range: nothing to do there) still removes the KV cells. Positions combine as the larger
    minimum and the smaller maximum of the halves."""
    model = Model.load(TINY / "tiny-lfm2.gguf")
    ctx = Context(model, ContextParams(n_ctx=64, n_seq_max=2, n_threads=2))
    mem = ctx.memory
    ctx.decode(Batch.get_one(list(range(1, 11))))
    assert not mem.seq_rm(0, 5, -1)
    assert mem.kv.cells.n_seq(0) == 10 and mem.rs.seq_pos_max(0) == 9
    assert mem.seq_rm(0, 3, 5)
    assert mem.kv.cells.n_seq(0) == 8 and mem.kv.seq_pos_min(0) == 0
    assert (mem.seq_pos_min(0), mem.seq_pos_max(0)) == (9, 9)
    assert mem.kv.n_layer == 2 and mem.rs.layers == (0, 2)  # each half holds only its layers
    mb = ctx.memory_breakdown()
    assert mb["kv"] == mem.kv.k.nbytes + mem.kv.v.nbytes and mb["rs"] == mem.rs.r.nbytes + mem.rs.s.nbytes

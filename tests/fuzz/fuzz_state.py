"""Fuzz target: the state-blob loader and session files (llamactx/state.py, KVCache.state_read).

A context of the tiny model (two sequences, kv_unified=False: 256 cells each) holds a saved state. Each input's
first byte picks what the rest is: a whole-context blob, a sequence blob (into sequence 1), or a session file of
either kind. A rejected input must raise StateError with the memory exactly as it was; an accepted one must leave
a context that decodes (or says DecodeError / no slot), and a sequence load must not touch sequence 0. Seeds: the
real blobs and session files of that context.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from tests.fuzz.harness import input_file, instrumented, main, scratch_file
from tests.gguf.tiny_model import write_tiny_llama

with instrumented():
    from llamactx import Batch, Context, ContextParams, DecodeError, Model, StateError

KINDS = ("whole", "seq", "whole-file", "seq-file")
INPUT = scratch_file("state")


def _setup() -> tuple[Context, bytes, dict[str, bytes]]:
    with tempfile.TemporaryDirectory() as name:  # the model stays mapped once its file is gone
        tmp = Path(name)
        model = Model.load(write_tiny_llama(tmp / "tiny.gguf", n_embd=32, n_ff=32, n_layer=2, n_head=2, n_head_kv=1))
        ctx = Context(model, ContextParams(n_ctx=256, n_seq_max=2, n_batch=64, n_threads=1, n_threads_batch=1))
        batch = Batch(12, n_seq_max=2)
        for i, t in enumerate([1, 259, 260, 261, 262, 70, 71]):
            batch.add(t, i, (0,), i == 6)
        for i, t in enumerate([1, 100, 101, 102, 103]):
            batch.add(t, i, (1,), i == 4)
        if ctx.decode(batch) != 0:
            raise RuntimeError("the fuzz context could not decode its seed state")
        ctx.memory.seq_rm(1, 1, 2)  # a gap, as a real state may have
        blob = ctx.state_get_data()
        blobs = {"whole": blob, "seq": ctx.state_seq_get_data(1)}
        ctx.state_save_file(tmp / "whole.session", [1, 259, 260])
        ctx.state_seq_save_file(tmp / "seq.session", 1, [1, 101, 102])
        blobs.update({f"{kind}-file": (tmp / f"{kind}.session").read_bytes() for kind in ("whole", "seq")})
    seeds = {f"{kind}.bin": bytes([KINDS.index(kind)]) + data for kind, data in blobs.items()}
    return ctx, blob, seeds


CTX, BASE, SEEDS = _setup()


def image(ctx: Context) -> tuple[np.ndarray, ...]:
    kv = ctx.memory
    return kv.cells.pos.copy(), kv.cells.seq.copy(), kv.k.copy(), kv.v.copy(), np.array(ctx.get_logits())


def seq0(ctx: Context) -> tuple[list[int], bytes, bytes]:
    """Sequence 0's positions and K / V rows: what a load into sequence 1 must leave alone."""
    kv = ctx.memory
    idx = kv.cells.seq_cells(0)
    return kv.cells.pos[idx].tolist(), kv.k[:, idx].tobytes(), kv.v[:, idx].tobytes()


def load(kind: str, payload: bytes) -> None:
    if kind == "whole":
        CTX.state_set_data(payload)
    elif kind == "seq":
        CTX.state_seq_set_data(payload, 1)
    else:
        with input_file(INPUT, payload) as path:
            if kind == "whole-file":
                CTX.state_load_file(path)
            else:
                CTX.state_seq_load_file(path, 1)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    kind = KINDS[data[0] % len(KINDS)]
    before, before_seq0 = image(CTX), seq0(CTX)
    try:
        load(kind, data[1:])
    except StateError:
        after = image(CTX)
        if not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, after, strict=True)):
            raise AssertionError(f"a rejected {kind} state changed the context") from None
        return
    try:
        if kind.startswith("seq") and seq0(CTX) != before_seq0:
            raise AssertionError(f"a {kind} state loaded into sequence 1 changed sequence 0")
        try:
            CTX.decode(Batch.get_one([5]))
        except DecodeError:
            pass
    finally:
        CTX.state_set_data(BASE)


if __name__ == "__main__":
    for data in SEEDS.values():  # warm up: the numba kernels load from their cache before any timing
        test_one_input(data)
    main(test_one_input, SEEDS)

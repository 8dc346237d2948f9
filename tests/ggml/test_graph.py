"""The compiled forward (llamactx.ggml.graph + kernels.compute) and the fast attention kernel against the reference.

FastOps records a forward pass as a graph once per ubatch shape and runs it in one compiled call; ReferenceOps
computes it op by op. Both must give the same bits, for prompts, single-token decode, several sequences in one
ubatch (a server step: decode tokens plus a prompt chunk) and sequences whose cells are scattered in the cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx import Batch, Context, ContextParams, Model
from llamactx.backend.reference import ReferenceOps
from llamactx.ggml.attention import attention_f16_cells
from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.flash_attn import flash_attn_f16_cells
from llamactx.ggml.graph import Graph, GraphUnsupported
from llamactx.ggml.inputs import VisibleCells
from llamactx.ggml.kernels.attention import attend
from llamactx.ggml.kernels.flash import flash_attend
from tests.gguf.tiny_model import tensor_table, tiny_hparams, write_tiny_llama


def _seq_batch(parts, outputs="last") -> Batch:
    """parts: (seq_id, tokens, pos0); every token an output, or only each part's last."""
    batch = Batch(sum(len(t) for _, t, _ in parts))
    for seq, toks, pos0 in parts:
        for i, t in enumerate(toks):
            batch.add(int(t), pos0 + i, (seq,), outputs == "all" or i == len(toks) - 1)
    return batch


def _server_steps(model, ops, swa_full=True, flash_attn="disabled") -> list[np.ndarray]:
    """Logits of: prompts of 3 sequences, then steps of their next tokens plus chunks of a 4th sequence's prompt,
    with a sequence removed between steps so that later cells are reused out of order. swa_full: one cache for
    every layer; False: Gemma's iSWA pair of caches)."""
    rng = np.random.default_rng(3)
    tok = lambda n: rng.integers(0, 2000, n).tolist()  # noqa: E731
    ctx = Context(model, ContextParams(n_ctx=256, n_seq_max=4, kv_unified=True, swa_full=swa_full,
                                       flash_attn=flash_attn), ops=ops)
    out = []
    steps = [
        [(0, tok(9), 0), (1, tok(5), 0), (2, tok(12), 0)],
        [(0, tok(1), 9), (1, tok(1), 5), (2, tok(1), 12), (3, tok(16), 0)],
        [(0, tok(1), 10), (2, tok(1), 13), (3, tok(16), 16)],
        [(0, tok(1), 11), (2, tok(1), 14), (3, tok(16), 32)],  # same shape as the step before: a reused plan
        [(3, tok(1), 48)],
    ]
    for i, parts in enumerate(steps):
        assert ctx.decode(_seq_batch(parts, "all" if i == 0 else "last")) == 0
        out.append(np.array(ctx.get_logits()))
        if i == 1:
            ctx.memory.seq_rm(1)  # its cells are reused by the next steps
    return out, ctx


@pytest.mark.parametrize("name", ["smollm", "gemma"])
def test_graph_forward_gives_the_reference_bits(request, name):
    model = request.getfixturevalue(name)
    fast, ctx = _server_steps(model, None)
    ref, _ = _server_steps(model, ReferenceOps())
    for got, want in zip(fast, ref, strict=True):
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    plans = ctx.ops._plans
    assert all(entry is not None for entry in plans.values())  # every step ran as a compiled graph
    assert len(plans) == len(fast) - 1  # steps 3 and 4 share one plan


def test_iswa_memory_runs_as_a_graph_with_the_reference_bits(gemma):
    """Gemma 3's iSWA memory hands attention two views (global and sliding-window caches): the program stores and
    reads each layer in its own cache, with the reference ops' numbers. (tests/test_gemma_iswa.py runs past the
    window, where the SWA cache wraps and its views are rotated.)"""
    fast, ctx = _server_steps(gemma, None, swa_full=False)
    ref, _ = _server_steps(gemma, ReferenceOps(), swa_full=False)
    for got, want in zip(fast, ref, strict=True):
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert ctx.ops._plans and all(entry is not None for entry in ctx.ops._plans.values())


@pytest.mark.parametrize("name", ["smollm", "gemma"])
def test_graph_flash_attention_gives_the_reference_bits(request, name):
    """Flash attention inside the program (kernels.flash: the tiled kernel's arithmetic for every token) against
    the reference ops' flash attention, on the server-style steps (Gemma on its iSWA caches)."""
    model = request.getfixturevalue(name)
    fast, ctx = _server_steps(model, None, swa_full=False, flash_attn="enabled")
    ref, _ = _server_steps(model, ReferenceOps(), swa_full=False, flash_attn="enabled")
    for got, want in zip(fast, ref, strict=True):
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert ctx.ops._plans and all(entry is not None for entry in ctx.ops._plans.values())


def test_unsupported_attention_runs_op_by_op(smollm):
    """A quantized K cache has no executor kernel: the context computes op by op, with the same numbers as the
    reference ops."""
    toks = list(range(300, 320))
    logits, ctxs = [], []
    for ops in (None, ReferenceOps()):
        ctx = Context(smollm, ContextParams(n_ctx=64, type_k="q8_0"), ops=ops)
        assert ctx.decode(Batch.get_one(toks)) == 0 and ctx.decode(Batch.get_one([7])) == 0
        logits.append(np.array(ctx.get_logits_ith(-1)))
        ctxs.append(ctx)
    assert len(ctxs[0].ops._plans) == 0  # no graph was planned
    np.testing.assert_array_equal(logits[0], logits[1])


def test_graph_records_instead_of_computing():
    g = Graph(supports=lambda w: True)
    x = g.input("embd", (3, 8))
    y = (x.reshape(3, 2, 4).reshape(3, -1) + np.arange(8, dtype=np.float32)) * 2.0
    assert y.shape == (3, 8) and [t.op for t in g.nodes] == ["input", "view", "view", "add_row", "scale"]
    with pytest.raises(GraphUnsupported):
        x.reshape(6, 4)  # moves values between rows
    with pytest.raises(GraphUnsupported):
        x[np.array([0, 2])]  # rows other than the output ids
    with pytest.raises(GraphUnsupported):
        g.softcap(x, 30.0)


@pytest.mark.parametrize("n, n_head, n_head_kv, d, n_kv", [
    (1, 9, 3, 64, 150), (7, 9, 3, 64, 150), (5, 4, 1, 256, 150), (1, 4, 1, 256, 150), (3, 9, 3, 64, 20),
    (1, 9, 3, 64, 1500), (2, 9, 3, 64, 1300), (1, 4, 1, 256, 1200),
    (1, 6, 2, 48, 1100)])  # the last four split over cells (the last: 48 columns, a partial 64-column block)
def test_fast_attention_matches_the_reference_kernel(n, n_head, n_head_kv, d, n_kv):
    """kernels.attention (512-bit lanes, only visible cells read) against ggml.attention (ReferenceOps), bit for
    bit: scattered visible cells of several sequences, masked cells, probabilities that round to zero; few tokens
    over many cells take the pass split over cell and column blocks."""
    rng = np.random.default_rng(n * d + n_kv)
    k = (rng.standard_normal((n_kv, n_head_kv * d)) * 2).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float16)
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    visible = rng.random((n, n_kv)) < 0.5
    visible[:, 3] = True
    mask = np.where(visible, 0.0, -np.inf).astype(np.float32)  # (n, n_kv)
    vis = VisibleCells.from_mask(mask, rng.permutation(n_kv))  # sums in a position order unlike cell order
    want = attention_f16_cells(q, k, v, n_head_kv, vis, 0.125)
    for n_threads in (1, 4):  # one token over many cells takes the split passes with one thread too
        got = np.empty((n, n_head * d), np.float32)
        attend(q.reshape(n, -1), k.view(np.uint16), v.view(np.uint16), n_head, n_head_kv, vis.cells, vis.n_cells,
               vis.mask_add, np.float32(0.125), got, n_threads)
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("n, n_head, n_head_kv, d, n_kv, causal", [
    (1, 9, 3, 64, 150, False), (7, 9, 3, 64, 150, False), (5, 4, 1, 256, 150, False), (3, 4, 2, 32, 90, False),
    (70, 9, 3, 64, 200, True), (66, 4, 1, 256, 130, True), (3, 9, 3, 64, 20, False),
    (1, 9, 3, 64, 1500, False), (2, 9, 3, 64, 1300, True), (1, 4, 1, 256, 1200, False), (1, 6, 2, 48, 700, True),
    (40, 9, 3, 64, 300, "mixed")])
def test_fast_flash_attention_matches_the_reference_kernel(n, n_head, n_head_kv, d, n_kv, causal):
    """kernels.flash (K tiles transposed in registers, V chains 16 columns to a register) against
    ggml.flash_attn's tiled arithmetic (ReferenceOps), bit for bit: scattered visible cells of several sequences
    or a causal prompt, tiles without a visible cell, probabilities that underflow to zero, head sizes that are
    not a multiple of 64, a prompt's tokens in blocks beside other sequences' tokens; few tokens over many cells
    take the pass split over tiles and column blocks."""
    rng = np.random.default_rng(n * d + n_kv)
    k = (rng.standard_normal((n_kv, n_head_kv * d)) * 3).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float16)
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    if causal:  # the last n cells are the ubatch's own tokens, each sees the cells before it
        visible = np.arange(n_kv)[None, :] <= np.arange(n_kv - n, n_kv)[:, None]
        visible[:, 64:128] = False  # a tile no token sees
        order = None
    else:
        visible = rng.random((n, n_kv)) < 0.5
        visible[:, 3] = True
        order = rng.permutation(n_kv)  # sums in a position order unlike cell order
    if causal == "mixed":  # a server step: a prompt chunk's tokens (blocks sharing K tiles) beside others' tokens
        visible[::7] = rng.random((len(visible[::7]), n_kv)) < 0.3
        order = None
    mask = np.where(visible, 0.0, -np.inf).astype(np.float32)  # (n, n_kv)
    vis = VisibleCells.from_mask(mask, order)
    want = flash_attn_f16_cells(q, k, v, n_head_kv, vis, 0.125, n_kv, 1)
    for n_threads in (1, 4):
        got = np.full((n, n_head * d), np.nan, np.float32)
        flash_attend(q.reshape(n, -1), k.view(np.uint16), v.view(np.uint16), n_head, n_head_kv, vis.cells,
                     vis.n_cells, vis.mask_add, np.float32(0.125), got, n_threads)
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("t", [T.BF16, T.IQ4_NL, T.MXFP4], ids=lambda t: T(t).name)
def test_model_of_a_hub_type_runs_as_a_compiled_graph(tmp_path, t):
    """A model whose layers' matrices and embedding table are BF16 / IQ4_NL / MXFP4 (its output matrix F32: the
    tiny vocabulary's 263 rows fit neither tinyBLAS nor the repacked kernels): FastOps plans every ubatch as one
    compiled program (mul_mat and get_rows nodes of that type) and gives ReferenceOps' logits bit for bit, prompt
    and decode steps."""
    if t == T.BF16 and F32_EPR != 16:
        pytest.skip("an AVX2 target computes BF16 on the reference kernels")
    table = tensor_table(tiny_hparams())
    types = {name: t for name, shape in table.items() if len(shape) == 2}
    model = Model.load(write_tiny_llama(tmp_path / "hub.gguf", types=types,
                                        shapes={"output.weight": table["token_embd.weight"]}))
    toks = np.random.default_rng(5).integers(0, model.hparams.n_vocab, 12).tolist()
    logits, ctxs = [], []
    for ops in (None, ReferenceOps()):
        ctx = Context(model, ContextParams(n_ctx=64, n_threads=2), ops=ops)
        assert ctx.decode(Batch.get_one(toks[:9])) == 0
        rows = [np.array(ctx.get_logits_ith(-1))]
        for i, tok in enumerate(toks[9:]):
            assert ctx.decode(_seq_batch([(0, [tok], 9 + i)])) == 0
            rows.append(np.array(ctx.get_logits_ith(-1)))
        logits.append(np.stack(rows))
        ctxs.append(ctx)
    assert logits[0].view(np.uint32).tolist() == logits[1].view(np.uint32).tolist()
    plans = ctxs[0].ops._plans
    assert plans and all(entry is not None for entry in plans.values())

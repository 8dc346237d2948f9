"""The KV cache types bf16, q4_1, q5_0, q5_1 and iq4_nl (-ctk / -ctv, type_k / type_v): their rows are stored
with ggml's own from_float bytes (tests/data/kv_types/make_kv_rows_reference.py), and a context decodes with them.
Attention over a quantized cache runs the reference path (float64 sums, like q4_0 / q8_0): not bit-exact, and 4-
and 5-bit caches amplify rounding differences into other quantization levels, so only bf16 is compared with
llama.cpp's logits here (kv_types*.npz holds llama.cpp's for every type, for the exact kernels to come)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Context, ContextParams
from llamactx.batch import Batch
from llamactx.ggml.quants_kv import KV_QUANTIZE
from llamactx.memory.kv_cache import kv_row_nbytes
from tests.conftest import DATA, VARIANT

KV = DATA / "kv_types"
NEW_TYPES = ("bf16", "q4_1", "q5_0", "q5_1", "iq4_nl")


def _load(name: str):
    path = KV / name
    if not path.exists():
        pytest.fail(f"missing reference {path}: run the make_*.py scripts in tests/data/kv_types")
    return np.load(path)


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_rows_are_ggmls_from_float_bytes(type_name):
    ref = _load("kv_rows.npz")
    ours = KV_QUANTIZE[type_name](ref["x"])
    assert ours.shape == (ref["x"].shape[0], kv_row_nbytes(type_name, ref["x"].shape[1]))
    assert np.array_equal(ours, ref[type_name].view(np.uint8).reshape(ours.shape))


def _decode(model, tokens, type_name, flash="enabled"):
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2, type_k=type_name,
                                       type_v=type_name if flash == "enabled" else "f16", flash_attn=flash))
    batch = Batch(len(tokens))
    for i, t in enumerate(tokens):
        batch.add(int(t), i, (0,), True)
    assert ctx.decode(batch) == 0
    return ctx, np.array(ctx.get_logits())


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_cache_holds_the_from_float_rows_and_decodes(smollm, type_name):
    """The cache's K bytes are from_float of the K rows it decodes back to; the logits are finite and the cache is
    the type's size (bytes per token = layers x the K and V row sizes)."""
    tokens = _load("kv_types_avx2.npz" if VARIANT == "avx2" else "kv_types.npz")["tokens"][:16]
    ctx, logits = _decode(smollm, tokens, type_name)
    assert np.isfinite(logits).all()
    kv = ctx.memory
    hp = smollm.hparams
    assert kv.k.shape[-1] == kv_row_nbytes(type_name, hp.n_embd_k_gqa)
    stored = kv.k[0, : len(tokens)]
    from llamactx.memory.kv_cache import _decode as decode_rows
    assert np.array_equal(KV_QUANTIZE[type_name](decode_rows(type_name, stored, hp.n_embd_k_gqa)), stored)
    per_token = hp.n_layer * (kv_row_nbytes(type_name, hp.n_embd_k_gqa) + kv_row_nbytes(type_name, hp.n_embd_v_gqa))
    assert ctx.memory_breakdown()["kv"] == 256 * per_token


def test_bf16_cache_agrees_with_llama_cpp_where_confident(smollm):
    """bf16 keys and values, flash attention: llama.cpp's top-1 wherever it leads its top-2 by >= 0.5."""
    ref = _load("kv_types_avx2.npz" if VARIANT == "avx2" else "kv_types.npz")
    _, logits = _decode(smollm, ref["tokens"], "bf16")
    ids, vals = ref["bf16_ids"], ref["bf16_logits"]
    confident = vals[:, 0] - vals[:, 1] >= 0.5
    assert confident.sum() > 50
    assert (logits.argmax(axis=1)[confident] == ids[confident, 0]).all()


def test_quantized_v_needs_flash_attention_but_bf16_does_not(smollm):
    from llamactx.cparams import ContextParamsError

    Context(smollm, ContextParams(n_ctx=64, type_k="bf16", type_v="bf16", flash_attn="disabled"))
    for t in ("q4_1", "q5_0", "q5_1", "iq4_nl"):
        with pytest.raises(ContextParamsError, match=f"type_v = '{t}' requires flash_attn"):
            Context(smollm, ContextParams(n_ctx=64, type_v=t, flash_attn="disabled"))

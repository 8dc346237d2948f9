"""Gemma 3 past its sliding window on the iSWA cache, against llama.cpp (tests/data/make_gemma_iswa_reference.py).

A 1536-token prompt in three 512-token ubatches, then 32 greedy tokens one at a time, as llama-cpp-python ran it
with `swa_full=False` (the small SWA cache whose cells wrap around) and `swa_full=True`. ggml's attention sums
follow the cells' absolute indices; llamactx's follow positions by default (docs/numerics.md):

- `kv_layout_exact=True`: the SWA cache places tokens in llama.cpp's cells, so the rows equal llama.cpp's
  `swa_full=False` rows bit for bit;
- the default: the rows equal llama.cpp's `swa_full=True` rows bit for bit (there cell = position), so they differ
  from `swa_full=False` exactly as llama.cpp differs from itself.
Rows are compared by a sha256 of the full float32 row; the stored top-64 and 512 sampled logits give the size of
a difference when there is one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams
from llamactx.memory.kv_cache_iswa import KVCacheISWA
from tests.conftest import VARIANT_DIR

DATA = Path(__file__).parent / "data" / "gemma3-270m-q4_k_m"


@pytest.fixture(scope="module")
def iswa_ref():
    meta = json.loads((DATA / VARIANT_DIR / "iswa.json").read_text())
    return meta, dict(np.load(DATA / VARIANT_DIR / "iswa.npz"))


def _rows(model, meta, exact: bool) -> np.ndarray:
    """llamactx's logits at the reference rows: the last 64 prompt positions, then each greedy step, flash
    attention off as in the reference. (96, n_vocab)"""
    ctx = Context(model, ContextParams(n_ctx=2048, n_batch=512, n_ubatch=512, kv_layout_exact=exact,
                                       flash_attn="disabled"))
    assert isinstance(ctx.memory, KVCacheISWA)
    ctx.ops.ggml_single_row = True  # llama.cpp decodes one token through ggml's single-row kernels
    prompt, first = meta["prompt"], meta["first_pos"]
    rows = []
    for s in range(0, len(prompt), 512):
        b = Batch(512)
        for i in range(s, s + 512):
            b.add(prompt[i], i, (0,), i >= first)
        assert ctx.decode(b) == 0
        if s + 512 > first:
            rows.append(np.array(ctx.get_logits()))
    assert ctx.memory.seq_pos_min(0) == 512  # the SWA cache dropped what no window sees any more
    for k, tok in enumerate(meta["greedy"]):
        b = Batch(1)
        b.add(tok, len(prompt) + k, (0,), True)
        assert ctx.decode(b) == 0
        rows.append(np.array(ctx.get_logits()))
    return np.concatenate(rows)


def _compare(rows: np.ndarray, meta: dict, arrays: dict, key: str) -> dict:
    same = [hashlib.sha256(r.tobytes()).hexdigest() == h for r, h in zip(rows, meta[f"{key}_sha256"], strict=True)]
    ours = np.concatenate([np.take_along_axis(rows, arrays["top_ids"], axis=1), rows[:, arrays["sample_ids"]]], 1)
    ref = np.concatenate([arrays[f"{key}_top"], arrays[f"{key}_sample"]], axis=1)
    d = np.abs(ours - ref).max(axis=1)
    top = rows.argmax(axis=1) == arrays[f"{key}_argmax"]
    return {"identical": sum(same), "prompt_max": float(d[:64].max()), "prompt_top1": int(top[:64].sum()),
            "greedy_top1": int(top[64:].sum())}


def test_layout_exact_equals_llama_cpp_swa_cache(gemma, iswa_ref):
    meta, arrays = iswa_ref
    rows = _rows(gemma, meta, exact=True)
    assert _compare(rows, meta, arrays, "swa") == {"identical": 96, "prompt_max": 0.0, "prompt_top1": 64,
                                                   "greedy_top1": 32}


def test_default_equals_llama_cpp_full_swa_cache(gemma, iswa_ref):
    """Independent of cell placement, and within llama.cpp's own spread between its two SWA caches (the spread
    is the difference itself, since the rows are llama.cpp's swa_full=True rows)."""
    meta, arrays = iswa_ref
    rows = _rows(gemma, meta, exact=False)
    assert _compare(rows, meta, arrays, "full")["identical"] == 96
    vs_swa = _compare(rows, meta, arrays, "swa")
    spread = meta["spread"]
    assert vs_swa["prompt_max"] <= spread["prompt_max_dlogit"]
    assert vs_swa["prompt_top1"] >= spread["prompt_top1_agree"]


def test_kv_bytes_at_32k_context_are_under_a_quarter(gemma):
    """15 of Gemma 3's 18 layers keep 1024 cells instead of 32768 (no decode needed: the arrays are allocated)."""
    iswa = Context(gemma, ContextParams(n_ctx=32768)).memory_breakdown()["kv"]
    full = Context(gemma, ContextParams(n_ctx=32768, swa_full=True)).memory_breakdown()["kv"]
    assert full == 18 * 32768 * 256 * 2 * 2  # K and V, f16, one KV head of 256
    assert iswa == (3 * 32768 + 15 * 1024) * 256 * 2 * 2
    assert iswa * 4 <= full

"""The forward pass against llama.cpp's own outputs (tests/data/*/reference.json, made with llama.cpp 0c1e570).

Two ops backends run the same model code: `ReferenceOps` (llamactx/backend/reference.py), which follows the x86
kernels llama.cpp runs for every shape (docs/numerics.md) and reproduces its prompt-processing logits bit for bit,
and the default `FastOps` (llamactx/backend/fast.py), which must match it.
"""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams
from llamactx.backend.reference import ReferenceOps
from tests.conftest import reference_logits

MODELS = ["smollm", "gemma"]
OPS = ["reference", "fast"]



def _cases() -> list:
    return [pytest.param(name, ops, id=f"{name}-{ops}") for name in MODELS for ops in OPS]


def _model_and_ref(request, name):
    model = request.getfixturevalue(name)
    ref = request.getfixturevalue(name + "_ref")
    key = "smollm2" if name == "smollm" else "gemma3"
    return model, ref, key


def _ops(kind: str):
    return ReferenceOps() if kind == "reference" else None  # None: the context's default (FastOps)


@pytest.fixture(scope="module")
def results():
    """Measurements shared by the tests of this module, computed once per (what, model, ops)."""
    return {}


def _cached(results: dict, key: tuple, compute):
    if key not in results:
        results[key] = compute()
    return results[key]


def all_logits(model, tokens, ops=None, **params) -> np.ndarray:
    """Logits of every position of `tokens` decoded as one batch, flash attention off as the references were
    made (a quantized V cache needs it on) unless `params` say otherwise; tests/test_flash_attn.py checks it on.
    (n, n_vocab)"""
    params.setdefault("flash_attn", "disabled" if params.get("type_v", "f16") in ("f16", "f32") else "auto")
    ctx = Context(model, ContextParams(n_ctx=1024, n_batch=1024, n_ubatch=512, **params), ops=ops)
    batch = Batch(len(tokens))
    for i, t in enumerate(tokens):
        batch.add(t, i, (0,), True)
    assert ctx.decode(batch) == 0
    return np.array(ctx.get_logits())


def last_logit_deltas(model, ref, key, ops=None):
    """(our argmax, llama.cpp's top-1, mean |dlogit|, max |dlogit|) for each reference prompt."""
    rows = []
    for i, case in enumerate(ref["prompts"]):
        ctx = Context(model, ContextParams(n_ctx=512, flash_attn="disabled"), ops=ops)
        assert ctx.decode(Batch.get_one(case["tokens"])) == 0
        ours = ctx.get_logits_ith(-1)
        delta = np.abs(ours - reference_logits(key, i))
        rows.append((int(np.argmax(ours)), case["top20_ids"][0], float(delta.mean()), float(delta.max())))
    return rows


def perplexity(model, tokens, ops=None) -> float:
    logits = all_logits(model, tokens, ops).astype(np.float64)
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    nll = lse[:-1] - logits[np.arange(len(tokens) - 1), tokens[1:]]
    return float(np.exp(nll.mean()))


def _deltas(request, results, name, ops):
    model, ref, key = _model_and_ref(request, name)
    return _cached(results, ("deltas", name, ops), lambda: last_logit_deltas(model, ref, key, _ops(ops)))


def _ppl(request, results, name, ops) -> tuple[float, float]:
    model, ref, _ = _model_and_ref(request, name)
    ppl = _cached(results, ("ppl", name, ops), lambda: perplexity(model, ref["perplexity"]["tokens"], _ops(ops)))
    return ppl, ref["perplexity"]["ppl"]


@pytest.mark.parametrize("name, ops", _cases())
def test_last_logits_top1_equals_llama_cpp(request, results, name, ops):
    for ours, theirs, _, _ in _deltas(request, results, name, ops):
        assert ours == theirs


@pytest.mark.parametrize("name, ops", _cases())
def test_last_logits_close_to_llama_cpp(request, results, name, ops):
    for _, _, mean, worst in _deltas(request, results, name, ops):
        assert mean <= 0.15 and worst <= 1.0, (mean, worst)


@pytest.mark.parametrize("name, ops", _cases())
def test_ops_reproduce_llama_cpp_bit_for_bit(request, results, name, ops):
    """Every op follows the kernel llama.cpp runs for its shape, so the logits are identical."""
    assert [d[3] for d in _deltas(request, results, name, ops)] == [0.0] * 4
    ppl, theirs = _ppl(request, results, name, ops)
    assert ppl == pytest.approx(theirs, rel=1e-12)


@pytest.mark.parametrize("name, ops", _cases())
def test_perplexity_within_one_percent(request, results, name, ops):
    ppl, theirs = _ppl(request, results, name, ops)
    assert abs(ppl / theirs - 1) < 0.01, (ppl, theirs)


def confident_agreement(model, ref, **params) -> tuple[int, int]:
    """Teacher-forced along llama.cpp's greedy completions: (agreements, confident positions), where a position
    is confident when llama.cpp's top-1 leads its top-2 by >= 0.5."""
    agree = total = 0
    for case in ref["greedy"]:
        prompt, completion = case["prompt_tokens"], case["completion_tokens"]
        logits = all_logits(model, prompt + completion, **params)[len(prompt) - 1 :]
        for step, (ids, vals) in enumerate(zip(case["step_top5_ids"], case["step_top5_logits"], strict=True)):
            if vals[0] - vals[1] >= 0.5:
                total += 1
                agree += int(np.argmax(logits[step])) == ids[0]
    return agree, total


@pytest.mark.parametrize("name", MODELS)
def test_teacher_forced_greedy_agrees_where_confident(request, name):
    model, ref, _ = _model_and_ref(request, name)
    agree, total = confident_agreement(model, ref)
    assert total > 50
    assert agree == total


def test_q8_0_kv_cache_keeps_confident_agreement(smollm, smollm_ref):
    agree, total = confident_agreement(smollm, smollm_ref, type_k="q8_0", type_v="q8_0")
    assert agree == total


def test_q8_0_kv_cache_is_53_percent_of_f16(smollm):
    f16 = Context(smollm, ContextParams(n_ctx=1024)).memory_breakdown()["kv"]
    q8 = Context(smollm, ContextParams(n_ctx=1024, type_k="q8_0", type_v="q8_0")).memory_breakdown()["kv"]
    assert f16 == 1024 * 23040  # KERNELS.md: 23,040 bytes per token in f16
    assert q8 / f16 == pytest.approx(34 / 64)

"""The forward pass against llama.cpp's own outputs (tests/data/*/reference.json, made with llama.cpp 0c1e570)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams
from tests.conftest import reference_logits

MODELS = ["smollm", "gemma"]


def _model_and_ref(request, name):
    model = request.getfixturevalue(name)
    ref = request.getfixturevalue(name + "_ref")
    key = "smollm2" if name == "smollm" else "gemma3"
    return model, ref, key


def all_logits(model, tokens, **params) -> np.ndarray:
    """Logits of every position of `tokens` decoded as one batch. (n, n_vocab)"""
    ctx = Context(model, ContextParams(n_ctx=1024, n_batch=1024, n_ubatch=512, **params))
    batch = Batch(len(tokens))
    for i, t in enumerate(tokens):
        batch.add(t, i, (0,), True)
    assert ctx.decode(batch) == 0
    return np.array(ctx.get_logits())


# Gemma's K-quant matmuls (Q4_K, Q6_K) go through ggml's tiled / repacked kernels, whose accumulation order
# llamactx does not reproduce yet (docs/numerics.md); its logits sit at mean |dlogit| 0.17-0.42.
GEMMA_NOT_EXACT = pytest.mark.xfail(strict=True, reason="Gemma K-quant kernels not reproduced bit for bit yet")


def last_logit_deltas(model, ref, key):
    """(our argmax, llama.cpp's top-1, mean |dlogit|, max |dlogit|) for each reference prompt."""
    rows = []
    for i, case in enumerate(ref["prompts"]):
        ctx = Context(model, ContextParams(n_ctx=512))
        assert ctx.decode(Batch.get_one(case["tokens"])) == 0
        ours = ctx.get_logits_ith(-1)
        delta = np.abs(ours - reference_logits(key, i))
        rows.append((int(np.argmax(ours)), case["top20_ids"][0], float(delta.mean()), float(delta.max())))
    return rows


@pytest.mark.parametrize("name", MODELS)
def test_last_logits_top1_equals_llama_cpp(request, name):
    model, ref, key = _model_and_ref(request, name)
    for ours, theirs, _, _ in last_logit_deltas(model, ref, key):
        assert ours == theirs


@pytest.mark.parametrize("name", ["smollm", pytest.param("gemma", marks=GEMMA_NOT_EXACT)])
def test_last_logits_close_to_llama_cpp(request, name):
    model, ref, key = _model_and_ref(request, name)
    for _, _, mean, worst in last_logit_deltas(model, ref, key):
        assert mean <= 0.15 and worst <= 1.0, (mean, worst)


def perplexity(model, tokens) -> float:
    logits = all_logits(model, tokens).astype(np.float64)
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    nll = lse[:-1] - logits[np.arange(len(tokens) - 1), tokens[1:]]
    return float(np.exp(nll.mean()))


@pytest.mark.parametrize("name, bound", [("smollm", 0.05), ("gemma", 0.10)])
def test_perplexity_close_to_llama_cpp(request, name, bound):
    model, ref, _ = _model_and_ref(request, name)
    ppl = perplexity(model, ref["perplexity"]["tokens"])
    assert abs(ppl / ref["perplexity"]["ppl"] - 1) < bound, (ppl, ref["perplexity"]["ppl"])


# The target. Measured: SmolLM2 22.82 vs 23.63 (-3.4%), Gemma 9.52 vs 8.77 (+8.6%): the attention and
# K-quant paths are not yet reproduced bit for bit, and the models amplify ulps (docs/numerics.md).
@pytest.mark.xfail(strict=True, reason="attention / K-quant accumulation order not reproduced exactly yet")
@pytest.mark.parametrize("name", MODELS)
def test_perplexity_within_one_percent(request, name):
    model, ref, _ = _model_and_ref(request, name)
    ppl = perplexity(model, ref["perplexity"]["tokens"])
    assert abs(ppl / ref["perplexity"]["ppl"] - 1) < 0.01, (ppl, ref["perplexity"]["ppl"])


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

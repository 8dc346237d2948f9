"""The decode loop and the high-level LLM API: streaming, stop conditions, context shift, prompt caching."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.llm import LLM


@pytest.fixture(scope="module")
def llm(smollm):
    return LLM(smollm, n_ctx=512)


def test_greedy_completion_equals_llama_cpp(llm, smollm_ref):
    case = smollm_ref["greedy"][3]
    out = llm.complete(case["prompt_tokens"], max_tokens=24, temperature=0)
    assert out.tokens == case["completion_tokens"][:24]
    assert out.finish_reason == "length"
    assert out.text == llm.model.vocab.detokenize(out.tokens)


def _has_whole_multibyte(text: str) -> bool:
    return any(ord(ch) > 0x7F for ch in text) and "\ufffd" not in text


def test_streamed_text_equals_complete_text_with_multibyte_output(llm):
    prompt = "Translate to Japanese: good morning, my friend. Japanese:"
    # the first seed whose text has a multibyte character and only whole ones (which seed does depends on the CPU's
    # arithmetic; a sampled byte token can leave an invalid sequence, which both texts show as U+FFFD)
    seed = next(s for s in range(11, 41) if _has_whole_multibyte(llm.complete(prompt, max_tokens=40, seed=s,
                                                                              temperature=1.0).text))
    full = llm.complete(prompt, max_tokens=40, seed=seed, temperature=1.0)
    chunks = list(llm.complete(prompt, max_tokens=40, seed=seed, temperature=1.0, stream=True))
    assert "".join(c.text for c in chunks) == full.text
    assert llm.result.tokens == full.tokens
    assert any(ord(ch) > 0x7F for ch in full.text), full.text  # the case is meaningful
    assert all("\ufffd" not in c.text for c in chunks)


def test_stop_string_is_not_emitted(llm):
    out = llm.complete("1, 2, 3, 4, 5,", max_tokens=40, temperature=0, stop=[" 9"])
    assert out.finish_reason == "stop" and out.stop_word == " 9"
    assert out.text == " 6, 7, 8,"


def test_eog_stops_with_reason_stop(llm, smollm_ref):
    case = smollm_ref["greedy"][2]  # a chat prompt: llama.cpp stops at EOS after "1. Red\n2. Blue\n3. Green"
    out = llm.complete(case["prompt_tokens"], max_tokens=100, temperature=0)
    assert out.finish_reason == "stop" and out.stop_word is None
    assert out.text == case["completion_text"]


def test_context_full_is_length_or_shifts(smollm):
    small = LLM(smollm, n_ctx=256)
    prompt = small.tokenize("Count: 1, 2, 3, 4, 5,")
    out = small.complete(prompt, max_tokens=400, temperature=0)
    # the last token is sampled from a full context and not stored: n_ctx + 1 tokens in all
    assert out.finish_reason == "length" and len(prompt) + len(out.tokens) == 257
    shifted = small.complete(prompt, max_tokens=300, temperature=0, context_shift=True, n_keep=4)
    assert shifted.finish_reason == "length" and len(shifted.tokens) == 300
    assert len(small.tokens) < 256
    assert small.ctx.memory.seq_pos_max(0) == len(small.tokens) - 1


def test_chat_reuses_the_previous_turn(llm):
    llm.reset()
    messages = [{"role": "user", "content": "Name three colors, as a numbered list."}]
    first = llm.chat(messages, temperature=0, max_tokens=30)
    assert first.text == "1. Red\n2. Blue\n3. Green"
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And one animal?"}]
    second = llm.chat(messages, temperature=0, max_tokens=30)
    assert second.timings.cached_n > 30 and second.timings.prompt_n < 20
    assert second.text


def test_same_seed_same_text_different_seed_differs(llm):
    a = llm.complete("Once upon a time", max_tokens=16, seed=5, temperature=1.0)
    b = llm.complete("Once upon a time", max_tokens=16, seed=5, temperature=1.0)
    c = llm.complete("Once upon a time", max_tokens=16, seed=6, temperature=1.0)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_embed_is_normalised_and_meaningful(llm):
    e = llm.embed(["The cat sat on the mat.", "A cat was sitting on a mat.", "Stock markets fell sharply."])
    assert e.shape == (3, llm.model.hparams.n_embd)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1, rtol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2]


def test_bad_options_are_rejected(llm):
    with pytest.raises(TypeError, match="unknown sampling option"):
        llm.complete("x", max_tokens=1, temprature=0.5)
    with pytest.raises(ValueError, match="top_p"):
        llm.complete("x", max_tokens=1, top_p=1.5)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.complete([], max_tokens=1)

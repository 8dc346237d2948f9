"""What llama-cpp-python's own tests do not reach: the disk cache, chat handlers and formats, and llama.h's
functions with C's calling conventions (out-buffers, negative sizes, the sampler chain), on a tiny model."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import llama_chat_format

TINY = Path(__file__).parent.parent / "data" / "tiny" / "tiny-llama3.gguf"


def tiny(**kw) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(TINY), n_ctx=64, n_batch=64, n_ubatch=64, verbose=False, **kw)


def test_disk_cache_restores_the_prompt_state(tmp_path):
    prompt = "The quick brown fox"
    expected = tiny().create_completion(prompt, max_tokens=4, temperature=0.0)["choices"][0]["text"]
    cache = llama_cpp.LlamaDiskCache(cache_dir=str(tmp_path / "cache"))
    writer = tiny()
    writer.set_cache(cache)
    writer.create_completion(prompt, max_tokens=4, temperature=0.0)
    reopened = llama_cpp.LlamaDiskCache(cache_dir=str(tmp_path / "cache"))  # the index survives the process
    tokens = writer.tokenize(prompt.encode())
    assert tokens in reopened and cache.cache_size > 0
    reader = tiny()
    reader.set_cache(reopened)
    loads = []
    original = reader.load_state
    reader.load_state = lambda state: (loads.append(state.n_tokens), original(state))
    assert reader.create_completion(prompt, max_tokens=4, temperature=0.0)["choices"][0]["text"] == expected
    assert loads and loads[0] >= len(tokens)


def test_chat_handler_of_a_named_format_completes_its_prompt():
    llm = tiny(chat_handler=llama_chat_format.get_chat_completion_handler("chatml"))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = llama_chat_format.format_chatml(messages).prompt
    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    chat = llm.create_chat_completion(messages=messages, max_tokens=5, temperature=0.0)
    plain = llm.create_completion(llm.tokenize(prompt.encode(), add_bos=True, special=True), max_tokens=5,
                                  temperature=0.0, stop=["<|im_end|>"])
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["content"] == plain["choices"][0]["text"]
    with pytest.raises(ValueError, match="chat format 'nope'"):
        llama_chat_format.get_chat_completion_handler("nope")


def test_low_level_buffers_and_sampler_chain():
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(TINY).encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    text = b"The quick brown fox"
    buf = (ctypes.c_int32 * 4)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, 4, True, False)
    assert n < -4  # too small: minus the count, as llama.h
    buf = (llama_cpp.llama_token * -n)()  # llama.h's typedef, as llama-cpp-python binds it (c_int32)
    assert llama_cpp.llama_tokenize(vocab, text, len(text), buf, -n, True, False) == -n
    tokens = list(buf)
    piece = ctypes.create_string_buffer(32)
    k = llama_cpp.llama_token_to_piece(vocab, tokens[1], piece, 32, 0, False)
    assert 0 < k and piece.raw[:k] == vocab.token_to_piece(tokens[1])
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = 64
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens)) == 0
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    logits = np.array(llama_cpp.llama_get_logits_ith(ctx, -1))
    assert llama_cpp.llama_sampler_sample(chain, ctx, -1) == int(np.argmax(logits))
    state = bytearray(llama_cpp.llama_state_get_size(ctx))
    assert llama_cpp.llama_state_get_data(ctx, state, len(state)) == len(state)
    mem = llama_cpp.llama_get_memory(ctx)
    assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == len(tokens) - 1
    assert llama_cpp.llama_memory_seq_rm(mem, 0, 2, -1) and llama_cpp.llama_memory_seq_pos_max(mem, 0) == 1
    assert llama_cpp.llama_state_set_data(ctx, state, len(state)) == len(state)
    assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == len(tokens) - 1
    with pytest.raises(NotImplementedError, match="llama_numa_init"):
        llama_cpp.llama_numa_init(0)
    assert not hasattr(llama_cpp, "llama_model_get_tensor")
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


def test_logits_all_scores_and_prompt_lookup_drafts_keep_greedy_outputs():
    tokens = tiny().tokenize(b"The quick brown fox jumps over the lazy dog. The quick brown fox")
    plain, every_row = tiny(), tiny(logits_all=True)
    plain.eval(tokens)
    every_row.eval(tokens)
    assert every_row.scores.shape[0] == every_row.n_ctx() and plain.scores.shape[0] == plain.n_batch
    np.testing.assert_array_equal(every_row.scores[len(tokens) - 1], plain._ctx.ctx.get_logits_ith(-1))
    assert np.abs(every_row.scores[: len(tokens)]).min(axis=1).max() > 0  # every position's row was filled

    def first(llm, n=12):
        out = []
        for t in llm.generate(tokens, temp=0.0):
            out.append(t)
            if len(out) == n:
                return out

    drafted = tiny(draft_model=llama_cpp.LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=4))
    assert drafted._logits_all  # drafts need every row's logits, as llama-cpp-python sets
    assert first(drafted) == first(tiny())


def test_chat_format_names_are_checked_when_made():
    with pytest.raises(ValueError, match="chat template 'nope'"):
        tiny(chat_format="nope")
    with pytest.raises(ValueError, match="functionary"):
        tiny(chat_format="functionary-v2")
    assert tiny(chat_format="chatml-function-calling")._runtime.template.source  # chatml, see test_llama_api


def test_chat_handler_gets_the_keywords_llama_cpp_python_passes():
    """A chat_handler is called as llama-cpp-python 0.3.36 calls it (llama.py create_chat_completion's
    `handler(llama=self, ...)`, read with ast): the same keywords, none of llamactx's additions
    (reasoning_format), and its answer is returned as is."""
    import ast

    from tests.conftest import LLAMACPP_SDIST

    path = LLAMACPP_SDIST / "llama_cpp" / "llama.py"
    if not path.exists():
        pytest.fail(f"{path} is missing: `make test` unpacks llama-cpp-python 0.3.36's sdist there")
    call = next(n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "handler")
    upstream = {k.arg for k in call.keywords}
    seen = {}

    def handler(**kwargs):
        seen.update(kwargs)
        return {"answer": 42}

    llm = tiny(chat_handler=handler)
    assert llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=3) == {"answer": 42}
    assert set(seen) == upstream and seen["llama"] is llm and seen["max_tokens"] == 3

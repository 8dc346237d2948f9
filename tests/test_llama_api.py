"""llama-cpp-python's own high-level tests and README examples, ported to this repository's `llama_cpp`
package (llama_cpp/ on llamactx) with the embedded SmolLM2 instead of their downloads, so expected texts are
SmolLM2's (tests/llama_cpp_compat runs the upstream files themselves). The OpenAI shapes are checked against
the `openai` package's types."""

from __future__ import annotations

import json
import multiprocessing

import jsonschema
import llama_cpp
import numpy as np
import openai.types as oai
import openai.types.chat as oai_chat
import pytest

MODEL = "smollm2"


@pytest.fixture(scope="module")
def model():
    return llama_cpp.Llama(MODEL, n_ctx=512, n_batch=32, n_ubatch=32, n_threads=multiprocessing.cpu_count(),
                           n_threads_batch=multiprocessing.cpu_count(), logits_all=False, flash_attn=False,
                           verbose=False)


def test_llama_cpp_tokenization():  # tests/test_llama.py, on SmolLM2's vocabulary
    llama = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
    text = b"Hello World"
    tokens = llama.tokenize(text)
    assert tokens == [19556, 2260]  # SmolLM2 adds no BOS
    assert llama.detokenize(tokens) == text
    text = b"Hello World<|im_end|>"
    assert llama.tokenize(text)[-1] != llama.token_eos()
    assert llama.tokenize(text, special=True)[-1] == llama.token_eos()
    assert llama.tokenize(b"", add_bos=True, special=True) == []


def test_real_llama(model):  # tests/test_llama.py test_real_llama
    output = model.create_completion("The quick brown fox jumps over the lazy dog. The quick brown fox",
                                     max_tokens=6, top_k=50, top_p=0.9, temperature=0.0, seed=1337)
    assert output["choices"][0]["text"] == " is a classic example of a"
    oai.Completion.model_validate(output)

    output = model.create_completion("The capital of france is paris, 'true' or 'false'?:\n", max_tokens=4,
                                     top_k=50, top_p=0.9, temperature=0.8, seed=1337,
                                     grammar=llama_cpp.LlamaGrammar.from_string('root ::= "true" | "false"'))
    assert output["choices"][0]["text"] == "true"

    suffix = b"rot"
    tokens = model.tokenize(suffix, add_bos=True, special=True)

    def logit_processor_func(input_ids, logits):
        for token in tokens:
            logits[token] *= 1000
        return logits

    output = model.create_completion("The capital of france is par", max_tokens=4, top_k=50, top_p=0.9,
                                     temperature=0.8, seed=1337,
                                     logits_processor=llama_cpp.LogitsProcessorList([logit_processor_func]))
    assert output["choices"][0]["text"].lower().startswith("rot")

    model.set_seed(1337)
    state = model.save_state()
    numbers = 'root ::= "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" | "10"'

    def pick():
        return model.create_completion("Pick a number from 1 to 10?:\n", max_tokens=4, top_k=50, top_p=0.9,
                                       temperature=1.0, grammar=llama_cpp.LlamaGrammar.from_string(numbers)
                                       )["choices"][0]["text"]

    picks = [pick() for _ in range(4)]
    model.load_state(state)
    assert pick() == picks[0]
    assert len(set(picks)) > 1  # the seed moves on between completions


def test_real_llama_repeated_prompt_cache(model):  # tests/test_llama.py
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    output_1 = model.create_completion(prompt, max_tokens=6, temperature=0.0, seed=1337)
    output_2 = model.create_completion(prompt, max_tokens=6, temperature=0.0, seed=1337)
    assert output_1["choices"][0]["text"] == " is a classic example of a"
    assert output_2["choices"][0]["text"] == output_1["choices"][0]["text"]
    assert output_2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_shorter_prompt_prefix_reuse_matches_fresh(model):  # tests/test_llama.py, the transformer case
    fresh = llama_cpp.Llama(MODEL, n_ctx=512, verbose=False)
    long_prompt, short_prompt = "The quick brown fox jumps over the lazy", "The quick brown fox"
    model.create_completion(long_prompt, max_tokens=1, temperature=0.0)
    reused = model.create_completion(short_prompt, max_tokens=4, temperature=0.0)
    assert reused["choices"][0]["text"] == fresh.create_completion(short_prompt, max_tokens=4,
                                                                  temperature=0.0)["choices"][0]["text"]


def test_stopping_criteria_and_stream_chunks(model):
    def stop_after_comma(input_ids, logits):
        return model.detokenize(input_ids[-1:]).endswith(b",")

    out = model("1, 2, 3,", max_tokens=20, temperature=0,
                stopping_criteria=llama_cpp.StoppingCriteriaList([stop_after_comma]))
    assert out["choices"][0]["text"] == " 4," and out["choices"][0]["finish_reason"] == "stop"
    chunks = list(model("1, 2, 3,", max_tokens=6, temperature=0, stream=True, logprobs=2))
    oai.Completion.model_validate(chunks[-1])  # the SDK's type wants a finish_reason: only the last has one
    assert "".join(c["choices"][0]["text"] for c in chunks) == " 4, 5,"  # six tokens
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(len(c["choices"][0]["logprobs"]["top_logprobs"][0]) == 2 for c in chunks[:-1]
               if c["choices"][0]["logprobs"])


def test_readme_completion_with_echo_and_stop(model):  # README: "Q: Name the planets ..."
    output = model("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\n"], echo=True,
                   temperature=0)
    text = output["choices"][0]["text"]
    assert text.startswith("Q: Name the planets in the solar system? A: ") and "\n" not in text
    assert output["object"] == "text_completion" and output["usage"]["completion_tokens"] <= 32


def test_readme_chat_and_json_modes(model):  # README: chat completion, JSON mode, JSON schema mode
    chat = model.create_chat_completion(messages=[
        {"role": "system", "content": "You are an assistant who perfectly describes images."},
        {"role": "user", "content": "Describe this image in detail please."}], max_tokens=24, temperature=0)
    oai_chat.ChatCompletion.model_validate(chat)
    assert chat["choices"][0]["message"]["role"] == "assistant" and chat["choices"][0]["message"]["content"]
    def finished(**kw):  # the first seeded answer that ends before max_tokens (which one depends on the CPU)
        for seed in range(3, 13):
            out = model.create_chat_completion(temperature=0.7, max_tokens=96, seed=seed, **kw)
            if out["choices"][0]["finish_reason"] == "stop":
                return out["choices"][0]["message"]["content"]
        raise AssertionError("no seed finished its JSON within 96 tokens")

    content = finished(messages=[{"role": "system", "content": "You are a helpful assistant that outputs in JSON."},
                                 {"role": "user", "content": "Who won the world series in 2020"}],
                       response_format={"type": "json_object"})
    assert isinstance(json.loads(content), dict)
    schema = {"type": "object", "properties": {"team_name": {"type": "string"}}, "required": ["team_name"]}
    content = finished(messages=[{"role": "user", "content": "Who won the world series in 2020"}],
                       response_format={"type": "json_object", "schema": schema})
    jsonschema.validate(json.loads(content), schema)


def test_readme_function_calling(model):  # README: function calling with tool_choice
    out = model.create_chat_completion(
        messages=[{"role": "user", "content": "Extract Jason is 25 years old"}],
        tools=[{"type": "function", "function": {
            "name": "UserDetail", "parameters": {"type": "object", "title": "UserDetail", "properties": {
                "name": {"title": "Name", "type": "string"}, "age": {"title": "Age", "type": "integer"}},
                "required": ["name", "age"]}}}],
        tool_choice={"type": "function", "function": {"name": "UserDetail"}}, temperature=0, max_tokens=64)
    oai_chat.ChatCompletion.model_validate(out)
    call = out["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "UserDetail" and out["choices"][0]["finish_reason"] == "tool_calls"
    args = json.loads(call["function"]["arguments"])
    assert isinstance(args["name"], str) and isinstance(args["age"], int)


def test_chat_stream_and_logprobs_validate(model):
    chunks = list(model.create_chat_completion(messages=[{"role": "user",
                                                          "content": "Name three colors, as a numbered list."}],
                                               temperature=0, stream=True, logprobs=True, top_logprobs=2))
    for c in chunks:
        oai_chat.ChatCompletionChunk.model_validate(c)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "1. Red\n2. Blue\n3. Green"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_real_llama_embeddings():  # tests/test_llama.py, on SmolLM2's hidden states
    # a decoder's pooling is "none" unless asked (llama.cpp's default): one vector per token, not normalised
    tokens = llama_cpp.Llama(MODEL, n_ctx=32, n_batch=32, n_ubatch=32, embedding=True, verbose=False)
    per_token = tokens.embed("Hello World")
    assert len(per_token) == 2 and all(len(v) == 576 for v in per_token)
    model = llama_cpp.Llama(MODEL, n_ctx=32, n_batch=32, n_ubatch=32, embedding=True, verbose=False,
                            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    embedding = model.embed("Hello World")
    assert len(embedding) == 576
    np.testing.assert_allclose(embedding, np.mean(per_token, axis=0), rtol=1e-5, atol=1e-5)
    assert abs(np.linalg.norm(embedding) - 1.0) > 1e-3  # not normalised unless asked
    assert np.linalg.norm(model.embed("Hello World", normalize=True)) == pytest.approx(1.0, abs=1e-5)
    prompts = ["Hello World", "A different prompt"]
    individual = [model.embed(p) for p in prompts]
    batched = model.embed(prompts)
    assert len(batched) == len(prompts)
    for one, many in zip(individual, batched, strict=True):
        np.testing.assert_allclose(many, one, rtol=1e-4, atol=1e-4)
    created = model.create_embedding(prompts)
    oai.CreateEmbeddingResponse.model_validate(created)
    assert created["data"][1]["embedding"] == model.embed(prompts[1])  # not normalised, as llama-cpp-python


def test_bad_options_raise_value_errors_naming_them(model):
    with pytest.raises(ValueError, match="top_p"):
        model("x", top_p=3.0)
    with pytest.raises(ValueError, match="outside the vocab"):
        model([1, 10**9])


def test_real_model_low_level_on_smollm2():  # tests/test_llama.py test_real_model, SmolLM2's token ids
    import llama_cpp._internals as internals

    from llamactx.embedded import smollm2_path

    params = llama_cpp.llama_model_default_params()
    assert not llama_cpp.llama_supports_mlock() and llama_cpp.llama_supports_mmap()
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
    model = internals.LlamaModel(path_model=str(smollm2_path()), params=params)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 32
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    context = internals.LlamaContext(model=model, params=cparams)
    assert model.tokenize(b"Hello, world!", add_bos=True, special=True) == [19556, 28, 905, 17]
    tokens = model.tokenize(b"The quick brown fox jumps over the lazy dog. The quick brown fox", True, True)
    batch = internals.LlamaBatch(n_tokens=len(tokens), embd=0, n_seq_max=1)
    sampler = internals.LlamaSampler()
    sampler.add_greedy()
    result, n_eval, step = [], 0, tokens
    for _ in range(6):
        batch.set_batch(step, n_past=n_eval, logits_all=False)
        context.decode(batch)
        n_eval += len(step)
        step = [sampler.sample(context, -1)]
        result += step
    assert model.detokenize(result) == b" is a classic example of a"  # = Llama.create_completion's, temp 0
    with pytest.raises(ValueError, match="load_mode"):
        params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MLOCK
        llama_cpp.llama_model_load_from_file(str(smollm2_path()), params)
    with pytest.raises(AttributeError, match="llama_cpp.llama_model_get_tensor"):
        llama_cpp.llama_cpp.llama_model_get_tensor  # noqa: B018 -- a llama.h name llamactx lacks
    model.close()
    assert context.ctx is None


def test_token_level_generate_matches_completion_and_reuses_prefix(model):
    tokens = model.tokenize(b"The quick brown fox jumps over the lazy dog. The quick brown fox")
    out = []
    for token in model.generate(tokens, temp=0.0):
        out.append(token)
        if len(out) == 6:
            break
    assert model.detokenize(out) == b" is a classic example of a"
    assert model.n_tokens == len(tokens) + 5 and model.input_ids[: len(tokens)].tolist() == tokens
    model.eval(out[-1:])  # the last sampled token, then a completion of the same text reuses all of it
    text = model.create_completion(tokens + out, max_tokens=1, temperature=0.0)
    assert text["usage"]["prompt_tokens_details"]["cached_tokens"] == len(tokens) + 5


def test_constructor_options_are_honoured_or_refused_by_name():
    with pytest.raises(ValueError, match="use_mlock"):
        llama_cpp.Llama(MODEL, use_mlock=True, verbose=False)
    with pytest.raises(ValueError, match="kv_overrides"):
        llama_cpp.Llama(MODEL, kv_overrides={"x": 1}, verbose=False)
    with pytest.raises(ValueError, match="pooling_type"):
        llama_cpp.Llama(MODEL, pooling_type=9, verbose=False)
    with pytest.raises(TypeError, match="n_ctxx"):
        llama_cpp.Llama(MODEL, n_ctxx=64, verbose=False)
    small = llama_cpp.Llama(MODEL, n_ctx=64, verbose=False)  # n_batch at most n_ctx, n_ubatch at most n_batch
    assert small.n_batch == 64 and (small._ctx.ctx.params.n_batch, small._ctx.ctx.params.n_ubatch) == (64, 64)
    llm = llama_cpp.Llama(MODEL, verbose=False)
    assert llm.n_ctx() == 512 and llm._ctx.ctx.params.flash_attn is False  # llama-cpp-python's defaults
    import pickle

    again = pickle.loads(pickle.dumps(llm))
    assert again.n_ctx() == 512 and again.model_path == llm.model_path
    llm.close()
    with pytest.raises(RuntimeError, match="closed"):
        llm.eval([1])


def test_chatml_function_calling_format_returns_tool_calls():  # llama-cpp-python's chat_format name
    llm = llama_cpp.Llama(MODEL, n_ctx=512, chat_format="chatml-function-calling", verbose=False)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    choice = {"type": "function", "function": {"name": "get_weather"}}
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                     tools=[tool], tool_choice=choice, max_tokens=48, temperature=0.0)
    call = out["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"])["city"], str)
    assert out["choices"][0]["finish_reason"] == "tool_calls"

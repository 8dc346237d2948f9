"""The official `openai` client against the real server: models, completions, chat (stream and not), embeddings,
n=2, logprobs, JSON-schema output that validates, usage and streaming equal to the whole."""

from __future__ import annotations

import base64
import json

import jsonschema
import numpy as np
import openai
import pytest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_models_lists_the_alias(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]


def test_completion_is_llama_cpp_greedy_text(client, smollm, smollm_ref):
    case = smollm_ref["greedy"][3]
    out = client.completions.create(model="smollm2", prompt=case["prompt_tokens"], max_tokens=24, temperature=0)
    assert out.choices[0].text == smollm.vocab.detokenize(case["completion_tokens"][:24])
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(case["prompt_tokens"]) and out.usage.completion_tokens == 24


def test_chat_stream_equals_chat_and_stops(client):
    messages = [{"role": "user", "content": "Name three colors, as a numbered list."}]
    whole = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=40)
    assert whole.choices[0].message.content == "1. Red\n2. Blue\n3. Green"
    assert whole.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=40,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streamed_text_never_splits_a_character(client):
    prompt = "Translate to Japanese: good morning, my friend. Japanese:"
    for seed in range(11, 41):  # the first seed whose text has whole multibyte characters (it depends on the CPU)
        kw = dict(model="smollm2", prompt=prompt, max_tokens=40, temperature=1.0, seed=seed)
        whole = client.completions.create(**kw).choices[0].text
        if any(ord(ch) > 0x7F for ch in whole) and "\ufffd" not in whole:
            break
    parts = [c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(parts) == whole and any(ord(ch) > 0x7F for ch in whole)
    assert all("\ufffd" not in p for p in parts)


def test_n_choices_share_the_prompt(client, server):
    before = server.state.engine.stats.n_prompt_tokens
    prompt = "Once upon a time, in a land far away, there lived a king who had three daughters. " * 3
    out = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12, temperature=0.9, seed=3, n=3)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert len({c.text for c in out.choices}) == 3  # consecutive seeds
    assert out.usage.completion_tokens == 36
    # the prompt is decoded once: the other choices share its cells (each decodes only its last token)
    assert server.state.engine.stats.n_prompt_tokens - before <= out.usage.prompt_tokens + 2


def test_embeddings_float_and_base64(client):
    texts = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Stock markets fell sharply."]
    floats = client.embeddings.create(model="smollm2", input=texts)
    vecs = np.array([d.embedding for d in floats.data], np.float32)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1, rtol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    b64 = client.embeddings.create(model="smollm2", input=texts[0], encoding_format="base64")
    raw = b64.data[0].embedding
    decoded = np.frombuffer(base64.b64decode(raw), "<f4") if isinstance(raw, str) else np.array(raw, np.float32)
    np.testing.assert_array_equal(decoded, vecs[0])


def test_completion_logprobs(client):
    out = client.completions.create(model="smollm2", prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 4 and "".join(lp.tokens) == out.choices[0].text
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(len(t) == 3 and max(t.values()) == pytest.approx(p) for t, p in zip(lp.top_logprobs,
                                                                                   lp.token_logprobs, strict=True))


def test_chat_logprobs(client):
    out = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert "".join(c.token for c in content) == out.choices[0].message.content


def test_json_schema_output_validates(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    out = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give a person's name and age as JSON."}],
        max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)


def test_bad_requests_raise_the_client_error(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="smollm2", prompt="x", max_tokens=4, temperature=-1)
    assert info.value.status_code == 400 and "temperature" in str(info.value)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "x"}], top_p=7)


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_tool_call_is_parsed_into_tool_calls(client, stream):
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=WEATHER, tool_choice="required", temperature=0, max_tokens=64)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        pieces = [tc for d in deltas for tc in d.tool_calls or []]  # the name with "{", then the arguments
        assert {tc.index for tc in pieces} == {0} and pieces[0].function.arguments == "{" and len(pieces) > 2
        calls = [(pieces[0].function.name, "".join(tc.function.arguments or "" for tc in pieces))]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        out = client.chat.completions.create(**kw)
        calls = [(c.function.name, c.function.arguments) for c in out.choices[0].message.tool_calls]
        finish = [out.choices[0].finish_reason]
    assert finish == ["tool_calls"] and len(calls) == 1
    assert calls[0][0] == "get_weather" and isinstance(json.loads(calls[0][1])["city"], str)

"""Ollama's API (/api/*) through Ollama's own Python client (`ollama` on PyPI) against a real server: chat,
generate, streaming, structured output, tools, embeddings, the listing routes, keep_alive, errors; the same
requests give the same texts as the OpenAI routes. The translation's pure parts (options, durations, names,
thinking pieces) are checked without a server."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import httpx
import jsonschema
import ollama
import pytest

from llamactx import chat_parse
from llamactx.api import ollama as O
from llamactx.api import protocol as P
from llamactx.api import responses as R
from llamactx.api.ollama_responses import ChatRenderer, GenerateRenderer
from llamactx.engine import Chunk
from llamactx.server.lifecycle import Lifecycle, Phase
from tests.server.conftest import running_server

SAY = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0, "seed": 7, "num_predict": 8}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PERSON = {"type": "object", "properties": {"age": {"type": "integer"}, "available": {"type": "boolean"}},
          "required": ["age", "available"], "additionalProperties": False}


@pytest.fixture(scope="module")
def srv():
    with running_server(model="smollm2", alias="smollm2", n_slots=2, n_ctx=2048) as running:
        yield running


@pytest.fixture(scope="module")
def client(srv):
    return ollama.Client(host=srv.url, timeout=300)


def _openai_chat(srv, **body) -> dict:
    with srv.client() as http:
        res = http.post("/v1/chat/completions", json={"max_tokens": GREEDY["num_predict"], "temperature": 0,
                                                      "seed": GREEDY["seed"], **body})
    assert res.status_code == 200, res.text
    return res.json()["choices"][0]


# -- without a server -------------------------------------------------------------------------------------------


def test_keep_alive_durations_are_ollamas():
    assert O.keep_alive_seconds(None) is None
    assert O.keep_alive_seconds(0) == 0 and O.keep_alive_seconds("0") == 0
    assert O.keep_alive_seconds(90) == 90 and O.keep_alive_seconds("90") == 90
    assert O.keep_alive_seconds("5m") == 300 and O.keep_alive_seconds("1h30m") == 5400
    assert O.keep_alive_seconds("250ms") == pytest.approx(0.25)
    assert O.keep_alive_seconds(-1) == -1 and O.keep_alive_seconds("-5m") == -1  # negative: forever
    for bad in ("soon", "5 minutes", True, [1]):
        with pytest.raises(P.ProtocolError, match="keep_alive"):
            O.keep_alive_seconds(bad)


def test_options_map_onto_samplers_and_load_options_are_honoured_or_refused():
    fixed = {"num_ctx": 2048, "num_thread": 2, "use_mmap": True}
    fields = O.options_fields({"num_predict": 5, "temperature": 0.5, "top_k": 3.0, "stop": "\n", "min_p": 0.1,
                               "repeat_penalty": 1.1, "num_keep": 4, "seed": 9, "num_ctx": 2048,
                               "tfs_z": 1.0, "penalize_newline": False, "mirostat": None}, fixed)
    assert fields == {"n_predict": 5, "temperature": 0.5, "top_k": 3, "stop": ["\n"], "min_p": 0.1,
                      "repeat_penalty": 1.1, "n_keep": 4, "seed": 9}
    assert O.options_fields({"num_predict": -2}, fixed) == {"n_predict": -1}  # -2: until the context is full
    refusals = [({"num_ctx": 8192}, 'option "num_ctx" = 8192 cannot change per request: this server runs '
                                    "num_ctx = 2048"),
                ({"num_gpu": 1}, 'option "num_gpu" = 1: llamactx has no such setting'),
                ({"top_k": "x"}, 'option "top_k" must be of type integer'),
                ({"top_k": 2.5}, 'option "top_k" must be of type integer'),
                ({"temperature": True}, 'option "temperature" must be of type float'),
                ({"stop": [1]}, 'option "stop" must be of type array of strings'),
                ({"tfs_z": 0.9}, 'option "tfs_z" = 0.9: llama.cpp no longer has this sampler'),
                ({"top_p": 2.0}, 'option "top_p": Input should be less than or equal to 1'),
                ({"bogus": 1}, 'option "bogus" is not an option llamactx knows'),
                ([1], "options must be an object")]
    for options, message in refusals:
        with pytest.raises(P.ProtocolError, match=message.replace("(", r"\(")) as e:
            O.options_fields(options, fixed)
        assert e.value.status == 400


def test_model_names_are_name_colon_tag():
    assert O.names_of(["smollm2", "qwen:0.5b", "ns/m"]) == ["smollm2:latest", "qwen:0.5b", "ns/m:latest"]
    assert O.model_name("smollm2", ["smollm2"]) == "smollm2"
    assert O.model_name("SmolLM2:latest", ["smollm2"]) == "smollm2"
    with pytest.raises(P.ProtocolError, match="model 'smollm2:7b' not found") as e:
        O.model_name("smollm2:7b", ["smollm2"])
    assert e.value.status == 404
    with pytest.raises(P.ProtocolError, match="model is required"):
        O.model_name("", ["smollm2"])


def test_thinking_and_content_stream_as_ollama_pieces():
    """A thinking model's reply, parsed as the chat endpoint parses it, as Ollama's message.thinking / thinking
    pieces and the whole (a template that writes <think> blocks)."""
    source = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{# <think> </think> #}")
    assert O.thinks(source) and not O.thinks("{{ messages }}")
    params = chat_parse.chat_params(source, "<|im_start|>assistant\n")
    seq = SimpleNamespace(timings=SimpleNamespace(prompt_ms=30.0, predicted_ms=50.0), n_prompt=3, n_output=5,
                          finish_reason="stop", tokens=[1, 2, 3])
    for renderer_cls, field in ((ChatRenderer, "message"), (GenerateRenderer, "response")):
        renderer = renderer_cls("m", None, "prompt", None, name="m:latest", parse=params, t0=time.monotonic())
        c = R.Choice(0, seq=seq)
        out = []
        for piece in ["<thi", "nk>pl", "an</th", "ink>\n\nHel", "lo!"]:
            c.add([Chunk(5, piece)], False)
            out += renderer.delta(c, [])
        c.done = True
        out += renderer.last(c)
        parts = [o["message"] if field == "message" else o for o in out]
        assert "".join(p.get("thinking", "") for p in parts) == "plan"
        assert "".join(p["content" if field == "message" else "response"] for p in parts) == "Hello!"
        assert [o["done"] for o in out] == [False] * (len(out) - 1) + [True] and out[-1]["done_reason"] == "stop"
        assert out[-1]["eval_duration"] == 50_000_000 and out[-1]["prompt_eval_count"] == 3
        whole = renderer.response([c])
        body = whole["message"] if field == "message" else whole
        assert body["thinking"] == "plan" and body[field if field == "response" else "content"] == "Hello!"
        assert (whole.get("context") == [1, 2, 3]) == (field == "response")


def test_keep_alive_sets_how_long_the_lifecycle_stays_loaded_once_idle():
    """server/lifecycle.py without a model: a release's keep_alive (0: now, < 0: never) overrides
    --sleep-idle-seconds until a release without one."""
    loads, unloads = [], []
    lc = Lifecycle(lambda: loads.append(1) or True, lambda: unloads.append(1), lambda: False, idle_s=-1)
    lc.start()
    try:
        for keep, sleeps in ((-1, False), (None, False), (0, True)):
            lc.hold()  # wakes it when asleep
            assert lc.phase is Phase.READY and lc.expires_in() in (None, 0.0)
            lc.release(keep)
            deadline = time.monotonic() + 5
            while sleeps and not lc.is_sleeping and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # a watcher would have acted by now
            assert lc.is_sleeping == sleeps and len(unloads) == int(sleeps)
        lc.hold()
        lc.release(30)
        assert 29 < lc.expires_in() <= 30 and not lc.is_sleeping and len(loads) == 2  # woken once
    finally:
        lc.stop()


# -- through the client ------------------------------------------------------------------------------------------


def test_chat_matches_the_openai_route(srv, client):
    res = client.chat(model="smollm2", messages=SAY, options=GREEDY, stream=False, logprobs=True, top_logprobs=2)
    openai = _openai_chat(srv, messages=SAY, logprobs=True, top_logprobs=2)
    assert res.message.role == "assistant" and res.message.content == openai["message"]["content"]
    assert res.message.content and res.done and res.done_reason == openai["finish_reason"]
    assert res.model == "smollm2" and res.eval_count == GREEDY["num_predict"] and res.prompt_eval_count > 5
    assert 0 < res.eval_duration < res.total_duration and res.prompt_eval_duration > 0
    want = openai["logprobs"]["content"]
    assert [(lp.token, len(lp.top_logprobs)) for lp in res.logprobs] == [(w["token"], 2) for w in want]
    assert [lp.logprob for lp in res.logprobs] == pytest.approx([w["logprob"] for w in want], abs=1e-5)
    # sampled, with the same seed: the options reach the same sampler chain as the OpenAI fields
    sampled = {"temperature": 1.2, "seed": 42, "top_k": 30, "top_p": 0.9, "min_p": 0.02, "repeat_penalty": 1.1}
    mine = client.chat(model="smollm2", messages=SAY, options={**sampled, "num_predict": 8}).message.content
    theirs = _openai_chat(srv, messages=SAY, **sampled)["message"]["content"]
    assert mine == theirs and mine != res.message.content
    created = datetime.fromisoformat(res.created_at.replace("Z", "+00:00"))
    assert abs((datetime.now(timezone.utc) - created).total_seconds()) < 60


def test_chat_stream_is_ndjson_pieces_then_done(srv, client):
    parts = list(client.chat(model="smollm2:latest", messages=SAY, options=GREEDY, stream=True, logprobs=True))
    whole = client.chat(model="smollm2", messages=SAY, options=GREEDY, stream=False)
    assert len(parts) > 2 and all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].message.content == "" and parts[-1].done_reason == whole.done_reason
    assert parts[-1].eval_count == whole.eval_count and parts[-1].model == "smollm2:latest"
    streamed = [lp for p in parts for lp in p.logprobs or []]  # each piece carries its tokens' logprobs
    assert len(streamed) == whole.eval_count and "".join(lp.token for lp in streamed) == whole.message.content
    with httpx.stream("POST", srv.url + "/api/chat", json={"model": "smollm2", "messages": SAY,
                                                           "options": GREEDY}) as res:
        assert res.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in res.iter_lines() if line]
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]


def test_generate_matches_chat_and_raw_matches_completions(srv, client):
    prompt = "The capital of France is"
    res = client.generate(model="smollm2", prompt=prompt, options=GREEDY)
    chat = _openai_chat(srv, messages=[{"role": "user", "content": prompt}])
    assert res.response == chat["message"]["content"] and res.done and res.eval_count == 8
    assert res.context and res.context[-1] != 0 and len(res.context) >= res.prompt_eval_count
    raw = client.generate(model="smollm2", prompt=prompt, raw=True, options=GREEDY, logprobs=True)
    with srv.client() as http:
        comp = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                                  "seed": 7, "logprobs": 0}).json()
    assert raw.response == comp["choices"][0]["text"] and raw.context is None
    assert [lp.logprob for lp in raw.logprobs] == pytest.approx(comp["choices"][0]["logprobs"]["token_logprobs"],
                                                                abs=1e-5)
    pieces = list(client.generate(model="smollm2", prompt=prompt, raw=True, options=GREEDY, stream=True))
    assert "".join(p.response for p in pieces) == raw.response and pieces[-1].done
    # context continues the conversation: its tokens come first in the next prompt
    more = client.generate(model="smollm2", prompt="And of Spain?", context=res.context,
                           options={**GREEDY, "num_predict": 2})
    assert more.prompt_eval_count > len(res.context) and more.context[:len(res.context)] == list(res.context)


def test_structured_output_follows_the_schema_as_openai(srv, client):
    ask = [{"role": "user", "content": "Ollama is 22 years old and busy. Reply in JSON."}]
    options = {**GREEDY, "num_predict": 40}
    res = client.chat(model="smollm2", messages=ask, format=PERSON, options=options)
    jsonschema.validate(json.loads(res.message.content), PERSON)
    with srv.client() as http:
        openai = http.post("/v1/chat/completions", json={
            "messages": ask, "max_tokens": 40, "temperature": 0, "seed": 7,
            "response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}).json()
    assert res.message.content == openai["choices"][0]["message"]["content"]
    begun = client.generate(model="smollm2", prompt="Name a colour.", format="json", options=GREEDY).response
    assert begun.lstrip().startswith("{")  # "json": an object (cut off here at num_predict)


def test_a_tool_call_has_its_arguments_as_an_object(srv, client):
    call = {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                      "required": ["city"], "additionalProperties": False}},
        "required": ["name", "arguments"], "additionalProperties": False}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    options = {**GREEDY, "num_predict": 30}
    res = client.chat(model="smollm2", messages=ask, tools=[WEATHER], format=call, options=options)
    (tc,) = res.message.tool_calls
    assert tc.function.name == "get_weather" and isinstance(tc.function.arguments["city"], str)
    openai = _openai_chat(srv, messages=ask, tools=[WEATHER], max_tokens=30,
                          response_format={"type": "json_schema", "json_schema": {"schema": call}})
    assert json.loads(openai["message"]["tool_calls"][0]["function"]["arguments"]) == dict(tc.function.arguments)
    parts = list(client.chat(model="smollm2", messages=ask, tools=[WEATHER], format=call, options=options,
                             stream=True))
    assert [p.message.tool_calls for p in parts if p.message.tool_calls] == [res.message.tool_calls]
    # the call and its result go back into the conversation
    history = [*ask, {"role": "assistant", "content": "", "tool_calls": [{"function": {
        "name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]
    after = client.chat(model="smollm2", messages=history, tools=[WEATHER], options={**GREEDY, "num_predict": 4})
    assert after.done and after.prompt_eval_count > res.prompt_eval_count


def test_embeddings_match_the_openai_route(srv, client):
    res = client.embed(model="smollm2", input=["hello", "the sky is blue"])
    with srv.client() as http:
        openai = http.post("/v1/embeddings", json={"input": ["hello", "the sky is blue"]}).json()["data"]
    assert len(res.embeddings) == 2 and res.prompt_eval_count > 2
    for got, want in zip(res.embeddings, openai, strict=True):
        norm = sum(x * x for x in want["embedding"]) ** 0.5
        assert got == pytest.approx([x / norm for x in want["embedding"]], abs=1e-6)  # Ollama's are unit length
    short = client.embed(model="smollm2", input="hello", dimensions=8).embeddings[0]
    assert len(short) == 8 and sum(x * x for x in short) == pytest.approx(1.0)
    legacy = client.embeddings(model="smollm2", prompt="hello").embedding
    assert legacy == pytest.approx(openai[0]["embedding"], abs=1e-6)
    assert client.embed(model="smollm2", input=[]).embeddings == []


def test_list_show_ps_version(srv, client):
    (listed,) = client.list().models
    assert listed.model == "smollm2:latest" and listed.details.format == "gguf"
    assert listed.details.family == "llama" and listed.details.parameter_size == "135M" and listed.size > 1e6
    show = client.show("smollm2")
    assert show.details == listed.details and "completion" in show.capabilities
    assert show.modelinfo["general.architecture"] == "llama" and show.modelinfo["llama.block_count"] == 30
    assert show.modelinfo["tokenizer.ggml.tokens"] == []  # long arrays only with verbose, as Ollama
    assert show.template == srv.state.template.source and "num_ctx" in show.parameters
    (running,) = client.ps().models
    assert running.model == "smollm2:latest" and running.context_length == 2048 and running.digest == listed.digest
    assert httpx.get(srv.url + "/api/version").json()["version"]


def test_errors_are_ollamas_shape(srv, client):
    cases = [({"model": "llama3", "messages": SAY}, 404, "model 'llama3' not found"),
             ({"messages": SAY}, 400, "model is required"),
             ({"model": "smollm2", "messages": SAY, "options": {"temperature": "hot"}}, 400,
              'option "temperature" must be of type float'),
             ({"model": "smollm2", "messages": SAY, "options": {"num_ctx": 99999}}, 400, "cannot change per request"),
             ({"model": "smollm2", "messages": SAY, "think": True}, 400, '"smollm2" does not support thinking'),
             ({"model": "smollm2", "messages": [{"role": "user", "content": "?", "images": ["AAAA"]}]}, 400,
              "image input is not supported"),
             ({"model": "smollm2", "messages": SAY, "format": "yaml"}, 400, "invalid format"),
             ({"model": "smollm2", "messages": SAY, "keep_alive": "soon"}, 400, "keep_alive")]
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        for body, status, message in cases:
            res = http.post("/api/chat", json=body)
            assert res.status_code == status and set(res.json()) == {"error"}, res.text
            assert message in res.json()["error"]
        res = http.post("/api/pull", json={"model": "llama3"})
        assert res.status_code == 501 and "pulling models is not supported" in res.json()["error"]
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="nope", prompt="hi")
    assert e.value.status_code == 404 and e.value.error == "model 'nope' not found"
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("smollm2")
    assert e.value.status_code == 501


def test_keep_alive_zero_unloads_and_the_next_request_loads_again(srv, client):
    state = srv.state
    first = client.generate(model="smollm2", prompt="Hi", options={**GREEDY, "num_predict": 2}, keep_alive="1s")
    (running,) = client.ps().models
    left = (running.expires_at - datetime.now(timezone.utc)).total_seconds()
    assert -1 < left <= 1.5  # keep_alive 1s: it goes once idle for a second
    _wait_unloaded(client)
    assert state.model is None and client.list().models  # the listing routes answer without waking it
    assert state.model is None
    again = client.generate(model="smollm2", prompt="Hi", options={**GREEDY, "num_predict": 2})
    assert again.response == first.response and again.load_duration > 0 and client.ps().models
    gone = client.generate(model="smollm2", keep_alive=0)  # Ollama's "unload" request
    assert gone.done_reason == "unload" and gone.done
    _wait_unloaded(client)
    loaded = client.chat(model="smollm2", messages=[])  # Ollama's "load" request
    assert loaded.done_reason == "load" and client.ps().models and state.model is not None
    assert client.ps().models[0].expires_at.year == 9999  # no keep_alive, no --sleep-idle-seconds: stays


def _wait_unloaded(client, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while client.ps().models:
        assert time.monotonic() < deadline, "the model was not unloaded"
        time.sleep(0.1)

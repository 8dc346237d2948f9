"""tool_choice through the `openai` client, streamed and not: SmolLM2 with Qwen 2.5's template (Hermes <tool_call>
blocks, the tools in its system prompt), temperature 0.

- "required": the grammar holds the reply to calls valid for the tools' schemas; the streamed deltas (a call's
  name with its arguments so far, "{", then its arguments in pieces) add up to the non-streamed calls.
- a named function: the call is to that function.
- "auto" steered into a call (the marker's first tokens favoured by logit_bias): the lazy grammar takes over at
  <tool_call> and the arguments are valid JSON for the tool.
- parallel_tool_calls: the grammar allows more than one call; without it, one.
- "none": no call, no grammar, the tools still in the prompt: llama-server's answer
  (tests/data/tool_calls/llama_server_none.json, recorded by make_tool_choice_reference.py there).

Native llama-server 0c1e570 with the same model, template and flags (--jinja --chat-template-file) lets the
reply begin with text before a call even for "required" (its grammar: `until("<tool_call>")` then calls), and
SmolLM2 writes prose until max_tokens; so its calls are no reference here. test_tool_call_reference.py compares
calls with llama-server's on Functionary v3.2's template, whose grammar makes the model call at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.server.conftest import running_server

TEMPLATE_PATH = "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
REFERENCE_NONE = Path(__file__).parents[1] / "data" / "tool_calls" / "llama_server_none.json"
REQUIRED_KEYS = {"get_weather": {"city"}, "get_time": {"timezone"}}
BASE = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "temperature": 0,
        "max_tokens": 64, "tools": [WEATHER, TIME]}


@pytest.fixture(scope="module")
def client(llamacpp_src):
    template = (llamacpp_src / TEMPLATE_PATH).read_text()
    with running_server(model="smollm2", alias="smollm2", n_slots=1, n_ctx=4096, chat_template=template) as running:
        yield openai.OpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0)


def _ask(client, stream: bool, **body) -> dict:
    """content, calls [(name, arguments)], finish reason, and for a stream its tool-call pieces."""
    kw = {**BASE, **body}
    if not stream:
        choice = client.chat.completions.create(model="smollm2", **kw).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return {"content": choice.message.content or None, "calls": calls, "finish": choice.finish_reason}
    content, calls, pieces, finish = "", {}, [], None
    for chunk in client.chat.completions.create(model="smollm2", stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            pieces.append(tc)
            name, args = calls.get(tc.index, ("", ""))
            calls[tc.index] = (tc.function.name or name, args + (tc.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    return {"content": content or None, "calls": [calls[i] for i in sorted(calls)], "finish": finish,
            "pieces": pieces}


def _both(client, **body) -> dict:
    whole, streamed = _ask(client, False, **body), _ask(client, True, **body)
    assert (whole["content"], whole["calls"], whole["finish"]) == (
        streamed["content"], streamed["calls"], streamed["finish"])
    return streamed


def _valid(calls: list) -> None:
    for name, args in calls:
        assert set(json.loads(args)) == REQUIRED_KEYS[name], (name, args)


def test_a_required_call_streams_its_name_then_its_arguments(client):
    got = _both(client, tool_choice="required")
    assert got["finish"] == "tool_calls" and len(got["calls"]) == 1
    _valid(got["calls"])
    first, rest = got["pieces"][0], got["pieces"][1:]
    assert first.id and first.type == "function" and first.function.name and first.function.arguments == "{"
    assert len(rest) > 2 and all(p.function.name is None and p.id is None and p.index == 0 for p in rest)


def test_a_named_function_is_the_one_called(client):
    got = _both(client, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert got["finish"] == "tool_calls" and [n for n, _ in got["calls"]] == ["get_time"]
    _valid(got["calls"])


def test_auto_steered_into_a_call_is_held_to_the_schema(client):
    got = _both(client, tool_choice="auto", logit_bias={"<": 12, "tool": 6})
    assert got["finish"] == "tool_calls" and len(got["calls"]) == 1
    _valid(got["calls"])


def test_parallel_calls_are_allowed_only_when_asked(client):
    many = _both(client, tool_choice="required", parallel_tool_calls=True, max_tokens=120)
    one = _both(client, tool_choice="required", max_tokens=120)
    assert len(one["calls"]) == 1 and len(many["calls"]) >= 2
    _valid(many["calls"])
    assert [p.index for p in many["pieces"]] == sorted(p.index for p in many["pieces"])


def test_none_calls_nothing_and_answers_as_llama_server(client):
    if not REFERENCE_NONE.exists():
        pytest.fail(f"{REFERENCE_NONE} is missing: run tests/data/tool_calls/make_tool_choice_reference.py")
    native = json.loads(REFERENCE_NONE.read_text())
    got = _both(client, tool_choice="none", max_tokens=native["request"]["max_tokens"])
    assert (got["content"], got["calls"], got["finish"]) == (native["message"]["content"], [],
                                                              native["finish_reason"])

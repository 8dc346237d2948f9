"""Thinking and tool calls as llama-server returns them, through the `openai` client: the embedded SmolLM2 is
steered by a grammar into a `<think>...</think>` reply, and the streamed deltas add up to the non-streamed
message (reasoning_content apart from content); a request's unknown reasoning_format is a 400 naming the known
ones; reasoning_format "none" leaves the thinking in the content."""

from __future__ import annotations

import json

import openai
import pytest

THOUGHT, ANSWER = "I should greet", "Hello there."
GRAMMAR = f'root ::= "<think>{THOUGHT}</think>{ANSWER}"'
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _ask(client, stream: bool, **extra):
    kw = dict(model="smollm2", messages=MESSAGES, temperature=0, max_tokens=48, extra_body={"grammar": GRAMMAR,
                                                                                             **extra})
    if not stream:
        msg = client.chat.completions.create(**kw).choices[0].message
        return msg.content, (msg.model_extra or {}).get("reasoning_content")
    content, reasoning = "", ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
    return content, reasoning or None


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_comes_back_as_reasoning_content(client, stream):
    assert _ask(client, stream) == (ANSWER, THOUGHT)


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_format_none_keeps_thinking_in_the_content(client, stream):
    assert _ask(client, stream, reasoning_format="none") == (f"<think>{THOUGHT}</think>{ANSWER}", None)


def test_unknown_reasoning_format_is_a_400_naming_the_known_ones(client):
    with pytest.raises(openai.BadRequestError, match="deepseek-legacy"):
        _ask(client, False, reasoning_format="r1")


def test_enable_thinking_must_be_a_boolean(client):
    with pytest.raises(openai.BadRequestError, match="enable_thinking"):
        _ask(client, False, chat_template_kwargs={"enable_thinking": "yes"})


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _chat(client, stream: bool, grammar: str, **extra):
    """(content, reasoning, [(name, arguments)], finish_reason) of one reply, accumulating a stream's deltas as
    an OpenAI client does (tool calls by index)."""
    kw = dict(model="smollm2", messages=MESSAGES, tools=WEATHER, temperature=0, max_tokens=96,
              extra_body={"grammar": grammar, **extra})
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        msg = choice.message
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        return msg.content, (msg.model_extra or {}).get("reasoning_content"), calls, choice.finish_reason
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for tc in delta.tool_calls or []:
            name, args = calls.get(tc.index, ("", ""))
            calls[tc.index] = (tc.function.name or name, args + (tc.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    return content or None, reasoning or None, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_after_thinking(client, stream):
    """The model thinks, says a word and calls a tool (tool_choice auto): the same message streamed or not."""
    grammar = 'root ::= "<think>' + THOUGHT + '</think>Checking." ' + _literal(CALL)
    content, reasoning, calls, finish = _chat(client, stream, grammar)
    assert (content, reasoning, finish) == ("Checking.", THOUGHT, "tool_calls")
    assert [(n, json.loads(a)) for n, a in calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_json_comes_back_as_content(client, stream):
    bad = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    content, reasoning, calls, finish = _chat(client, stream, "root ::= " + _literal(bad))
    # a stream sends a call while it is written, as long as its arguments begin a JSON object: the name and
    # '{"city":' went out before the model broke the JSON; the final parse still gives the text as content
    assert (content, reasoning, calls, finish) == (bad, None, [("get_weather", '{"city":')] if stream else [], "stop")


def _literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sse(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as res:
        return [json.loads(line[6:]) for line in res.iter_lines() if line.startswith("data: {")]


def test_messages_carry_thinking_blocks_streamed_and_not(server):
    """/v1/messages: a thinking block (empty signature, as llama-server's) before the text, whole or as
    thinking_delta / text_delta events of their own blocks."""
    body = {"model": "smollm2", "max_tokens": 48, "messages": MESSAGES, "grammar": GRAMMAR, "temperature": 0}
    with server.client() as http:
        whole = http.post("/v1/messages", json=body).json()
        events = _sse(http, "/v1/messages", body)
    assert whole["content"] == [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                {"type": "text", "text": ANSWER}]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    text = {kind: "".join(e["delta"].get(kind, "") for e in events if e["type"] == "content_block_delta")
            for kind in ("thinking", "text")}
    assert starts == ["thinking", "text"] and text == {"thinking": THOUGHT, "text": ANSWER}


def test_responses_carry_a_reasoning_item_streamed_and_not(server):
    body = {"model": "smollm2", "max_output_tokens": 48, "input": "Say hello.", "grammar": GRAMMAR,
            "temperature": 0}
    with server.client() as http:
        whole = http.post("/v1/responses", json=body).json()
        events = _sse(http, "/v1/responses", body)
    kinds = [item["type"] for item in whole["output"]]
    assert kinds == ["reasoning", "message"]
    assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert whole["output"][1]["content"][0]["text"] == ANSWER
    deltas = {kind: "".join(e["delta"] for e in events if e["type"] == f"response.{kind}.delta")
              for kind in ("reasoning_text", "output_text")}
    assert deltas == {"reasoning_text": THOUGHT, "output_text": ANSWER}
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["reasoning", "message"]

"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) as a Claude-style client sends it: the
same chat underneath, answered as a `message` or as the Messages stream's events."""

from __future__ import annotations

import json

HI = {"model": "smollm2", "max_tokens": 12, "temperature": 0,
      "messages": [{"role": "user", "content": "Say hello."}]}


def test_a_message_is_the_chat_answer_in_content_blocks(server):
    with server.client() as http:
        body = http.post("/v1/messages", json={**HI, "system": "You are terse."}).json()
        chat = http.post("/v1/chat/completions", json={
            "max_tokens": 12, "temperature": 0, "messages": [{"role": "system", "content": "You are terse."},
                                                             HI["messages"][0]]}).json()
        assert body["type"] == "message" and body["role"] == "assistant" and body["id"].startswith("msg")
        assert body["content"] == [{"type": "text", "text": chat["choices"][0]["message"]["content"]}]
        assert body["stop_reason"] in ("end_turn", "max_tokens") and "timings" not in body
        usage = body["usage"]
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == chat["usage"]["prompt_tokens"]
        assert usage["output_tokens"] == chat["usage"]["completion_tokens"]
        blocks = http.post("/v1/messages", json={**HI, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Say hello."}]}]}).json()
        assert blocks["content"] == body["content"] or blocks["content"][0]["type"] == "text"


def test_the_stream_is_messages_events(server):
    with server.client() as http, http.stream("POST", "/v1/messages", json={**HI, "stream": True}) as res:
        lines = [line for line in res.iter_lines() if line]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    kinds = [e["type"] for e in events]
    assert names == kinds and "[DONE]" not in "".join(lines)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and "content_block_stop" in kinds
    assert events[0]["message"]["content"] == [] and events[0]["message"]["usage"]["input_tokens"] > 0
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    with server.client() as http:
        assert text == http.post("/v1/messages", json=HI).json()["content"][0]["text"]


def test_count_tokens_and_bad_messages(server):
    with server.client() as http:
        n = http.post("/v1/messages/count_tokens", json={"messages": HI["messages"]}).json()
        assert n["input_tokens"] > 0 and set(n) == {"input_tokens"}
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        res = http.post("/v1/messages", json={**HI, "messages": [{"role": "user", "content": [image]}]})
        assert res.status_code == 400 and "image input is not supported" in res.json()["error"]["message"]
        res = http.post("/v1/messages", json={"max_tokens": 4})
        assert res.status_code == 400 and "messages" in res.json()["error"]["message"]
        res = http.post("/v1/messages", json={**HI, "messages": [{"role": "robot", "content": "x"}]})
        assert res.status_code == 400 and "messages[0].role" in res.json()["error"]["message"]


def test_tools_and_tool_results_reach_the_template(server):
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    convo = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                "input": {"city": "Paris"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18 C, sunny"}]}]
    with server.client() as http:
        res = http.post("/v1/messages", json={**HI, "tools": tools, "messages": convo})
        assert res.status_code == 200 and res.json()["type"] == "message"
        forced = http.post("/v1/messages", json={**HI, "max_tokens": 48, "tools": tools,
                                                 "tool_choice": {"type": "tool", "name": "get_weather"}}).json()
        use = [b for b in forced["content"] if b["type"] == "tool_use"]
        assert forced["stop_reason"] == "tool_use" and use[0]["name"] == "get_weather", forced
        assert isinstance(use[0]["input"], dict)

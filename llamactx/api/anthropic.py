"""Anthropic's Messages API over the chat pipeline (llama-server's /v1/messages and /v1/messages/count_tokens,
tools/server/server-common.cpp `convert_anthropic_to_oai` and server-task.cpp's to_json_anthropic*).

A Messages request becomes an OpenAI chat request (system blocks -> a system message, tool_use / tool_result
blocks -> tool calls and tool messages, input_schema -> parameters, stop_sequences -> stop), runs as a chat, and
is answered as a `message` with content blocks, or as the Messages stream's events.
"""

from __future__ import annotations

import json
from typing import Any

from llamactx.api import protocol as P
from llamactx.api.responses import ChatRenderer, Choice
from llamactx.engine import Chunk

_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _text(blocks, field: str) -> str:
    """The text of a content value: a string, or a list of blocks of which only text ones are allowed here."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise P.ProtocolError(f"{field} must be a string or a list of content blocks")
    parts = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "image":
            raise P.ProtocolError(f"{field}[{i}]: image input is not supported by this server (no multimodal "
                                  "projector)")
        else:
            raise P.ProtocolError(f"{field}[{i}]: content block type {kind!r} is not allowed here")
    return "\n".join(parts)


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat request body for a Messages request body. ProtocolError names the first bad field."""
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text(body["system"], "system")})
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise P.ProtocolError("messages: an array of messages is required")
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise P.ProtocolError(f"messages[{i}].role must be 'user' or 'assistant'")
        content = m.get("content", "")
        if isinstance(content, str):
            messages.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise P.ProtocolError(f"messages[{i}].content must be a string or a list of content blocks")
        text, calls = [], []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            where = f"messages[{i}].content[{j}]"
            if kind == "tool_use" and m["role"] == "assistant":
                calls.append({"id": str(block.get("id", "")), "type": "function", "function": {
                    "name": str(block.get("name", "")), "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and m["role"] == "user":
                result = _text(block.get("content", ""), f"{where}.content")
                messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                                 "content": ("Error: " if block.get("is_error") else "") + result})
            else:
                text.append(_text([block], f"messages[{i}].content"))
        if text or calls:
            msg: dict[str, Any] = {"role": m["role"], "content": "\n".join(text)}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
    if not messages or all(m["role"] == "system" for m in messages):
        messages.append({"role": "user", "content": ""})  # llama-server accepts an empty conversation
    chat: dict[str, Any] = {"messages": messages, "stream": bool(body.get("stream", False))}
    for src, dst in (("max_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("top_k", "top_k"), ("stop_sequences", "stop"), ("model", "model")):
        if src in body:
            chat[dst] = body[src]
    for key in P.LLAMA_SERVER_FIELDS:  # llama-server's own request fields pass through
        if key in body:
            chat[key] = body[key]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":  # server-chat.cpp: a thinking budget
        chat["thinking_budget_tokens"] = thinking.get("budget_tokens", 10000)
    if body.get("tools"):
        if not isinstance(body["tools"], list):
            raise P.ProtocolError("tools must be an array")
        chat["tools"] = [{"type": "function", "function": {"name": t.get("name"), "description":
                                                          t.get("description", ""),
                                                          "parameters": t.get("input_schema", {})}}
                         for t in body["tools"] if isinstance(t, dict)]
        choice = body.get("tool_choice") or {}
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "any":
            chat["tool_choice"] = "required"
        elif kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind == "none":
            chat["tool_choice"] = "none"
    return chat


class MessagesRenderer(ChatRenderer):
    """A chat's choice as an Anthropic `message` (a thinking block first when the model thought, then text, then
    tool_use blocks), or as the Messages stream: message_start, each block's start / deltas / stop as the parsed
    reply grows (thinking_delta, text_delta, input_json_delta), message_delta with the stop reason, message_stop.
    """

    sse_events = True  # "event: <type>" lines, and no [DONE]

    def __init__(self, *args, n_prompt: int = 0, **kw):
        super().__init__(*args, **kw)
        self.id = P.new_id("msg")
        self.n_prompt = n_prompt
        self._block = -1  # the index of the open block in the stream (-1: none yet)
        self._kind = ""  # its kind: "thinking", "text" or "tool_use"

    def _blocks(self, c: Choice) -> tuple[list[dict[str, Any]], str]:
        message, finish = self._message(c)
        blocks: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content") or not (message.get("tool_calls") or blocks):
            blocks.append({"type": "text", "text": message.get("content") or ""})
        for call in message.get("tool_calls", []):
            blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                           "input": _input(call["function"]["arguments"])})
        return blocks, finish

    def _usage(self, c: Choice) -> dict[str, int]:
        t = c.seq.timings
        return {"input_tokens": c.seq.n_prompt - t.cached_n, "output_tokens": c.seq.n_output,
                "cache_read_input_tokens": t.cached_n, "cache_creation_input_tokens": 0}

    def _stop(self, c: Choice, finish: str) -> tuple[str, str | None]:
        word = c.seq.stream.stop_word if finish == "stop" else None
        return ("stop_sequence", word) if word else (_STOP_REASON.get(finish, "end_turn"), None)

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        c = choices[0]
        blocks, finish = self._blocks(c)
        reason, word = self._stop(c, finish)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": blocks,
                "stop_reason": reason, "stop_sequence": word, "usage": self._usage(c)}

    def first(self, c: Choice) -> list[dict[str, Any]]:
        usage = {"input_tokens": self.n_prompt, "output_tokens": 0}
        return [{"type": "message_start", "message": {"id": self.id, "type": "message", "role": "assistant",
                                                      "model": self.model, "content": [], "stop_reason": None,
                                                      "stop_sequence": None, "usage": usage}}]

    def delta(self, c: Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        return self._events(super().delta(c, chunks))

    def _events(self, chat_chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The Messages events of the chat deltas: a block opens when the kind of delta changes."""
        out: list[dict[str, Any]] = []
        for chunk in chat_chunks:
            delta = chunk["choices"][0]["delta"]
            if delta.get("reasoning_content"):
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
            if delta.get("content"):
                out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                if "id" in call:
                    out += self._open("tool_use", {"type": "tool_use", "id": call["id"], "name": fn.get("name", ""),
                                                   "input": {}}, new=True)
                if fn.get("arguments"):
                    out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out

    def _open(self, kind: str, block: dict[str, Any], new: bool = False) -> list[dict[str, Any]]:
        if self._kind == kind and not new:
            return []
        out = self._close()
        self._block, self._kind = self._block + 1, kind
        return [*out, {"type": "content_block_start", "index": self._block, "content_block": block}]

    def _close(self) -> list[dict[str, Any]]:
        if not self._kind:
            return []
        self._kind = ""
        return [{"type": "content_block_stop", "index": self._block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._block, "delta": delta}

    def last(self, c: Choice) -> list[dict[str, Any]]:
        out = self._events([ch for ch in super().last(c) if ch["choices"][0]["delta"]])
        if self._block < 0:  # nothing was generated: still one (empty) text block
            out += self._open("text", {"type": "text", "text": ""})
        out += self._close()
        _, finish = self._message(c)
        reason, word = self._stop(c, finish)
        out += [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": word},
                 "usage": {"output_tokens": c.seq.n_output}},
                {"type": "message_stop"}]
        return out

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        return {}


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return {}


def count_tokens_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request of a count_tokens body (max_tokens is not needed there)."""
    return to_chat({**body, "stream": False})


__all__ = ["MessagesRenderer", "count_tokens_body", "to_chat"]

"""Content, `<think>` reasoning and Hermes `<tool_call>{json}</tool_call>` calls: the formats of Hermes 2 Pro / 3,
Qwen 2.5 / Qwen3 / QwQ, MiMo, DeepSeek R1 distills without calls, SmolLM3, and any template without a dedicated
parser (llama.cpp counterpart: the differential autoparser of common/chat-diff-analyzer.cpp and
chat-auto-parser-generator.cpp, which derives exactly these shapes from such templates, and the content-only
parser of common_chat_peg_parse).

`generic` is llamactx's own format for a template that never mentions tools: tool_calls.prepare tells the model to
answer with a Hermes block, and a call forced by a grammar comes out as a bare JSON object ({"name", "arguments"},
or {"tool_calls": [...]}, or {"response": "..."} for a plain answer), as common/chat's old generic format did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, arguments_of, json_at, json_text, split_reasoning

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# a call's JSON up to its arguments, name first: {"name": "f", "arguments": (the arguments are passed on as the
# model wrote them, as llama.cpp's mapper does, so that a stream can send them while they are written)
CALL_HEAD = r'\{\s*"name"\s*:\s*"((?:[^"\\\n]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
BLOCK_HEAD = re.compile(re.escape(OPEN) + r"\s*" + CALL_HEAD)
JSON_HEAD = re.compile(r"\s*" + CALL_HEAD)


def parse_content(params: ChatParams, text: str) -> ChatMsg:
    """Reasoning (when the family has a thinking tag) and the rest as content."""
    reasoning, rest = split_reasoning(params, params.prefixed(text))
    return ChatMsg(rest, reasoning)


def parse_hermes(params: ChatParams, text: str) -> ChatMsg:
    reasoning, rest = split_reasoning(params, params.prefixed(text))
    if not params.has_tools:
        return ChatMsg(rest, reasoning)
    content, calls = hermes_calls(rest, params.parallel_tool_calls, params.partial)
    return ChatMsg(content, reasoning, calls)


def parse_generic(params: ChatParams, text: str) -> ChatMsg:
    reasoning, rest = split_reasoning(params, params.prefixed(text))
    if not params.has_tools:
        return ChatMsg(rest, reasoning)
    content, calls = generic_calls(rest, params.partial)
    return ChatMsg(content, reasoning, calls if params.parallel_tool_calls else calls[:1])


def generic_calls(text: str, partial: bool = False) -> tuple[str, list[ToolCall]]:
    """(content, calls) of llamactx's generic format: Hermes blocks, else a reply that is one JSON object (a
    call, a {"tool_calls": [...]} list, or {"response": "..."}); anything else is content."""
    content, calls = hermes_calls(text, True, partial)
    if calls:
        return content, calls
    found = json_at(text)
    if found is not None and not text[found[1]:].strip() and isinstance(found[0], Mapping):
        obj = found[0]
        if isinstance(obj.get("response"), str) and len(obj) == 1:
            return obj["response"], []
        calls = _as_written(calls_of(obj), text, JSON_HEAD.match(text), found[1])
        if calls:
            return "", calls
    return text, []


def hermes_calls(text: str, parallel: bool, partial: bool = False) -> tuple[str, list[ToolCall]]:
    """(content, calls): the text before the first `<tool_call>` block and the calls of the blocks. A block
    whose JSON is not a call leaves the whole text as content (the model's words are never lost). When
    `partial`, a block still being written ends the calls (stream.parse_partial sends it as it grows)."""
    first = text.find(OPEN)
    if first < 0:
        return text, []
    calls, pos, tail = [], first, []
    while pos >= 0:
        found = json_at(text, pos + len(OPEN))
        if found is None:
            if partial and calls:
                break
            return text, []
        block_calls = _as_written(calls_of(found[0]), text, BLOCK_HEAD.match(text, pos), found[1])
        end = text.find(CLOSE, found[1])
        if not block_calls or (end >= 0 and text[found[1]:end].strip()):
            return text, []
        calls += block_calls
        after = end + len(CLOSE) if end >= 0 else found[1]
        pos = text.find(OPEN, after)
        tail.append(text[after:pos if pos >= 0 else len(text)])
    if not parallel:
        calls = calls[:1]
    rest = "".join(tail).strip()
    return text[:first] + (("\n" + rest) if rest else ""), calls


def _as_written(calls: list[ToolCall], text: str, head: re.Match | None, end: int) -> list[ToolCall]:
    """`calls` with the one call's arguments as the model wrote them, when its JSON starts with `head`."""
    if len(calls) != 1 or head is None:
        return calls
    raw = json_text(text, head.end())
    if raw is None or raw[1] > end or not raw[0].startswith("{") or json.loads(raw[0]) != json.loads(
            calls[0].arguments):
        return calls
    return [ToolCall(calls[0].name, raw[0], calls[0].id)]


def calls_of(obj: Any) -> list[ToolCall]:
    """The calls in one JSON object: {"name", "arguments" | "parameters"}, OpenAI's {"function": {...}}, or a
    {"tool_calls": [...]} / {"tool_call": {...}} wrapper."""
    if not isinstance(obj, Mapping):
        return []
    if isinstance(obj.get("tool_calls"), list):
        return [c for item in obj["tool_calls"] for c in calls_of(item)]
    if isinstance(obj.get("tool_call"), Mapping):
        return calls_of(obj["tool_call"])
    if isinstance(obj.get("function"), Mapping):
        inner = calls_of(obj["function"])
        return [ToolCall(c.name, c.arguments, str(obj.get("id") or c.id)) for c in inner]
    name = obj.get("name")
    args = arguments_of(obj.get("arguments", obj.get("parameters", {})))
    if not isinstance(name, str) or not name or args is None:
        return []
    return [ToolCall(name, args, str(obj.get("id") or ""))]

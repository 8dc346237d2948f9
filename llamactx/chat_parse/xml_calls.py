"""Qwen3-Coder's XML tool calls, also Qwen3.5, Nemotron Nano 3 and StepFun 3.5 (llama.cpp counterpart:
common/parsers/qwen3-coder.cpp, common_chat_params_init_qwen3_coder):

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is raw text up to "\\n</parameter>" (its own trailing newline kept); a parameter whose schema does not
allow only strings is read as JSON when it parses as the schema's kind. Reasoning ends at "</think>" or at the
first "<tool_call>" (a call ends a prefilled thinking block).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, dumps, split_reasoning

_FUNCTION = re.compile(r"<function=([^>\n]+)>\n?")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?")


def parse_qwen3_coder(params: ChatParams, text: str) -> ChatMsg:
    reasoning, rest = split_reasoning(params, params.prefixed(text), also_ends=("<tool_call>",))
    if not params.has_tools:
        return ChatMsg(rest, reasoning)
    starts = ["<tool_call>"] + ([] if params.thinking_start else [f"<function={n}>" for n in params.tool_names()])
    first = min((i for i in (rest.find(s) for s in starts) if i >= 0), default=-1)
    if first < 0:
        return ChatMsg(rest, reasoning)
    calls, pos = [], first
    while pos < len(rest):
        call, end = _call(params, rest, pos)
        if call is None:
            if params.partial and calls:  # the next call is still being written
                break
            return ChatMsg(rest, reasoning)
        calls.append(call)
        pos = end
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
        if not rest.startswith("<tool_call>", pos):
            break
    if rest[pos:].strip() and not params.partial:  # text after the calls: keep the model's words
        return ChatMsg(rest, reasoning)
    return ChatMsg(rest[:first], reasoning, calls if params.parallel_tool_calls else calls[:1])


def _call(params: ChatParams, text: str, pos: int) -> tuple[ToolCall | None, int]:
    if text.startswith("<tool_call>", pos):
        pos += len("<tool_call>")
        while pos < len(text) and text[pos] in " \n":
            pos += 1
    m = _FUNCTION.match(text, pos)
    if m is None:
        return None, pos
    name, pos = m.group(1).strip(), m.end()
    schema = params.parameters(name).get("properties") or {}
    args: dict[str, Any] = {}
    while True:
        while pos < len(text) and text[pos] in " \n":
            pos += 1
        m = _PARAMETER.match(text, pos)
        if m is None:
            break
        key = m.group(1).strip()
        end = text.find("\n</parameter>", m.end())
        close = len("\n</parameter>")
        if end < 0:
            end, close = text.find("</parameter>", m.end()), len("</parameter>")
            if end < 0:
                return None, pos
        args[key] = typed_value(text[m.end():end], schema.get(key) if isinstance(schema, Mapping) else None)
        pos = end + close
    if not text.startswith("</function>", pos):
        return None, pos
    pos += len("</function>")
    while pos < len(text) and text[pos] in " \n":
        pos += 1
    if text.startswith("</tool_call>", pos):
        pos += len("</tool_call>")
    return ToolCall(name, dumps(args)), pos


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, Mapping):
        return set()
    t = schema.get("type")
    types = set(t) if isinstance(t, list) else {t} if isinstance(t, str) else set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            types |= _types(sub)
    if "enum" in schema and not types:
        types |= {type(v).__name__.replace("str", "string") for v in schema["enum"]}
    return types


def typed_value(raw: str, schema: Any) -> Any:
    """A parameter's value: the raw text for a string parameter (or an unknown one that is not JSON), else JSON."""
    types = _types(schema)
    if types == {"string"}:
        return raw
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return raw
    if types and "string" in types and isinstance(value, str):
        return raw
    return value

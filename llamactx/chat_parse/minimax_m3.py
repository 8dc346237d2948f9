"""MiniMax-M3's namespaced XML tool calls (llama.cpp counterpart: common/parsers/minimax-m3.cpp,
common_chat_params_init_minimax_m3, and common_chat_peg_minimax_m3_mapper):

    <mm:think>THINKING</mm:think>ANSWER]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="NAME">]<]minimax[>[<ARG>VALUE]<]minimax[>[</ARG>...]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

Every tag carries the namespace token "]<]minimax[>[". A value is read by the tool's schema, as the template
writes it (its to_xml() macro): a parameter that may be a string is the raw text up to its closing tag, an
object is nested parameter elements, an array is `<item>` elements, anything else is JSON. A union tries its
alternatives in order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, dumps, held_back, json_at, may_be_string, schema_alternatives

NS = "]<]minimax[>["
THINK_START, THINK_END = "<mm:think>", "</mm:think>"
FC_START, FC_END, INVOKE_END = NS + "<tool_call>", NS + "</tool_call>", NS + "</invoke>"
_INVOKE = re.compile(re.escape(NS) + r'<invoke name="([^"]*)">')
_WS = re.compile(r"\s*")


def parse_minimax_m3(params: ChatParams, text: str) -> ChatMsg:
    full = params.prefixed(text)
    msg = ChatMsg()
    pos = _reasoning(params, full, msg)
    if not params.has_tools:
        msg.content = full[pos:]
        return msg
    at = full.find(FC_START, pos)
    msg.content = full[pos:at if at >= 0 else len(full)]
    if params.partial:
        msg.content = held_back(msg.content, (FC_START,))
    if at < 0:
        return msg
    calls, end = _calls(params, full, at + len(FC_START))
    if calls is None:
        if not params.partial:
            msg.content = full[pos:]  # a malformed call stays with the user
        return msg
    msg.tool_calls = calls
    return msg


def _reasoning(params: ChatParams, text: str, msg: ChatMsg) -> int:
    """The position after the thinking block (or a bare </mm:think>), with its text as reasoning when
    extracted and thinking is on (with thinking off, a block is dropped as llama.cpp drops it)."""
    if not params.extract_reasoning:
        return 0
    if text.startswith(THINK_END):
        return len(THINK_END)
    if not text.startswith(THINK_START):
        return 0
    end = text.find(THINK_END, len(THINK_START))
    if end < 0:
        if params.partial and params.enable_thinking:
            msg.reasoning_content = held_back(text[len(THINK_START):].lstrip(), (THINK_END,))
            return len(text)
        return 0
    if params.enable_thinking:
        msg.reasoning_content = text[len(THINK_START):end].lstrip()
    return end + len(THINK_END)


def _calls(params: ChatParams, text: str, pos: int) -> tuple[list[ToolCall] | None, int]:
    calls: list[ToolCall] = []
    while True:
        pos = _WS.match(text, pos).end()
        m = _INVOKE.match(text, pos)
        if m is None or m.group(1) not in params.tool_names():
            break
        schema = params.parameters(m.group(1))
        found = _members(text, _WS.match(text, m.end()).end(), schema, INVOKE_END)
        if found is None:
            return (calls, len(text)) if params.partial and calls else (None, pos)
        calls.append(ToolCall(m.group(1), dumps(found[0])))
        pos = found[1]
        if not params.parallel_tool_calls:
            break
    pos = _WS.match(text, pos).end()
    if not calls or not (text.startswith(FC_END, pos) or params.partial):
        return None, pos
    return calls, pos + len(FC_END)


def _value(text: str, pos: int, schema: Any, close: str) -> tuple[Any, int] | None:
    """(value, end after `close`) of the value at `pos`, read by `schema` (value_of in minimax-m3.cpp)."""
    schema = schema if isinstance(schema, Mapping) else {}
    if may_be_string(schema):
        end = text.find(close, pos)
        return None if end < 0 else (text[pos:end], end + len(close))
    alts = schema_alternatives(schema)
    if alts:
        for alt in alts:
            found = _value(text, pos, alt, close)
            if found is not None:
                return found
        return None
    if schema.get("type") == "object" and isinstance(schema.get("properties"), Mapping) and schema["properties"]:
        return _members(text, _WS.match(text, pos).end(), schema, close)
    if schema.get("type") == "array":
        return _items(text, pos, schema.get("items"), close)
    found = json_at(text, pos)
    if found is None:
        return None
    end = _WS.match(text, found[1]).end()
    return (found[0], end + len(close)) if text.startswith(close, end) else None


def _members(text: str, pos: int, schema: Any, close: str) -> tuple[dict[str, Any], int] | None:
    """An object's parameter elements up to `close` (members_of)."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    out: dict[str, Any] = {}
    while True:
        pos = _WS.match(text, pos).end()
        if text.startswith(close, pos):
            return out, pos + len(close)
        tag = next((k for k in props if text.startswith(f"{NS}<{k}>", pos)), None)
        if tag is None:
            return None
        found = _value(text, pos + len(f"{NS}<{tag}>"), props[tag], f"{NS}</{tag}>")
        if found is None:
            return None
        out[tag], pos = found


def _items(text: str, pos: int, schema: Any, close: str) -> tuple[list[Any], int] | None:
    out: list[Any] = []
    opening = NS + "<item>"
    while True:
        pos = _WS.match(text, pos).end()
        if text.startswith(close, pos):
            return out, pos + len(close)
        if not text.startswith(opening, pos):
            return None
        found = _value(text, pos + len(opening), schema, NS + "</item>")
        if found is None:
            return None
        out.append(found[0])
        pos = found[1]

"""Cohere2 MoE / North Code's marker-wrapped turns (llama.cpp counterpart: common/parsers/cohere2moe.cpp,
common_chat_params_init_cohere2moe; standard_json_tools with Cohere's keys in common/chat-peg-parser.cpp):

    <|START_THINKING|>THINKING<|END_THINKING|><|START_TEXT|>ANSWER<|END_TEXT|>
    <|START_THINKING|>THINKING<|END_THINKING|><|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f",
        "parameters": {...}}, ...]<|END_ACTION|>

The thinking block is opened by the generation prompt; it ends at its end tag or where the text or the action
begins. An action list still being written shows each call once its tool_name is complete (with its id, and
its parameters once they are), as llama.cpp's partial JSON mapper shows it; Command R7B's actions stream the
same way (json_calls).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, held_back, json_at, json_text

THINK_START, THINK_END = "<|START_THINKING|>", "<|END_THINKING|>"
TEXT_START, TEXT_END = "<|START_TEXT|>", "<|END_TEXT|>"
ACTION_START, ACTION_END = "<|START_ACTION|>", "<|END_ACTION|>"
TURN_END = "<|END_OF_TURN_TOKEN|>"
MARKERS = (THINK_START, THINK_END, TEXT_START, TEXT_END, ACTION_START, ACTION_END, TURN_END)
_KEY = r'"%s"\s*:\s*"((?:[^"\\]|\\.)*)"'


def parse_cohere2moe(params: ChatParams, text: str) -> ChatMsg:
    full = params.prefixed(text)
    msg, pos = ChatMsg(), 0
    if full.startswith(THINK_START):
        ends = [i for i in (full.find(t, len(THINK_START)) for t in (THINK_END, TEXT_START, ACTION_START)) if i >= 0]
        end = min(ends, default=len(full))
        pos = end + (len(THINK_END) if full.startswith(THINK_END, end) else 0)
        if params.extract_reasoning:
            msg.reasoning_content = full[len(THINK_START):end]
        else:
            msg.content = full[:pos]
    if params.has_tools and full.startswith(ACTION_START, pos):
        calls = action_calls(full, pos + len(ACTION_START), params.partial)
        if calls is not None:
            msg.tool_calls = calls if params.parallel_tool_calls else calls[:1]
        elif not params.partial:
            msg.content += full[pos:]
    elif full.startswith(TEXT_START, pos):
        msg.content += full[pos + len(TEXT_START):].split(TEXT_END, 1)[0]
    else:
        msg.content += full[pos:].split(TURN_END, 1)[0]
    if params.partial:
        msg.content = held_back(msg.content, MARKERS)
        msg.reasoning_content = held_back(msg.reasoning_content, MARKERS)
    return msg


def _call(item: object) -> ToolCall | None:
    if not isinstance(item, Mapping) or not isinstance(item.get("tool_name"), str):
        return None
    args = item.get("parameters", {})
    if not isinstance(args, Mapping):
        return None
    return ToolCall(item["tool_name"], "", str(item.get("tool_call_id", "")))


def action_calls(text: str, pos: int, partial: bool) -> list[ToolCall] | None:
    """The calls of the JSON action list at `pos` ({"tool_call_id", "tool_name", "parameters"} objects), their
    arguments as the model wrote them; None when it is not one. When `partial`, a list still being written gives
    its complete calls and the one being written once its name is."""
    found = json_at(text, pos)
    if found is not None:
        if not isinstance(found[0], list):
            return None
        calls = _items(text, pos)
        return calls if calls and len(calls) == len(found[0]) else None
    return _items(text, pos) if partial else None


def _arguments_text(item_text: str) -> str:
    """The "parameters" value of one call object as written."""
    m = re.search(r'"parameters"\s*:\s*', item_text)
    raw = json_text(item_text, m.end()) if m else None
    return raw[0] if raw else ""


def _items(text: str, pos: int) -> list[ToolCall]:
    """The calls of the list at `pos`, up to the first item that is not a complete call (the one being written
    counts once its tool_name is complete)."""
    m = re.compile(r"\s*\[\s*").match(text, pos)
    if m is None:
        return []
    calls, at = [], m.end()
    while at < len(text) and text[at] != "]":
        raw = json_text(text, at)
        if raw is None:
            name, call_id = re.search(_KEY % "tool_name", text[at:]), re.search(_KEY % "tool_call_id", text[at:])
            if name:
                calls.append(ToolCall(name.group(1), "", call_id.group(1) if call_id else ""))
            break
        found = json_at(raw[0])
        call = _call(found[0]) if found else None
        if call is None:
            break
        call.arguments = _arguments_text(raw[0]) or "{}"
        calls.append(call)
        at = re.compile(r"\s*,?\s*").match(text, raw[1]).end()
    return calls

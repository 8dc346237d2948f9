"""Mistral's `[TOOL_CALLS]` formats and Magistral / Ministral's `[THINK]` blocks (llama.cpp counterparts:
common/parsers/ministral3.cpp for Ministral / Magistral 3, and the autoparser's output for Mistral Nemo, Mistral
Small 3.2 and Devstral, whose shapes test-chat.cpp pins down):

    [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "123456789"}]      Nemo: one JSON list
    [TOOL_CALLS]f[ARGS]{...}                                                Devstral, Ministral 3 (repeatable)
    [TOOL_CALLS]f[CALL_ID]123456789[ARGS]{...}                              Mistral Small 3.2
    [THINK]reasoning[/THINK]answer                                          Magistral, Ministral 3 Reasoning
"""

from __future__ import annotations

from llamactx.chat_parse.hermes import calls_of
from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, json_at, json_text, split_reasoning

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def parse_mistral(params: ChatParams, text: str) -> ChatMsg:
    reasoning, rest = split_reasoning(params, params.prefixed(text))
    if not params.has_tools:
        return ChatMsg(rest, reasoning)
    first = rest.find(TOOL_CALLS)
    if first < 0:
        return ChatMsg(rest, reasoning)
    calls = _calls(rest, first, params.partial)
    if not calls:
        return ChatMsg(rest, reasoning)
    return ChatMsg(rest[:first], reasoning, calls if params.parallel_tool_calls else calls[:1])


def _calls(text: str, pos: int, partial: bool) -> list[ToolCall] | None:
    """The calls from `pos` (at a [TOOL_CALLS]) to the end, or None when any is malformed (when `partial`, the
    complete ones before one still being written)."""
    calls: list[ToolCall] = []
    while pos < len(text):
        if not text.startswith(TOOL_CALLS, pos):
            return calls if partial or not text[pos:].strip() else None
        pos += len(TOOL_CALLS)
        found = json_at(text, pos)
        if found is not None and isinstance(found[0], list):  # Nemo's JSON list
            listed = [c for item in found[0] for c in calls_of(item)]
            if len(listed) != len(found[0]) or not listed:
                return calls if partial else None
            calls += listed
            pos = found[1]
            continue
        args_at = text.find(ARGS, pos)
        if args_at < 0:
            return calls if partial else None
        name, call_id = text[pos:args_at], ""
        if CALL_ID in name:
            name, call_id = name.split(CALL_ID, 1)
        found_text = json_text(text, args_at + len(ARGS))
        if not name.strip() or found_text is None:
            return calls if partial else None
        calls.append(ToolCall(name.strip(), found_text[0], call_id.strip()))
        pos = found_text[1]
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return calls

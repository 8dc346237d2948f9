"""Kimi K3's sections built from <|open|> / <|close|> / <|sep|> (llama.cpp counterpart: common/parsers/kimi-k3.cpp,
common_chat_params_init_kimi_k3):

    <|open|>think<|sep|>THINKING<|close|>think<|sep|><|open|>response<|sep|>ANSWER<|close|>response<|sep|>
    <|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="a" type="number"<|sep|>1
    <|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>

The generation prompt leaves the think section open, so a reply cut short while thinking is all reasoning. An
argument whose schema type is "string" (or unnamed) is its raw text, any other is JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, dumps, held_back

SEP = "<|sep|>"
MSG_START = '<|open|>message role="assistant"<|sep|>'
THINK_START, THINK_END = "<|open|>think<|sep|>", "<|close|>think<|sep|>"
RESP_START, RESP_END = "<|open|>response<|sep|>", "<|close|>response<|sep|>"
TOOLS_START, TOOLS_END = "<|open|>tools<|sep|>", "<|close|>tools<|sep|>"
CALL_END, ARG_END, MSG_END, EOM = "<|close|>call<|sep|>", "<|close|>argument<|sep|>", "<|close|>message<|sep|>", \
    "<|end_of_msg|>"
MARKERS = (THINK_END, RESP_START, RESP_END, TOOLS_START, MSG_END, EOM)
_CALL = re.compile(r'<\|open\|>call tool="([^"]*)"[^<]*?' + re.escape(SEP))
_ARG = re.compile(r'<\|open\|>argument key="([^"]*)"[^<]*?' + re.escape(SEP))


def parse_kimi_k3(params: ChatParams, text: str) -> ChatMsg:
    full = params.prefixed(text).removeprefix(MSG_START).removeprefix(THINK_START)
    msg = ChatMsg()
    end = _first(full, 0, (THINK_END, RESP_START))
    if params.extract_reasoning:
        msg.reasoning_content = full[:end]
    else:
        msg.content = full[:end]
    pos = end + (len(THINK_END) if full.startswith(THINK_END, end) else 0)
    pos += len(RESP_START) if full.startswith(RESP_START, pos) else 0
    end = _first(full, pos, (RESP_END, TOOLS_START, MSG_END) if params.has_tools else (RESP_END, MSG_END))
    msg.content += full[pos:end]
    pos = end + (len(RESP_END) if full.startswith(RESP_END, end) else 0)
    if params.has_tools and full.startswith(TOOLS_START, pos):
        calls = _calls(params, full, pos + len(TOOLS_START))
        if calls:
            msg.tool_calls = calls
        elif not params.partial:
            msg.content += full[pos:]
    if params.partial:
        msg.content = held_back(msg.content, MARKERS)
        msg.reasoning_content = held_back(msg.reasoning_content, MARKERS)
    return msg


def _first(text: str, pos: int, tags: tuple[str, ...]) -> int:
    return min((i for i in (text.find(t, pos) for t in tags) if i >= 0), default=len(text))


def _calls(params: ChatParams, text: str, pos: int) -> list[ToolCall]:
    """The complete calls of the tools section (one still being written is left out)."""
    calls = []
    while (m := _CALL.match(text, pos)) is not None and m.group(1) in params.tool_names():
        props = params.parameters(m.group(1)).get("properties") or {}
        args, pos = {}, m.end()
        while (a := _ARG.match(text, pos)) is not None:
            end = text.find(ARG_END, a.end())
            if end < 0:
                return calls
            schema = props.get(a.group(1)) if isinstance(props, Mapping) else None
            args[a.group(1)] = _value(text[a.end():end], schema)
            pos = end + len(ARG_END)
        if not text.startswith(CALL_END, pos):
            return calls
        calls.append(ToolCall(m.group(1), dumps(args)))
        pos += len(CALL_END)
    return calls


def _value(raw: str, schema: object) -> object:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if not isinstance(kind, str) or kind == "string":
        return raw
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return raw

"""DeepSeek R1 and V3.1 tool calls (llama.cpp counterpart: the autoparser's reading of those templates, pinned
by tests/test-chat.cpp; common/parsers/deepseek.cpp holds the V3.2 / V4 DSML format, not parsed here):

    R1    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{ARGS}\\n```
          <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
    V3.1  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

Both think in `<think>...</think>`, opened by the generation prompt when thinking is on.
"""

from __future__ import annotations

import re

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, json_text, split_reasoning

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE = re.compile(r"\s*```(?:json)?\s*")


def parse_deepseek(params: ChatParams, text: str) -> ChatMsg:
    reasoning, rest = split_reasoning(params, params.prefixed(text))
    if not params.has_tools:
        return ChatMsg(rest, reasoning)
    at = rest.find(CALLS_BEGIN)
    first = rest.find(CALL_BEGIN)
    start = at if at >= 0 else first
    if start < 0:
        return ChatMsg(rest, reasoning)
    calls, pos = [], start + (len(CALLS_BEGIN) if at >= 0 else 0)
    while True:
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
        if not rest.startswith(CALL_BEGIN, pos):
            break
        call, end = _call(rest, pos + len(CALL_BEGIN))
        if call is None:
            if params.partial and calls:  # the next call is still being written
                pos = len(rest)
                break
            return ChatMsg(rest, reasoning)
        pos = end
        calls.append(call)
    tail = rest[pos:].strip()
    if tail.startswith(CALLS_END):
        tail = tail[len(CALLS_END):].strip()
    if not calls or (tail and not params.partial):
        return ChatMsg(rest, reasoning)
    return ChatMsg(rest[:start], reasoning, calls if params.parallel_tool_calls else calls[:1])


def _call(text: str, pos: int) -> tuple[ToolCall | None, int]:
    sep = text.find(SEP, pos)
    if sep < 0:
        return None, pos
    kind, pos = text[pos:sep], sep + len(SEP)
    if kind == "function":  # R1: the name on its own line, then a fenced JSON block
        newline = text.find("\n", pos)
        if newline < 0:
            return None, pos
        name, pos = text[pos:newline].strip(), newline
        m = _FENCE.match(text, pos)
        pos = m.end() if m else pos
    else:
        name = kind.strip()
    found = json_text(text, pos)
    if found is None or not name:
        return None, pos
    pos = found[1]
    m = re.compile(r"\s*(?:```)?\s*").match(text, pos)
    pos = m.end()
    if not text.startswith(CALL_END, pos):
        return None, pos
    return ToolCall(name, found[0]), pos + len(CALL_END)

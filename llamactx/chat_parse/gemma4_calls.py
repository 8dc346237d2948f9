"""Gemma 4's channels and tool calls (llama.cpp counterpart: common/parsers/gemma4.cpp,
common_chat_params_init_gemma4, and common_chat_peg_gemma4_mapper's gemma4_to_json in common/chat-peg-parser.cpp):

    <|channel>thought\\nTHINKING<channel|>ANSWER<|tool_call>call:NAME{key:VALUE,...}<tool_call|>

A value is Gemma's own notation: strings between <|"|> quotes, bare keys, JSON numbers / true / false / null,
[...] lists and {...} dicts; a call's arguments are that value rewritten as JSON. A reply is a run of messages
(a thought block, then content up to the next channel tag); a stray `<channel|>` ends the answer, and an empty
`<|channel>` before a thought is skipped, as the model sometimes writes them.
"""

from __future__ import annotations

import json
import re

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, held_back

TURN = "<|turn>model\n"
CHANNEL, THOUGHT, CHANNEL_END = "<|channel>", "<|channel>thought", "<channel|>"
CALL, CALL_END = "<|tool_call>call:", "<tool_call|>"
QUOTE = '<|"|>'
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WS = re.compile(r"\s*")


def parse_gemma4(params: ChatParams, text: str) -> ChatMsg:
    full = params.prefixed(text).removeprefix(TURN)
    tools = params.has_tools
    msg, pos = ChatMsg(), 0
    stops = (CHANNEL, CHANNEL_END, "<|tool_call>") if tools else (CHANNEL, CHANNEL_END)
    while pos < len(full):
        moved = _thought(params, full, pos, msg)
        if moved is None:  # an unclosed thought in a finished reply: nothing more parses
            break
        end = min((i for i in (full.find(s, moved) for s in stops) if i >= 0), default=len(full))
        msg.content += full[moved:end]
        if end == pos:
            break
        pos = end
    if tools:
        _calls(params, full, pos, msg)
    if params.partial:
        msg.content = held_back(msg.content, (CHANNEL, THOUGHT, CHANNEL_END, CALL))
    return msg


def _thought(params: ChatParams, text: str, pos: int, msg: ChatMsg) -> int | None:
    """The position after the thought block at `pos` (`pos` itself when there is none)."""
    if not text.startswith(CHANNEL, pos):
        return pos
    at = pos
    while text.startswith(CHANNEL, at) and not text.startswith(THOUGHT, at):
        at += len(CHANNEL)  # empty channel tags before the thought
    if not text.startswith(THOUGHT, at):
        return pos if at == pos else at
    body_at = at + len(THOUGHT)
    end = text.find(CHANNEL_END, body_at)
    if end < 0 and not params.partial:
        return None
    body = text[body_at:end if end >= 0 else len(text)]
    if params.extract_reasoning:
        msg.reasoning_content += body.lstrip() if end >= 0 else held_back(body.lstrip(), (CHANNEL_END,))
    elif end >= 0:
        msg.content += text[at:end + len(CHANNEL_END)]
    return end + len(CHANNEL_END) if end >= 0 else len(text)


def _calls(params: ChatParams, text: str, pos: int, msg: ChatMsg) -> None:
    """The calls from the first <|tool_call> after `pos` (the text between is skipped, as llama.cpp's
    scan-to-toolcall does); a malformed call and what follows stay with the user as content."""
    at = text.find("<|tool_call>", pos)
    while at >= 0 and (params.parallel_tool_calls or not msg.tool_calls):
        call = _call(params, text, at)
        if call is None:
            if not params.partial:
                msg.content += text[at:]
            return
        msg.tool_calls.append(call[0])
        at = call[1] if text.startswith("<|tool_call>", call[1]) else -1


def _call(params: ChatParams, text: str, pos: int) -> tuple[ToolCall, int] | None:
    if not text.startswith(CALL, pos):
        return None
    pos += len(CALL)
    name = next((n for n in params.tool_names() if text.startswith(n + "{", pos)), None)
    if name is None:
        return None
    value = _value(text, pos + len(name))
    if value is None or not text.startswith(CALL_END, value[1]):
        return None
    return ToolCall(name, value[0]), value[1] + len(CALL_END)


def _value(text: str, pos: int) -> tuple[str, int] | None:
    """(JSON text, end) of the Gemma value at `pos`, None when it is not one."""
    if text.startswith(QUOTE, pos):
        end = text.find(QUOTE, pos + len(QUOTE))
        return None if end < 0 else (json.dumps(text[pos + len(QUOTE):end], ensure_ascii=False),
                                     end + len(QUOTE))
    if text.startswith("{", pos) or text.startswith("[", pos):
        return _container(text, pos)
    m = _NUMBER.match(text, pos)
    if m:
        return m.group(0), m.end()
    for word in ("true", "false", "null"):
        if text.startswith(word, pos):
            return word, pos + len(word)
    return None


def _container(text: str, pos: int) -> tuple[str, int] | None:
    """A {key:value,...} dict or a [value,...] list (gemma4-dict / gemma4-array)."""
    close = "}" if text[pos] == "{" else "]"
    pos = _WS.match(text, pos + 1).end()
    items: list[str] = []
    if text.startswith(close, pos):
        return ("{}" if close == "}" else "[]"), pos + 1
    while True:
        key = ""
        if close == "}":
            colon = text.find(":", pos)
            brace = text.find("}", pos)
            if colon < 0 or (0 <= brace < colon) or colon == pos:
                return None
            key = json.dumps(text[pos:colon], ensure_ascii=False) + ":"
            pos = _WS.match(text, colon + 1).end()
        value = _value(text, pos)
        if value is None:
            return None
        items.append(key + value[0])
        pos = _WS.match(text, value[1]).end()
        if text.startswith(",", pos):
            pos = _WS.match(text, pos + 1).end()
            continue
        if text.startswith(close, pos):
            opening = "{" if close == "}" else "["
            return opening + ",".join(items) + close, pos + 1
        return None

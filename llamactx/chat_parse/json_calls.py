"""Tool calls written as JSON between markers, for the families llama.cpp's autoparser derives from their
templates (llama.cpp counterpart: common/chat-auto-parser-generator.cpp's JSON tool-call sections; the shapes are
the ones tests/test-chat.cpp pins down for each template):

    Llama 3.x        {"type": "function", "name": "f", "parameters": {...}}   (optionally after <|python_tag|>)
    Functionary 3.1  <function=f>{...}</function>
    Functionary 3.2  f\\n{...}   /   all\\nTEXT                                (common/parsers/functionary-v3-2.cpp)
    FireFunction v2  functools[{"name": "f", "arguments": {...}}]
    Command R7B      <|START_THINKING|>..<|END_THINKING|><|START_ACTION|>[{"tool_call_id", "tool_name",
                     "parameters"}]<|END_ACTION|>  /  <|START_RESPONSE|>TEXT<|END_RESPONSE|>
    Command R+       Action:\\n```json\\n[{"tool_name", "parameters"}]\\n```
    Nemotron Nano 2  <TOOLCALL>[{"name", "arguments"}]</TOOLCALL>
    Apriel           <tool_calls>[{"name", "arguments"}]</tool_calls>
    Apertus          <|tools_prefix|>[{"f": {...}}]<|tools_suffix|>
    Granite 3.x      <|tool_call|>[{"name", "arguments"}]
    GigaChat 3 / 3.1 <|message_sep|>\n\nfunction call<|role_sep|>\n{"name", "arguments"}  /  <|function_call|>{...}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from llamactx.chat_parse.cohere2moe import action_calls
from llamactx.chat_parse.hermes import calls_of
from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, arguments_of, held_back, json_at, json_text, split_reasoning

# format -> (opening marker, closing marker) of a JSON list of calls
LIST_MARKERS = {
    "firefunction": ("functools", ""),
    "nemotron-v2": ("<TOOLCALL>", "</TOOLCALL>"),
    "apriel": ("<tool_calls>", "</tool_calls>"),
    "apertus": ("<|tools_prefix|>", "<|tools_suffix|>"),
    "granite": ("<|tool_call|>", ""),
    "command-r7b": ("<|START_ACTION|>", "<|END_ACTION|>"),
    "gigachat3": ("<|message_sep|>\n\nfunction call<|role_sep|>\n", ""),  # common/parsers/gigachat-v3.cpp
    "gigachat3.1": ("<|function_call|>", ""),
}


def _finish(params: ChatParams, content: str, reasoning: str, calls: list[ToolCall]) -> ChatMsg:
    return ChatMsg(content, reasoning, calls if params.parallel_tool_calls else calls[:1])


def _call_of(obj: Any) -> list[ToolCall]:
    """One call in any of these families' shapes (Cohere's tool_name / tool_call_id, Apertus' {name: args})."""
    if isinstance(obj, Mapping) and "tool_name" in obj:
        args = arguments_of(obj.get("parameters", {}))
        if not isinstance(obj["tool_name"], str) or args is None:
            return []
        return [ToolCall(obj["tool_name"], args, str(obj.get("tool_call_id", "")))]
    calls = calls_of(obj)
    if not calls and isinstance(obj, Mapping) and len(obj) == 1:
        name, args = next(iter(obj.items()))
        text = arguments_of(args)
        return [ToolCall(name, text)] if text is not None else []
    return calls


def parse_marked_list(params: ChatParams, text: str) -> ChatMsg:
    """A JSON list of calls after an opening marker (LIST_MARKERS), with optional <think> reasoning."""
    full = params.prefixed(text)
    if params.format == "command-r7b":
        return _command_r7b(params, full)
    reasoning, rest = split_reasoning(params, full)
    if not params.has_tools:
        return ChatMsg(rest, reasoning)
    opening, closing = LIST_MARKERS[params.format]
    at = rest.find(opening)
    if at < 0:
        return ChatMsg(held_back(rest, (opening,)) if params.partial else rest, reasoning)
    found = json_at(rest, at + len(opening))
    if found is None:
        return ChatMsg(rest[:at] if params.partial else rest, reasoning)  # a call being written is no content
    items = found[0] if isinstance(found[0], list) else [found[0]]
    calls = [c for item in items for c in _call_of(item)]
    tail = rest[found[1]:].strip()
    if closing and tail.startswith(closing):
        tail = tail[len(closing):].strip()
    if not calls or len(calls) != len(items) or tail:
        return ChatMsg(rest, reasoning)
    return _finish(params, rest[:at], reasoning, calls)


def _command_r7b(params: ChatParams, text: str) -> ChatMsg:
    reasoning = ""
    m = re.match(r"\s*<\|START_THINKING\|>(.*?)(<\|END_THINKING\|>|\Z)", text, re.S)
    if m and params.extract_reasoning and (m.group(2) or params.partial):
        reasoning, text = m.group(1).strip(), text[m.end():]
    r = re.search(r"<\|START_RESPONSE\|>(.*?)(?:<\|END_RESPONSE\|>|$)", text, re.S)
    if r:
        text = text[:r.start()] + r.group(1) + text[r.end():]
    return parse_marked_list_body(params, text, reasoning)


def parse_marked_list_body(params: ChatParams, rest: str, reasoning: str) -> ChatMsg:
    opening, closing = LIST_MARKERS[params.format]
    at = rest.find(opening) if params.has_tools else -1
    if at < 0:
        return ChatMsg(rest, reasoning)
    found = json_at(rest, at + len(opening))
    if found is None and params.partial and params.format == "command-r7b":  # the action list being written
        return _finish(params, rest[:at], reasoning, action_calls(rest, at + len(opening), True) or [])
    items = found[0] if found is not None and isinstance(found[0], list) else None
    calls = [c for item in items or [] for c in _call_of(item)]
    if not calls or len(calls) != len(items or []):
        return ChatMsg(rest, reasoning)
    return _finish(params, rest[:at], reasoning, calls)


def parse_command_r_plus(params: ChatParams, text: str) -> ChatMsg:
    text = re.sub(r"^\s*<\|CHATBOT_TOKEN\|>|<\|END_OF_TURN_TOKEN\|>\s*$", "", text)
    m = re.search(r"Action:\s*```(?:json)?\s*", text) if params.has_tools else None
    found = json_at(text, m.end()) if m else None
    if found is None or not isinstance(found[0], list):
        return ChatMsg(text)
    calls = [c for item in found[0] for c in _call_of(item)]
    if not calls or len(calls) != len(found[0]) or text[found[1]:].strip().strip("`").strip():
        return ChatMsg(text)
    return _finish(params, text[:m.start()], "", calls)


def parse_llama3(params: ChatParams, text: str) -> ChatMsg:
    """Llama 3.x: the whole reply one JSON call ({"type": "function", "name", "parameters"}), possibly after
    <|python_tag|>, several separated by ";" when parallel; else content."""
    if not params.has_tools:
        return ChatMsg(text)
    body = text.strip()
    body = body[len("<|python_tag|>"):] if body.startswith("<|python_tag|>") else body
    calls, pos = [], 0
    while pos < len(body):
        found = json_at(body, pos)
        obj = found[0] if found else None
        if not isinstance(obj, Mapping) or obj.get("name") not in params.tool_names():
            return ChatMsg(text)
        calls += calls_of({"name": obj["name"], "arguments": obj.get("parameters", obj.get("arguments", {}))})
        pos = found[1]
        while pos < len(body) and body[pos] in " \n;":
            pos += 1
    return _finish(params, "", "", calls) if calls else ChatMsg(text)


def parse_functionary_v3_1(params: ChatParams, text: str) -> ChatMsg:
    if not params.has_tools:
        return ChatMsg(text)
    calls, content, pos = [], None, 0
    for m in re.finditer(r"<function=([^>]+)>", text):
        if m.start() < pos:
            continue
        found = json_text(text, m.end())
        if found is None or not text[found[1]:].lstrip().startswith("</function>"):
            return ChatMsg(text)
        content = text[:m.start()] if content is None else content
        calls.append(ToolCall(m.group(1), found[0]))
        pos = text.index("</function>", found[1]) + len("</function>")
    return _finish(params, content or "", "", calls) if calls else ChatMsg(text)


def parse_functionary_v3_2(params: ChatParams, text: str) -> ChatMsg:
    """`>>>recipient\\n` messages (the first `>>>` is in the generation prompt): "all" is content, a tool's name
    starts its JSON arguments (common/parsers/functionary-v3-2.cpp)."""
    content, calls = "", []
    for part in text.split(">>>"):
        if not part or (params.partial and "\n" not in part):  # an unfinished recipient line
            continue
        recipient, _, body = part.partition("\n")
        if recipient == "all" or not params.has_tools or recipient not in params.tool_names():
            content += body if recipient == "all" else part
            continue
        found = json_text(body)
        if found is None:
            content += "" if params.partial else part  # unfinished arguments wait; malformed ones are content
            continue
        calls.append(ToolCall(recipient, found[0]))
    return _finish(params, content, "", calls)

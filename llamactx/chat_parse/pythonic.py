"""LFM2 / LFM2.5's pythonic tool calls (llama.cpp counterpart: common/parsers/lfm2.cpp):

    <think>reasoning</think>text<|tool_call_start|>[f(a=1, b="x"), g()]<|tool_call_end|>

A call list is read with Python's own parser (ast, literals only: nothing is evaluated); true / false / null are
taken as JSON's, as llama.cpp's parser allows. Anything that is not a list of calls with literal keyword
arguments is content.
"""

from __future__ import annotations

import ast
import re

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, dumps, split_reasoning

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
_JSON_WORDS = {"true": "True", "false": "False", "null": "None"}
MAX_CALL_CHARS = 1 << 20  # ast's recursion on a hostile nesting is bounded by the text it reads


def parse_lfm2(params: ChatParams, text: str) -> ChatMsg:
    reasoning, rest = split_reasoning(params, params.prefixed(text))
    start = rest.find(START)
    if not params.has_tools or start < 0:
        return ChatMsg(rest, reasoning)
    end = rest.find(END, start)
    body = rest[start + len(START):end if end >= 0 else len(rest)]
    calls = _calls(body)
    tail = rest[end + len(END):].strip() if end >= 0 else ""
    if calls is None or (end < 0 and not params.partial) or tail:
        return ChatMsg(rest if not params.partial else rest[:start], reasoning)
    return ChatMsg(rest[:start], reasoning, calls if params.parallel_tool_calls else calls[:1])


def _calls(body: str) -> list[ToolCall] | None:
    if len(body) > MAX_CALL_CHARS:
        return None
    source = re.sub(r"\b(true|false|null)\b", lambda m: _JSON_WORDS[m.group(1)], body.strip())
    try:
        tree = ast.parse(source, mode="eval").body
        if not isinstance(tree, ast.List):
            return None
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
                return None
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            calls.append(ToolCall(ast.unparse(node.func), dumps(args)))
        return calls
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None

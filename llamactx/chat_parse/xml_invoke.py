"""Tool calls as XML elements with one element per parameter, for the families whose tags differ only in
spelling (llama.cpp counterparts: the autoparser's tag-tagged tool parser, build_tool_parser_tag_tagged in
common/chat-auto-parser-generator.cpp, for MiniMax-M2 and Seed-OSS; common/parsers/minicpm5.cpp;
common/parsers/deepseek.cpp for DeepSeek V3.2 / V4's DSML):

    MiniMax-M2  <minimax:tool_call><invoke name="f"><parameter name="a">V</parameter></invoke>...</minimax:tool_call>
    Seed-OSS    <seed:tool_call><function=f><parameter=a>V</parameter></function></seed:tool_call>   (per call)
    MiniCPM5    <function name="f"><param name="a">V</param></function>   (V may be <![CDATA[...]]>)
    DeepSeek    <｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="a" string="true">V
                </｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>   (V4: tool_calls; a call may end
                the thinking block without its </think>)

A parameter that may be a string (parse_params.may_be_string) is the raw text up to its closing tag; any other is
JSON. The text before the first call is content; a call that does not parse leaves the whole text as content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, dumps, held_back, may_be_string, split_reasoning


@dataclass(frozen=True, slots=True)
class XmlCalls:
    section: tuple[str, str]  # around all the calls ("", "" when none)
    per_call: tuple[str, str]  # around each call
    call_open: re.Pattern  # group 1: the function's name
    call_close: str
    param_open: re.Pattern  # group 1: the parameter's name
    param_close: str
    cdata: bool = False  # a string value may be wrapped in <![CDATA[...]]>
    calls_end_thinking: bool = False  # a call may follow the reasoning without its end tag (DeepSeek DSML)

    @property
    def trigger(self) -> str:
        """Where the calls begin (the grammar trigger)."""
        return self.section[0] or self.per_call[0] or self.call_open.pattern.split("(")[0].replace("\\", "")


FORMATS = {
    "minimax-m2": XmlCalls(("<minimax:tool_call>", "</minimax:tool_call>"), ("", ""),
                           re.compile(r'<invoke name="([^"]+)">'), "</invoke>",
                           re.compile(r'<parameter name="([^"]+)">'), "</parameter>"),
    "seed-oss": XmlCalls(("", ""), ("<seed:tool_call>", "</seed:tool_call>"),
                         re.compile(r"<function=([^>\n]+)>"), "</function>",
                         re.compile(r"<parameter=([^>\n]+)>"), "</parameter>"),
    **{name: XmlCalls((f"<｜DSML｜{block}>", f"</｜DSML｜{block}>"), ("", ""),
                      re.compile(r'<｜DSML｜invoke name="([^"]+)">'), "</｜DSML｜invoke>",
                      re.compile(r'<｜DSML｜parameter name="([^"]+)" string="(?:true|false)">'), "</｜DSML｜parameter>",
                      calls_end_thinking=True)
       for name, block in (("deepseek-v3.2", "function_calls"), ("deepseek-v4", "tool_calls"))},
    "minicpm5": XmlCalls(("", ""), ("", ""), re.compile(r'<function name="([^"]+)">'), "</function>",
                         re.compile(r'<param name="([^"]+)">'), "</param>", cdata=True),
}
_WS = re.compile(r"\s*")


def parse_xml_invoke(params: ChatParams, text: str) -> ChatMsg:
    fmt = FORMATS[params.format]
    full = params.prefixed(text)
    if fmt.calls_end_thinking and params.extract_reasoning and not params.enable_thinking:
        # thinking off: a bare end tag, or a block the model wrote anyway, is dropped (deepseek.cpp)
        m = re.match(r"\s*(?:<think>.*?)?</think>", full, re.S)
        return _finish(params, fmt, "", full[m.end():] if m else full)
    reasoning, rest = split_reasoning(params, full, (fmt.section[0],) if fmt.calls_end_thinking else ())
    if params.partial and fmt.calls_end_thinking:  # the section tag that may end the thinking, cut
        reasoning = held_back(reasoning, (fmt.section[0],)).rstrip()
    return _finish(params, fmt, reasoning, rest)


def _finish(params: ChatParams, fmt: XmlCalls, reasoning: str, rest: str) -> ChatMsg:
    if not params.has_tools:
        return ChatMsg(rest, reasoning)
    first = rest.find(fmt.trigger)
    if first < 0:
        return ChatMsg(held_back(rest, (fmt.trigger,)) if params.partial else rest, reasoning)
    calls, end = calls_at(params, fmt, rest, first)
    if calls is None or (rest[end:].strip() and not params.partial):
        return ChatMsg(rest[:first] if params.partial else rest, reasoning)
    return ChatMsg(rest[:first], reasoning, calls)


def calls_at(params: ChatParams, fmt: XmlCalls, text: str, pos: int) -> tuple[list[ToolCall] | None, int]:
    """(the calls from `pos`, at the section or first call's tag, and the position after them); None when they
    do not parse (when `partial`, the complete calls before one still being written)."""
    if fmt.section[0]:
        pos = _WS.match(text, pos + len(fmt.section[0])).end()
    calls: list[ToolCall] = []
    while params.parallel_tool_calls or not calls:
        start = pos
        if fmt.per_call[0]:
            if not text.startswith(fmt.per_call[0], pos):
                break
            pos = _WS.match(text, pos + len(fmt.per_call[0])).end()
        found = _call(params, fmt, text, pos)
        if found is None:
            if calls and (params.partial or not text[start:].strip()):
                return calls, len(text)
            return None, pos
        calls.append(found[0])
        pos = _WS.match(text, found[1]).end()
        if fmt.per_call[1]:
            if not text.startswith(fmt.per_call[1], pos):
                return (calls, len(text)) if params.partial else (None, pos)
            pos = _WS.match(text, pos + len(fmt.per_call[1])).end()
        if not fmt.per_call[0] and not fmt.call_open.match(text, pos):
            break
    if fmt.section[1]:
        if not text.startswith(fmt.section[1], pos):
            return (calls, len(text)) if params.partial and calls else (None, pos)
        pos = _WS.match(text, pos + len(fmt.section[1])).end()
    return calls or None, pos


def _call(params: ChatParams, fmt: XmlCalls, text: str, pos: int) -> tuple[ToolCall, int] | None:
    m = fmt.call_open.match(text, pos)
    if m is None or m.group(1).strip() not in params.tool_names():
        return None
    name = m.group(1).strip()
    props = params.parameters(name).get("properties") or {}
    args: dict = {}
    pos = _WS.match(text, m.end()).end()
    while (p := fmt.param_open.match(text, pos)) is not None:
        key = p.group(1).strip()
        value = _value(fmt, text, p.end(), props.get(key) if isinstance(props, dict) else None)
        if value is None:
            return None
        args[key], pos = value
        pos = _WS.match(text, pos).end()
    if not text.startswith(fmt.call_close, pos):
        return None
    return ToolCall(name, dumps(args)), pos + len(fmt.call_close)


def _value(fmt: XmlCalls, text: str, pos: int, schema: object) -> tuple[object, int] | None:
    """(value, end after the closing tag) of a parameter."""
    if fmt.cdata and may_be_string(schema) and text.startswith("<![CDATA[", pos):
        end = text.find("]]>", pos)
        if end < 0 or not text.startswith(fmt.param_close, end + 3):
            return None
        return text[pos + len("<![CDATA["):end], end + 3 + len(fmt.param_close)
    end = text.find(fmt.param_close, pos)
    if end < 0:
        return None
    raw = text[pos:end]
    if may_be_string(schema):
        return raw, end + len(fmt.param_close)
    try:
        return json.loads(raw), end + len(fmt.param_close)
    except (json.JSONDecodeError, RecursionError):
        return raw, end + len(fmt.param_close)

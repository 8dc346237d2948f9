"""Tool calls whose name and arguments sit between special tags: Kimi K2 and GLM 4.5 / 4.6 / 4.7 (llama.cpp
counterparts: common/parsers/kimi-k2.cpp, and the autoparser's reading of GLM's templates, pinned by
tests/test-chat.cpp):

    Kimi K2  <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{ARGS}
             <|tool_call_end|>...<|tool_calls_section_end|>          (the id is "functions.NAME:IDX")
    GLM      <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>   (newlines optional;
             a value is typed by the tool's schema, as Qwen3-Coder's XML values are)
    Ling 3   GLM's calls after <role>ASSISTANT</role>, ending at <|role_end|> (common/parsers/ling3.cpp)
"""

from __future__ import annotations

import re

from llamactx.chat_parse.json_prefix import scan
from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, dumps, held_back, json_text, split_reasoning
from llamactx.chat_parse.xml_calls import typed_value

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_KIMI_ID = re.compile(r"\s*(functions\.([^:<\s]+):\d+)\s*")
_GLM_CALL = re.compile(r"<tool_call>\s*([^<\s]+)\s*((?:<arg_key>.*?</arg_key>\s*<arg_value>.*?</arg_value>\s*)*)"
                       r"</tool_call>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _finish(params: ChatParams, content: str, reasoning: str, calls: list[ToolCall]) -> ChatMsg:
    return ChatMsg(content, reasoning, calls if params.parallel_tool_calls else calls[:1])


def parse_kimi_k2(params: ChatParams, text: str) -> ChatMsg:
    """Kimi's calls; as llama.cpp's parser, leniently: a call ends thinking (the model calls from inside it), and
    the section markers and a call's end tag may be missing."""
    reasoning, rest = split_reasoning(params, params.prefixed(text), also_ends=(SECTION_BEGIN, CALL_BEGIN))
    found_at = [i for i in (rest.find(SECTION_BEGIN), rest.find(CALL_BEGIN)) if i >= 0]
    if not params.has_tools or not found_at:
        return ChatMsg(rest, reasoning)
    start = min(found_at)
    calls, pos = [], start
    pos += len(SECTION_BEGIN) if rest.startswith(SECTION_BEGIN, pos) else 0
    while rest.startswith(CALL_BEGIN, pos):
        m = _KIMI_ID.match(rest, pos + len(CALL_BEGIN))
        found = json_text(rest, m.end() + len(ARG_BEGIN)) if m and rest.startswith(ARG_BEGIN, m.end()) else None
        if found is None:
            if params.partial and m and rest.startswith(ARG_BEGIN, m.end()):  # arguments still being written
                args_at = m.end() + len(ARG_BEGIN)
                scanned = scan(rest, args_at)
                if scanned is not None:
                    calls.append(ToolCall(m.group(2), rest[args_at:scanned[0]].lstrip(), m.group(1)))
                    pos = len(rest)
                break
            if params.partial and calls:
                break
            return ChatMsg(rest, reasoning)
        calls.append(ToolCall(m.group(2), found[0], m.group(1)))
        pos = found[1] + (len(CALL_END) if rest.startswith(CALL_END, found[1]) else 0)
    tail = rest[pos:].strip().removeprefix(SECTION_END).strip()
    if not calls or (tail and not params.partial):
        return ChatMsg(rest, reasoning)
    return _finish(params, rest[:start], reasoning, calls)


def _glm_calls(params: ChatParams, text: str, pos: int) -> tuple[list[ToolCall], int]:
    """The GLM-style <tool_call>NAME<arg_key>..</arg_key><arg_value>..</arg_value></tool_call> calls from `pos`
    (separated by whitespace) and the position after them."""
    calls = []
    while (m := _GLM_CALL.match(text, pos)) is not None:
        schema = params.parameters(m.group(1)).get("properties") or {}
        args = {k.strip(): typed_value(v, schema.get(k.strip())) for k, v in _GLM_ARG.findall(m.group(2))}
        calls.append(ToolCall(m.group(1), dumps(args)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return calls, pos


ROLE, ROLE_END = "<role>ASSISTANT</role>", "<|role_end|>"


def parse_ling3(params: ChatParams, text: str) -> ChatMsg:
    """Ling 3.0 / Bailing V3 (common/parsers/ling3.cpp): GLM's calls, a thinking block whose tags are both
    optional (while the generation prompt leaves it open, a call ends it too), and prose after the calls up to
    an <|role_end|> the model may spell out."""
    gp = params.generation_prompt
    think_open = gp.rfind("<think>") > gp.rfind("</think>")
    full = params.prefixed(text).removeprefix(ROLE).lstrip()
    full = full.removeprefix("<think>")
    ends = [i for i in (full.find("</think>"), full.find("<tool_call>") if think_open else -1) if i >= 0]
    body_end = min(ends, default=len(full))
    body, pos = full[:body_end], body_end + (len("</think>") if full.startswith("</think>", body_end) else 0)
    msg = ChatMsg(reasoning_content=body) if params.extract_reasoning else ChatMsg(body)
    rest = full[pos:]
    call_at = rest.find("<tool_call>") if params.has_tools else -1
    calls, after = _glm_calls(params, rest, call_at) if call_at >= 0 else ([], 0)
    if calls:
        msg.content += rest[:call_at]
        msg.tool_calls = calls if params.parallel_tool_calls else calls[:1]
        rest = rest[after:]
        call_at = rest.find("<tool_call>")
    if params.partial and call_at >= 0:
        rest = rest[:call_at]  # a call being written shows once complete
    msg.content += rest.split(ROLE_END, 1)[0]
    if params.partial:
        markers = ("</think>", "<tool_call>", ROLE_END)
        msg.content, msg.reasoning_content = held_back(msg.content, markers), held_back(msg.reasoning_content, markers)
    return msg


def parse_glm(params: ChatParams, text: str) -> ChatMsg:
    reasoning, rest = split_reasoning(params, params.prefixed(text))
    start = rest.find("<tool_call>")
    if not params.has_tools or start < 0:
        return ChatMsg(rest, reasoning)
    calls, pos = _glm_calls(params, rest, start)
    if not calls or (rest[pos:].strip() and not params.partial):
        return ChatMsg(rest, reasoning)
    return _finish(params, rest[:start], reasoning, calls)

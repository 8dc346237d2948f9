"""Parsing a reply while it is generated, so that a stream sends each piece once and in its final place
(llama.cpp counterpart: common_chat_parse with is_partial = true, whose lenient PEG parse stops before a marker
that is not complete yet, and tools/server's per-token diffs of the parsed message).

`parse_partial(params, text)` parses the text so far, holding back what may still change: a marker cut in half at
the end ("</thi", "<tool_ca"), and a tool call that has begun but is not complete (its text never shows up as
content). In the formats whose calls name the function before JSON arguments (Hermes `<tool_call>` blocks,
llamactx's generic JSON, Functionary v3.1's `<function=f>`), a call being written is there already, with its name
and the arguments written so far (as long as they are the beginning of a JSON object: json_prefix.scan), as
llama-server streams it; other formats show a call once it is complete. The message it gives only grows as text
is added, so `message.diffs` between two of them are what to send; the final parse (`parse`) then adds the rest,
a malformed call included (as content).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from llamactx.chat_parse import hermes
from llamactx.chat_parse.json_prefix import scan
from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams

# format -> the markers that open its tool calls
CALL_MARKERS: dict[str, tuple[str, ...]] = {
    "generic": ("<tool_call>",),
    "hermes": ("<tool_call>",),
    "qwen3-coder": ("<tool_call>", "<function="),
    "gpt-oss": (),
    "mistral": ("[TOOL_CALLS]",),
    "deepseek": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
    "llama3": ("<|python_tag|>",),
    "functionary-v3.1": ("<function=",),
    "functionary-v3.2": (">>>",),
    "command-r-plus": ("Action:",),
    "firefunction": ("functools",),
    "nemotron-v2": ("<TOOLCALL>",),
    "apriel": ("<tool_calls>",),
    "apertus": ("<|tools_prefix|>",),
    "granite": ("<|tool_call|>",),
    "command-r7b": ("<|START_ACTION|>",),
    "kimi-k2": ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
    "glm": ("<tool_call>",),
    "lfm2": ("<|tool_call_start|>",),
}
# format -> (the heads of a call up to its JSON arguments, name in group 1; whether a head only opens the reply)
CALL_HEADS: dict[str, tuple[tuple[re.Pattern, bool], ...]] = {
    "hermes": ((hermes.BLOCK_HEAD, False),),
    "generic": ((hermes.BLOCK_HEAD, False), (hermes.JSON_HEAD, True)),
    "functionary-v3.1": ((re.compile(r"<function=([^>]+)>"), False),),
}
# formats whose call may be the whole reply as a bare JSON object
JSON_REPLY = ("generic", "llama3")
# the markers that close a call or a section, and Harmony's and Command R7B's own: held back when cut as well
OTHER_MARKERS = ("</tool_call>", "<|tool_call_end|>", "<|tool_calls_section_end|>", "</arg_value>",
                 "</function>", "</parameter>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>",
                 "</TOOLCALL>", "</tool_calls>", "<|tools_suffix|>", "<|END_ACTION|>", "<|START_RESPONSE|>",
                 "<|END_RESPONSE|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|CHATBOT_TOKEN|>",
                 "<|END_OF_TURN_TOKEN|>", "<|start|>assistant", "<|channel|>", "<|message|>", "<|end|>")


def _markers(params: ChatParams) -> tuple[str, ...]:
    return (*CALL_MARKERS.get(params.format, ()), *((params.thinking_start,) if params.thinking_start else ()),
            *params.thinking_end, *OTHER_MARKERS)


def _without_cut_marker(text: str, markers: tuple[str, ...]) -> str:
    """`text` less a tail that is the beginning of a marker (the rest of it may come with the next token)."""
    longest = max((len(m) for m in markers), default=0)
    for k in range(min(len(text), longest - 1), 0, -1):
        tail = text[-k:]
        if any(len(m) > k and m.startswith(tail) for m in markers):
            return text[:-k]
    return text


def parse_partial(params: ChatParams, text: str, parse) -> ChatMsg:
    """The message of an unfinished reply (`parse` is chat_parse.parse)."""
    msg = parse(replace(params, partial=True), _without_cut_marker(text, _markers(params)))
    if params.has_tools:
        cuts = [i for i in (msg.content.find(m) for m in CALL_MARKERS.get(params.format, ())) if i >= 0]
        if cuts:
            msg.content = msg.content[:min(cuts)]
        if params.format in JSON_REPLY and msg.content.lstrip().startswith("{"):
            msg.content = ""  # may be a call as a whole JSON reply: known only once complete
        call = _call_being_written(params, text, msg.tool_calls)
        if call is not None:
            msg.tool_calls.append(call)
    return msg


def _call_being_written(params: ChatParams, text: str, done: list[ToolCall]) -> ToolCall | None:
    """The call after the `done` ones, with its name and its arguments so far, when its head is complete and
    its arguments so far begin a JSON object; None otherwise (nothing more to send yet)."""
    heads = CALL_HEADS.get(params.format)
    body = _after_reasoning(params, text)
    if not heads or body is None or (done and not params.parallel_tool_calls):
        return None
    found = sorted((m for pattern, at_start in heads
                    for m in ([pattern.match(body)] if at_start else pattern.finditer(body)) if m),
                   key=lambda m: m.start())
    if len(found) <= len(done) or any(_name(m) != c.name for m, c in zip(found, done, strict=False)):
        return None
    head = found[len(done)]
    scanned = scan(body, head.end())
    if scanned is None or body[head.end():scanned[0]].lstrip()[:1] not in ("", "{"):
        return None
    return ToolCall(_name(head), body[head.end():scanned[0]].strip())


def _name(head: re.Match) -> str:
    try:
        return json.loads(f'"{head.group(1)}"')
    except json.JSONDecodeError:
        return head.group(1)


def _after_reasoning(params: ChatParams, text: str) -> str | None:
    """The reply after its thinking block (all of it when there is none), None while the block is open."""
    full = params.prefixed(text)
    start = params.thinking_start
    if not (params.extract_reasoning and start and full.lstrip().startswith(start)):
        return full
    ends = [(full.find(tag), tag) for tag in params.thinking_end if tag in full]
    if not ends:
        return None
    i, tag = min(ends)
    return full[i + len(tag):]

"""Parsing a reply while it is generated, so that a stream sends each piece once and in its final place
(llama.cpp counterpart: common_chat_parse with is_partial = true, whose lenient PEG parse stops before a marker
that is not complete yet, and tools/server's per-token diffs of the parsed message).

`parse_partial(params, text)` parses the text so far, holding back what may still change: a marker cut in half at
the end ("</thi", "<tool_ca"), and a tool call that has begun but is not complete (its text never shows up as
content). The message it gives only grows as text is added, so `message.diffs` between two of them are what to
send; the final parse (`parse`) then adds the rest, a malformed call included (as content).
"""

from __future__ import annotations

from dataclasses import replace

from llamactx.chat_parse.message import ChatMsg
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
    return msg

"""Muse Glimmer's recipient-addressed messages (llama.cpp counterpart: common/parsers/muse-glimmer.cpp,
common_chat_params_init_muse_glimmer):

    <|start|>assistant to=self<|message|>THINKING<|eom|>
    <|start|>assistant to=user<|message|>ANSWER<|eom|>                      (or <|eot|> to end the turn)
    <|start|>assistant to=f<|message|><atem:function_calls><atem:invoke name="f">
        <atem:parameter name="a">V</atem:parameter></atem:invoke></atem:function_calls>

The generation prompt is "<|start|>assistant", so the reply starts at " to=". Thinking messages come first; then
an answer, a call, or an answer closed by <|eom|> and then calls ("inform then act"). Call markup inside an
answer or a thought is text, not a call. Parameters are read as xml_invoke reads them.
"""

from __future__ import annotations

import re

from llamactx.chat_parse.message import ChatMsg
from llamactx.chat_parse.parse_params import ChatParams, held_back
from llamactx.chat_parse.xml_invoke import XmlCalls, calls_at

START, EOM, EOT = "<|start|>assistant", "<|eom|>", "<|eot|>"
SELF, MESSAGE = " to=self<|message|>", "<|message|>"
CALLS = XmlCalls(("<atem:function_calls>", "</atem:function_calls>"), ("", ""),
                 re.compile(r'<atem:invoke name="([^"]+)">'), "</atem:invoke>",
                 re.compile(r'<atem:parameter name="([^"]+)">'), "</atem:parameter>")
_RECIPIENT = re.compile(r" to=([^<]*?)<\|message\|>")
MARKERS = (EOM, EOT, START, CALLS.section[0])


def parse_muse_glimmer(params: ChatParams, text: str) -> ChatMsg:
    gp = params.generation_prompt
    full = (gp if gp.startswith(START) else START) + text
    msg = ChatMsg()
    if not params.extract_reasoning and not params.has_tools and not params.response_format:
        msg.content = full[len(START):]
        return msg
    parts = full.split(START)[1:]
    i = 0
    while i < len(parts) and parts[i].startswith(SELF):  # the thinking messages
        body = parts[i][len(SELF):].split(EOM, 1)[0]
        if params.extract_reasoning:
            msg.reasoning_content += body
        else:
            msg.content += body
        i += 1
    for part in parts[i:]:
        if not _message(params, part, msg):
            break
    if params.partial:
        msg.content = held_back(msg.content, MARKERS)
        msg.reasoning_content = held_back(msg.reasoning_content, MARKERS)
    return msg


def _message(params: ChatParams, part: str, msg: ChatMsg) -> bool:
    """Add one message after the thinking: an answer (which may be followed by calls) or calls. False when
    nothing more can follow."""
    m = _RECIPIENT.match(part)
    if m and m.group(1) not in ("user", "self") and params.has_tools:
        calls, _ = calls_at(params, CALLS, part, m.end())
        if calls is None:
            if not params.partial:
                msg.content += part[m.end():]
            return False
        msg.tool_calls += calls if params.parallel_tool_calls or not msg.tool_calls else []
        return params.parallel_tool_calls
    at = len(" to=user") if part.startswith(" to=user") else 0
    if not part.startswith(MESSAGE, at) or msg.content or msg.tool_calls:
        return False
    body = part[at + len(MESSAGE):]
    end = min((j for j in (body.find(EOM), body.find(EOT)) if j >= 0), default=len(body))
    msg.content += body[:end]
    return body.startswith(EOM, end) and params.has_tools  # only calls may follow an answer

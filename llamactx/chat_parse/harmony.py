"""gpt-oss's Harmony format (llama.cpp counterpart: common/parsers/gpt-oss.cpp, common_chat_params_init_gpt_oss).

The reply is a run of messages, each `<|start|>assistant` (the first one is the generation prompt) then a channel:

    <|channel|>analysis<|message|>THINKING<|end|>              reasoning
    <|channel|>commentary<|message|>PREAMBLE<|end|>            content
    <|channel|>final<|message|>ANSWER                          content (the last message)
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}   a tool call
     to=functions.NAME<|channel|>commentary<|message|>{ARGS}                       (recipient in the role)

A call to a recipient outside `functions.` (the built-in python / container tools) is dropped, as llama.cpp
drops it; a stray `<|channel|>commentary to=assistant` before a channel is ignored. With reasoning_format none
the analysis messages stay in the content, markup and all.
"""

from __future__ import annotations

import re

from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, json_text

START, END = "<|start|>assistant", "<|end|>"
_HEADER = re.compile(
    r"(?P<stray><\|channel\|>commentary(?: to=assistant)?(?=<\|channel\|>))?"
    r"(?: to=(?P<role_to>[^\s<]+))?"
    r"<\|channel\|>(?P<channel>analysis|commentary|final)"
    r"(?: to=(?P<chan_to>[^\s<]+))?"
    r"(?:\s*(?:<\|constrain\|>)?[A-Za-z0-9_-]+)?"
    r"<\|message\|>")


def parse_gpt_oss(params: ChatParams, text: str) -> ChatMsg:
    full = params.generation_prompt + text if params.generation_prompt.startswith(START) else START + text
    msg = ChatMsg()
    for part in full.split(START)[1:]:
        m = _HEADER.match(part)
        if m is None:
            if not params.partial:  # not Harmony: the model's words as they are (a header may be unfinished)
                msg.content += part
            continue
        body = part[m.end():]
        closed = body.find(END)
        body_text = body[:closed] if closed >= 0 else body
        recipient = m.group("role_to") or m.group("chan_to")
        if recipient:
            _call(params, msg, recipient, body_text)
        elif m.group("channel") == "analysis":
            if params.extract_reasoning:
                msg.reasoning_content += body_text
            else:
                msg.content += part[m.start("channel") - len("<|channel|>"):m.end()] + body_text + (
                    END if closed >= 0 else "")
        else:
            msg.content += body_text
    if not params.parallel_tool_calls:
        msg.tool_calls = msg.tool_calls[:1]
    return msg


def _call(params: ChatParams, msg: ChatMsg, recipient: str, body: str) -> None:
    if not recipient.startswith("functions.") or not params.has_tools:
        return  # built-in tools (python, container.exec) and the assistant itself are not function calls
    name = recipient[len("functions."):]
    found = json_text(body)
    if found is None or body[found[1]:].strip():
        if not params.partial:  # malformed arguments: the text stays with the user (unfinished ones wait)
            msg.content += body
        return
    msg.tool_calls.append(ToolCall(name, found[0]))

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
from llamactx.chat_parse.json_prefix import dumped_prefix, scan
from llamactx.chat_parse.message import ChatMsg, ToolCall
from llamactx.chat_parse.parse_params import ChatParams, dumps
from llamactx.chat_parse.xml_calls import _types as typed_kinds
from llamactx.chat_parse.xml_calls import typed_value

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
# A call's head: its text up to its JSON arguments, the name in group "name" (and the id in group "id" where the
# format writes one first). RAW: the parser passes the arguments on as written; DUMPED: it re-serialises them (so a
# stream sends json_prefix.dumped_prefix of them).
RAW, DUMPED = "raw", "dumped"
_NAME = r'"(?P<name>(?:[^"\\\n]|\\.)*)"'
_JSON_CALL = r'\{\s*"name"\s*:\s*' + _NAME + r'\s*,\s*"(?:arguments|parameters)"\s*:\s*'


def _listed(opening: str, item: str = _JSON_CALL) -> re.Pattern:
    """The head of a call in a JSON list after `opening`: the first item, or one after a comma."""
    return re.compile(r"(?:" + opening + r"\s*\[|\}\s*,)\s*" + item)


# format -> ((head, whether it only opens the reply, RAW | DUMPED), ...)
CALL_HEADS: dict[str, tuple[tuple[re.Pattern, bool, str], ...]] = {
    "hermes": ((re.compile(re.escape(hermes.OPEN) + r"\s*" + _JSON_CALL), False, RAW),),
    "generic": ((re.compile(re.escape(hermes.OPEN) + r"\s*" + _JSON_CALL), False, RAW),
                (re.compile(r"\s*" + _JSON_CALL), True, RAW)),
    "functionary-v3.1": ((re.compile(r"<function=(?P<name>[^>]+)>"), False, RAW),),
    "functionary-v3.2": ((re.compile(r"(?:\A|>>>)(?P<name>[^\n>]+)\n"), False, RAW),),  # a message to a tool
    "llama3": ((re.compile(r"(?:\A\s*(?:<\|python_tag\|>)?|;)\s*\{\s*(?:\"type\"\s*:\s*\"function\"\s*,\s*)?"
                           r'"name"\s*:\s*' + _NAME + r'\s*,\s*"(?:parameters|arguments)"\s*:\s*'), False, DUMPED),),
    "mistral": ((re.compile(r"\[TOOL_CALLS\](?P<name>[^\[\]{\"]+?)(?:\[CALL_ID\](?P<id>[^\[]*))?\[ARGS\]"),
                 False, RAW),
                (_listed(r"\[TOOL_CALLS\]"), False, DUMPED)),
    "deepseek": ((re.compile(r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>(?P<name>[^\n<]+)\n\s*```(?:json)?\s*(?=\{)"),
                  False, RAW),
                 (re.compile(r"<｜tool▁call▁begin｜>(?!function<)(?P<name>[^<]+?)<｜tool▁sep｜>"), False, RAW)),
    "gpt-oss": ((re.compile(r"to=functions\.(?P<name>[^\s<]+)(?:\s*<\|channel\|>commentary)?"
                            r"(?:\s*(?:<\|constrain\|>)?[A-Za-z0-9_-]+)?<\|message\|>"), False, RAW),),
    "firefunction": ((_listed("functools"), False, DUMPED),),
    "nemotron-v2": ((_listed("<TOOLCALL>"), False, DUMPED),),
    "apriel": ((_listed("<tool_calls>"), False, DUMPED),),
    "granite": ((_listed(r"<\|tool_call\|>"), False, DUMPED),),
    "command-r7b": ((_listed(r"<\|START_ACTION\|>", r'\{\s*"tool_call_id"\s*:\s*"(?P<id>[^"]*)"\s*,\s*'
                             r'"tool_name"\s*:\s*' + _NAME + r'\s*,\s*"parameters"\s*:\s*'), False, DUMPED),),
    "command-r-plus": ((_listed(r"Action:\s*```(?:json)?\s*", r'\{\s*"tool_name"\s*:\s*' + _NAME +
                                r'\s*,\s*"parameters"\s*:\s*'), False, DUMPED),),
    "apertus": ((_listed(r"<\|tools_prefix\|>", r'\{\s*"(?P<name>[^"]+)"\s*:\s*'), False, DUMPED),),
}
# formats whose arguments are tagged values (format -> call head with its name, a parameter's opening with its
# key, the text that ends a value, the separator the parser skips): a stream sends the parser's JSON of the values
# so far, a string value while it is written (xml_calls, tagged_calls)
TAGGED: dict[str, tuple[re.Pattern, re.Pattern, str, str]] = {
    "qwen3-coder": (re.compile(r"<function=(?P<name>[^>\n]+)>\n?"), re.compile(r"<parameter=(?P<key>[^>\n]+)>\n?"),
                    "\n</parameter>", " \n"),
    "glm": (re.compile(r"<tool_call>\s*(?P<name>[^<\s]+)(?=[\s<])\s*"),  # a whole name: "f" may begin "f_2"
            re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>", re.S), "</arg_value>", " \t\r\n"),
}
# formats whose heads name any recipient: only the tools' names start a call
TOOL_NAMED = ("functionary-v3.2", "gpt-oss")
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
    if any(text.endswith(m) for m in markers):  # ">>>" ends in ">>", the beginning of another: it is whole
        return text
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
        msg.tool_calls += _calls_being_written(params, text, msg.tool_calls)
        for call in msg.tool_calls:  # a named call's arguments are "{" until more is written
            call.arguments = call.arguments or "{"
    return msg


def _calls_being_written(params: ChatParams, text: str, done: list[ToolCall]) -> list[ToolCall]:
    """The calls after the `done` ones that the text has begun: each whose head is complete, with its arguments
    so far (as long as they begin a JSON object), up to the first unfinished one; arguments not begun yet are
    "{" (common_chat_peg_mapper on TOOL_NAME)."""
    heads = CALL_HEADS.get(params.format)
    body = _after_reasoning(params, text)
    if params.format in TAGGED and body is not None:
        return _tagged_calls_being_written(params, body, done)
    if not heads or body is None:
        return []
    found = sorted(((m, style) for pattern, at_start, style in heads
                    for m in ([pattern.match(body)] if at_start else pattern.finditer(body)) if m),
                   key=lambda found: found[0].start())
    if params.format in TOOL_NAMED:
        found = [(m, style) for m, style in found if _name(m) in params.tool_names()]
    if any(_name(m) != c.name for (m, _), c in zip(found, done, strict=False)):
        return []
    out: list[ToolCall] = []
    for head, style in found[len(done):]:
        if (done or out) and not params.parallel_tool_calls:
            break
        scanned = scan(body, head.end())
        raw = body[head.end():scanned[0]].strip() if scanned is not None else None
        if raw is None or raw[:1] not in ("", "{"):
            break
        args = dumped_prefix(raw) if style == DUMPED and raw else raw
        if args is None:
            break
        out.append(ToolCall(_name(head), args or "{", _id(head)))
        if not scanned[1]:
            break
    return out


def _tagged_calls_being_written(params: ChatParams, body: str, done: list[ToolCall]) -> list[ToolCall]:
    """The tagged call after the `done` ones, with the JSON of its complete values and of a string value being
    written (without the closing quote and brace: what the final dumps begins with)."""
    head_re, param_re, value_end, space = TAGGED[params.format]
    heads = [m for m in head_re.finditer(body) if m.group("name").strip() in params.tool_names()]
    if len(heads) <= len(done) or (done and not params.parallel_tool_calls):
        return []
    head = heads[len(done)]
    name = head.group("name").strip()
    schema = params.parameters(name).get("properties") or {}
    args: dict = {}
    pos, partial = head.end(), ""
    while True:
        while pos < len(body) and body[pos] in space:
            pos += 1
        m = param_re.match(body, pos)
        if m is None:
            break
        key = m.group("key").strip()
        end = body.find(value_end, m.end())
        if end < 0:
            if typed_kinds(schema.get(key)) == {"string"}:  # a string goes out while written; others once whole
                value = body[m.end():]
                cut = next((k for k in range(len(value_end) - 1, 0, -1) if value.endswith(value_end[:k])), 0)
                value = value[:len(value) - cut]  # the end tag may be on its way
                partial = json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)[:-1]
            break
        args[key] = typed_value(body[m.end():end], schema.get(key))
        pos = end + len(value_end)
    known = dumps(args)[:-1]
    return [ToolCall(name, known + (", " if args and partial else "") + partial)]


def _name(head: re.Match) -> str:
    try:
        return json.loads(f'"{head.group("name")}"')
    except json.JSONDecodeError:
        return head.group("name")


def _id(head: re.Match) -> str:
    return (head.groupdict().get("id") or "").strip()


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

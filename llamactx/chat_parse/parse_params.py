"""What a family parser is given, and the scanning it shares (common/chat.h common_chat_params /
common_chat_parser_params, and the building blocks of common/chat-peg-parser.cpp: literals, `until`, reasoning
blocks, JSON values).

llama.cpp parses `generation_prompt + text`: the suffix the template appends for the assistant turn, then what the
model wrote. A template whose generation prompt opens a thinking block (Qwen3.5's "<think>\\n", DeepSeek R1's
"<think>\\n") therefore parses text that starts inside it. `ChatParams.prefixed(text)` gives that input from the
thinking tag on (the turn header itself carries nothing to parse).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamactx.errors import LlamactxError

# common/common.h common_reasoning_format, by common_reasoning_format_name
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
TOOL_CHOICES = ("auto", "required", "none")


class ChatParseError(LlamactxError, ValueError):
    """A parse option out of range (reasoning_format, tool_choice), naming the field and the known values."""


def check_reasoning_format(value: str, field: str = "reasoning_format") -> str:
    """`value` if it is one of llama.cpp's reasoning formats, else ChatParseError naming them
    (common_reasoning_format_from_name)."""
    if value not in REASONING_FORMATS:
        raise ChatParseError(f"{field}: unknown reasoning format {value!r} (known: {', '.join(REASONING_FORMATS)})")
    return value


@dataclass(frozen=True, slots=True)
class ChatParams:
    """The parse side of common_chat_params for one request."""

    format: str
    generation_prompt: str = ""
    reasoning_format: str = "auto"
    enable_thinking: bool = True
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False
    thinking_start: str = ""  # "" when the family has no thinking block
    thinking_end: tuple[str, ...] = field(default=())
    partial: bool = False  # the reply is still being generated (stream.parse_partial)
    prefill: str = ""  # a continued message's text before what the model adds (continue_final_message)
    response_format: bool = False  # a json_schema / response_format constrains the answer to one JSON value

    @property
    def extract_reasoning(self) -> bool:
        return self.reasoning_format != "none"

    @property
    def has_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def tool_names(self) -> list[str]:
        return [function_of(t).get("name", "") for t in self.tools]

    def parameters(self, name: str) -> Mapping[str, Any]:
        """The JSON schema of tool `name`'s parameters ({} when unknown)."""
        for t in self.tools:
            fn = function_of(t)
            if fn.get("name") == name:
                params = fn.get("parameters")
                return params if isinstance(params, Mapping) else {}
        return {}

    def prefixed(self, text: str) -> str:
        """`text` preceded by the part of the generation prompt from its thinking tag on (the whole model turn
        as the model sees it)."""
        start = self.thinking_start
        gp = self.generation_prompt
        if start and start in gp:
            return gp[gp.rindex(start):] + text
        return text


def function_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function", tool)
    return fn if isinstance(fn, Mapping) else {}


def split_reasoning(params: ChatParams, text: str, also_ends: Sequence[str] = ()) -> tuple[str, str]:
    """(reasoning, rest) of `text` when it opens with the thinking tag: the block runs to the first end tag
    (consumed) or to the first of `also_ends` (kept: a tool call that ends thinking); an unclosed block is all
    reasoning (a reply cut short while thinking). Without extraction, or without the tag, ("", text).
    The rest loses its leading whitespace after a block, as llama.cpp's `reasoning << content` does."""
    start = params.thinking_start
    if not (params.extract_reasoning and start):
        return "", text
    body = text.lstrip()
    if not body.startswith(start):
        return "", text
    body = body[len(start):]
    best, consumed = len(body), 0
    for tag in params.thinking_end:
        i = body.find(tag)
        if 0 <= i < best:
            best, consumed = i, len(tag)
    for tag in also_ends:
        i = body.find(tag)
        if 0 <= i < best:
            best, consumed = i, 0
    return body[:best].strip(), body[best + consumed:].lstrip()


def held_back(text: str, markers: Sequence[str]) -> str:
    """`text` less a tail that begins one of `markers` (a partial reply may be cut inside a tag)."""
    for k in range(min(len(text), max((len(m) for m in markers), default=1) - 1), 0, -1):
        if any(len(m) > k and m.startswith(text[-k:]) for m in markers):
            return text[:-k]
    return text


_DECODER = json.JSONDecoder()


def json_at(text: str, pos: int = 0) -> tuple[Any, int] | None:
    """(value, end) of the JSON value at `pos` (after whitespace), or None where there is none."""
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except (json.JSONDecodeError, RecursionError):
        return None


def json_text(text: str, pos: int = 0) -> tuple[str, int] | None:
    """(the JSON value's own text, end) at `pos`: arguments are passed on as the model wrote them."""
    found = json_at(text, pos)
    if found is None:
        return None
    end = found[1]
    start = pos + len(text[pos:end]) - len(text[pos:end].lstrip())
    return text[start:end], end


def dumps(value: Any) -> str:
    """Arguments built from parsed values, as llama.cpp's json::dump() with its ", " / ": " separators."""
    return json.dumps(value, ensure_ascii=False)


def arguments_of(value: Any) -> str | None:
    """A call's arguments as JSON text: an object as JSON, a string as is when it holds JSON; None otherwise."""
    if isinstance(value, Mapping):
        return dumps(value)
    if isinstance(value, str):
        found = json_at(value)
        return value if found is not None and isinstance(found[0], Mapping) else None
    return None


_FENCED = re.compile(r"\s*```(?:json)?\s*(.*?)\s*```\s*\Z", re.S)


def response_content(content: str, partial: bool = False) -> str:
    """The answer of a response-format reply: its JSON value, out of a ```json fence when the model wrote one
    (the autoparser's response-format rule: "```json" JSON "```" or JSON alone). When `partial`, a fence being
    opened or closed is held back, so that the answer only grows."""
    m = _FENCED.match(content)
    if m:
        return m.group(1)
    body = content.strip()
    if not partial:
        return body
    if "```json".startswith(body):
        return ""
    if body.startswith("```json"):
        body = body[len("```json"):].split("```", 1)[0]
        return body.rstrip("`").strip()
    return body


def schema_alternatives(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A union's alternatives: anyOf / oneOf, or one schema per entry of a list of types ([] otherwise)."""
    alts = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(alts, list):
        return [a for a in alts if isinstance(a, Mapping)]
    if isinstance(schema.get("type"), list):
        return [{**schema, "type": t} for t in schema["type"]]
    return []


def may_be_string(schema: Any) -> bool:
    """common_chat_schema::may_be_string: a string, a string const / enum member, or a union with one."""
    if not isinstance(schema, Mapping):
        return False
    if schema.get("type") == "string":
        return True
    if "const" in schema:
        return isinstance(schema["const"], str)
    if isinstance(schema.get("enum"), list):
        return any(isinstance(v, str) for v in schema["enum"])
    if isinstance(schema.get("allOf"), list):
        parts = [s for s in schema["allOf"] if isinstance(s, Mapping) and s]
        return bool(parts) and all(may_be_string(s) for s in parts)
    return any(may_be_string(a) for a in schema_alternatives(schema))

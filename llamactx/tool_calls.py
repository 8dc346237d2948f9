"""Tool calling: tools go into the prompt, the model's tool calls come out parsed (llama.cpp's common/chat: the
Hermes `<tool_call>` format and the generic JSON format).

- `prepare(template, messages, tools, tool_choice)`: what the chat template renders. A template that takes
  `tools` gets them as they are; one that does not gets a system message describing them and the Hermes
  format to answer in (as common/chat's generic handler adds its own instructions).
- `call_schema(tools, tool_choice)`: when a call is required ("required", or a named function), the JSON
  schema the output must follow: {"name": one of the tools, "arguments": its parameters}. Sampled under that
  schema (the grammar sampler), the output always parses as a call.
- `call_grammar(fns, fmt, tool_choice, parallel)`: the grammar that keeps a call valid JSON for its tool's
  schema (llama.cpp: the template's tool-call grammar, json-schema-to-grammar of each tool's parameters): for the
  Hermes `<tool_call>` formats a lazy one triggered at the call's start when the model may also answer in words
  ("auto"), from the first token when it must call ("required", a named function); one call unless
  `parallel_tool_calls`. Other formats get the bare JSON call for "required" and no grammar for "auto".
- `parse(text)`: (content, calls) from the model's text in llamactx's generic format: `<tool_call>{json}
  </tool_call>` blocks (Hermes, Qwen 2.5, SmolLM2's tool tuning), or a whole JSON object with `tool_calls` /
  `tool_call` / `name` + `arguments`, or {"response": "..."} (the generic format's plain answer). Anything else
  is content. The parsing itself is llamactx.chat_parse's (every family's); this is its template-free form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamactx.chat_parse.hermes import generic_calls
from llamactx.chat_parse.message import ToolCall, new_call_id
from llamactx.errors import LlamactxError

__all__ = ["ToolCall", "ToolCallError", "ToolGrammar", "call_grammar", "call_schema", "functions", "parse", "prepare",
           "required_function"]

# common/json-schema-to-grammar.cpp SPACE_RULE: nothing, a space, or one or two newlines and an indent
JSON_SPACE = r"(?: |\n{1,2}[ \t]{0,20})?"
BLOCK_FORMATS = ("hermes", "generic")  # formats whose calls are <tool_call>{json}</tool_call> blocks

class ToolCallError(LlamactxError, ValueError):
    """Malformed `tools` / `tool_choice` in a request (names the field)."""


def functions(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The `function` objects of OpenAI `tools`, checked: each has a name, parameters are an object schema."""
    out = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            raise ToolCallError(f"tools[{i}]: expected {{'type': 'function', 'function': {{...}}}}")
        fn = tool.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolCallError(f"tools[{i}].function.name: missing or not a string")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, Mapping):
            raise ToolCallError(f"tools[{i}].function.parameters: expected a JSON schema object")
        out.append({"name": fn["name"], "description": fn.get("description", ""), "parameters": dict(params)})
    return out


def required_function(tool_choice: Any, fns: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The functions one of which must be called, or None when a call is not required ("auto", "none")."""
    if tool_choice in (None, "auto", "none"):
        return None
    if tool_choice == "required":
        if not fns:
            raise ToolCallError("tool_choice: 'required' needs at least one tool")
        return fns
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [f for f in fns if f["name"] == name]
        if not chosen:
            raise ToolCallError(f"tool_choice.function.name: {name!r} is not one of the tools")
        return chosen
    raise ToolCallError(f"tool_choice: {tool_choice!r} is not 'none', 'auto', 'required' or a function")


def call_schema(fns: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of one call to one of `fns`, in compact JSON. Arguments take only the declared
    parameters unless the function's schema says otherwise (OpenAI's strict mode), so that a small model cannot
    ramble on in extra keys."""
    options = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": _closed(f["parameters"])},
                "required": ["name", "arguments"], "additionalProperties": False} for f in fns]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}


@dataclass(frozen=True, slots=True)
class ToolGrammar:
    """A tool-call grammar in llguidance's Lark; lazy (applied from the first trigger word on) when `triggers`."""

    lark: str
    triggers: tuple[str, ...] = ()


def call_grammar(fns: list[dict[str, Any]], fmt: str, tool_choice: Any, parallel: bool) -> ToolGrammar | None:
    """The grammar of this request's calls (common_chat_params grammar / grammar_lazy / grammar_triggers), or None
    when nothing is constrained ("none", no tools, a format without a grammar here for "auto")."""
    required = required_function(tool_choice, fns)
    if not fns or tool_choice == "none" or (required is None and fmt not in BLOCK_FORMATS):
        return None
    schema = {k: v for k, v in call_schema(required or fns).items() if k != "x-guidance"}
    schema["x-guidance"] = {"whitespace_flexible": True, "whitespace_pattern": JSON_SPACE}
    if fmt not in BLOCK_FORMATS:  # the bare JSON call (the parse goes generic)
        return ToolGrammar(f"%llguidance {{}}\nstart: call\ncall: %json {json.dumps(schema)}\n")
    start = "start: block (WS? block)*" if parallel else "start: block"
    lark = (f'%llguidance {{}}\n{start}\nblock: "<tool_call>" WS? call WS? "</tool_call>"\n'
            f"WS: /[ \\t\\r\\n]+/\ncall: %json {json.dumps(schema)}\n")
    return ToolGrammar(lark, () if required else ("<tool_call>",))


def _closed(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("type") == "object" and "properties" in params and "additionalProperties" not in params:
        return {**params, "additionalProperties": False}
    return params


def prepare(template_source: str, messages: list[dict[str, Any]], fns: list[dict[str, Any]],
            tool_choice: Any = "auto") -> tuple[list[dict[str, Any]], bool]:
    """(messages, pass_tools): the messages to render and whether the template takes `tools` itself. A template
    that never mentions tools gets a system message describing them, unless tool_choice is "none" (a template that
    takes them still renders them then, as llama-server's prompt has them whatever the tool_choice)."""
    if not fns or "tools" in template_source:
        return messages, bool(fns)
    if tool_choice == "none":
        return messages, False
    spec = json.dumps([{"type": "function", "function": f} for f in fns], ensure_ascii=False)
    note = ("You can call these tools:\n" + spec + "\nTo call one, answer only with <tool_call>{\"name\": "
            "\"...\", \"arguments\": {...}}</tool_call>.")
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}
        return [first, *messages[1:]], False
    return [{"role": "system", "content": note}, *messages], False


def parse(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a model's answer in llamactx's generic format (chat_parse.hermes.generic_calls);
    content None when the answer is only calls, and every call has an id."""
    content, calls = generic_calls(text)
    for call in calls:
        call.id = call.id or new_call_id()
    if calls:
        return content.strip() or None, calls
    return content, calls

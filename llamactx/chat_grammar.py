"""The grammar of a chat format's tool calls: what its model may write when it must or may call a tool (llama.cpp
counterpart: the `grammar`, `grammar_lazy` and `grammar_triggers` that each common_chat_params_init_* builds from
its parser with common_peg_arena::build_grammar, e.g. common/parsers/functionary-v3-2.cpp; common/sampling.cpp
turns the triggers into llama_sampler_init_grammar_lazy_patterns).

`call_grammar(fns, params, tool_choice, parallel)` gives a `tool_calls.ToolGrammar` (llguidance Lark, with trigger
words or patterns when lazy) or None:

- Functionary v3.2 (`>>>recipient\\n`, the first `>>>` in the generation prompt): as llama.cpp builds it,
  "required" is `all\\n` text then a call, or calls from the first token; "auto" is lazy, switched on by a tool's
  name opening a message (`name\\n` at the reply's start or after `>>>`), from where calls follow.
- Functionary v3.1 (`<function=NAME>{args}</function>`), Nemotron Nano 2 / Apriel / Granite (a JSON list of
  {"name", "arguments"} after `<TOOLCALL>` / `<tool_calls>` / `<|tool_call|>`): the calls from the first token
  for "required", lazy on the format's call marker for "auto" (the autoparser's section or per-call start).
- The Hermes `<tool_call>` formats and llamactx's generic one: tool_calls.call_grammar's.
- Any other format: tool_calls.call_grammar's bare JSON call for "required" (its reply then parses as the generic
  format: `uses_own_format` is False), nothing for "auto".

Arguments follow each tool's JSON schema with json-schema-to-grammar's whitespace (tool_calls.JSON_SPACE), so a
model under this grammar writes, token for token, what it writes under llama.cpp's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llamactx import chat_sampling, tool_calls
from llamactx.chat_parse import ChatParams
from llamactx.sampling.grammar import GrammarSampler
from llamactx.sampling.lazy_grammar import LazyGrammarSampler
from llamactx.tool_calls import ToolGrammar
from llamactx.vocab import Vocab

# text without ">>>" (functionary-v3-2.cpp's p.until(">>>"))
_NO_RECIPIENT = r"(?:[^>]|>[^>]|>>[^>])*>{0,2}"


@dataclass(frozen=True, slots=True)
class PatternGrammar:
    """A lazy grammar switched on by regular expressions (COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN): from a match's
    first non-empty group on (the whole match without one)."""

    lark: str
    patterns: tuple[str, ...]


def _args(fn: Mapping[str, Any]) -> str:
    """%json of a function's parameters, with llama.cpp's space rule between tokens."""
    schema = dict(tool_calls._closed(fn["parameters"]))  # noqa: SLF001 - the one closing rule tool calls share
    schema["x-guidance"] = {"whitespace_flexible": True, "whitespace_pattern": tool_calls.JSON_SPACE}
    return "%json " + json.dumps(schema)


def _lark_text(text: str) -> str:
    return json.dumps(text)


def _functionary_v3_2(fns: list[dict[str, Any]], required: bool, parallel: bool) -> ToolGrammar | PatternGrammar:
    """functionary-v3-2.cpp: `tool-<name> ::= "<name>\\n" <args>`, `tools ::= tool+`; required:
    ("all\\n" until(">>>") tool | tools), or ("all\\n" until(">>>") tools | tools) when parallel; auto: tools,
    lazy."""
    rules = [f"tool_{i}: {_lark_text(f['name'] + chr(10))} args_{i}\nargs_{i}: {_args(f)}" for i, f in enumerate(fns)]
    one = " | ".join(f"tool_{i}" for i in range(len(fns)))
    lines = ["%llguidance {}", f"tool: {one}", "tools: tool+", *rules]
    if not required:
        names = "|".join(re.escape(f["name"]) for f in fns)
        return PatternGrammar("\n".join([lines[0], "start: tools", *lines[1:]]) + "\n",
                              (rf"\A((?:{names})\n)", rf">>>((?:{names})\n)"))
    # "all\n" text then a call: the text is a lazy lexeme ending at the first "<name>\n", then that call's args
    after = [f"after_{i}: head_{i} args_{i}" + ("" if not parallel else " tool*") for i in range(len(fns))]
    heads = [f"head_{i}[lazy]: /{_NO_RECIPIENT}/ {_lark_text(f['name'] + chr(10))}" for i, f in enumerate(fns)]
    content = '"all\\n" (' + " | ".join(f"after_{i}" for i in range(len(fns))) + ")"
    return ToolGrammar("\n".join([lines[0], f"start: {content} | tools", *lines[1:], *after, *heads]) + "\n")


def _functionary_v3_1(fns: list[dict[str, Any]], required: bool, parallel: bool) -> ToolGrammar:
    """`<function=NAME>{args}</function>`, one or (parallel) more; lazy on "<function=" when not required (the
    autoparser's per-call start, common_chat_params' grammar_triggers)."""
    rules = [f'tool_{i}: "<function=" {_lark_text(f["name"] + ">")} args_{i} "</function>"\nargs_{i}: {_args(f)}'
             for i, f in enumerate(fns)]
    return _lark(rules, len(fns), parallel, "", (), () if required else ("<function=",))


def _json_list(opening: str, closing: str) -> Callable[[list[dict[str, Any]], bool, bool], ToolGrammar]:
    """OPENING [{"name": "f", "arguments": {args}}, ...] CLOSING (Nemotron Nano 2, Apriel, Granite): one item,
    or (parallel) more, each a call to one of the tools; lazy on OPENING when not required."""

    def build(fns: list[dict[str, Any]], required: bool, parallel: bool) -> ToolGrammar:
        rules = [f'tool_{i}: "{{" WS? "\\"name\\"" WS? ":" WS? {_lark_text(json.dumps(f["name"]))} WS? "," WS? '
                 f'"\\"arguments\\"" WS? ":" WS? args_{i} WS? "}}"\nargs_{i}: {_args(f)}'
                 for i, f in enumerate(fns)]
        return _lark(rules, len(fns), parallel, ",", (opening + "[", "]" + closing),
                     () if required else (opening,))

    return build


def _lark(rules: list[str], n: int, parallel: bool, sep: str, wrap: tuple[str, ...],
          triggers: tuple[str, ...]) -> ToolGrammar:
    """start: WRAP[0] tool (WS? SEP WS? tool)* WRAP[1], the calls `tool_<i>` of `rules` (one unless
    `parallel`)."""
    more = (f" (WS? {_lark_text(sep)} WS? tool)*" if sep else " (WS? tool)*") if parallel else ""
    head, tail = (f"{_lark_text(wrap[0])} WS? ", f" WS? {_lark_text(wrap[1])}") if wrap else ("", "")
    lines = ["%llguidance {}", f"start: {head}tool{more}{tail}",
             "tool: " + " | ".join(f"tool_{i}" for i in range(n)), r"WS: /[ \t\r\n]+/", *rules]
    return ToolGrammar("\n".join(lines) + "\n", triggers)


FORMAT_GRAMMARS: dict[str, Callable[[list[dict[str, Any]], bool, bool], ToolGrammar | PatternGrammar]] = {
    "functionary-v3.2": _functionary_v3_2,
    "functionary-v3.1": _functionary_v3_1,
    "nemotron-v2": _json_list("<TOOLCALL>", "</TOOLCALL>"),
    "apriel": _json_list("<tool_calls>", "</tool_calls>"),
    "granite": _json_list("<|tool_call|>", ""),
}


def uses_own_format(params: ChatParams, tool_choice: Any, fns: list[dict[str, Any]]) -> bool:
    """Whether a reply under this request's grammar is in the template's own format (so it parses with the
    template's parser); False where a required call is forced as llamactx's bare JSON call."""
    return tool_calls.required_function(tool_choice, fns) is None or params.format in FORMAT_GRAMMARS


def call_grammar(fns: list[dict[str, Any]], params: ChatParams, tool_choice: Any,
                 parallel: bool) -> ToolGrammar | PatternGrammar | None:
    """The grammar of this request's calls, or None when nothing is constrained. A named function as
    tool_choice is "required" with that function alone. Raises tool_calls.ToolCallError for a tool_choice that
    names no tool."""
    build = FORMAT_GRAMMARS.get(params.format)
    if build is None or not fns or tool_choice == "none":
        return tool_calls.call_grammar(fns, params.format, tool_choice, parallel)
    required = tool_calls.required_function(tool_choice, fns)
    return build(required or fns, required is not None, parallel)


def grammar_sampler(vocab: Vocab, grammar: ToolGrammar | PatternGrammar, params: ChatParams | None = None):
    """The sampler of `grammar` (compiled by llguidance: call it off the event loop); a lazy one while the reply
    may still be words. Raises GrammarError when a tool's parameters are not a schema the engine compiles."""
    if isinstance(grammar, ToolGrammar):
        return chat_sampling.tool_grammar_sampler(vocab, grammar, params)
    return LazyGrammarSampler(GrammarSampler.from_lark(vocab, grammar.lark), (),
                              params.thinking_end if params else (), chat_sampling.opens_thinking(params),
                              patterns=grammar.patterns)

"""A chat request prepared as llama-server prepares it: the prompt with its tools, how the reply is parsed
(thinking into `reasoning_content`, calls into `tool_calls`) and the grammar that keeps the calls valid (llama.cpp
counterpart: common/chat.cpp common_chat_templates_apply, whose common_chat_params carry the prompt, the parser's
format, the generation prompt, the thinking tags and the grammar with its lazy triggers).

The library front ends (`Llama.create_chat_completion`, `LLM.chat`, `llamactx chat`) go through `prepare_chat`, so
that a model's reply is split and its tool calls constrained the way the server's /v1/chat/completions does it
(server/prompts.py render_chat and server/completions.py chat_parse_params, which take the same steps from a
validated request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from llamactx import chat_grammar, chat_parse, tool_calls
from llamactx.chat_grammar import PatternGrammar
from llamactx.chat_parse import ChatParams
from llamactx.tool_calls import ToolGrammar

__all__ = ["ChatSetup", "grammar_sampler", "prepare_chat"]


@dataclass(frozen=True, slots=True)
class ChatSetup:
    """What one chat turn needs: the `prompt` text, the functions a reply may call (`fns`: none for tool_choice
    "none"), the `parse` params of the reply and the tool-call `grammar` (None when nothing is constrained)."""

    prompt: str
    fns: list[dict[str, Any]]
    parse: ChatParams
    grammar: ToolGrammar | PatternGrammar | None

    @property
    def call_required(self) -> bool:
        """Whether the grammar makes the reply a call from its first token (tool_choice "required" / named)."""
        if isinstance(self.grammar, PatternGrammar):
            return not self.grammar.patterns
        return self.grammar is not None and not self.grammar.triggers


def prepare_chat(template, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                 tool_choice: Any = "auto", parallel_tool_calls: bool = False, reasoning_format: str = "auto",
                 chat_template_kwargs: Mapping[str, Any] | None = None) -> ChatSetup:
    """The prompt, reply parser and call grammar of a chat turn on `template` (a ChatTemplate). The tools are in
    the prompt whatever the tool_choice (as llama-server's), but "none" parses and constrains no call. Raises
    ToolCallError for malformed tools / tool_choice, ChatParseError for an unknown reasoning format."""
    chat_parse.check_reasoning_format(reasoning_format)
    tool_choice = "auto" if tool_choice is None else tool_choice
    kwargs = dict(chat_template_kwargs or {})
    fns = tool_calls.functions(tools)
    msgs, pass_tools = tool_calls.prepare(template.source, list(messages), fns, tool_choice)
    fns = fns if tool_choice != "none" else []
    tools_arg = list(tools) if pass_tools and tools else None
    prompt = template.render(msgs, True, tools_arg, kwargs or None)
    gp = chat_parse.generation_prompt(template, msgs, tools_arg, kwargs)
    parse = chat_parse.chat_params(
        template.source, gp, tools=[{"type": "function", "function": f} for f in fns],
        reasoning_format=reasoning_format, enable_thinking=kwargs.get("enable_thinking", True),
        parallel_tool_calls=parallel_tool_calls, tool_choice=tool_choice if fns else "none")
    if not chat_grammar.uses_own_format(parse, tool_choice, fns):  # the grammar writes a bare JSON call
        parse = replace(parse, format="generic")
    grammar = chat_grammar.call_grammar(fns, parse, tool_choice, parallel_tool_calls)
    return ChatSetup(prompt, fns, parse, grammar)


def grammar_sampler(vocab, grammar: ToolGrammar | PatternGrammar, params: ChatParams):
    """The sampler of a ChatSetup's `grammar` (lazy when it has triggers; llguidance compiles it), as the
    server's. Raises GrammarError when a tool's parameters are not a schema the engine can compile."""
    return chat_grammar.grammar_sampler(vocab, grammar, params)

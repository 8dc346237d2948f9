"""Parsing what a chat model wrote into an OpenAI assistant message: content, reasoning_content and tool_calls
(llama.cpp counterpart: common/chat.cpp common_chat_parse, with the per-family parsers of common/parsers/ and the
formats its autoparser derives; tools/server sends the result as `reasoning_content` / `tool_calls`).

Modules:
    parse_params ChatParams (the parse side of common_chat_params), reasoning formats, reasoning blocks, JSON scans
    message     ChatMsg / ToolCall, the OpenAI message, and the diffs a stream sends (common_chat_msg_diff)
    detect      which format a template's model writes (common_chat_try_specialized_template's markers)
    hermes      content, <think> reasoning, Hermes <tool_call> JSON, and llamactx's generic format
    xml_calls   Qwen3-Coder / Qwen3.5 / Nemotron 3 XML calls (<function=...><parameter=...>)
    harmony     gpt-oss's channels (analysis / commentary / final, to=functions.x)
    mistral     [TOOL_CALLS] (Nemo, Small 3.2, Devstral, Ministral 3) and [THINK]
    deepseek    DeepSeek R1 / V3.1 tool calls
    json_calls  JSON calls between markers: Llama 3.x, Functionary, FireFunction, Command R7B / R+, Granite,
                Nemotron Nano 2, Apriel, Apertus
    tagged_calls  Kimi K2, GLM 4.5 / 4.6 / 4.7 and Ling 3 calls (names and arguments between special tags)
    pythonic    LFM2 / LFM2.5's [f(a=1)] calls
    gemma4_calls  Gemma 4's thought channel and call:f{k:<|"|>v<|"|>} calls
    minimax_m3  MiniMax-M3's namespaced <invoke name=...> calls, values read by the tool's schema
    xml_invoke  one XML element per parameter: MiniMax-M2, Seed-OSS, MiniCPM5, DeepSeek V3.2 / V4 (DSML)
    kimi_k3     Kimi K3's <|open|>section<|sep|> ... <|close|>section<|sep|> replies and calls
    muse_glimmer  Muse Glimmer's " to=recipient" messages and <atem:invoke> calls
    cohere2moe  Cohere2 MoE's <|START_TEXT|> / <|START_ACTION|> turns, and Cohere's action lists as they stream
    json_prefix how far a text begins a JSON value (the arguments a stream may send of a call being written)
    stream      parse_partial: the message of an unfinished reply, which only grows (for streamed deltas)

`parse(params, text)` never raises for what a model wrote: output that does not follow its format (malformed
tool JSON, a call to an unknown recipient) comes back as content.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from llamactx.chat_parse import (
    cohere2moe,
    deepseek,
    gemma4_calls,
    harmony,
    hermes,
    json_calls,
    kimi_k3,
    minimax_m3,
    mistral,
    muse_glimmer,
    pythonic,
    stream,
    tagged_calls,
    xml_calls,
    xml_invoke,
)
from llamactx.chat_parse.detect import chat_params, detect_format
from llamactx.chat_parse.message import ChatMsg, MsgDiff, ToolCall, diffs
from llamactx.chat_parse.parse_params import (
    REASONING_FORMATS,
    ChatParams,
    ChatParseError,
    check_reasoning_format,
    response_content,
)

__all__ = ["REASONING_FORMATS", "ChatMsg", "ChatParams", "ChatParseError", "MsgDiff", "ToolCall",
           "chat_params", "check_reasoning_format", "detect_format", "diffs", "generation_prompt", "parse",
           "parse_output", "parse_partial"]

PARSERS: dict[str, Callable[[ChatParams, str], ChatMsg]] = {
    "generic": hermes.parse_generic,
    "hermes": hermes.parse_hermes,
    "qwen3-coder": xml_calls.parse_qwen3_coder,
    "gpt-oss": harmony.parse_gpt_oss,
    "mistral": mistral.parse_mistral,
    "deepseek": deepseek.parse_deepseek,
    "llama3": json_calls.parse_llama3,
    "functionary-v3.1": json_calls.parse_functionary_v3_1,
    "functionary-v3.2": json_calls.parse_functionary_v3_2,
    "command-r-plus": json_calls.parse_command_r_plus,
    "kimi-k2": tagged_calls.parse_kimi_k2,
    "glm": tagged_calls.parse_glm,
    "ling3": tagged_calls.parse_ling3,
    "cohere2moe": cohere2moe.parse_cohere2moe,
    "kimi-k3": kimi_k3.parse_kimi_k3,
    "muse-glimmer": muse_glimmer.parse_muse_glimmer,
    "lfm2": pythonic.parse_lfm2,
    "gemma4": gemma4_calls.parse_gemma4,
    "minimax-m3": minimax_m3.parse_minimax_m3,
    **{name: xml_invoke.parse_xml_invoke for name in xml_invoke.FORMATS},
    **{name: json_calls.parse_marked_list for name in json_calls.LIST_MARKERS},
}


def parse(params: ChatParams, text: str) -> ChatMsg:
    """The message in `text` (what the model wrote after the prompt) under `params`."""
    msg = PARSERS[params.format](params, params.prefill + text)
    if params.response_format and not msg.tool_calls:
        msg.content = response_content(msg.content, params.partial)
    if params.tool_choice == "none" or not params.tools:
        msg.tool_calls = []
    if params.reasoning_format == "deepseek-legacy" and msg.reasoning_content and params.thinking_end:
        # the thinking stays in the content, tags and all, and is also returned apart
        msg.content = f"{params.thinking_start}{msg.reasoning_content}{params.thinking_end[0]}{msg.content}"
    return msg


def parse_partial(params: ChatParams, text: str) -> ChatMsg:
    """The message of a reply still being generated: it only grows as text is added (stream.parse_partial)."""
    return stream.parse_partial(params, text, parse)


class RenderingTemplate(Protocol):
    source: str

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = ...,
               tools: Sequence[Mapping[str, Any]] | None = ..., extra: Mapping[str, Any] | None = ...) -> str: ...


def generation_prompt(template: RenderingTemplate, messages: Sequence[Mapping[str, Any]],
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      extra: Mapping[str, Any] | None = None) -> str:
    """The suffix the template appends for the assistant's turn: the prompt with the generation prompt minus the
    one without, from where they differ (common_chat_template_generation_prompt_impl)."""
    with_gp = template.render(messages, True, tools, extra)
    without = template.render(messages, False, tools, extra)
    n = 0
    for a, b in zip(with_gp, without, strict=False):
        if a != b:
            break
        n += 1
    return with_gp[n:]


def parse_output(template: RenderingTemplate, text: str, *, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]] | None = None, reasoning_format: str = "auto",
                 enable_thinking: bool = True, parallel_tool_calls: bool = False, tool_choice: Any = "auto",
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAI assistant message for `text`, what the model generated after the prompt `template` renders
    from `messages` / `tools` with the generation prompt (and `enable_thinking`, as llama-server passes it).
    Raises ChatParseError for an unknown reasoning format; never for the model's own text."""
    check_reasoning_format(reasoning_format)
    variables = {"enable_thinking": enable_thinking, **(extra or {})}
    gp = generation_prompt(template, messages, tools, variables)
    params = chat_params(template.source, gp, tools=tools, reasoning_format=reasoning_format,
                         enable_thinking=enable_thinking, parallel_tool_calls=parallel_tool_calls,
                         tool_choice=tool_choice)
    return parse(params, text).to_oai()

"""Which output format a chat template's model writes, found from the template's text as llama.cpp finds it
(llama.cpp counterpart: common/chat.cpp common_chat_try_specialized_template's markers, then, for the templates
its differential autoparser reads, the markers that tell those families apart).

`chat_params(...)` builds the `ChatParams` of one request: the format, its thinking tags and the generation
prompt the caller rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llamactx.chat_parse.parse_params import TOOL_CHOICES, ChatParams, ChatParseError, check_reasoning_format

# format -> (thinking start tag, thinking end tags)
THINKING = {
    "gpt-oss": ("<|channel|>analysis<|message|>", ("<|end|>",)),
    "mistral": ("[THINK]", ("[/THINK]",)),
    "command-r7b": ("<|START_THINKING|>", ("<|END_THINKING|>",)),
    "qwen3-coder": ("<think>", ("</think>",)),
    # Apriel 1.6: the autoparser takes the marker before the reasoning as its start, so the generation
    # prompt's "Here are my reasoning steps:" is reasoning
    "apriel": ("<|begin_assistant|>", ("[BEGIN FINAL RESPONSE]",)),
    "kimi-k2": ("<think>", ("</think>",)),  # common/parsers/kimi-k2.cpp, whatever the template says
    "gemma4": ("<|channel>thought", ("<channel|>",)),
    "minimax-m3": ("<mm:think>", ("</mm:think>",)),
    "seed-oss": ("<seed:think>", ("</seed:think>",)),
    "ling3": ("<think>", ("</think>",)),
    "cohere2moe": ("<|START_THINKING|>", ("<|END_THINKING|>",)),
    "kimi-k3": ("<|open|>think<|sep|>", ("<|close|>think<|sep|>",)),
    "muse-glimmer": (" to=self<|message|>", ("<|eom|>",)),
    "deepseek-v3.2": ("<think>", ("</think>",)),
    "deepseek-v4": ("<think>", ("</think>",)),
    "minicpm5": ("<think>", ("</think>",)),
}
# what a content continuation writes after the reasoning, where it is more than the end tag
CONTINUE_CONTENT = {"gpt-oss": "<|end|><|start|>assistant<|channel|>final<|message|>",
                    "cohere2moe": "<|END_THINKING|><|START_TEXT|>",
                    "kimi-k3": "<|close|>think<|sep|><|open|>response<|sep|>",
                    "muse-glimmer": "<|eom|><|start|>assistant to=user<|message|>"}
THINK_TAGS = ("<think>", ("</think>",))

# (format, markers that must all be in the template): the first match wins, in llama.cpp's order
_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("gpt-oss", ("<|channel|>",)),
    ("muse-glimmer", ("<atem:function_calls>", "<|eom|>")),
    ("functionary-v3.2", (">>>all",)),
    ("kimi-k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")),
    ("kimi-k3", ("<|open|>", "<|close|>", "<|end_of_msg|>")),
    ("lfm2", ("<|tool_list_start|>", "<|tool_list_end|>")),
    ("lfm2", ("List of tools: [",)),
    ("gemma4", ("'<|tool_call>call:'",)),
    ("minimax-m3", ("]<]minimax[>[", "<tool_call>", "<invoke name=")),
    ("cohere2moe", ("<|START_TEXT|>", "<|START_ACTION|>")),
    ("gigachat3.1", ("<|role_sep|>", "<|message_sep|>", "<|function_call|>")),
    ("gigachat3", ("<|role_sep|>", "<|message_sep|>")),
    ("ling3", ("<role>ASSISTANT</role>", "<arg_key>")),
    ("deepseek-v3.2", ("dsml_token", "DSML", "function_calls")),
    ("deepseek-v4", ("dsml_token", "DSML", "tool_calls")),
    ("minicpm5", ("Tool usage guidelines:", "<function name=\"", "<param name=\"")),
    ("minimax-m2", ("<minimax:tool_call>", "<invoke name=")),
    ("seed-oss", ("<seed:tool_call>", "<function=")),
    ("qwen3-coder", ("<tool_call>", "<function=", "<parameter=")),
    ("deepseek", ("<｜tool▁calls▁begin｜>",)),
    ("command-r7b", ("<|START_ACTION|>", "<|START_THINKING|>")),
    ("command-r-plus", ("Action:", "```json")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("functionary-v3.1", ("<function=", "<|python_tag|>")),
    ("firefunction", ("functools[",)),
    ("nemotron-v2", ("<TOOLCALL>",)),
    ("apriel", ("<tool_calls>",)),
    ("apertus", ("<|tools_prefix|>",)),
    ("granite", ("<|tool_call|>",)),
    ("glm", ("<tool_call>", "<arg_key>")),
    ("hermes", ("<tool_call>",)),
    ("llama3", ("<|start_header_id|>", "\"parameters\"")),
]


def detect_format(source: str) -> str:
    """The output format of `source`: one of the parsers' names, "hermes" for <tool_call> JSON, "generic" for a
    template that knows no tool format (llamactx's own tool prompt)."""
    for name, markers in _RULES:
        if all(m in source for m in markers):
            return name
    return "generic"


def thinking_tags(fmt: str, source: str) -> tuple[str, tuple[str, ...]]:
    """The thinking block's tags for `fmt`: its own, <think> for a template that writes one, none otherwise."""
    if fmt in THINKING:
        start, ends = THINKING[fmt]
        if fmt == "mistral" and "[THINK]" not in source:
            return "", ()
        if fmt == "qwen3-coder" and "<think>" not in source:
            return "", ()
        if fmt == "apriel" and "'[BEGIN FINAL RESPONSE]' in asst_text" not in source:
            return "", ()
        return start, ends
    if "<think>" in source or fmt == "generic":
        return THINK_TAGS
    return "", ()


def chat_params(source: str, generation_prompt: str, *, tools: Sequence[Mapping[str, Any]] | None = None,
                reasoning_format: str = "auto", enable_thinking: bool = True, parallel_tool_calls: bool = False,
                tool_choice: Any = "auto", continue_final_message: str = "",
                continue_msg: Mapping[str, Any] | None = None, response_format: bool = False) -> ChatParams:
    """The ChatParams of one request on template `source`. A named function as tool_choice parses as
    "required"; raises ChatParseError for an unknown reasoning format or tool choice.

    `continue_final_message` ("content" or "reasoning_content") continues `continue_msg`, the last message,
    which the caller left out of the rendering of `generation_prompt`: the model's turn then starts with that
    message's reasoning (and, continuing the content, its end tag and content), as common_chat_templates_apply
    splices it back. `response_format`: the request constrains the answer to a JSON schema."""
    check_reasoning_format(reasoning_format)
    if isinstance(tool_choice, Mapping):
        tool_choice = "required"
    if tool_choice is None:
        tool_choice = "auto"
    if tool_choice not in TOOL_CHOICES:
        raise ChatParseError(f"tool_choice: {tool_choice!r} is not one of {', '.join(TOOL_CHOICES)} or a function")
    fmt = detect_format(source)
    start, ends = thinking_tags(fmt, source)
    prefill = ""
    if continue_final_message:
        real = start if fmt != "generic" or start in source else ""  # llamactx's own tags are no template's
        end = CONTINUE_CONTENT.get(fmt, ends[0] if ends else "")
        generation_prompt, prefill = continued_prompt(generation_prompt, real, end, continue_final_message,
                                                      continue_msg or {})
    return ChatParams(fmt, generation_prompt, reasoning_format, enable_thinking, tuple(tools or ()), tool_choice,
                      parallel_tool_calls, start, ends, prefill=prefill, response_format=response_format)


CONTINUATIONS = ("content", "reasoning_content")


def continued_prompt(generation_prompt: str, start: str, end: str, kind: str,
                     msg: Mapping[str, Any]) -> tuple[str, str]:
    """(generation prompt, prefill) continuing `msg` (chat-auto-parser-generator.cpp generate_parser's
    continuation branch): the prompt up to its thinking tag, the tag and the message's reasoning, then for a
    content continuation the end tag and the content. Without thinking tags the content is the prefill."""
    if kind not in CONTINUATIONS:
        raise ChatParseError(f"continue_final_message: {kind!r} is not one of {', '.join(CONTINUATIONS)}")
    content = msg.get("content") or ""
    if not isinstance(content, str):  # typed parts: their text, as common_chat_msg::render_content joins them
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    if not start:
        return generation_prompt, content if kind == "content" else ""
    gp = generation_prompt[:generation_prompt.find(start)] if start in generation_prompt else generation_prompt
    gp += start + (msg.get("reasoning_content") or "")
    if kind == "content":
        gp += end + content
    return gp, ""

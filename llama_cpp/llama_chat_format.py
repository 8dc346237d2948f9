"""llama-cpp-python's llama_chat_format: chat formatters (messages -> prompt text and stop strings), the registry
of named formats, and the adapter that turns a formatter into a chat completion handler for
`Llama(chat_handler=...)`. Jinja templates render in a sandbox with Transformers' conventions (trim_blocks,
lstrip_blocks, `raise_exception`, `tojson`, `strftime_now`), as llama-cpp-python renders them. Without a
chat_handler, Llama.create_chat_completion renders the model's own template with llamactx.chat_template (the
server's path)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Protocol

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llamactx.llama_cpp_options import StoppingCriteriaList

from . import llama_types


@dataclasses.dataclass
class ChatFormatterResponse:
    """A formatted prompt, the stop strings of its format, and whether the text already holds the BOS."""

    prompt: str
    stop: str | list[str] | None = None
    stopping_criteria: StoppingCriteriaList | None = None
    added_special: bool = False


class ChatFormatter(Protocol):
    def __call__(self, *, messages: list[llama_types.ChatCompletionRequestMessage],
                 **kwargs: Any) -> ChatFormatterResponse: ...


class LlamaChatCompletionHandler(Protocol):
    def __call__(self, *, llama: Any, messages: list[llama_types.ChatCompletionRequestMessage],
                 **kwargs: Any) -> Any: ...


class Jinja2ChatFormatter:
    """A formatter from a Jinja chat template (Hugging Face's `chat_template`)."""

    class IgnoreGenerationTags(jinja2.ext.Extension):
        """Hugging Face's `{% generation %}` tag renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def __init__(self, template: str, eos_token: str, bos_token: str, add_generation_prompt: bool = True,
                 stop_token_ids: list[int] | None = None):
        self.template, self.eos_token, self.bos_token = template, eos_token, bos_token
        self.add_generation_prompt = add_generation_prompt
        self.stop_token_ids = set(stop_token_ids) if stop_token_ids is not None else None
        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Jinja2ChatFormatter.IgnoreGenerationTags,
                                                        jinja2.ext.loopcontrols])
        env.filters["tojson"] = self.tojson
        self._environment = env.from_string(template)

    @staticmethod
    def strftime_now(f: str) -> str:
        return datetime.now().strftime(f)

    @staticmethod
    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def __call__(self, *, messages: list, functions: list | None = None, function_call: Any = None,
                 tools: list | None = None, tool_choice: Any = None, **kwargs: Any) -> ChatFormatterResponse:
        def raise_exception(message: str):
            raise ValueError(message)

        prompt = self._environment.render(
            messages=messages, eos_token=self.eos_token, bos_token=self.bos_token, raise_exception=raise_exception,
            add_generation_prompt=self.add_generation_prompt, functions=functions, function_call=function_call,
            tools=tools, tool_choice=tool_choice, strftime_now=self.strftime_now)
        criteria = None
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            criteria = StoppingCriteriaList([lambda input_ids, logits: int(input_ids[-1]) in ids])
        return ChatFormatterResponse(prompt=prompt, stop=[self.eos_token], stopping_criteria=criteria,
                                     added_special=True)

    def to_chat_handler(self) -> LlamaChatCompletionHandler:
        return chat_formatter_to_chat_completion_handler(self)


def hf_tokenizer_config_to_chat_formatter(tokenizer_config: dict[str, Any],
                                          add_generation_prompt: bool = True) -> ChatFormatter:
    """A formatter from a Hugging Face tokenizer_config.json (its chat_template, bos_token and eos_token). As
    llama-cpp-python, an empty assistant message is appended with add_generation_prompt. ValueError naming a
    missing or non-string field."""
    for field in ("chat_template", "bos_token", "eos_token"):
        if not isinstance(tokenizer_config.get(field), str):
            raise ValueError(f"tokenizer_config[{field!r}] = {tokenizer_config.get(field)!r}: expected a string")
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        tokenizer_config["chat_template"])
    bos, eos = tokenizer_config["bos_token"], tokenizer_config["eos_token"]

    def format_tokenizer_config(messages: list, **kwargs: Any) -> ChatFormatterResponse:
        if add_generation_prompt:
            messages = [*messages, llama_types.ChatCompletionRequestAssistantMessage(role="assistant", content="")]
        prompt = template.render(messages=messages, bos_token=bos, eos_token=eos, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=[eos, bos], added_special=True)

    return format_tokenizer_config


def hf_tokenizer_config_to_chat_completion_handler(tokenizer_config: dict[str, Any],
                                                   add_generation_prompt: bool = True) -> LlamaChatCompletionHandler:
    return chat_formatter_to_chat_completion_handler(
        hf_tokenizer_config_to_chat_formatter(tokenizer_config, add_generation_prompt))


# -- the completion handler around a formatter ------------------------------------------------------------------

_COMPLETION_ARGS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "stream", "seed", "max_tokens",
                    "presence_penalty", "frequency_penalty", "repeat_penalty", "tfs_z", "mirostat_mode",
                    "mirostat_tau", "mirostat_eta", "model", "logits_processor", "grammar", "logit_bias")


def chat_formatter_to_chat_completion_handler(chat_formatter: ChatFormatter) -> LlamaChatCompletionHandler:
    """A handler that formats the messages, completes the prompt with llama.create_completion and answers a
    chat.completion (or its chunks with stream=True). Tools are refused (ValueError): a formatter has no way to
    parse calls."""

    def handler(*, llama: Any, messages: list, functions: list | None = None, tools: list | None = None,
                stop: str | list[str] | None = None, response_format: dict | None = None, **kwargs: Any):
        if functions or tools:
            raise ValueError("tools/functions: this chat format's handler cannot parse tool calls")
        result = chat_formatter(messages=messages)
        stops = [s for s in ([stop] if isinstance(stop, str) else stop or []) +
                 ([result.stop] if isinstance(result.stop, str) else result.stop or [])]
        args = {k: v for k, v in kwargs.items() if k in _COMPLETION_ARGS and v is not None}
        if response_format and response_format.get("type") == "json_object":
            from llamactx.llama_cpp_options import LlamaGrammar

            schema = response_format.get("schema")
            args["grammar"] = LlamaGrammar.from_json_schema(json.dumps(schema if schema else {"type": "object"}))
        prompt = llama.tokenize(result.prompt.encode(), add_bos=not result.added_special, special=True)
        out = llama.create_completion(prompt, stop=stops, stopping_criteria=result.stopping_criteria, **args)
        return _chat_chunks(out) if args.get("stream") else _chat_response(out)

    return handler


def _chat_response(completion: dict) -> dict:
    choice = completion["choices"][0]
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": choice["text"]},
                         "logprobs": choice.get("logprobs"), "finish_reason": choice["finish_reason"]}],
            "usage": completion.get("usage")}


def _chat_chunks(chunks: Iterator[dict]) -> Iterator[dict]:
    first = True
    for chunk in chunks:
        choice = chunk["choices"][0]
        base = {"id": "chat" + chunk["id"], "model": chunk["model"], "created": chunk["created"],
                "object": "chat.completion.chunk"}
        if first:
            yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                        "finish_reason": None}]}
            first = False
        delta = {"content": choice["text"]} if choice["text"] else {}
        yield {**base, "choices": [{"index": 0, "delta": delta, "logprobs": choice.get("logprobs"),
                                    "finish_reason": choice["finish_reason"]}]}


# -- named formats --------------------------------------------------------------------------------------------

CHAT_HANDLERS: dict[str, LlamaChatCompletionHandler] = {}
CHAT_FORMATTERS: dict[str, ChatFormatter] = {}


def register_chat_format(name: str) -> Callable[[ChatFormatter], ChatFormatter]:
    def register(f: ChatFormatter) -> ChatFormatter:
        CHAT_FORMATTERS[name] = f
        CHAT_HANDLERS[name] = chat_formatter_to_chat_completion_handler(f)
        return f

    return register


def get_chat_completion_handler(name: str) -> LlamaChatCompletionHandler:
    if name not in CHAT_HANDLERS:
        raise ValueError(f"chat format {name!r} is not one of {', '.join(sorted(CHAT_HANDLERS))}")
    return CHAT_HANDLERS[name]


def _system_message(messages: list) -> str:
    return next((m["content"] or "" for m in messages if m["role"] == "system"), "")


def _map_roles(messages: list, roles: dict[str, str]) -> list[tuple[str, str | None]]:
    return [(roles[m["role"]], m["content"] if isinstance(m["content"], str) else None)
            for m in messages if m["role"] in roles]


@register_chat_format("llama-2")
def format_llama2(messages: list, **kwargs: Any) -> ChatFormatterResponse:
    system = _system_message(messages)
    system = f"[INST] <<SYS>>\n{system}\n<</SYS>>" if system else ""
    turns, seps = _map_roles(messages, {"user": "<s>[INST]", "assistant": "[/INST]"}), (" ", "</s>")
    prompt = system + " "
    for i, (role, text) in enumerate(turns):
        if system and i == 0:
            prompt += (text or "") + seps[i % 2]
        elif text:
            prompt += role + text + " " + seps[i % 2]
        else:
            prompt += role + " "
    return ChatFormatterResponse(prompt=prompt + "[/INST]")


@register_chat_format("chatml")
def format_chatml(messages: list, **kwargs: Any) -> ChatFormatterResponse:
    sep = "<|im_end|>"
    system = f"<|im_start|>system\n{_system_message(messages)}"
    turns = _map_roles(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"})
    prompt = system + sep + "\n"
    for role, text in [*turns, ("<|im_start|>assistant", None)]:
        prompt += role + "\n" + (text + sep + "\n" if text else "")
    return ChatFormatterResponse(prompt=prompt, stop=sep)


@register_chat_format("mistral-instruct")
def format_mistral_instruct(messages: list, **kwargs: Any) -> ChatFormatterResponse:
    eos = "</s>"
    prompt = ""
    for m in messages:
        if m["role"] == "user" and isinstance(m["content"], str):
            prompt += "[INST] " + m["content"]
        elif m["role"] == "assistant" and m["content"] is not None:
            prompt += " [/INST]" + m["content"] + eos
    return ChatFormatterResponse(prompt=prompt + " [/INST]", stop=eos)


"""Ollama's API over the chat and completion pipelines: its requests as OpenAI / llama-server request bodies
(Ollama's api/types.go: GenerateRequest, ChatRequest, Options, Duration; server/routes.go: GenerateHandler,
ChatHandler; docs/api.md).

- `model_name` maps Ollama's `name:tag` (":latest" when none) onto one of the server's aliases.
- `options_fields` maps `options` onto the sampler fields (num_predict -> n_predict, num_keep -> n_keep, the
  rest by name). Options fixed when the model loads (num_ctx, num_batch, num_thread, ...) are honoured when they
  ask for what the server runs and refused (400, naming option, value and the server's value) otherwise; options
  llama.cpp dropped (tfs_z, penalize_newline) only at their neutral value; unknown ones are refused, never
  ignored.
- `chat_body` turns a chat request into an OpenAI chat body: messages (tool calls' arguments as JSON text,
  tool results, no images), tools, `format` ("json" or a JSON schema) as response_format, `think` as the
  template's enable_thinking (`think_kwargs`), `logprobs` / `top_logprobs` as the chat endpoint's.

The answers are llamactx.api.ollama_responses'.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from typing import Any

from llamactx.api import protocol as P

# Ollama's sampler options -> llama-server's request fields (api/types.go Options; the extensions are
# llama.cpp's other samplers, under their llama-server names)
SAMPLER_OPTIONS: dict[str, tuple[str, type]] = {
    "num_predict": ("n_predict", int), "num_keep": ("n_keep", int), "seed": ("seed", int),
    "temperature": ("temperature", float), "top_k": ("top_k", int), "top_p": ("top_p", float),
    "min_p": ("min_p", float), "typical_p": ("typical_p", float), "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int), "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float), "mirostat": ("mirostat", int),
    "mirostat_tau": ("mirostat_tau", float), "mirostat_eta": ("mirostat_eta", float), "stop": ("stop", list),
    "dry_multiplier": ("dry_multiplier", float), "dry_base": ("dry_base", float),
    "dry_allowed_length": ("dry_allowed_length", int), "dry_penalty_last_n": ("dry_penalty_last_n", int),
    "xtc_probability": ("xtc_probability", float), "xtc_threshold": ("xtc_threshold", float),
    "top_n_sigma": ("top_n_sigma", float), "dynatemp_range": ("dynatemp_range", float),
    "dynatemp_exponent": ("dynatemp_exponent", float), "min_keep": ("min_keep", int),
}
# samplers llama.cpp removed: accepted only where they change nothing
NEUTRAL_OPTIONS: dict[str, Any] = {"tfs_z": 1.0, "penalize_newline": False}
# options fixed when the model loads (llama.cpp's context and model params): the server's flag for each
LOAD_OPTIONS: dict[str, str] = {
    "num_ctx": "-c / -np", "num_batch": "-b", "num_thread": "-t", "f16_kv": "-ctk / -ctv", "use_mmap": "",
    "use_mlock": "", "num_gpu": "", "main_gpu": "", "low_vram": "", "logits_all": "", "vocab_only": "",
    "embedding_only": "", "numa": "", "num_gqa": "", "rope_frequency_base": "", "rope_frequency_scale": "",
}
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def now_iso() -> str:
    """Ollama's created_at: RFC 3339 in UTC."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


# -- names, durations, options ------------------------------------------------------------------------------------


def names_of(aliases: list[str]) -> list[str]:
    """The Ollama names of the server's aliases: "name:latest" for an alias without a tag."""
    return [a if ":" in a.rsplit("/", 1)[-1] else f"{a}:latest" for a in aliases]


def model_name(given: Any, aliases: list[str]) -> str:
    """The alias an Ollama model name means (case-insensitive, ":latest" when no tag is given). ProtocolError 400
    when it is missing, 404 (Ollama's "model 'x' not found") when the server has no such model."""
    if not isinstance(given, str) or not given:
        raise P.ProtocolError("model is required", 400)
    full = names_of([given])[0].lower()
    for alias, name in zip(aliases, names_of(aliases), strict=True):
        if full == name.lower():
            return alias
    raise P.ProtocolError(f"model '{given}' not found", 404)


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's keep_alive (api.Duration): a number of seconds or a Go duration ("5m", "1h30m", "0"); negative:
    forever (-1.0 here). None when not given; ProtocolError naming the value otherwise."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return -1.0 if value < 0 else float(value)
    if isinstance(value, str):
        text = value.strip()
        sign, body = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
        try:
            seconds = float(body)  # a bare number is seconds
        except ValueError:
            parts = _GO_DURATION.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise P.ProtocolError(f"keep_alive: {value!r} is not a duration (seconds, or Go's \"5m\", "
                                      "\"1h30m\", \"-1\")") from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        return -1.0 if sign < 0 and seconds > 0 else seconds
    raise P.ProtocolError(f"keep_alive: {value!r} is not a duration (seconds, or Go's \"5m\", \"1h30m\", \"-1\")")


def _typed(key: str, value: Any, kind: type) -> Any:
    """An option's value as `kind`, or Ollama's "option ... must be of type ..." (400)."""
    if kind is list:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise P.ProtocolError(f'option "{key}" must be of type array of strings (got {value!r})')
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise P.ProtocolError(f'option "{key}" must be of type boolean (got {value!r})')
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise P.ProtocolError(f'option "{key}" must be of type {"integer" if kind is int else "float"} '
                              f"(got {value!r})")
    if kind is int:
        if value != int(value):
            raise P.ProtocolError(f'option "{key}" must be of type integer (got {value!r})')
        return int(value)
    return float(value)


def options_fields(options: Any, fixed: dict[str, Any]) -> dict[str, Any]:
    """llama-server request fields for Ollama's `options`. `fixed`: the value this server runs each load-time
    option at (absent: it has no such setting). ProtocolError (400) names the option, its value and the limit."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise P.ProtocolError(f"options must be an object (got {type(options).__name__})")
    out: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key in SAMPLER_OPTIONS:
            field, kind = SAMPLER_OPTIONS[key]
            value = _typed(key, value, kind)
            out[field] = -1 if key == "num_predict" and value < -1 else value  # -2 (fill the context): -1 here
        elif key in NEUTRAL_OPTIONS:
            neutral = NEUTRAL_OPTIONS[key]
            if _typed(key, value, type(neutral)) != neutral:
                raise P.ProtocolError(f'option "{key}" = {value!r}: llama.cpp no longer has this sampler; only '
                                      f"{json.dumps(neutral)} (no effect) is accepted")
        elif key in LOAD_OPTIONS:
            _check_load_option(key, value, fixed)
        else:
            raise P.ProtocolError(f'option "{key}" is not an option llamactx knows (Ollama\'s Modelfile '
                                  "parameters and llama.cpp's samplers are)")
    _check_ranges(out)
    return out


def _check_load_option(key: str, value: Any, fixed: dict[str, Any]) -> None:
    """A load-time option is honoured when it asks for what the server runs; anything else is a 400."""
    if key not in fixed:
        raise P.ProtocolError(f'option "{key}" = {value!r}: llamactx has no such setting (it is fixed when a model '
                              "loads in Ollama)")
    have = fixed[key]
    if _typed(key, value, type(have)) != have:
        flag = LOAD_OPTIONS[key]
        raise P.ProtocolError(f'option "{key}" = {value!r} cannot change per request: this server runs {key} = '
                              f"{json.dumps(have)}" + (f" (set when it starts: {flag})" if flag else ""))


def _check_ranges(fields: dict[str, Any]) -> None:
    """The sampler fields' ranges, reported under their option names."""
    try:
        P.validate(P.SamplingFields, fields)
    except P.ProtocolError as e:
        field, _, rest = str(e).partition(": ")
        option = next((k for k, (f, _) in SAMPLER_OPTIONS.items() if f == field), field)
        raise P.ProtocolError(f'option "{option}": {rest}') from None


def logprob_fields(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """`logprobs` / `top_logprobs` as the chat endpoint's (logprobs, top_logprobs) or the completion endpoint's
    (logprobs: n)."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise P.ProtocolError(f"logprobs must be a boolean (got {wanted!r})")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= P.MAX_TOP_LOGPROBS):
        raise P.ProtocolError(f"top_logprobs must be between 0 and {P.MAX_TOP_LOGPROBS} (got {top!r})")
    if not wanted:
        return {}
    return {"logprobs": True, "top_logprobs": top or 0} if chat else {"logprobs": top or 0}


def format_fields(fmt: Any) -> dict[str, Any]:
    """Ollama's `format` ("json", or a JSON schema) as llama-server's response_format."""
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": fmt}}}
    raise P.ProtocolError(f'invalid format: {json.dumps(fmt)}; expected "json" or a valid JSON schema')


# -- requests -----------------------------------------------------------------------------------------------------


def thinks(template_source: str) -> bool:
    """Whether the model thinks: its template writes <think> blocks (Ollama's thinking.InferTags)."""
    return "<think>" in template_source and "</think>" in template_source


def think_kwargs(body: dict[str, Any], model: str, thinking: bool) -> dict[str, Any]:
    """`think` as the template's enable_thinking (not given: the server's -rea default). A model that does not
    think refuses think = true as Ollama does; levels ("high", ...) are gpt-oss's and refused."""
    think = body.get("think")
    if isinstance(think, str):
        raise P.ProtocolError(f'think value "{think}" is not supported for this model')
    if think is not None and not isinstance(think, bool):
        raise P.ProtocolError(f"think must be a boolean (got {think!r})")
    if think and not thinking:
        raise P.ProtocolError(f'"{model}" does not support thinking')
    return {"chat_template_kwargs": {"enable_thinking": think}} if thinking and think is not None else {}


def _no_images(images: Any, field: str) -> None:
    if images:
        raise P.ProtocolError(f"{field}: image input is not supported by this server (no multimodal projector)")


def chat_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages for Ollama's: tool calls' arguments become JSON text, `tool_name` the tool message's
    name; images are refused."""
    if not isinstance(raw, list):
        raise P.ProtocolError("messages must be an array of messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise P.ProtocolError(f"messages[{i}].role must be one of system, user, assistant, tool")
        _no_images(m.get("images"), f"messages[{i}].images")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise P.ProtocolError(f"messages[{i}].content must be a string")
        msg: dict[str, Any] = {"role": m["role"], "content": content}
        if m.get("tool_calls"):
            msg["tool_calls"] = [_openai_call(c, f"messages[{i}].tool_calls[{j}]", j)
                                 for j, c in enumerate(m["tool_calls"])]
        if m["role"] == "tool" and isinstance(m.get("tool_name"), str):
            msg["name"] = m["tool_name"]
        out.append(msg)
    return out


def _openai_call(call: Any, field: str, index: int) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise P.ProtocolError(f"{field}.function.name: missing or not a string")
    args = fn.get("arguments", {})
    return {"id": call.get("id") or f"call_{index}", "type": "function",
            "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def chat_body(body: dict[str, Any], sampling: dict[str, Any], think: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI chat body of an Ollama chat request whose options are already `sampling` (options_fields) and
    whose `think` is `think` (think_kwargs)."""
    chat: dict[str, Any] = {"messages": chat_messages(body.get("messages")), "stream": stream_of(body),
                            **sampling, **format_fields(body.get("format")), **logprob_fields(body, True)}
    if body.get("tools"):
        chat["tools"] = body["tools"]
    chat.update(think)
    return chat


def generate_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation /api/generate renders (Ollama's chatPrompt for generate): a system message, then the
    prompt as the user's. `template` (a Go template), `images` and `suffix` are refused."""
    for key, why in (("template", "Go templates are not supported: the model's chat template is used"),
                     ("suffix", "fill-in-the-middle is POST /infill (input_prefix, input_suffix) here")):
        if body.get(key):
            raise P.ProtocolError(f"{key}: {why}")
    _no_images(body.get("images"), "images")
    system, prompt = body.get("system"), body.get("prompt") or ""
    if not isinstance(prompt, str) or (system is not None and not isinstance(system, str)):
        raise P.ProtocolError("prompt and system must be strings")
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def context_tokens(body: dict[str, Any], n_vocab: int) -> list[int]:
    """/api/generate's `context` (the tokens a previous answer returned), checked against the vocabulary."""
    ctx = body.get("context") or []
    if not isinstance(ctx, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ctx):
        raise P.ProtocolError("context must be an array of token ids")
    return P.check_tokens(ctx, n_vocab, "context")


def stream_of(body: dict[str, Any]) -> bool:
    stream = body.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise P.ProtocolError(f"stream must be a boolean (got {stream!r})")
    return stream

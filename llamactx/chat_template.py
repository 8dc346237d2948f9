"""Chat templates: turn a list of messages into a prompt with the model's own jinja template.

The template is a GGUF's `tokenizer.chat_template`, rendered as HF transformers renders it
(apply_chat_template): jinja2's ImmutableSandboxedEnvironment with trim_blocks / lstrip_blocks, the
loopcontrols extension, a no-op `{% generation %}` tag, the `raise_exception` and `strftime_now` globals and a
`tojson` filter that does not HTML-escape. Variables follow llama-server (common/chat.cpp
common_chat_template_direct_apply_impl): `messages`, `bos_token`, `eos_token`, `add_generation_prompt`, and
`tools` only when tools are given. A model without a template gets the built-in template its vocabulary points
to, as llama.cpp's built-in templates do (src/llama-chat.cpp): Gemma's `<start_of_turn>` turns, Llama 3's header
tokens, or chatml (common_chat_templates_init, CHATML_TEMPLATE_SRC); `message` says which, once, for the caller to
show.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llamactx.errors import LlamactxError

# common/chat.cpp CHATML_TEMPLATE_SRC
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

# llama-chat.cpp LLM_CHAT_TEMPLATE_GEMMA: no system role (merged into the first user turn), "assistant" is "model"
GEMMA_TEMPLATE = (
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(system='') -%}\n"
    "{%- for message in messages -%}\n"
    "  {%- if message.role == 'system' -%}\n"
    "    {%- set ns.system = ns.system + message.content | trim -%}\n"
    "  {%- else -%}\n"
    "    {%- set role = 'model' if message.role == 'assistant' else message.role -%}\n"
    "    {{- '<start_of_turn>' + role + '\\n' -}}\n"
    "    {%- if ns.system and role != 'model' -%}{{- ns.system + '\\n\\n' -}}{%- set ns.system = '' -%}{%- endif -%}\n"
    "    {{- message.content | trim + '<end_of_turn>\\n' -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

# llama-chat.cpp LLM_CHAT_TEMPLATE_LLAMA_3
LLAMA3_TEMPLATE = (
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "  {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + "
    "'<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

# llama-chat.cpp LLM_CHAT_TEMPLATE_COMMAND_R: no BOS, contents trimmed
COMMAND_R_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {%- set token = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>'}.get(message.role, "
    "'<|CHATBOT_TOKEN|>') -%}\n"
    "  {{- '<|START_OF_TURN_TOKEN|>' + token + message.content | trim + '<|END_OF_TURN_TOKEN|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}"
)

# name -> (source, the tokens that must be in the vocabulary for it to be chosen for a model without a template)
BUILTIN_TEMPLATES = {
    "command-r": (COMMAND_R_TEMPLATE, ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>")),
    "gemma": (GEMMA_TEMPLATE, ("<start_of_turn>", "<end_of_turn>")),
    "llama3": (LLAMA3_TEMPLATE, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    "chatml": (CHATML_TEMPLATE, ("<|im_start|>", "<|im_end|>")),
}

TOKEN_NULL = -1  # llama.h LLAMA_TOKEN_NULL


# the variables render() sets itself, and jinja's own `self`: chat_template_kwargs may not name them
RENDER_VARIABLES = frozenset({"messages", "bos_token", "eos_token", "add_generation_prompt", "tools", "self"})

class ChatTemplateError(LlamactxError, ValueError):
    """A chat template could not be compiled or rendered: its own raise_exception, or a jinja error."""


class ChatVocab(Protocol):
    """What ChatTemplate.from_model reads from a vocabulary."""

    bos: int
    eos: int

    def token_get_text(self, token: int) -> str: ...

    def tokenize(self, text: str, add_special: bool = ..., parse_special: bool = ...) -> list[int]: ...


class ChatModel(Protocol):
    """What ChatTemplate.from_model reads from a model."""

    @property
    def chat_template(self) -> str | None: ...

    @property
    def vocab(self) -> ChatVocab: ...


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(Extension):
    """HF's `{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering
    ignores it."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


# A template from a model file is untrusted code: its rendering is bounded in steps (lines of the compiled
# template executed), time and output, so a nested loop or a runaway macro ends with a ChatTemplateError.
MAX_RENDER_STEPS = 1_000_000
MAX_RENDER_SECONDS = 0.5
MIN_OUTPUT_CHARS = 1 << 20  # plus 4x the messages' own text
MAX_EXPONENT = 4096


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with `*` and `**` checked before they run: `'x' * 10**10` would allocate before any bound on
    the output could see it."""

    intercepted_binops = frozenset({"*", "**"})
    _limits = threading.local()  # the output bound of the render running in this thread

    @property
    def max_chars(self) -> int:
        return getattr(self._limits, "max_chars", MIN_OUTPUT_CHARS)

    @max_chars.setter
    def max_chars(self, value: int) -> None:
        self._limits.max_chars = value

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > self.max_chars:
                    raise ChatTemplateError(f"a repetition of {len(seq)} x {n} exceeds the limit of "
                                            f"{self.max_chars} characters")
        elif isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise ChatTemplateError(f"an exponent of {right} exceeds the limit of {MAX_EXPONENT}")
        return super().call_binop(context, operator, left, right)


class _Budget:
    """A trace function for the rendering thread that counts the template's executed lines and watches the
    clock (the compiled template's code objects are named "<template>")."""

    def __init__(self, name: str):
        self.name, self.steps = name, 0
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS

    def trace(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == "<template>" else None

    def _line(self, frame, event, arg):
        self.steps += 1
        if self.steps > MAX_RENDER_STEPS:
            raise ChatTemplateError(f"chat template {self.name!r} ran more than {MAX_RENDER_STEPS} steps")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template {self.name!r} ran longer than {MAX_RENDER_SECONDS} s "
                                    f"({self.steps} steps)")
        return self._line


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def detect_template_name(source: str) -> str:
    """The llama.cpp family name of a template, by its markers (a subset of llama-chat.cpp
    llm_chat_detect_template); "jinja" when none matches. Informational only: rendering always runs the jinja.
    """
    if "<|im_start|>" in source:
        return "phi4" if "<|im_sep|>" in source else "chatml"
    if source.startswith("mistral") or "[INST]" in source:
        return "mistral-v7" if "[SYSTEM_PROMPT]" in source else "llama2"
    if "<|assistant|>" in source and "<|end|>" in source:
        return "phi3"
    if "<start_of_turn>" in source:
        return "gemma"
    if "<|start_header_id|>" in source and "<|end_header_id|>" in source:
        return "llama3"
    return "jinja"


def _content_text(i: int, parts: Sequence[Any]) -> str:
    """Text parts joined with newlines (common_chat_msg::to_json_oaicompat concat_typed_text)."""
    texts = []
    for j, part in enumerate(parts):
        if (
            not isinstance(part, Mapping)
            or part.get("type") != "text"
            or not isinstance(part.get("text"), str)
        ):
            raise ChatTemplateError(
                f"messages[{i}].content[{j}]: expected a part {{'type': 'text', 'text': str}}, got {part!r}"
            )
        texts.append(part["text"])
    return "\n".join(texts)


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check OpenAI-style messages and normalise their content to strings (common_chat_msgs_parse_oaicompat).

    Each message needs a non-empty string `role` and a `content` that is a string or a list of text parts; an
    assistant message with `tool_calls` may omit `content` (it becomes ""). Other keys are passed through.
    Returns copies. Raises ValueError naming the message index and field.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(f"messages: expected a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ChatTemplateError("messages: at least one message is required")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise ChatTemplateError(f"messages[{i}]: expected an object with 'role' and 'content', got {msg!r}")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role: missing or not a non-empty string (got {role!r})")
        content = msg.get("content")
        if content is None:
            if not msg.get("tool_calls"):
                raise ChatTemplateError(
                    f"messages[{i}].content: missing (only a message with tool_calls may omit it)"
                )
            content = ""
        elif isinstance(content, list):
            content = _content_text(i, content)
        elif not isinstance(content, str):
            raise ChatTemplateError(
                f"messages[{i}].content: expected a string or a list of text parts, got {content!r}"
            )
        out.append({**msg, "content": content})
    return out


def builtin_for_vocab(vocab: ChatVocab) -> str:
    """The built-in template whose turn markers are all single tokens of `vocab` ("gemma", "llama3", "chatml"),
    chatml when none is: the turn-end token then is a token the model knows, and ends generation."""
    for name, (_, markers) in BUILTIN_TEMPLATES.items():
        if all(len(ids := vocab.tokenize(m, add_special=False, parse_special=True)) == 1
               and vocab.token_get_text(ids[0]) == m for m in markers):
            return name
    return "chatml"


class ChatTemplate:
    """A compiled chat template plus the special tokens it may use.

    `source` None or empty selects the chatml fallback, and a built-in name ("chatml", "gemma", "llama3") that
    template: `is_fallback` is True and `message` says which was chosen and why (the caller shows it once; nothing
    is printed or warned here). `add_bos` / `add_eos` mirror the vocabulary's flags: when
    the tokenizer adds BOS itself, a rendered prompt that starts with `bos_token` loses it (and likewise for a
    trailing EOS), as llama-server does, so the prompt is not double-prefixed. Raises ChatTemplateError (a
    ValueError) if the template does not compile.
    """

    __slots__ = ("source", "name", "bos_token", "eos_token", "add_bos", "add_eos", "is_fallback", "message",
                 "_template")  # fmt: skip

    def __init__(
        self,
        source: str | None,
        bos_token: str = "",
        eos_token: str = "",
        name: str | None = None,
        *,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> None:
        builtin = "chatml" if not source else source if source in BUILTIN_TEMPLATES else None
        self.is_fallback = builtin is not None
        self.source = BUILTIN_TEMPLATES[builtin][0] if builtin else str(source)
        self.name = builtin or name or detect_template_name(self.source)
        self.message = ""
        if builtin:
            whose = f"{name} has" if name else "the model has"
            self.message = f"{whose} no chat template; using the built-in {builtin} template"
        self.bos_token, self.eos_token = bos_token, eos_token
        self.add_bos, self.add_eos = add_bos, add_eos
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template {self.name!r}: syntax error on line {e.lineno}: {e.message}"
            ) from e
        except (RecursionError, MemoryError) as e:  # jinja2's parser recurses once per nesting level
            raise ChatTemplateError(f"chat template {self.name!r}: nested too deeply to compile") from e

    @classmethod
    def from_model(cls, model: ChatModel, name: str | None = None, source: str | None = None) -> ChatTemplate:
        """The template of a loaded model (`model.chat_template`, `model.vocab`), or `source` instead (a built-in
        name or Jinja text: llama-server's --chat-template), with its BOS/EOS texts and add_bos / add_eos flags
        (common_chat_templates_init). A missing BOS/EOS token gives an empty string.
        """
        vocab = model.vocab

        def text(token: int | None) -> str:
            return "" if token is None or token == TOKEN_NULL else vocab.token_get_text(token)

        return cls(
            source or model.chat_template or builtin_for_vocab(vocab),
            text(vocab.bos),
            text(vocab.eos),
            name,
            add_bos=bool(getattr(vocab, "add_bos", False)),
            add_eos=bool(getattr(vocab, "add_eos", False)),
        )

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, fallback={self.is_fallback})"

    def _render_bounded(self, variables: dict[str, Any]) -> str:
        text_size = sum(len(str(m.get("content") or "")) for m in variables["messages"])
        max_chars = MIN_OUTPUT_CHARS + 4 * text_size
        env = self._template.environment
        env.max_chars = max_chars  # type: ignore[attr-defined]
        budget = _Budget(self.name)
        previous = sys.gettrace()
        sys.settrace(budget.trace)
        try:
            parts, n = [], 0
            for part in self._template.generate(**variables):
                n += len(part)
                if n > max_chars:
                    raise ChatTemplateError(f"chat template {self.name!r}: output exceeds {max_chars} characters")
                parts.append(part)
            return "".join(parts)
        finally:
            sys.settrace(previous)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt for `messages`; `tools` (OpenAI function specs) are passed only when given, `extra`
        becomes further template variables (llama-server's chat_template_kwargs, e.g. enable_thinking).

        Raises ValueError for malformed messages (naming index and field) and ChatTemplateError (a ValueError)
        carrying the template's own message when it calls raise_exception or fails to render, or when it runs
        past its bounds (steps, seconds, output characters, recursion), or when `extra` names one of the
        variables render sets itself.
        """
        taken = sorted(set(extra or ()) & RENDER_VARIABLES)
        if taken:
            raise ChatTemplateError(f"chat_template_kwargs: {taken[0]!r} is reserved (the names render sets "
                                    f"itself: {', '.join(sorted(RENDER_VARIABLES))})")
        variables: dict[str, Any] = {
            **(extra or {}),
            "messages": validate_messages(messages),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_generation_prompt": add_generation_prompt,
        }
        if tools:
            variables["tools"] = list(tools)
        try:
            prompt = self._render_bounded(variables)
        except ChatTemplateError:
            raise
        except RecursionError:
            raise ChatTemplateError(f"chat template {self.name!r}: recursion too deep") from None
        except MemoryError:
            raise ChatTemplateError(f"chat template {self.name!r}: out of memory while rendering") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template {self.name!r}: {type(e).__name__}: {e.message}") from e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as e:
            raise ChatTemplateError(f"chat template {self.name!r}: {type(e).__name__}: {e}") from e
        if self.add_bos and self.bos_token and prompt.startswith(self.bos_token):
            prompt = prompt[len(self.bos_token) :]
        if self.add_eos and self.eos_token and prompt.endswith(self.eos_token):
            prompt = prompt[: -len(self.eos_token)]
        return prompt

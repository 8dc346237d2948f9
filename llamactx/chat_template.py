"""Chat templates: turn a list of messages into a prompt with the model's own jinja template, or a named one.

The template is a GGUF's `tokenizer.chat_template`, rendered as HF transformers renders it
(apply_chat_template): jinja2's ImmutableSandboxedEnvironment with trim_blocks / lstrip_blocks, the
loopcontrols extension, a no-op `{% generation %}` tag, the `raise_exception` and `strftime_now` globals and a
`tojson` filter that does not HTML-escape. Variables follow llama-server (common/chat.cpp
common_chat_template_direct_apply_impl): `messages`, `bos_token`, `eos_token`, `add_generation_prompt`, and
`tools` only when tools are given. A template may instead be a name (a text with no "{{" or "{%"): one of
llama.cpp's built-in templates (src/llama-chat.cpp, chat_builtin.py: "llama2", "mistral-v7", "phi3", "zephyr"...)
or of llama-cpp-python's chat formats (chat_format.py: "llama-2", "alpaca"...); an unknown name is an error that
lists the known ones. A model without a template gets the built-in template its vocabulary points to: Gemma's
`<start_of_turn>` turns, Llama 3's header tokens, Command R's, or chatml (common_chat_templates_init,
CHATML_TEMPLATE_SRC); `message` says which, once, for the caller to show.
"""

from __future__ import annotations

import difflib
import json
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llamactx.chat_builtin import LLM_CHAT_TEMPLATES, apply_builtin
from llamactx.chat_detect import detect_builtin
from llamactx.chat_format import CHAT_FORMATS, format_chat
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

# name -> (source, the tokens that must be in the vocabulary for it to be chosen for a model without a template);
# a name's source is the name itself (rendered by chat_builtin, as llama_chat_apply_template does), but chatml's
# is common/chat.cpp's Jinja (common_chat_templates_init renders the name "chatml" with CHATML_TEMPLATE_SRC)
BUILTIN_TEMPLATES = {
    "command-r": ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>")),
    "gemma": ("gemma", ("<start_of_turn>", "<end_of_turn>")),
    "llama3": ("llama3", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
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
    if isinstance(value, Iterator):  # `map(...)` / `select(...)` are lists in llama.cpp's jinja
        value = list(value)
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Undefined(jinja2.Undefined):
    """An undefined variable added to a string is the string, as in llama.cpp's jinja (common/jinja: undefined
    values concatenate as ""); any other use fails as jinja2's does."""

    __slots__ = ()

    def __add__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self._fail_with_undefined_error()

    def __radd__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self._fail_with_undefined_error()


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
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"],
        undefined=_Undefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def detect_template_name(source: str) -> str:
    """The llama.cpp built-in style a template's markers point to (llama-chat.cpp llm_chat_detect_template, in
    chat_builtin.detect_builtin); "jinja" when none matches. Informational only: a Jinja template is always rendered
    as Jinja."""
    return detect_builtin(source) or "jinja"


def is_template_name(source: str) -> bool:
    """Whether `source` is a template name rather than Jinja source: it has no "{{" and no "{%" (a Jinja text
    without either could only render itself; llama.cpp's llm_chat_detect_template likewise takes such a string as a
    name first)."""
    return "{{" not in source and "{%" not in source


def known_template_names() -> tuple[str, ...]:
    """Every name ChatTemplate accepts: llama.cpp's built-in names, then llama-cpp-python's other chat_format
    names."""
    return LLM_CHAT_TEMPLATES + tuple(n for n in CHAT_FORMATS if n not in LLM_CHAT_TEMPLATES)


def unknown_name_error(name: str, what: str = "chat template") -> ChatTemplateError:
    """The error for a name that is no known template: it names the known ones (and the closest, if any)."""
    shown = name if len(name) <= 60 else name[:57] + "..."
    close = difflib.get_close_matches(name, known_template_names(), n=1) if len(name) <= 100 else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    lcp = [n for n in CHAT_FORMATS if n not in LLM_CHAT_TEMPLATES]
    return ChatTemplateError(
        f"{what} {shown!r} is not a known template name{hint} and not a Jinja template (no '{{{{' or '{{%'); "
        f"llama.cpp's built-in names: {', '.join(LLM_CHAT_TEMPLATES)}; llama-cpp-python's chat_format names: "
        f"{', '.join(lcp)}"
    )


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

    `source` is Jinja text, or a name (see is_template_name): one of llama.cpp's built-in names (llama-chat.cpp
    LLM_CHAT_TEMPLATES: "llama2", "mistral-v7", "phi3", "zephyr", "deepseek3"...), rendered by chat_builtin exactly
    as llama_chat_apply_template renders it, or one of llama-cpp-python's other chat_format names ("llama-2",
    "alpaca", "mistral-instruct"...), rendered as llama-cpp-python renders it (chat_format); `chat_format=True` looks
    a name up among llama-cpp-python's names first (its own "chatml", "gemma", "zephyr", "vicuna", "openchat" and
    "chatglm3" differ from llama.cpp's). None or empty selects chatml (common/chat.cpp's CHATML_TEMPLATE_SRC, as is
    the name "chatml"). With a name, `is_fallback` is True and `message` says which template is used (the caller
    shows it once; nothing is printed or warned here); `stop` is the stop string of a llama-cpp-python format (None
    otherwise). `add_bos` / `add_eos` mirror the vocabulary's flags: when the tokenizer adds BOS itself, a rendered
    Jinja prompt that starts with `bos_token` loses it (and likewise for a trailing EOS), as llama-server does, so
    the prompt is not double-prefixed; a built-in's prompt is kept as it is, as llama.cpp keeps it. Raises
    ChatTemplateError (a ValueError) if the template does not compile, or for a name that is no known template
    (the error lists the known names).
    """

    __slots__ = ("source", "name", "bos_token", "eos_token", "add_bos", "add_eos", "is_fallback", "message", "stop",
                 "_template", "_builtin", "_chat_format")  # fmt: skip

    def __init__(
        self,
        source: str | None,
        bos_token: str = "",
        eos_token: str = "",
        name: str | None = None,
        *,
        add_bos: bool = False,
        add_eos: bool = False,
        chat_format: bool = False,
    ) -> None:
        self.bos_token, self.eos_token = bos_token, eos_token
        self.add_bos, self.add_eos = add_bos, add_eos
        self._template: jinja2.Template | None = None
        self._builtin: str | None = None  # a chat_builtin style
        self._chat_format: str | None = None  # a chat_format name
        self.stop: str | None = None
        key = str(source) if source else "chatml"
        self.is_fallback = is_template_name(key)
        self.source, self.message = key, ""
        if not self.is_fallback:
            self.name = name or detect_template_name(key)
            self._compile()
            return
        if chat_format and key in CHAT_FORMATS:
            self._chat_format = key
        elif key == "chatml":
            self.source = CHATML_TEMPLATE
            self._compile()
        elif key in LLM_CHAT_TEMPLATES:
            self._builtin = key
        elif key in CHAT_FORMATS:
            self._chat_format = key
        else:
            raise unknown_name_error(key)
        if self._chat_format:
            self.stop = format_chat(key, ()).stop
        self.name = key
        whose = f"{name} has" if name else "the model has"
        self.message = (f"{whose} no chat template; using the built-in chatml template" if not source
                        else f"using the built-in {key} template")

    def _compile(self) -> None:
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"chat template {self.name!r}: syntax error on line {e.lineno}: {e.message}"
            ) from e
        except (RecursionError, MemoryError) as e:  # jinja2's parser recurses once per nesting level
            raise ChatTemplateError(f"chat template {self.name!r}: nested too deeply to compile") from e

    @classmethod
    def from_chat_format(cls, chat_format: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """llama-cpp-python's `Llama(chat_format=...)`: its name first (`chat_format=True`), then any name or
        Jinja text ChatTemplate takes."""
        return cls(chat_format, bos_token, eos_token, chat_format=True)

    @classmethod
    def from_model(cls, model: ChatModel, name: str | None = None, source: str | None = None, *,
                   chat_format: bool = False) -> ChatTemplate:
        """The template of a loaded model (`model.chat_template`, `model.vocab`), or `source` instead (a built-in
        name or Jinja text: llama-server's --chat-template; with `chat_format`, a name is llama-cpp-python's first,
        as Llama(chat_format=...) means it), with its BOS/EOS texts and add_bos / add_eos flags
        (common_chat_templates_init). A missing BOS/EOS token gives an empty string.
        """
        vocab = model.vocab

        def text(token: int | None) -> str:
            return "" if token is None or token == TOKEN_NULL else vocab.token_get_text(token)

        fallback = not source and not model.chat_template
        template = cls(
            source or model.chat_template or builtin_for_vocab(vocab),
            text(vocab.bos),
            text(vocab.eos),
            name,
            add_bos=bool(getattr(vocab, "add_bos", False)),
            add_eos=bool(getattr(vocab, "add_eos", False)),
            chat_format=chat_format,
        )
        if fallback:
            whose = f"{name} has" if name else "the model has"
            template.message = f"{whose} no chat template; using the built-in {template.name} template"
        return template

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, fallback={self.is_fallback})"

    def parse_output(self, text: str, *, messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]] | None = None, reasoning_format: str = "auto",
                     enable_thinking: bool = True, parallel_tool_calls: bool = False) -> dict[str, Any]:
        """The OpenAI assistant message (content, reasoning_content, tool_calls) of `text`, what the model wrote
        after this template's prompt for `messages` / `tools` (llama.cpp's common_chat_parse; llamactx.chat_parse
        does the parsing). Raises ValueError for an unknown reasoning format, never for the model's text."""
        from llamactx.chat_parse import parse_output  # the parsers import nothing of this module

        return parse_output(self, text, messages=messages, tools=tools, reasoning_format=reasoning_format,
                            enable_thinking=enable_thinking, parallel_tool_calls=parallel_tool_calls)

    def _render_bounded(self, variables: dict[str, Any]) -> str:
        text_size = sum(len(str(m.get("content") or "")) for m in variables["messages"])
        max_chars = MIN_OUTPUT_CHARS + 4 * text_size
        assert self._template is not None
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

    def _render_named(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        if self._chat_format is not None:
            return format_chat(self._chat_format, messages).prompt
        assert self._builtin is not None  # __init__ sets one of _template, _builtin, _chat_format
        return apply_builtin(self._builtin, [(m["role"], m["content"]) for m in messages], add_generation_prompt)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt for `messages`; `tools` (OpenAI function specs) are passed only when given, `extra`
        becomes further template variables (llama-server's chat_template_kwargs, e.g. enable_thinking). A built-in
        (a name) sees only each message's role and content, as llama_chat_apply_template does: it ignores `tools`
        and `extra`; llama-cpp-python's formats also ignore `add_generation_prompt` (they always open the
        assistant's turn, as llama-cpp-python's do).

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
        if self._template is None:
            return self._render_named(variables["messages"], add_generation_prompt)
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

"""Ollama's answers: a generation as /api/chat and /api/generate return it, whole or as NDJSON pieces (Ollama's
server/routes.go ChatHandler / GenerateHandler, api/types.go ChatResponse, GenerateResponse, Metrics), thinking
split out of the text (thinking/parser.go), and a model's card for /api/tags, /api/show and /api/ps
(ListModelResponse, ShowResponse, ProcessModelResponse).

The renderers follow llamactx.api.responses' `Renderer` protocol (first / delta / last / response), so the one
generation pipeline serves Ollama too; the server frames their stream objects as NDJSON lines.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

from llamactx import tool_calls
from llamactx.api import protocol as P
from llamactx.api import responses as R
from llamactx.api.ollama import names_of, now_iso, ns
from llamactx.engine import Chunk

FOREVER = "9999-12-31T23:59:59Z"  # /api/ps' expires_at for keep_alive < 0
MAX_ARRAY = 5  # /api/show's model_info: longer arrays are shown empty unless verbose (Ollama's getModelData)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (a tag that may still be arriving)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ThinkSplitter:
    """Ollama's thinking.Parser: streamed text split into thinking (from the opening tag, or from the start when
    the prompt ended with it, to the closing tag) and content; leading whitespace of each part is dropped."""

    def __init__(self, tags: tuple[str, str], inside: bool = False):
        self.open, self.close = tags
        self.state = "thinking_start" if inside else "start"
        self.buf = ""

    def add(self, text: str) -> tuple[str, str]:
        """(thinking, content) that `text` completes; a possible tag's beginning is held back."""
        self.buf += text
        thinking, content = "", ""
        while self.buf:
            if self.state == "start":
                head = self.buf.lstrip()
                if head.startswith(self.open):
                    self.buf, self.state = head[len(self.open):], "thinking_start"
                elif self.open.startswith(head):
                    break
                else:
                    self.state = "content"
            elif self.state in ("thinking_start", "content_start"):
                self.buf = self.buf.lstrip()
                if self.buf:
                    self.state = "thinking" if self.state == "thinking_start" else "content"
            elif self.state == "thinking":
                i = self.buf.find(self.close)
                if i < 0:
                    keep = _partial_suffix(self.buf, self.close)
                    thinking += self.buf[:len(self.buf) - keep]
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                thinking += self.buf[:i]
                self.buf, self.state = self.buf[i + len(self.close):], "content_start"
            else:
                content, self.buf = content + self.buf, ""
        return thinking, content

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the text."""
        rest, self.buf = self.buf, ""
        if self.state in ("thinking", "thinking_start"):
            return rest.lstrip() if self.state == "thinking_start" else rest, ""
        return "", rest if self.state in ("start", "content") else rest.lstrip()


def split_thinking(text: str, tags: tuple[str, str] | None, inside: bool = False) -> tuple[str, str]:
    """(thinking, content) of a whole answer."""
    if tags is None:
        return "", text
    s = ThinkSplitter(tags, inside)
    t1, c1 = s.add(text)
    t2, c2 = s.finish()
    return t1 + t2, c1 + c2


class _Ollama:
    """What both renderers share: the model name as asked, the clock, thinking, the final object's metrics."""

    def _setup(self, name: str, tags: tuple[str, str] | None, t0: float, load_s: float) -> None:
        self.name, self.tags, self.t0, self.load_s = name, tags, t0, load_s
        self.inside = bool(tags) and self.prompt_text.rstrip().endswith(tags[0])
        self.splitter = ThinkSplitter(tags, self.inside) if tags else None

    def _head(self) -> dict[str, Any]:
        return {"model": self.name, "created_at": now_iso()}

    def _done(self, seq) -> dict[str, Any]:
        t = seq.timings
        return {"done": True, "done_reason": P.finish_reason(seq),
                "total_duration": ns(time.monotonic() - self.t0 + self.load_s), "load_duration": ns(self.load_s),
                "prompt_eval_count": seq.n_prompt, "prompt_eval_duration": ns(t.prompt_ms / 1e3),
                "eval_count": seq.n_output, "eval_duration": ns(t.predicted_ms / 1e3)}

    def _pieces(self, chunks: list[Chunk]) -> tuple[str, str]:
        text = "".join(ch.text for ch in chunks)
        return self.splitter.add(text) if self.splitter else ("", text)

    def usage_chunk(self, choices: list[R.Choice]) -> dict[str, Any]:
        return {}


class ChatRenderer(_Ollama, R.ChatRenderer):
    """/api/chat: `message` with content, thinking and tool calls (arguments as objects). With tools the text is
    parsed once complete, so a stream sends it (and the calls) in one piece at the end."""

    def __init__(self, *args, name: str, tags: tuple[str, str] | None = None, t0: float = 0.0,
                 load_s: float = 0.0, **kw):
        super().__init__(*args, **kw)
        self._setup(name, tags, t0, load_s)

    def _ollama_message(self, text: str) -> dict[str, Any]:
        thinking, content = split_thinking(text, self.tags, self.inside)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if self.tools:
            rest, calls = tool_calls.parse(content)
            message["content"] = rest or ""
            if calls:
                message["tool_calls"] = [_ollama_call(call) for call in calls]
        return message

    def response(self, choices: list[R.Choice]) -> dict[str, Any]:
        c = choices[0]
        return {**self._head(), "message": self._ollama_message(c.text), **self._done(c.seq)}

    def first(self, c: R.Choice) -> list[dict[str, Any]]:
        return []

    def delta(self, c: R.Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        if self.tools:
            return []
        thinking, content = self._pieces(chunks)
        return [self._piece(thinking, content)] if thinking or content else []

    def _piece(self, thinking: str, content: str) -> dict[str, Any]:
        message = {"role": "assistant", "content": content, **({"thinking": thinking} if thinking else {})}
        return {**self._head(), "message": message, "done": False}

    def last(self, c: R.Choice) -> list[dict[str, Any]]:
        out = []
        if self.tools:
            message = self._ollama_message(c.text)
            if message["content"] or len(message) > 2:
                out.append({**self._head(), "message": message, "done": False})
        elif self.splitter:
            thinking, content = self.splitter.finish()
            if thinking or content:
                out.append(self._piece(thinking, content))
        return [*out, {**self._head(), "message": {"role": "assistant", "content": ""}, **self._done(c.seq)}]


def _ollama_call(call: tool_calls.ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments)
    except json.JSONDecodeError:
        args = call.arguments
    return {"id": call.id, "function": {"name": call.name,
                                        "arguments": args if isinstance(args, dict) else {"value": args}}}


class GenerateRenderer(_Ollama, R.Renderer):
    """/api/generate: `response` pieces, then the final object with `context` (the prompt's and the answer's
    tokens, to continue from; not in raw mode)."""

    def __init__(self, *args, name: str, tags: tuple[str, str] | None = None, t0: float = 0.0,
                 load_s: float = 0.0, context: bool = True, **kw):
        super().__init__(*args, **kw)
        self._setup(name, tags, t0, load_s)
        self.context = context

    def _final(self, seq, text: str) -> dict[str, Any]:
        thinking, content = split_thinking(text, self.tags, self.inside)
        out = {**self._head(), "response": content, **({"thinking": thinking} if thinking else {}),
               **self._done(seq)}
        if self.context:
            out["context"] = [int(t) for t in seq.tokens]
        return out

    def response(self, choices: list[R.Choice]) -> dict[str, Any]:
        return self._final(choices[0].seq, choices[0].text)

    def first(self, c: R.Choice) -> list[dict[str, Any]]:
        return []

    def delta(self, c: R.Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        thinking, content = self._pieces(chunks)
        return [self._piece(thinking, content)] if thinking or content else []

    def _piece(self, thinking: str, content: str) -> dict[str, Any]:
        return {**self._head(), "response": content, **({"thinking": thinking} if thinking else {}), "done": False}

    def last(self, c: R.Choice) -> list[dict[str, Any]]:
        out = []
        if self.splitter:
            thinking, content = self.splitter.finish()
            if thinking or content:
                out.append(self._piece(thinking, content))
        return [*out, self._final(c.seq, "")]


# -- the model card -----------------------------------------------------------------------------------------------


def _json_value(value: Any, verbose: bool) -> Any:
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) > MAX_ARRAY and not verbose:
            return []
        return [_json_value(v, verbose) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


@dataclass(frozen=True, slots=True)
class ModelCard:
    """What Ollama's listing routes say of the server's model, read once while it is loaded (they answer from
    it while the model sleeps)."""

    aliases: tuple[str, ...]
    digest: str
    file_size: int
    weights_size: int
    modified_at: str
    details: dict[str, Any]
    meta: dict[str, Any]
    template: str
    capabilities: tuple[str, ...]
    license: str

    @classmethod
    def of(cls, model, aliases: list[str], template: str, tags: tuple[str, str] | None) -> ModelCard:
        stat = os.stat(model.path)
        details = {"parent_model": "", "format": "gguf", "family": model.arch, "families": [model.arch],
                   "parameter_size": model.hparams.size_label, "quantization_level": model.ftype_name}
        caps = ("completion", *(("tools",) if "tools" in template else ()), *(("thinking",) if tags else ()))
        meta = {k: v for k, v in model.meta.items() if k not in ("general.name", "tokenizer.chat_template")}
        lic = model.meta.get("general.license")
        return cls(tuple(aliases), model.fingerprint, stat.st_size, model.size,
                   datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z"),
                   details, meta, template, caps, lic if isinstance(lic, str) else "")

    def names(self) -> list[str]:
        return names_of(list(self.aliases))

    def tags(self) -> dict[str, Any]:
        """GET /api/tags."""
        return {"models": [{"name": n, "model": n, "modified_at": self.modified_at, "size": self.file_size,
                            "digest": self.digest, "details": self.details} for n in self.names()]}

    def ps(self, expires_in: float | None, n_ctx: int) -> dict[str, Any]:
        """GET /api/ps while the model is loaded; `expires_in`: seconds until it sleeps (None: never)."""
        expires = FOREVER if expires_in is None else \
            (datetime.now(timezone.utc) + timedelta(seconds=expires_in)).isoformat().replace("+00:00", "Z")
        return {"models": [{"name": n, "model": n, "size": self.weights_size, "digest": self.digest,
                            "details": self.details, "expires_at": expires, "size_vram": 0, "context_length": n_ctx}
                           for n in self.names()]}

    def show(self, parameters: dict[str, Any], verbose: bool) -> dict[str, Any]:
        """POST /api/show; `parameters`: the server's request defaults under Ollama's option names."""
        lines = [f"{k:<30} {json.dumps(v)}" for k, vs in parameters.items()
                 for v in (vs if isinstance(vs, list) else [vs])]
        modelfile = ("# Modelfile generated by \"ollama show\" (llamactx: the server's model and settings)\n"
                     f"FROM {self.names()[0]}\n" + "".join(f"PARAMETER {line}\n" for line in lines))
        return {"license": self.license, "modelfile": modelfile, "parameters": "\n".join(lines),
                "template": self.template, "details": self.details,
                "model_info": {k: _json_value(v, verbose) for k, v in self.meta.items()},
                "capabilities": list(self.capabilities), "modified_at": self.modified_at}

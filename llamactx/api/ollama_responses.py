"""Ollama's answers: a generation as /api/chat and /api/generate return it, whole or as NDJSON pieces (Ollama's
server/routes.go ChatHandler / GenerateHandler, api/types.go ChatResponse, GenerateResponse, Metrics), and a
model's card for /api/tags, /api/show and /api/ps (ListModelResponse, ShowResponse, ProcessModelResponse).
Thinking and tool calls come from the reply parsed as the chat endpoint parses it (llamactx.chat_parse).

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

from llamactx import chat_parse
from llamactx.api import protocol as P
from llamactx.api import responses as R
from llamactx.api.ollama import names_of, now_iso, ns
from llamactx.chat_parse.message import new_call_id
from llamactx.engine import Chunk

FOREVER = "9999-12-31T23:59:59Z"  # /api/ps' expires_at for keep_alive < 0
MAX_ARRAY = 5  # /api/show's model_info: longer arrays are shown empty unless verbose (Ollama's getModelData)


class _Ollama:
    """What both renderers share: the model name as asked, the clock, the reply parsed as the chat endpoint parses
    it (`parse`: llamactx.chat_parse's ChatParams, None for text as is) and the final object's metrics."""

    parse: chat_parse.ChatParams | None

    def _setup(self, name: str, t0: float, load_s: float) -> None:
        self.name, self.t0, self.load_s = name, t0, load_s
        self._shown = chat_parse.ChatMsg()  # what the stream sent so far
        self._lp: list[dict[str, Any]] = []  # logprobs of tokens whose text the stream has not sent yet

    def _head(self) -> dict[str, Any]:
        return {"model": self.name, "created_at": now_iso()}

    def _done(self, seq) -> dict[str, Any]:
        t = seq.timings
        return {"done": True, "done_reason": P.finish_reason(seq),
                "total_duration": ns(time.monotonic() - self.t0 + self.load_s), "load_duration": ns(self.load_s),
                "prompt_eval_count": seq.n_prompt, "prompt_eval_duration": ns(t.prompt_ms / 1e3),
                "eval_count": seq.n_output, "eval_duration": ns(t.predicted_ms / 1e3)}

    def _parsed_reply(self, text: str, partial: bool = False) -> chat_parse.ChatMsg:
        if self.parse is None:
            return chat_parse.ChatMsg(text)
        return (chat_parse.parse_partial if partial else chat_parse.parse)(self.parse, text)

    def _news(self, c: R.Choice, partial: bool) -> tuple[str, str, list[dict[str, Any]]]:
        """(thinking, content, calls) that the reply so far adds to what the stream sent; calls only once the
        reply is complete."""
        cur = self._parsed_reply(c.text, partial)
        thinking = content = ""
        for d in chat_parse.diffs(self._shown, cur):
            thinking, content = thinking + d.reasoning_content_delta, content + d.content_delta
        self._shown = cur
        return thinking, content, [] if partial else [ollama_call(call) for call in cur.tool_calls]

    def _token_lp(self, token: int, logprob: float) -> dict[str, Any]:
        piece = self.vocab.token_to_piece(token)
        return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}

    def _logprobs(self, chunks: list[Chunk], flush: bool = True) -> dict[str, Any]:
        """Ollama's `logprobs` (with `logprobs: true`): each sampled token's and its `top_logprobs`; in a stream,
        those of the tokens whose text the piece carries (`flush` false: kept for the next piece)."""
        if self.gen is None or self.gen.n_probs < 0:
            return {}
        self._lp += [{**self._token_lp(ch.token, ch.logprob),
                      "top_logprobs": [self._token_lp(t, lp) for t, lp in ch.top_logprobs]}
                     for ch in chunks if ch.token is not None and ch.logprob is not None]
        if not flush:
            return {}
        out, self._lp = self._lp, []
        return {"logprobs": out}

    def usage_chunk(self, choices: list[R.Choice]) -> dict[str, Any]:
        return {}


def ollama_call(call: chat_parse.ToolCall) -> dict[str, Any]:
    """A tool call as Ollama returns it: arguments as an object."""
    try:
        args = json.loads(call.arguments)
    except json.JSONDecodeError:
        args = call.arguments
    return {"id": call.id or new_call_id(),
            "function": {"name": call.name, "arguments": args if isinstance(args, dict) else {"value": args}}}


class ChatRenderer(_Ollama, R.ChatRenderer):
    """/api/chat: `message` with content, thinking and tool calls (arguments as objects); a stream sends the
    thinking and content each token adds, and the calls once the reply is complete."""

    def __init__(self, *args, name: str, t0: float = 0.0, load_s: float = 0.0, **kw):
        super().__init__(*args, **kw)
        self._setup(name, t0, load_s)

    @staticmethod
    def _message(thinking: str, content: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
        return {"role": "assistant", "content": content, **({"thinking": thinking} if thinking else {}),
                **({"tool_calls": calls} if calls else {})}

    def response(self, choices: list[R.Choice]) -> dict[str, Any]:
        c = choices[0]
        msg = self._parsed_reply(c.text)
        calls = [ollama_call(call) for call in msg.tool_calls]
        return {**self._head(), "message": self._message(msg.reasoning_content, msg.content, calls),
                **self._done(c.seq), **self._logprobs(c.chunks)}

    def first(self, c: R.Choice) -> list[dict[str, Any]]:
        return []

    def delta(self, c: R.Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        news = self._news(c, partial=True)
        lp = self._logprobs(chunks, flush=any(news))
        return [{**self._head(), "message": self._message(*news), "done": False, **lp}] if any(news) else []

    def last(self, c: R.Choice) -> list[dict[str, Any]]:
        news = self._news(c, partial=False)
        lp = self._logprobs([])
        out = [{**self._head(), "message": self._message(*news), "done": False, **lp}] if any(news) else []
        end = {**self._head(), "message": {"role": "assistant", "content": ""}, **self._done(c.seq)}
        return [*out, {**end, **(lp if not out and lp.get("logprobs") else {})}]


class GenerateRenderer(_Ollama, R.Renderer):
    """/api/generate: `response` (and `thinking`) pieces, then the final object with `context` (the prompt's and
    the answer's tokens, to continue from; not in raw mode)."""

    def __init__(self, *args, name: str, parse: chat_parse.ChatParams | None = None, t0: float = 0.0,
                 load_s: float = 0.0, context: bool = True, **kw):
        super().__init__(*args, **kw)
        self.parse, self.context = parse, context
        self._setup(name, t0, load_s)

    def _final(self, seq, thinking: str, content: str) -> dict[str, Any]:
        out = {**self._head(), "response": content, **({"thinking": thinking} if thinking else {}),
               **self._done(seq)}
        if self.context:
            out["context"] = [int(t) for t in seq.tokens]
        return out

    def response(self, choices: list[R.Choice]) -> dict[str, Any]:
        msg = self._parsed_reply(choices[0].text)
        return {**self._final(choices[0].seq, msg.reasoning_content, msg.content), **self._logprobs(choices[0].chunks)}

    def first(self, c: R.Choice) -> list[dict[str, Any]]:
        return []

    def _piece(self, thinking: str, content: str, lp: dict[str, Any]) -> dict[str, Any]:
        return {**self._head(), "response": content, **({"thinking": thinking} if thinking else {}), "done": False,
                **lp}

    def delta(self, c: R.Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        thinking, content, _ = self._news(c, partial=True)
        lp = self._logprobs(chunks, flush=bool(thinking or content))
        return [self._piece(thinking, content, lp)] if thinking or content else []

    def last(self, c: R.Choice) -> list[dict[str, Any]]:
        thinking, content, _ = self._news(c, partial=False)
        lp = self._logprobs([])
        if thinking or content:
            return [self._piece(thinking, content, lp), self._final(c.seq, "", "")]
        return [{**self._final(c.seq, "", ""), **(lp if lp.get("logprobs") else {})}]


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
    def of(cls, model, aliases: list[str], template: str, thinks: bool) -> ModelCard:
        stat = os.stat(model.path)
        details = {"parent_model": "", "format": "gguf", "family": model.arch, "families": [model.arch],
                   "parameter_size": model.hparams.size_label, "quantization_level": model.ftype_name}
        caps = ("completion", *(("tools",) if "tools" in template else ()), *(("thinking",) if thinks else ()))
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

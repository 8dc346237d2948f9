"""Ollama's API beside the OpenAI one (Ollama's server/routes.go GenerateRoutes): /api/chat, /api/generate,
/api/embed, /api/embeddings, /api/tags, /api/show, /api/ps, /api/version, and Ollama-shaped refusals of the
model-store routes (/api/pull, /api/push, /api/create, /api/copy, /api/delete, /api/blobs).

Each request is translated (llamactx.api.ollama) and runs through the server's own pipelines: the chat and
completion pipelines of routes_generation.py (`chat`, `completion`) and routes_embedding.py's embedder job
(`embed`), bound to the server's state by app.py, with Ollama's renderers (llamactx.api.ollama_responses). Their
SSE stream is re-framed as NDJSON, one JSON object a line. Errors are Ollama's {"error": "..."} with the status.
`keep_alive` is left for server/lifecycle.py, which holds every request: 0 unloads the model once idle (the next
request loads it again), < 0 keeps it, N seconds keeps it N seconds idle.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llamactx.api import ollama as O
from llamactx.api import protocol as P
from llamactx.api.ollama_responses import ChatRenderer, GenerateRenderer, ModelCard
from llamactx.errors import LlamactxError
from llamactx.server.completions import chat_parse_params, with_reasoning
from llamactx.server.lifecycle import Phase
from llamactx.server.prompts import render_chat
from llamactx.version import __version__

# the routes that never wake a sleeping model (they answer from the card read while it was loaded)
FREE = ("/api/tags", "/api/ps", "/api/version", "/api/show", "/api/pull", "/api/push", "/api/create",
        "/api/copy", "/api/delete", "/api/blobs/")
_STORE = {"pull": "pulling models", "push": "pushing models", "create": "creating models",
          "copy": "copying models", "delete": "deleting models", "blobs": "model blobs"}
# the server's request defaults (--temp, -n ...) under Ollama's option names, for /api/show's parameters
_OPTION_OF = {field: option for option, (field, _) in O.SAMPLER_OPTIONS.items()}

Handler = Callable[[Request], Awaitable[Response]]


def _ollama_errors(handler: Handler) -> Handler:
    """Errors as Ollama sends them: {"error": "..."} with the status (a 4xx for the request's own mistakes)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except P.ProtocolError as e:
            return JSONResponse({"error": str(e)}, e.status, headers=e.headers)
        except LlamactxError as e:
            return JSONResponse({"error": str(e)}, 400)

    return wrapped


async def _ndjson_lines(sse: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The generation pipeline's SSE events as NDJSON lines; an error event becomes Ollama's {"error": "..."}."""
    async for event in sse:
        for line in (event if isinstance(event, bytes) else event.encode()).split(b"\n"):
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            data = line[6:]
            if data.startswith(b'{"error"'):
                err = json.loads(data)["error"]
                data = json.dumps({"error": err.get("message") if isinstance(err, dict) else err}).encode()
            yield data + b"\n"


def _ndjson(response: Response) -> Response:
    if not isinstance(response, StreamingResponse):
        return response
    return StreamingResponse(_ndjson_lines(response.body_iterator), media_type="application/x-ndjson",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _keep(request: Request, seconds: float | None) -> None:
    """The request's keep_alive, for the lifecycle to apply when the request ends (HoldModel)."""
    if seconds is not None:
        request.scope["llamactx.keep_alive"] = seconds


def _load_answer(request: Request, model: str, keep: float | None, field: str) -> Response:
    """An empty prompt / conversation: load the model (holding it did), or unload it with keep_alive 0."""
    unload = keep == 0
    _keep(request, keep)
    empty = {"role": "assistant", "content": ""} if field == "message" else ""
    return JSONResponse({"model": model, "created_at": O.now_iso(), field: empty, "done": True,
                         "done_reason": "unload" if unload else "load"})


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        raise P.ProtocolError("missing request body")
    return P.parse_json(raw)


def _normalized(vec) -> list[float]:
    norm = math.sqrt(sum(float(x) * float(x) for x in vec))
    return [float(x) / max(norm, 1e-12) for x in vec]


def ollama_routes(state, chat: Callable, completion: Callable, embed: Callable) -> list[Route]:
    """The routes, over the bound pipelines `chat(request, body, renderer_cls)`, `completion(request,
    renderer_cls, body)` and `embed(request, inputs) -> (vectors, n_tokens) | None`."""
    cfg = state.config
    cards: list[ModelCard] = []

    def card() -> ModelCard:
        if not cards:
            cards.append(ModelCard.of(state.model, state.aliases or [state.alias], state.template.source,
                                      O.thinks(state.template.source)))
        return cards[0]

    state.lifecycle.on_sleeping_state(lambda sleeping: sleeping and card())  # read it before the model goes

    def fixed() -> dict[str, Any]:
        """What this server runs each load-time option at."""
        rt = cfg.runtime
        return {"num_ctx": state.n_ctx_slot(), "num_batch": rt.n_batch, "num_thread": rt.n_threads,
                "f16_kv": rt.type_k == "f16" and rt.type_v == "f16", "use_mmap": True, "use_mlock": False,
                "num_gpu": 0, "main_gpu": 0, "low_vram": False, "logits_all": False, "vocab_only": False,
                "embedding_only": False, "numa": False}

    def begin(body: dict[str, Any]) -> tuple[str, float | None, dict[str, Any]]:
        """The request's model name (checked), keep_alive and sampler fields."""
        name = body.get("model")
        O.model_name(name, state.aliases or [state.alias])
        return name, O.keep_alive_seconds(body.get("keep_alive")), O.options_fields(body.get("options"), fixed())

    async def chat_route(request: Request) -> Response:
        t0 = time.monotonic()
        state.check_ready()
        body = await _json(request)
        name, keep, sampling = begin(body)
        think = O.think_kwargs(body, name, O.thinks(state.template.source))
        if not body.get("messages"):
            return _load_answer(request, name, keep, "message")
        chat_body = O.chat_body(body, sampling, think)
        _keep(request, keep)
        renderer = partial(ChatRenderer, name=name, t0=t0, load_s=request.scope.get("llamactx.load_s", 0.0))
        return _ndjson(await chat(request, chat_body, renderer))

    async def generate_route(request: Request) -> Response:
        t0 = time.monotonic()
        state.check_ready()
        body = await _json(request)
        name, keep, sampling = begin(body)
        think = O.think_kwargs(body, name, O.thinks(state.template.source))
        if not body.get("prompt"):
            return _load_answer(request, name, keep, "response")
        raw = body.get("raw", False)
        if not isinstance(raw, bool):
            raise P.ProtocolError(f"raw must be a boolean (got {raw!r})")
        context = O.context_tokens(body, state.model.vocab.n_tokens)
        parse = None  # raw: the text as is
        if raw:
            if body.get("system") or body.get("template") or context:
                raise P.ProtocolError("raw mode does not support template, system, or context")
            text = body["prompt"]
            if not isinstance(text, str):
                raise P.ProtocolError("prompt must be a string")
        else:  # the chat endpoint's render and reply parsing, for one user message
            req = with_reasoning(state, P.validate(P.ChatCompletionRequest,
                                                   {"messages": O.generate_messages(body), **think}))
            text, _ = await asyncio.to_thread(render_chat, state.template, req)
            parse = await asyncio.to_thread(chat_parse_params, state, req, [])
        fields = {"prompt": [*context, text] if context else text, "stream": O.stream_of(body), **sampling,
                  **O.format_fields(body.get("format")), **O.logprob_fields(body, False)}
        _keep(request, keep)
        renderer = partial(GenerateRenderer, name=name, parse=parse, t0=t0,
                           load_s=request.scope.get("llamactx.load_s", 0.0), context=not raw)
        return _ndjson(await completion(request, renderer, fields))

    async def embed_inputs(request: Request, body: dict[str, Any], texts: list[str]) -> tuple[list, int] | None:
        if cfg.runtime.pooling == "none":
            raise P.ProtocolError("embeddings need a pooled vector: start the server with --pooling mean, last or "
                                  "cls")
        truncate = body.get("truncate", True)
        if not isinstance(truncate, bool):
            raise P.ProtocolError(f"truncate must be a boolean (got {truncate!r})")
        inputs: list = texts
        if truncate:  # Ollama's default: each input cut to the embedding context
            vocab, n_ctx = state.model.vocab, state.embedder.n_ctx
            inputs = await asyncio.to_thread(
                lambda: [vocab.tokenize(t, add_special=True, parse_special=False)[:n_ctx] for t in texts])
        return await embed(request, inputs)

    async def embed_route(request: Request) -> Response:
        t0 = time.monotonic()
        state.check_ready()
        body = await _json(request)
        name, keep, _ = begin(body)
        given = body.get("input")
        texts = ([given] if given else []) if isinstance(given, str) else given
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise P.ProtocolError("invalid input type: input must be a string or an array of strings")
        dims = body.get("dimensions")
        if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
            raise P.ProtocolError(f"dimensions must be a positive integer (got {dims!r})")
        _keep(request, keep)
        if not texts:
            return JSONResponse({"model": name, "embeddings": []})
        result = await embed_inputs(request, body, texts)
        if result is None:
            return Response(status_code=499)
        vecs, n_tokens = result
        load_s = request.scope.get("llamactx.load_s", 0.0)
        out = [_normalized(_normalized(v)[:dims] if dims else v) for v in vecs]
        return JSONResponse({"model": name, "embeddings": out,
                             "total_duration": O.ns(time.monotonic() - t0 + load_s), "load_duration": O.ns(load_s),
                             "prompt_eval_count": n_tokens})

    async def embeddings_route(request: Request) -> Response:
        state.check_ready()
        body = await _json(request)
        _, keep, _ = begin(body)
        prompt = body.get("prompt") or ""
        if not isinstance(prompt, str):
            raise P.ProtocolError("prompt must be a string")
        _keep(request, keep)
        if not prompt:
            return JSONResponse({"embedding": []})
        result = await embed_inputs(request, body, [prompt])
        if result is None:
            return Response(status_code=499)
        return JSONResponse({"embedding": [float(x) for x in result[0][0]]})

    async def tags_route(request: Request) -> Response:
        state.check_ready()
        return JSONResponse(card().tags())

    async def show_route(request: Request) -> Response:
        state.check_ready()
        body = await _json(request)
        name = body.get("model") or body.get("name")
        O.model_name(name, state.aliases or [state.alias])
        defaults = {_OPTION_OF[k]: v for k, v in cfg.request_defaults.items() if k in _OPTION_OF}
        params = {**defaults, "num_ctx": state.n_ctx_slot() if state.engine is not None else None}
        params = {k: v for k, v in params.items() if v is not None}
        return JSONResponse(card().show(params, body.get("verbose") is True))

    async def ps_route(request: Request) -> Response:
        state.check_ready()
        lc = state.lifecycle
        if lc.phase is not Phase.READY or state.engine is None:
            return JSONResponse({"models": []})
        return JSONResponse(card().ps(lc.expires_in(), state.n_ctx_slot()))

    async def version_route(request: Request) -> Response:
        return JSONResponse({"version": __version__})

    def refuse(what: str) -> Handler:
        async def store_route(request: Request) -> Response:
            names = ", ".join(O.names_of(state.aliases or [state.alias]))
            return JSONResponse({"error": f"{_STORE[what]} is not supported: llamactx serves the model it was "
                                          f"started with ({names}) from its GGUF file; to serve another, start "
                                          "`llamactx serve -m <file.gguf>`"}, 501)
        return store_route

    handlers = [("/api/chat", chat_route, "POST"), ("/api/generate", generate_route, "POST"),
                ("/api/embed", embed_route, "POST"), ("/api/embeddings", embeddings_route, "POST"),
                ("/api/tags", tags_route, "GET"), ("/api/show", show_route, "POST"), ("/api/ps", ps_route, "GET"),
                ("/api/version", version_route, "GET"), ("/api/pull", refuse("pull"), "POST"),
                ("/api/push", refuse("push"), "POST"), ("/api/create", refuse("create"), "POST"),
                ("/api/copy", refuse("copy"), "POST"), ("/api/delete", refuse("delete"), "DELETE"),
                ("/api/blobs/{digest}", refuse("blobs"), "POST")]
    return [Route(path, _ollama_errors(fn), methods=[method]) for path, fn, method in handlers]

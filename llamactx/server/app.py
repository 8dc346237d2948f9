"""The HTTP layer: routes, authentication, CORS, body limits and errors in llama-server's format (tools/server:
server.cpp routes, server-http.cpp middlewares, server-common.cpp `format_error_response`).

    app = create_app(ServerConfig.of(model="smollm2", n_slots=4))   # a Starlette app; `llamactx serve` runs it

The model loads in the background at start-up: /health answers 503 "Loading model" until it is ready. Handlers
never touch the Context: generation and anything else that needs it go through the engine thread (`worker.py`).
Bad input is a 4xx with {"error": {"code", "message", "type"}}, never a 500.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from llamactx import tool_calls
from llamactx.api import anthropic, infill, oai_responses
from llamactx.api import protocol as P
from llamactx.api import rerank as rerank_api
from llamactx.api.responses import ChatRenderer, NativeRenderer, Renderer
from llamactx.errors import LlamactxError
from llamactx.server import slots
from llamactx.server.completions import DISCONNECT_POLL_S, chat_parse_params, serve, with_reasoning
from llamactx.server.config import ServerConfig, ServerState
from llamactx.server.gcp import predict_route
from llamactx.server.http import return_large_buffers
from llamactx.server.lifecycle import HoldModel
from llamactx.server.metrics import CONTENT_TYPE as METRICS_TYPE
from llamactx.server.metrics import Snapshot
from llamactx.server.middleware import CanonicalHeaders, Cors, Guard
from llamactx.server.ollama_routes import FREE as OLLAMA_FREE
from llamactx.server.ollama_routes import ollama_routes
from llamactx.server.prompts import (
    completion_prompts,
    content_text,
    embedding_tokens,
    fit_prompt,
    prompt_tokens,
    render_chat,
    rerank_prompts,
)
from llamactx.server.streams import stream_routes
from llamactx.server.tools.toolbox import agent_routes
from llamactx.server.worker import Job

log = logging.getLogger("llamactx.server")
STATIC = Path(__file__).parent / "static"


def create_app(config: ServerConfig, load_in_background: bool = True) -> Starlette:
    return_large_buffers()
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(app):
        loader = threading.Thread(target=state.load, name="llamactx-load", daemon=True)
        loader.start()
        if not load_in_background:
            await asyncio.to_thread(loader.join)
        await state.toolbox.start()
        yield
        await state.toolbox.stop()
        state.lifecycle.stop()
        state.streams.close()
        if state.worker is not None:
            await asyncio.to_thread(state.worker.stop)

    routes = _routes(state)
    middleware = [Middleware(CanonicalHeaders), Middleware(Guard, config=config),
                  Middleware(HoldModel, lifecycle=state.lifecycle, free=_free_routes(config))]
    if config.cors_origins:
        middleware.insert(1, Middleware(Cors, origins=config.cors_origins))
    handlers = {HTTPException: _http_error, LlamactxError: _user_error, ClientDisconnect: _client_gone,
                Exception: _server_error}
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=handlers)
    app.state.llamactx = state
    return app


def _free_routes(config: ServerConfig) -> tuple[str, ...]:
    """The routes that never wake a sleeping server (llama-server's bypass_sleep ones, and those that need no
    model: the web page, the agent tools, the resumable streams' buffers)."""
    free = ("/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics", "/", "/static/", "/tools",
            "/cors-proxy", "/v1/stream", "/v1/streams/lookup")
    return free + OLLAMA_FREE + ((config.gcp_health_route,) if config.gcp_health_route else ())


# -- errors ------------------------------------------------------------------------------------------------------


async def _http_error(request: HttpRequest, exc: HTTPException) -> Response:
    kinds = {404: "not_found_error", 405: "invalid_request_error"}
    message = "File Not Found" if exc.status_code == 404 else str(exc.detail)
    err = P.ProtocolError(message, exc.status_code, kinds.get(exc.status_code, "invalid_request_error"))
    return JSONResponse(err.body(), exc.status_code)


async def _user_error(request: HttpRequest, exc: Exception) -> Response:
    """The user's input, named by the exception: a 4xx (a ProtocolError carries its own status and type)."""
    if isinstance(exc, P.ProtocolError):
        err = exc
    else:
        err = P.ProtocolError(str(exc))
    return JSONResponse(err.body(), err.status, headers=err.headers)


async def _client_gone(request: HttpRequest, exc: ClientDisconnect) -> Response:
    """The client went away before its request was read whole (an aborted upload, a read timeout): nobody is
    left to answer; a debug line, not an error."""
    log.debug("client left during %s", request.url.path)
    return Response(status_code=499)


async def _server_error(request: HttpRequest, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered 500 server_error (Starlette re-raises it after this)."""
    log.exception("internal error on %s", request.url.path)
    err = P.ProtocolError(f"internal error: {type(exc).__name__}", 500, "server_error")
    return JSONResponse(err.body(), err.status)


async def _json(request: HttpRequest) -> dict:
    return P.parse_json(await request.body())


# -- routes ------------------------------------------------------------------------------------------------------


def _routes(state: ServerState) -> list:
    cfg = state.config

    async def health(request):
        state.check_ready()
        return JSONResponse({"status": "ok"})

    def models_body() -> dict:
        meta = {"n_vocab": state.model.hparams.n_vocab, "n_ctx_train": state.model.hparams.n_ctx_train,
                "n_embd": state.model.hparams.n_embd, "n_params": state.model.n_params, "size": state.model.size}
        data = [{"id": state.alias, "aliases": state.aliases or [state.alias], "tags": cfg.tags,
                 "object": "model", "created": int(state.t_start), "owned_by": "llamactx",
                 "meta": meta}]
        return {"object": "list", "data": data}

    def props_body(is_sleeping: bool) -> dict:
        return {
            "default_generation_settings": {"n_ctx": state.n_ctx_slot(), "params": _default_params(cfg)},
            "total_slots": cfg.runtime.n_slots, "model_path": str(state.model.path), "model_alias": state.alias,
            "chat_template": state.template.source, "modalities": {"vision": False, "audio": False},
            "build_info": "llamactx", "webui": cfg.webui, "is_sleeping": is_sleeping,
        }

    # what the read-only routes answer while the model sleeps (llama-server's update_cached_responses)
    asleep: dict[str, Any] = {}

    def cache_responses(is_sleeping: bool) -> None:
        if is_sleeping:
            asleep.update(models=models_body(), props=props_body(True), metrics=Snapshot.of(state.engine))

    state.lifecycle.on_sleeping_state(cache_responses)

    def cached(name: str):
        """The response cached on entering sleep, or None when awake."""
        return asleep.get(name) if state.lifecycle.is_sleeping else None

    async def models(request):
        state.check_ready()
        return JSONResponse(cached("models") or models_body())

    async def props(request):
        state.check_ready()
        return JSONResponse(cached("props") or props_body(False))

    async def completions_oai(request):
        return await _completion(request, Renderer)

    async def completion_native(request):
        return await _completion(request, NativeRenderer)

    async def infill_route(request):
        state.check_ready()
        body = await _json(request)
        infill.check_supported(state.model.vocab)
        prefix, suffix, extra, prompt = infill.parse(body)
        rest = {k: v for k, v in body.items() if k not in ("input_prefix", "input_suffix", "input_extra", "prompt")}
        given = (rest.get("n_predict"), rest.get("max_tokens"), cfg.request_defaults.get("n_predict"))
        n_predict = next((v for v in given if isinstance(v, int) and not isinstance(v, bool)), -1)

        def tokens() -> list[int]:
            vocab = state.model.vocab
            prompt_ids = vocab.tokenize(prompt, add_special=False, parse_special=True)
            return infill.format_infill(vocab, prefix, suffix, extra, cfg.runtime.n_batch, n_predict,
                                        state.n_ctx_slot(), prompt_ids)

        return await _completion(request, NativeRenderer, {**rest, "prompt": await asyncio.to_thread(tokens)})

    async def _completion(request, renderer_cls, body: dict | None = None):
        state.check_ready()
        body = await _json(request) if body is None else body
        state.check_request_lora(body)
        req = P.validate(P.CompletionRequest, {**cfg.request_defaults, **body})
        if req.n > 1 and renderer_cls is NativeRenderer:
            raise P.ProtocolError(f"n: /completion returns one completion (got n = {req.n}); "
                                  "/v1/completions returns n choices")
        if req.suffix:
            raise P.ProtocolError("suffix: fill-in-the-middle is POST /infill (input_prefix, input_suffix) here", 400)
        if req.post_sampling_probs and renderer_cls is not NativeRenderer:
            raise P.ProtocolError("post_sampling_probs: only /completion reports probabilities after the sampler "
                                  "chain; here logprobs are the model's own")
        prompts, text = await asyncio.to_thread(completion_prompts, state, req.prompt, req.n_keep)
        n_probs = req.logprobs if req.logprobs is not None else (req.n_probs or -1)
        gen = P.GenerationRequest.from_fields(req, state.model.vocab, n_probs, cfg.context_shift)
        extra = {"response_fields": req.response_fields} if renderer_cls is NativeRenderer else {}
        renderer = renderer_cls(state.alias, state.model.vocab, text, gen, echo=req.echo, **extra)
        return await serve(state, request, prompts, gen, renderer)

    async def chat_completions(request):
        state.check_ready()
        return await _chat(request, await _json(request), ChatRenderer)

    async def messages(request):
        state.check_ready()
        return await _chat(request, anthropic.to_chat(await _json(request)), anthropic.MessagesRenderer)

    async def responses(request):
        state.check_ready()
        return await _chat(request, oai_responses.to_chat(await _json(request)), oai_responses.ResponsesRenderer)

    async def count_tokens(request):
        state.check_ready()
        body, path = await _json(request), request.url.path
        chat = oai_responses.to_chat(body) if path.endswith("/responses/input_tokens") else body \
            if path.endswith("/input_tokens") else anthropic.count_tokens_body(body)
        req = P.validate(P.ChatCompletionRequest, chat)
        prompt_text, _ = await asyncio.to_thread(render_chat, state, req)
        tokens = await asyncio.to_thread(prompt_tokens, state, prompt_text, True)
        return JSONResponse({"input_tokens": len(tokens)})

    async def _chat(request, body: dict, renderer_cls):
        state.check_request_lora(body)
        req = with_reasoning(state, P.validate(P.ChatCompletionRequest, {**cfg.request_defaults, **body}))
        prompt_text, fns = await asyncio.to_thread(render_chat, state, req)
        parse = await asyncio.to_thread(chat_parse_params, state, req, fns)
        tokens = await asyncio.to_thread(prompt_tokens, state, prompt_text, True)
        tokens = fit_prompt(state, tokens, req.n_keep)
        n_probs = (req.top_logprobs or 0) if req.logprobs else -1
        gen = P.GenerationRequest.from_fields(req, state.model.vocab, n_probs, cfg.context_shift)
        required = tool_calls.required_function(req.tool_choice, fns)
        if required:
            if gen.grammar is not None:
                raise P.ProtocolError("tool_choice: a required tool call cannot be combined with grammar / "
                                      "json_schema / response_format")
            gen.grammar = ("json_schema", tool_calls.call_schema(required))
        extra = {"n_prompt": len(tokens)} if renderer_cls in (anthropic.MessagesRenderer,
                                                               oai_responses.ResponsesRenderer) else {}
        renderer = renderer_cls(state.alias, state.model.vocab, prompt_text, gen, tools=bool(fns), parse=parse,
                                **extra)
        return await serve(state, request, [tokens], gen, renderer)

    async def embed(request, inputs: list) -> tuple[list, int] | None:
        """The vectors of `inputs` (texts or token lists) from the embedder on the engine thread, and their
        number of tokens; None if the client went away first."""
        if len(inputs) > cfg.embd_max_inputs:
            raise P.ProtocolError(f"input holds {len(inputs)} inputs, more than --embd-max-inputs = "
                                  f"{cfg.embd_max_inputs}")
        token_lists = await asyncio.to_thread(embedding_tokens, state, inputs)
        state.embedder.check(token_lists)
        job = state.worker.run(Job(lambda _engine: state.embedder.steps(token_lists)))
        vecs = await _wait_job(request, job)
        return None if vecs is None else (vecs, sum(len(t) for t in token_lists))

    async def embeddings(request):
        state.check_ready()
        if cfg.runtime.pooling == "none":
            raise P.ProtocolError("Pooling type 'none' is not OAI compatible: token-level embeddings are not served "
                                  "here; start the server with --pooling mean, last or cls")
        req = P.validate(P.EmbeddingRequest, await _json(request))
        inputs = req.input if isinstance(req.input, list) else [req.input]
        if inputs and isinstance(inputs[0], int):
            inputs = [inputs]
        inputs = [content_text(x, f"input[{i}]") if isinstance(x, dict) else x for i, x in enumerate(inputs)]
        embedded = await embed(request, inputs)
        if embedded is None:
            return Response(status_code=499)
        vecs, n_tokens = embedded
        return JSONResponse({"object": "list", "model": state.alias,
                             "data": [P.embedding_item(i, v, req.encoding_format) for i, v in enumerate(vecs)],
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    async def rerank(request):
        """llama-server's post_rerank: each (query, document) pair is scored by the reranker (pooling rank: the
        last token's hidden state, element 0, for a model without a classifier head) on the engine thread."""
        state.check_ready()
        if state.reranker is None:
            raise P.ProtocolError("This server does not support reranking. Start it with `--reranking`", 501,
                                  "not_supported_error")
        req = rerank_api.parse(await _json(request), cfg.embd_max_inputs)
        prompts = await asyncio.to_thread(rerank_prompts, state, req)
        job = state.worker.run(Job(lambda _engine: state.reranker.steps(prompts)))
        scores = await _wait_job(request, job)
        if scores is None:
            return Response(status_code=499)
        return JSONResponse(rerank_api.format_response(req, state.alias, scores[:, 0], [len(p) for p in prompts]))

    async def tokenize(request):
        state.check_ready()
        req = P.validate(P.TokenizeRequest, await _json(request))
        vocab = state.model.vocab
        tokens = await asyncio.to_thread(vocab.tokenize, req.content, req.add_special, req.parse_special)
        if req.with_pieces:
            out = [{"id": t, "piece": _piece_json(vocab.token_to_piece(t))} for t in tokens]
            return JSONResponse({"tokens": out})
        return JSONResponse({"tokens": tokens})

    async def detokenize(request):
        state.check_ready()
        req = P.validate(P.DetokenizeRequest, await _json(request))
        tokens = P.check_tokens(req.tokens, state.model.vocab.n_tokens, "tokens")
        return JSONResponse({"content": state.model.vocab.detokenize(tokens)})

    async def apply_template(request):
        state.check_ready()
        req = P.validate(P.ApplyTemplateRequest, await _json(request))
        prompt = await asyncio.to_thread(state.template.render, req.messages, True, req.tools,
                                         req.chat_template_kwargs)
        return JSONResponse({"prompt": prompt})

    async def slots_get(request):
        state.check_ready()
        if not cfg.slots:
            raise P.ProtocolError("This server does not support slots endpoint. Start it with `--slots`", 501,
                                  "not_supported_error")
        return JSONResponse(await asyncio.wrap_future(state.worker.call(slots.slots_info)))

    async def slots_post(request):
        state.check_ready()
        if not cfg.slot_save_path:
            raise P.ProtocolError("This server does not support slot actions. Start it with `--slot-save-path`",
                                  501, "not_supported_error")
        try:
            id_slot = int(request.path_params["id_slot"])
        except ValueError:
            raise P.ProtocolError(f"id_slot {request.path_params['id_slot']!r} is not an integer") from None
        action = request.query_params.get("action", "")
        if action == "erase":
            fn = lambda engine: slots.erase(engine, id_slot)  # noqa: E731
        elif action in ("save", "restore"):
            req = P.validate(P.SlotFileRequest, await _json(request))
            path = slots.slot_path(Path(cfg.slot_save_path), req.filename)
            op = slots.save if action == "save" else slots.restore
            fn = lambda engine: op(engine, id_slot, path)  # noqa: E731
        else:
            raise P.ProtocolError(f"action: {action!r} is not one of save, restore, erase")
        return JSONResponse(await asyncio.wrap_future(state.worker.call(fn)))

    async def lora_adapters_get(request):
        state.check_ready()
        return JSONResponse([{"id": i, "path": str(a.path), "scale": s,
                              "task_name": a.meta.get("adapter.lora.task_name", ""),
                              "prompt_prefix": a.meta.get("adapter.lora.prompt_prefix", "")}
                             for i, (a, s) in enumerate(zip(state.loras, state.lora_scales, strict=True))])

    async def lora_adapters_post(request):
        state.check_ready()
        try:
            body = P.parse_json(b'{"body": ' + await request.body() + b"}")["body"]  # any JSON value
        except P.ProtocolError:
            raise P.ProtocolError("request body is not valid JSON") from None
        if not isinstance(body, list):
            raise P.ProtocolError("Request body must be an array")
        scales = state.lora_scales_from(body, "body")
        await asyncio.wrap_future(state.worker.call(lambda engine: state.set_lora_scales(engine, scales)))
        return JSONResponse({"success": True})

    async def metrics(request):
        state.check_ready()
        if not cfg.metrics:
            raise P.ProtocolError("This server does not support metrics endpoint. Start it with `--metrics`", 501,
                                  "not_supported_error")
        snap = cached("metrics") or Snapshot.of(state.engine)
        return Response(state.metrics.render(snap), media_type=METRICS_TYPE,
                        headers={"Process-Start-Time-Unix": str(int(state.t_start))})

    async def index(request):
        if not cfg.webui:
            raise HTTPException(404)
        return FileResponse(STATIC / "index.html")

    routes = [
        Route("/health", health), Route("/v1/health", health),
        Route("/models", models), Route("/v1/models", models), Route("/props", props),
        Route("/v1/completions", completions_oai, methods=["POST"]),
        Route("/completion", completion_native, methods=["POST"]),
        Route("/completions", completion_native, methods=["POST"]),
        Route("/infill", infill_route, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]), Route("/responses", responses, methods=["POST"]),
        Route("/chat/completions/input_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses/input_tokens", count_tokens, methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", count_tokens, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/embeddings", embeddings, methods=["POST"]),
        Route("/v1/rerank", rerank, methods=["POST"]), Route("/rerank", rerank, methods=["POST"]),
        Route("/v1/reranking", rerank, methods=["POST"]), Route("/reranking", rerank, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/slots", slots_get), Route("/slots/{id_slot}", slots_post, methods=["POST"]),
        Route("/lora-adapters", lora_adapters_get),
        Route("/lora-adapters", lora_adapters_post, methods=["POST"]),
        Route("/metrics", metrics), Route("/", index), *agent_routes(state.toolbox),
        *stream_routes(state.streams), *ollama_routes(state, _chat, _completion, embed),
    ]
    if cfg.webui:
        routes.append(Mount("/static", StaticFiles(directory=STATIC), name="static"))
    if cfg.gcp_predict_route:
        routes.append(Route(cfg.gcp_predict_route, predict_route(routes), methods=["POST"]))
    if cfg.gcp_health_route:
        routes.append(Route(cfg.gcp_health_route, health))
    return routes


def _default_params(cfg: ServerConfig) -> dict:
    """A request's sampling fields when it gives none: the defaults, then the server's sampling flags (/props'
    default_generation_settings.params)."""
    req = P.validate(P.CompletionRequest, {"prompt": "x", **cfg.request_defaults})
    params = req.model_dump(exclude={"prompt", "model", "echo", "suffix", "logprobs", "stream_options",
                                     "response_format", "n"})
    params["seed"] = 0xFFFFFFFF if req.seed is None or req.seed == -1 else req.seed  # LLAMA_DEFAULT_SEED: random
    return params


async def _wait_job(http: HttpRequest, job):
    """The job's result; None (and the job dropped) if the client goes away first."""
    fut = asyncio.wrap_future(job.future)
    while True:
        done, _ = await asyncio.wait({fut}, timeout=DISCONNECT_POLL_S)
        if done:
            return fut.result()
        if await http.is_disconnected():
            job.cancel()
            return None


def _piece_json(piece: bytes):
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)

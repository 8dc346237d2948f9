"""The HTTP layer: routes, authentication, CORS, body limits and errors in llama-server's format (tools/server:
server.cpp routes, server-http.cpp middlewares, server-common.cpp `format_error_response`).

    app = create_app(ServerConfig.of(model="smollm2", n_slots=4))   # a Starlette app; `llamactx serve` runs it

The model loads in the background at start-up: /health answers 503 "Loading model" until it is ready. Handlers
never touch the Context: generation and anything else that needs it go through the engine thread (`worker.py`).
Bad input is a 4xx with {"error": {"code", "message", "type"}}, never a 500.

Every route is registered here, in `_routes`; the handlers are module-level functions `handler(state, request)`,
grouped by area:

    routes_info.py        /health, /models, /props, /metrics, the chat page; /tokenize, /detokenize, /apply-template
    routes_generation.py  /v1/completions, /completion, /infill, /v1/chat/completions, /v1/messages, /v1/responses,
                          the token counts
    routes_embedding.py   /v1/embeddings, /rerank
    routes_admin.py       /slots, /lora-adapters
    ollama_routes.py, streams.py, tools/toolbox.py, gcp.py   Ollama's API, resumable streams, agent tools, /predict
"""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import asynccontextmanager
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from llamactx.api import protocol as P
from llamactx.errors import LlamactxError
from llamactx.server import routes_admin as admin
from llamactx.server import routes_embedding as embedding
from llamactx.server import routes_generation as generation
from llamactx.server import routes_info as info
from llamactx.server.config import ServerConfig, ServerState
from llamactx.server.gcp import predict_route
from llamactx.server.http import return_large_buffers
from llamactx.server.lifecycle import HoldModel
from llamactx.server.middleware import CanonicalHeaders, Cors, Guard
from llamactx.server.ollama_routes import FREE as OLLAMA_FREE
from llamactx.server.ollama_routes import ollama_routes
from llamactx.server.routes_info import STATIC, SleepCache
from llamactx.server.streams import stream_routes
from llamactx.server.tools.toolbox import agent_routes

log = logging.getLogger("llamactx.server")


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


# -- routes: every route of the app, registered here; the handlers live in the routes_* modules by area ----------


def _routes(state: ServerState) -> list:
    """The app's routes, each handler bound to `state` (a handler is `handler(state, request)`)."""
    cfg = state.config
    asleep = SleepCache(state)  # before Ollama's card reader: the same order on entering sleep

    def bind(handler, *args):
        return partial(handler, state, *args)

    health, models, props = bind(info.health), bind(info.models, asleep), bind(info.props, asleep)
    completions_oai, completion_native = bind(generation.completions_oai), bind(generation.completion_native)
    chat_completions, responses = bind(generation.chat_completions), bind(generation.responses)
    count_tokens = bind(generation.count_tokens)
    embeddings, rerank = bind(embedding.embeddings), bind(embedding.rerank)
    ollama = ollama_routes(state, bind(generation.chat), bind(generation.completion), bind(embedding.embed))
    post = ["POST"]
    routes = [
        Route("/health", health), Route("/v1/health", health),
        Route("/models", models), Route("/v1/models", models), Route("/props", props),
        Route("/v1/completions", completions_oai, methods=post),
        Route("/completion", completion_native, methods=post),
        Route("/completions", completion_native, methods=post),
        Route("/infill", bind(generation.infill_route), methods=post),
        Route("/v1/chat/completions", chat_completions, methods=post),
        Route("/chat/completions", chat_completions, methods=post),
        Route("/v1/messages", bind(generation.messages), methods=post),
        Route("/v1/responses", responses, methods=post), Route("/responses", responses, methods=post),
        Route("/chat/completions/input_tokens", count_tokens, methods=post),
        Route("/v1/responses/input_tokens", count_tokens, methods=post),
        Route("/v1/chat/completions/input_tokens", count_tokens, methods=post),
        Route("/v1/messages/count_tokens", count_tokens, methods=post),
        Route("/v1/embeddings", embeddings, methods=post), Route("/embeddings", embeddings, methods=post),
        Route("/v1/rerank", rerank, methods=post), Route("/rerank", rerank, methods=post),
        Route("/v1/reranking", rerank, methods=post), Route("/reranking", rerank, methods=post),
        Route("/tokenize", bind(info.tokenize), methods=post),
        Route("/detokenize", bind(info.detokenize), methods=post),
        Route("/apply-template", bind(info.apply_template), methods=post),
        Route("/slots", bind(admin.slots_get)), Route("/slots/{id_slot}", bind(admin.slots_post), methods=post),
        Route("/lora-adapters", bind(admin.lora_adapters_get)),
        Route("/lora-adapters", bind(admin.lora_adapters_post), methods=post),
        Route("/metrics", bind(info.metrics, asleep)), Route("/", bind(info.index)), *agent_routes(state.toolbox),
        *stream_routes(state.streams), *ollama,
    ]
    if cfg.webui:
        routes.append(Mount("/static", StaticFiles(directory=STATIC), name="static"))
    if cfg.gcp_predict_route:
        routes.append(Route(cfg.gcp_predict_route, predict_route(routes), methods=post))
    if cfg.gcp_health_route:
        routes.append(Route(cfg.gcp_health_route, health))
    return routes

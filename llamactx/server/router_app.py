"""The router's HTTP app (llama-server's router mode, tools/server/server-models.cpp `server_models_routes` and
server.cpp's router branch): its own routes (/health, /props, /models, /v1/models, /models/load, /models/unload,
Ollama's /api/tags and /api/ps, the chat page) and every other route forwarded to the app of the model the request
names (server/model_router.py), which is loaded first when needed.

    app = create_router_app(config, specs, models_max=2)   # `llamactx serve --models-dir DIR` runs it

API keys, CORS and the body bound are checked here, once, before a model is chosen or loaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from llamactx.api import ollama as O
from llamactx.api import protocol as P
from llamactx.server.app import STATIC, create_app
from llamactx.server.config import ServerConfig
from llamactx.server.http import return_large_buffers
from llamactx.server.middleware import CanonicalHeaders, Cors, Guard
from llamactx.server.model_router import LOADED, ModelRouter, ModelSpec, RouterError, SharedModels, body_model
from llamactx.version import __version__

# the scope keys Starlette's routing adds: the model's own app sets its own
_ROUTING_KEYS = ("app", "router", "endpoint", "path_params", "route_root_path", "state")


def create_router_app(config: ServerConfig, specs: list[ModelSpec], models_max: int = 4,
                      autoload: bool = True, reload: Callable[[], list[ModelSpec]] | None = None) -> Starlette:
    """The router over `specs` (each with the config of its model's app), at most `models_max` resident (0: no
    limit); `autoload` False: a request for a model that is not loaded is refused (--no-models-autoload);
    `reload` reads the models again (GET /models?reload=1: the directory and the preset file)."""
    return_large_buffers()
    shared = SharedModels()

    def build_app(spec: ModelSpec):
        # the router answers CORS and checks keys; the model's app would only repeat them
        cfg = replace(spec.config, alias=",".join([spec.name, *spec.aliases]), api_keys=[], cors_origins=[],
                      url="", model_source=shared.get)
        return create_app(cfg, load_in_background=False)

    fake_timing = bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"))  # llama-server's test suite sets it
    router = ModelRouter(specs, models_max, autoload, build_app, debug_delay_s=2.0 if fake_timing else 0.0)

    @asynccontextmanager
    async def lifespan(app):
        await router.start()
        yield
        await router.close()

    middleware = [Middleware(CanonicalHeaders), Middleware(Guard, config=config)]
    if config.cors_origins:
        middleware.insert(1, Middleware(Cors, origins=config.cors_origins))
    handlers = {HTTPException: _http_error, P.ProtocolError: _protocol_error}
    app = Starlette(routes=_routes(config, router, reload), middleware=middleware, lifespan=lifespan,
                    exception_handlers=handlers)
    app.state.router = router
    return app


async def _http_error(request: Request, exc: HTTPException) -> Response:
    message = "File Not Found" if exc.status_code == 404 else str(exc.detail)
    return _error(request, P.ProtocolError(message, exc.status_code, "not_found_error"))


async def _protocol_error(request: Request, exc: P.ProtocolError) -> Response:
    return _error(request, exc)


def _error(request_or_path, err: P.ProtocolError) -> Response:
    """llama-server's error body; Ollama's {"error": "..."} on Ollama's routes."""
    path = request_or_path if isinstance(request_or_path, str) else request_or_path.url.path
    body = {"error": str(err)} if path.startswith("/api/") else err.body()
    return JSONResponse(body, err.status, headers=err.headers)


def _routes(config: ServerConfig, router: ModelRouter, reload: Callable | None) -> list:
    t_start = time.time()

    async def health(request):
        return JSONResponse({"status": "ok"})

    def model_info(entry) -> dict[str, Any]:
        info = {"id": entry.spec.name, "aliases": entry.spec.aliases, "tags": config.tags, "object": "model",
                "owned_by": "llamactx", "created": int(t_start), "status": entry.status_json(),
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "source": entry.spec.source, "can_remove": False, "path": str(entry.spec.path)}
        state = entry.state
        if entry.status == LOADED and state is not None and state.model is not None:
            hp = state.model.hparams
            info["meta"] = {"n_vocab": hp.n_vocab, "n_ctx_train": hp.n_ctx_train, "n_embd": hp.n_embd,
                            "n_params": state.model.n_params, "size": state.model.size}
        return info

    async def models(request):
        if request.query_params.get("reload") and reload is not None:
            await router.update(await asyncio.to_thread(reload))
        return JSONResponse({"object": "list", "data": [model_info(e) for e in router.entries.values()]})

    async def models_load(request):
        body = P.parse_json(await request.body())
        entry = router.entries.get(body.get("model"))
        if entry is None:
            raise RouterError("model is not found", 404, "not_found_error")
        await router.load(entry)
        return JSONResponse({"success": True})

    async def models_unload(request):
        body = P.parse_json(await request.body())
        entry = router.entries.get(body.get("model"))
        if entry is None:
            raise RouterError("model is not found")
        await router.unload(entry)
        return JSONResponse({"success": True})

    forward = Forward(router)

    async def props(request):
        if request.query_params.get("model"):
            return await forward.response(request)
        return JSONResponse({"role": "router", "max_instances": router.models_max,
                             "models_autoload": router.autoload, "model_alias": "llamactx", "model_path": "none",
                             "default_generation_settings": {"params": {}, "n_ctx": 0},
                             "build_info": f"b{__version__}-llamactx", "webui": config.webui,
                             "cors_proxy_enabled": config.agent.ui_mcp_proxy})

    async def ollama_tags(request):
        out = []
        for entry in router.entries.values():
            stat = entry.spec.path.stat() if entry.spec.path.exists() else None
            for name in O.names_of([entry.spec.name, *entry.spec.aliases]):
                out.append({"name": name, "model": name, "size": stat.st_size if stat else 0,
                            "modified_at": _iso(stat.st_mtime if stat else 0), "digest": "",
                            "details": {"format": "gguf", "parent_model": "", "family": "", "families": [],
                                        "parameter_size": "", "quantization_level": ""}})
        return JSONResponse({"models": out})

    async def ollama_ps(request):
        out = []
        for entry in router.entries.values():
            if entry.status == LOADED and entry.app is not None:
                status, body = await _asgi_get(entry.app, "/api/ps")
                if status == 200:
                    out += json.loads(body).get("models", [])
        return JSONResponse({"models": out})

    async def ollama_version(request):
        return JSONResponse({"version": __version__})

    async def index(request):
        if not config.webui:
            raise HTTPException(404)
        return FileResponse(STATIC / "index.html")

    routes = [Route("/health", health), Route("/v1/health", health), Route("/models", models),
              Route("/v1/models", models), Route("/models/load", models_load, methods=["POST"]),
              Route("/models/unload", models_unload, methods=["POST"]), Route("/props", props),
              Route("/api/tags", ollama_tags), Route("/api/ps", ollama_ps), Route("/api/version", ollama_version),
              Route("/", index)]
    if config.webui:
        routes.append(Mount("/static", StaticFiles(directory=STATIC), name="static"))
    return [*routes, Route("/{path:path}", forward)]


class Forward:
    """The ASGI endpoint of every other route: read the request, find its model, wait for it to be loaded, and
    hand the request to that model's app (its response, streamed or not, goes straight to the client)."""

    def __init__(self, router: ModelRouter):
        self.router = router

    async def __call__(self, scope, receive, send):
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body, more = body + msg.get("body", b""), msg.get("more_body", False)
        request = Request(scope)
        next_msg = asyncio.ensure_future(receive())  # the client leaving while its model is awaited
        try:
            entry = self._entry(request, body)
            if not self.router.autoload and entry.status != LOADED:
                raise RouterError("model is not loaded")
            if not await self._acquire(entry, next_msg):
                return  # gone while queued: it takes no model's place (llama-server's should_stop)
        except P.ProtocolError as e:
            next_msg.cancel()
            return await _error(scope["path"], e)(scope, receive, send)
        messages = [{"type": "http.request", "body": body, "more_body": False}, next_msg]

        async def replay():
            if messages:
                msg = messages.pop(0)
                return msg if isinstance(msg, dict) else await msg
            return await receive()

        child_scope = {k: v for k, v in scope.items() if k not in _ROUTING_KEYS}
        try:
            await asyncio.sleep(self.router.debug_delay_s)
            await entry.app(child_scope, replay, send)
        finally:
            await self.router.release(entry)

    async def _acquire(self, entry, next_msg: asyncio.Future) -> bool:
        """Wait for `entry` to be loaded and count the request on it; False when the client leaves first."""
        acquiring = asyncio.ensure_future(self.router.acquire(entry))
        await asyncio.wait({acquiring, next_msg}, return_when=asyncio.FIRST_COMPLETED)
        if acquiring.done():
            acquiring.result()  # a RouterError goes to the caller
            return True
        acquiring.cancel()
        try:
            await acquiring
        except asyncio.CancelledError:
            return False
        await self.router.release(entry)  # it got the model as it was cancelled
        return False

    def _entry(self, request: Request, body: bytes):
        name = body_model(request.method, dict(request.query_params), body)
        if request.url.path.startswith("/api/") and isinstance(name, str) and name:
            name = O.model_name(name, self.router.names())  # Ollama's "name:tag" ("name:latest" is "name")
        return self.router.entry(name)

    async def response(self, request: Request) -> Response:
        """A GET route the router also answers itself (/props?model=...): the model's own answer."""
        entry = self.router.entry(request.query_params.get("model"))
        await self.router.acquire(entry)
        try:
            scope = {k: v for k, v in request.scope.items() if k not in _ROUTING_KEYS}
            status, body = await _asgi_get(entry.app, request.url.path, scope)
        finally:
            await self.router.release(entry)
        return Response(body, status, media_type="application/json")


async def _asgi_get(app, path: str, scope: dict | None = None) -> tuple[int, bytes]:
    """GET `path` from an ASGI app in this process: (status, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": [],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), **(scope or {})}
    out = {"status": 500, "body": b""}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg):
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        elif msg["type"] == "http.response.body":
            out["body"] += msg.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["body"]


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")

"""The HTTP layer: routes, authentication, CORS, body limits and errors in llama-server's format (tools/server:
server.cpp routes, server-http.cpp middlewares, server-common.cpp `format_error_response`).

    app = create_app(ServerConfig(model="smollm2", n_slots=4))   # a Starlette app; `llamactx serve` runs it

The model loads in the background at start-up: /health answers 503 "Loading model" until it is ready. Handlers
never touch the Context: generation and anything else that needs it go through the engine thread (`worker.py`).
Bad input is a 4xx with {"error": {"code", "message", "type"}}, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
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
from llamactx.api.responses import ChatRenderer, NativeRenderer, Renderer
from llamactx.errors import LlamactxError
from llamactx.server.completions import DISCONNECT_POLL_S, serve
from llamactx.server.middleware import CanonicalHeaders, Cors, Guard
from llamactx.server.worker import Job

log = logging.getLogger("llamactx.server")
STATIC = Path(__file__).parent / "static"


@dataclass
class ServerConfig:
    """What `llamactx serve` was asked for (llama-server's flag names in comments)."""

    model: str | None = None  # -m: GGUF path or embedded name
    alias: str | None = None  # -a
    tags: list[str] = field(default_factory=list)  # --tags: shown by /v1/models
    chat_template: str | None = None  # --chat-template NAME|JINJA, --chat-template-file: instead of the model's
    pooling: str = "mean"  # --pooling: the embeddings' pooling
    n_ctx: int = 4096  # -c: the whole KV pool, shared by the slots
    n_slots: int = 4  # -np
    kv_unified: bool = True  # -kvu: a slot may use the whole -c; off: each slot gets -c / -np (llama-server's -np N)
    n_batch: int = 2048  # -b
    n_ubatch: int = 512  # -ub
    n_threads: int = 2  # -t
    n_threads_batch: int = 0  # -tb (0: = -t)
    type_k: str = "f16"  # -ctk
    type_v: str = "f16"  # -ctv
    flash_attn: str = "auto"  # -fa on|off|auto
    sampling: dict[str, Any] = field(default_factory=dict)  # --temp, --seed, -n ...: request fields' defaults
    api_keys: list[str] = field(default_factory=list)  # --api-key / --api-key-file
    # --cors-origins: the browser origins answered with CORS headers: "localhost" (any port of localhost,
    # 127.0.0.1, [::1]; the default), "*" (any, llama-server's default), or exact origins
    cors_origins: list[str] = field(default_factory=lambda: ["localhost"])
    metrics: bool = False  # --metrics
    slots: bool = True  # --slots / --no-slots
    webui: bool = True  # --no-webui
    context_shift: bool = False  # --context-shift
    swa_full: bool = False  # --swa-full
    slot_save_path: str | None = None  # --slot-save-path
    timeout: float = 600.0  # --timeout: a request's deadline in seconds
    max_queue: int = 64  # --max-queue: requests waiting beyond the slots
    max_body_bytes: int = 8 << 20
    read_timeout: float = 30.0  # --read-timeout: a request's headers and body must arrive within it (server/http.py)
    max_connections: int = 256  # --max-connections: open connections past it are answered 503
    embd_max_inputs: int = 8192  # --embd-max-inputs: inputs per embeddings request
    # Vertex AI's prediction protocol (llama-server's GCP compat, on when AIP_MODE=PREDICTION): the route of
    # POST {"instances": [...]} and an extra health route
    gcp_predict_route: str | None = None
    gcp_health_route: str | None = None
    lora: list[tuple[str, float]] = field(default_factory=list)  # --lora / --lora-scaled: (path, scale)
    url: str = ""  # where it listens, for the start-up message


class ServerState:
    """The model, engine and worker once loaded; what every handler reads."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.model = self.engine = self.worker = self.template = None
        self.embedder = None
        self.loras: list = []  # the LoraAdapters of --lora / --lora-scaled; their index is the API's id
        self.lora_scales: list[float] = []  # the scales every request gets (POST /lora-adapters)
        # -a may list several names (comma-separated): the API's id is the first in sorted order (llama-server's
        # std::set), and /v1/models lists them all
        self.aliases = sorted({a.strip() for a in (config.alias or "").split(",") if a.strip()})
        self.alias = self.aliases[0] if self.aliases else "llamactx"
        self.t_start = time.time()

    def load(self) -> None:
        from llamactx.chat_template import ChatTemplate
        from llamactx.embedded import resolve_model_path
        from llamactx.embedding import Embedder
        from llamactx.engine import Engine
        from llamactx.lora import load_adapters
        from llamactx.model import Model
        from llamactx.server.worker import EngineWorker

        c = self.config
        try:
            path = resolve_model_path(c.model)
            self.model = Model.load(path)
            self.alias = self.aliases[0] if self.aliases else Path(path).name
            lora = load_adapters(self.model, c.lora)
            self.loras, self.lora_scales = [a for a, _ in lora], [s for _, s in lora]
            self.engine = Engine(self.model, n_slots=c.n_slots, n_ctx=c.n_ctx, n_batch=c.n_batch, lora=lora,
                                 n_ubatch=c.n_ubatch, n_threads=c.n_threads,
                                 n_threads_batch=c.n_threads_batch or c.n_threads, type_k=c.type_k, type_v=c.type_v,
                                 swa_full=c.swa_full, flash_attn=c.flash_attn, kv_unified=c.kv_unified)
            self.template = ChatTemplate.from_model(self.model, name=self.alias, source=c.chat_template)
            if self.template.is_fallback and not c.chat_template:
                log.info(self.template.message)
            # an embedding input is at most one ubatch (llama-server's limit), so one slice of embedding work
            # between two generation steps is at most one ubatch's decode
            self.embedder = Embedder(self.model, n_ctx=min(c.n_ctx, c.n_ubatch), lora=lora,
                                     pooling="mean" if c.pooling == "none" else c.pooling,
                                     n_threads=c.n_threads, n_threads_batch=c.n_threads_batch or c.n_threads,
                                     flash_attn=c.flash_attn)
            self.engine.warmup()
            self.embedder.embed([[0]])  # its context and kernels too, so a first embeddings request stalls nobody
            self.worker = EngineWorker(self.engine, c.n_slots + c.max_queue, c.timeout)
            self.worker.start()
            self.ready.set()
            log.info("ready: %s on %d slots sharing %d KV cells%s", self.alias, c.n_slots, c.n_ctx,
                     f"; chat page and API at {c.url}" if c.url else "")
        except Exception as e:  # reported by /health and every endpoint; the process stays up
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("could not load the model: %s", self.load_error)

    def check_ready(self) -> None:
        if self.load_error:
            raise P.ProtocolError(f"the model could not be loaded: {self.load_error}", 503, "unavailable_error")
        if not self.ready.is_set():
            raise P.ProtocolError("Loading model", 503, "unavailable_error", headers={"Retry-After": "1"})

    def n_ctx_slot(self) -> int:
        return self.engine.n_ctx_slot

    def lora_scales_from(self, entries, field: str) -> list[float]:
        """llama-server's parse_lora_request + construct_lora_list: [{"id", "scale"}, ...] -> a scale for every
        adapter, 0 for those not listed. ProtocolError (400) for an unknown id or a scale that is not a number."""
        if not isinstance(entries, list):
            raise P.ProtocolError(f"{field} must be an array of objects with 'id' and 'scale' fields")
        scales = [0.0] * len(self.loras)
        for i, entry in enumerate(entries):
            lora_id = entry.get("id") if isinstance(entry, dict) else None
            scale = entry.get("scale", 0.0) if isinstance(entry, dict) else None
            if not isinstance(lora_id, int) or isinstance(lora_id, bool) or not 0 <= lora_id < len(self.loras):
                raise P.ProtocolError(f"{field}[{i}].id = {lora_id!r} is not an adapter id in [0, "
                                      f"{len(self.loras)})")
            if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
                raise P.ProtocolError(f"{field}[{i}].scale = {scale!r} is not a finite number")
            scales[lora_id] = float(scale)
        return scales

    def set_lora_scales(self, engine, scales: list[float]) -> None:
        """On the engine thread: every following step (and embedding) uses these scales."""
        pairs = list(zip(self.loras, scales, strict=True))
        engine.set_adapters_lora(pairs)
        self.embedder.lora = tuple((a, s) for a, s in pairs if s != 0.0)
        self.lora_scales = scales

    def check_request_lora(self, body: dict) -> None:
        """A request's own "lora" field: accepted when it asks for the scales in effect; per-request scales
        are not supported (one context serves every slot), so a different set is a 400."""
        if "lora" in body and self.lora_scales_from(body["lora"], "lora") != self.lora_scales:
            raise P.ProtocolError("lora: per-request adapter scales are not supported by this server; set them "
                                  "for every request with POST /lora-adapters")


def create_app(config: ServerConfig, load_in_background: bool = True) -> Starlette:
    from llamactx.server.http import return_large_buffers

    return_large_buffers()
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(app):
        loader = threading.Thread(target=state.load, name="llamactx-load", daemon=True)
        loader.start()
        if not load_in_background:
            await asyncio.to_thread(loader.join)
        yield
        if state.worker is not None:
            await asyncio.to_thread(state.worker.stop)

    routes = _routes(state)
    middleware = [Middleware(CanonicalHeaders), Middleware(Guard, config=config)]
    if config.cors_origins:
        middleware.insert(1, Middleware(Cors, origins=config.cors_origins))
    handlers = {HTTPException: _http_error, LlamactxError: _user_error, ClientDisconnect: _client_gone,
                Exception: _server_error}
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=handlers)
    app.state.llamactx = state
    return app


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

    async def models(request):
        state.check_ready()
        meta = {"n_vocab": state.model.hparams.n_vocab, "n_ctx_train": state.model.hparams.n_ctx_train,
                "n_embd": state.model.hparams.n_embd, "n_params": state.model.n_params, "size": state.model.size}
        data = [{"id": state.alias, "aliases": state.aliases or [state.alias], "tags": cfg.tags,
                 "object": "model", "created": int(state.t_start), "owned_by": "llamactx",
                 "meta": meta}]
        return JSONResponse({"object": "list", "data": data})

    async def props(request):
        state.check_ready()
        return JSONResponse({
            "default_generation_settings": {"n_ctx": state.n_ctx_slot(), "params": _default_params(cfg)},
            "total_slots": cfg.n_slots, "model_path": str(state.model.path), "model_alias": state.alias,
            "chat_template": state.template.source, "modalities": {"vision": False, "audio": False},
            "build_info": "llamactx", "webui": cfg.webui,
        })

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
        n_predict = next((v for v in (rest.get("n_predict"), rest.get("max_tokens"), cfg.sampling.get("n_predict"))
                          if isinstance(v, int) and not isinstance(v, bool)), -1)

        def tokens() -> list[int]:
            vocab = state.model.vocab
            prompt_tokens = vocab.tokenize(prompt, add_special=False, parse_special=True)
            return infill.format_infill(vocab, prefix, suffix, extra, cfg.n_batch, n_predict, state.n_ctx_slot(),
                                        prompt_tokens)

        return await _completion(request, NativeRenderer, {**rest, "prompt": await asyncio.to_thread(tokens)})

    async def _completion(request, renderer_cls, body: dict | None = None):
        state.check_ready()
        body = await _json(request) if body is None else body
        state.check_request_lora(body)
        req = P.validate(P.CompletionRequest, {**cfg.sampling, **body})
        if req.n > 1 and renderer_cls is NativeRenderer:
            raise P.ProtocolError(f"n: /completion returns one completion (got n = {req.n}); "
                                  "/v1/completions returns n choices")
        if req.suffix:
            raise P.ProtocolError("suffix: fill-in-the-middle is POST /infill (input_prefix, input_suffix) here", 400)
        if req.post_sampling_probs and renderer_cls is not NativeRenderer:
            raise P.ProtocolError("post_sampling_probs: only /completion reports probabilities after the sampler "
                                  "chain; here logprobs are the model's own")
        prompts, text = await asyncio.to_thread(_prompts, state, req.prompt, req.n_keep)
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
        prompt_text, _ = await asyncio.to_thread(_render_chat, state, req)
        tokens = await asyncio.to_thread(_prompt_tokens, state, prompt_text, True)
        return JSONResponse({"input_tokens": len(tokens)})

    async def _chat(request, body: dict, renderer_cls):
        state.check_request_lora(body)
        req = P.validate(P.ChatCompletionRequest, {**cfg.sampling, **body})
        prompt_text, fns = await asyncio.to_thread(_render_chat, state, req)
        tokens = await asyncio.to_thread(_prompt_tokens, state, prompt_text, True)
        tokens = _fit_prompt(state, tokens, req.n_keep)
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
        renderer = renderer_cls(state.alias, state.model.vocab, prompt_text, gen, tools=bool(fns), **extra)
        return await serve(state, request, [tokens], gen, renderer)

    async def embeddings(request):
        state.check_ready()
        if cfg.pooling == "none":
            raise P.ProtocolError("Pooling type 'none' is not OAI compatible: token-level embeddings are not served "
                                  "here; start the server with --pooling mean, last or cls")
        req = P.validate(P.EmbeddingRequest, await _json(request))
        inputs = req.input if isinstance(req.input, list) else [req.input]
        if inputs and isinstance(inputs[0], int):
            inputs = [inputs]
        inputs = [_content_text(x, f"input[{i}]") if isinstance(x, dict) else x for i, x in enumerate(inputs)]
        if len(inputs) > cfg.embd_max_inputs:
            raise P.ProtocolError(f"input holds {len(inputs)} inputs, more than --embd-max-inputs = "
                                  f"{cfg.embd_max_inputs}")
        token_lists = await asyncio.to_thread(_embedding_tokens, state, inputs)
        state.embedder.check(token_lists)
        job = state.worker.run(Job(lambda _engine: state.embedder.steps(token_lists)))
        vecs = await _wait_job(request, job)
        if vecs is None:
            return Response(status_code=499)
        n_tokens = sum(len(t) for t in token_lists)
        return JSONResponse({"object": "list", "model": state.alias,
                             "data": [P.embedding_item(i, v, req.encoding_format) for i, v in enumerate(vecs)],
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    async def rerank(request):
        state.check_ready()
        P.validate(P.RerankRequest, await _json(request))  # a malformed request is named first, as llama-server
        raise P.ProtocolError(f"rerank: {state.alias} has no rank (classifier) head; reranking needs a reranker "
                              "model (a cls / cls_out output layer)", 400)

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
        from llamactx.server.slots import slots_info

        return JSONResponse(await asyncio.wrap_future(state.worker.call(slots_info)))

    async def slots_post(request):
        state.check_ready()
        from llamactx.server import slots

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
        from llamactx.server.metrics import CONTENT_TYPE, render

        return Response(render(state), media_type=CONTENT_TYPE,
                        headers={"Process-Start-Time-Unix": str(int(state.t_start))})

    async def cors_proxy(request):
        raise P.ProtocolError("the web UI's CORS proxy is not available on this server", 403, "permission_error")

    async def index(request):
        if not cfg.webui:
            raise HTTPException(404)
        return FileResponse(STATIC / "index.html")

    async def predict(request):
        """Vertex AI's {"instances": [...]}: each instance is a request to the route its @requestFormat names
        (a path, or its camelCase alias: "chatCompletions"), run through this app, never streamed."""
        body = await _json(request)
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise P.ProtocolError("request body must include an array field named instances")
        if len(instances) > GCP_MAX_INSTANCES:
            raise P.ProtocolError(f"instances array exceeds maximum size of {GCP_MAX_INSTANCES}")
        auth = [(k.encode(), v.encode()) for k, v in request.headers.items() if k in ("authorization", "x-api-key")]
        targets = {_gcp_format(r.path): r.path for r in routes if isinstance(r, Route) and "POST" in (r.methods or ())}

        async def one(instance) -> Any:
            if not isinstance(instance, dict) or not isinstance(instance.get("@requestFormat"), str):
                return P.ProtocolError("each instance must include a string @requestFormat").body()
            payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
            payload["stream"] = False
            fmt = instance["@requestFormat"]
            path = targets.get(fmt) or (fmt if fmt in targets.values() else None)
            if path is None:
                return P.ProtocolError(f"no handler registered for @requestFormat: {fmt}").body()
            raw = await _asgi_post(request.app, path, json.dumps(payload).encode(), auth)
            try:
                return json.loads(raw)
            except ValueError:
                return raw.decode("utf-8", "replace")

        predictions = await asyncio.gather(*(one(i) for i in instances))
        return JSONResponse({"predictions": predictions})

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
        Route("/metrics", metrics), Route("/", index), Route("/cors-proxy", cors_proxy, methods=["GET", "POST"]),
    ]
    if cfg.webui:
        routes.append(Mount("/static", StaticFiles(directory=STATIC), name="static"))
    if cfg.gcp_predict_route:
        routes.append(Route(cfg.gcp_predict_route, predict, methods=["POST"]))
    if cfg.gcp_health_route:
        routes.append(Route(cfg.gcp_health_route, health))
    return routes


GCP_MAX_INSTANCES = 128


async def _asgi_post(app, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """POST `body` (JSON) to `path` of this ASGI app in-process, through its middlewares; the response body."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": None,
             "server": None, "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(body)).encode()), *headers]}
    sent, chunks = False, []

    async def receive():
        nonlocal sent
        if sent:  # the body was read; the caller waits for the answer, never leaves
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return b"".join(chunks)


def _gcp_format(path: str) -> str:
    """llama-server's path_to_gcp_format: "/v1/chat/completions" -> "chatCompletions"."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    out, cap = [], False
    for ch in s.lstrip("/"):
        if ch in "/-_":
            cap = True
        elif ch in ":{":
            break
        else:
            out.append(ch.upper() if cap else ch)
            cap = False
    return "".join(out)


def _prompts(state: ServerState, prompt, n_keep: int) -> tuple[list[list[int]], str]:
    """A completion prompt as token lists (one per prompt) and the text of the first (for echo)."""
    vocab = state.model.vocab
    if isinstance(prompt, (str, dict)):
        items: list = [prompt]
    elif any(isinstance(p, int) for p in prompt):  # token ids, maybe mixed with texts: one prompt
        if not all(isinstance(p, (int, str)) for p in prompt):
            raise P.ProtocolError("prompt: a list of token ids may hold texts, not nested lists or objects")
        if all(isinstance(p, int) for p in prompt):
            items = [prompt]
        else:
            items = [[t for j, p in enumerate(prompt) for t in (
                [p] if isinstance(p, int) else _prompt_tokens(state, p, True, add_special=j == 0))]]
    else:
        items = list(prompt)
    out = []
    for i, p in enumerate(items):
        if isinstance(p, dict):  # llama-server's multimodal prompt object: its text, and no media
            if p.get("multimodal_data"):
                raise P.ProtocolError(f"prompt[{i}].multimodal_data: this server has no multimodal projector")
            p = p.get("prompt_string")
            if not isinstance(p, str):
                raise P.ProtocolError(f"prompt[{i}].prompt_string must be a string")
            items[i] = p
        if isinstance(p, str):
            tokens = _prompt_tokens(state, p, True)
        else:
            tokens = P.check_tokens(p, vocab.n_tokens, f"prompt[{i}]" if len(items) > 1 else "prompt")
        if not tokens:
            raise P.ProtocolError(f"prompt[{i}] is empty")
        out.append(_fit_prompt(state, tokens, n_keep))
    if len(out) > P.MAX_N:
        raise P.ProtocolError(f"prompt: at most {P.MAX_N} prompts per request")
    first = items[0]
    return out, first if isinstance(first, str) else vocab.detokenize(out[0])


def _default_params(cfg: ServerConfig) -> dict:
    """A request's sampling fields when it gives none: the defaults, then the server's sampling flags (/props'
    default_generation_settings.params)."""
    req = P.validate(P.CompletionRequest, {"prompt": "x", **cfg.sampling})
    params = req.model_dump(exclude={"prompt", "model", "echo", "suffix", "logprobs", "stream_options",
                                     "response_format", "n"})
    params["seed"] = 0xFFFFFFFF if req.seed is None or req.seed == -1 else req.seed  # LLAMA_DEFAULT_SEED: random
    return params


def _content_text(obj: dict, field: str) -> str:
    """The text of llama-server's {"content": [{"type": "text", "text": ...}, ...]} input (no media here)."""
    blocks = obj.get("content")
    if not isinstance(blocks, list) or not blocks:
        raise P.ProtocolError(f"{field}.content must be a non-empty list of content parts")
    parts = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind != "text" or not isinstance(b.get("text"), str):
            what = "media input is not supported (no multimodal projector)" if kind in (
                "image_url", "input_audio", "input_video") else f"type {kind!r} is not 'text'"
            raise P.ProtocolError(f"{field}.content[{j}]: {what}")
        parts.append(b["text"])
    return "".join(parts)


def _embedding_tokens(state: ServerState, inputs: list) -> list[list[int]]:
    vocab = state.model.vocab
    return [P.check_tokens(x, vocab.n_tokens, f"input[{i}]") if isinstance(x, list)
            else _embedding_input(state, x, i) for i, x in enumerate(inputs)]


def _embedding_input(state: ServerState, text: str, i: int) -> list[int]:
    n_min, n_ctx = state.model.vocab.min_tokens(text), state.embedder.n_ctx
    if n_min > n_ctx:  # refused from its length, before tokenizing (see Vocab.min_tokens)
        raise P.ProtocolError(f"input[{i}] has at least {n_min} tokens, more than the embedding context's "
                              f"n_ctx = {n_ctx}")
    return state.model.vocab.tokenize(text, add_special=True, parse_special=False)


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


def _render_chat(state: ServerState, req: P.ChatCompletionRequest) -> tuple[str, list[dict]]:
    """The chat prompt, with the tools in it (unless tool_choice is "none"), and the tools' functions.

    A final assistant message is continued, not closed (llama-server's prefill_assistant, or vLLM's explicit
    continue_final_message): the prompt is the conversation before it with the generation prompt, then its
    text. Two assistant messages at the end, or continue_final_message with add_generation_prompt, are a 400."""
    if req.continue_final_message and req.add_generation_prompt:
        raise P.ProtocolError("continue_final_message and add_generation_prompt cannot both be true")
    fns = tool_calls.functions(req.tools) if req.tool_choice != "none" else []
    messages, pass_tools = tool_calls.prepare(state.template.source, req.messages, fns)
    tools = req.tools if pass_tools else None
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant" and isinstance(last.get("content"), str) and not last.get("tool_calls"):
        if len(messages) > 1 and messages[-2].get("role") == "assistant":
            raise P.ProtocolError("messages: two assistant messages at the end; the last one is continued, so the "
                                  "one before it must be another role's")
        if len(messages) > 1:
            head = state.template.render(messages[:-1], True, tools, req.chat_template_kwargs)
            return head + last["content"], fns
    add = True if req.add_generation_prompt is None else req.add_generation_prompt
    return state.template.render(messages, add, tools, req.chat_template_kwargs), fns


def _prompt_tokens(state: ServerState, text: str, parse_special: bool, add_special: bool = True) -> list[int]:
    """A prompt's tokens. Without --context-shift a text too long for a slot is refused from its length alone,
    before it is tokenized (a client's huge input costs no tokenizer time or cache memory: Vocab.min_tokens)."""
    vocab = state.model.vocab
    n_min, n_ctx = vocab.min_tokens(text), state.n_ctx_slot()
    if n_min >= n_ctx and not state.config.context_shift:
        raise _exceeds_context(n_min, n_ctx, at_least=True)
    return vocab.tokenize(text, add_special=add_special, parse_special=parse_special)


def _exceeds_context(n_tokens: int, n_ctx: int, at_least: bool = False) -> P.ProtocolError:
    return P.ProtocolError(f"the request exceeds the available context size ({'at least ' * at_least}{n_tokens} "
                           f"prompt tokens, n_ctx = {n_ctx}); try increasing it", 400, "exceed_context_size_error",
                           n_prompt_tokens=n_tokens, n_ctx=n_ctx)


def _fit_prompt(state: ServerState, tokens: list[int], n_keep: int) -> list[int]:
    """A prompt that fills a slot's context is refused (exceed_context_size_error), or with --context-shift
    truncated as llama-server does: the first n_keep tokens, then the last half of the context."""
    n_ctx = state.n_ctx_slot()
    if len(tokens) < n_ctx:
        return tokens
    if not state.config.context_shift:
        raise _exceeds_context(len(tokens), n_ctx)
    n_keep = max(0, min(n_keep, n_ctx // 2 - 1))
    return tokens[:n_keep] + tokens[len(tokens) - (n_ctx // 2 - n_keep):]


def _piece_json(piece: bytes):
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)

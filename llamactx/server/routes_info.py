"""What the server says about itself and its model: GET /health, /models (/v1/models), /props, /metrics, the chat
page (/), and the text utilities POST /tokenize, /detokenize, /apply-template (tools/server: server-context.cpp's
`get_health`, `get_models`, `get_props`, `get_metrics`, `post_tokenize`, `post_detokenize`, `post_apply_template`).

Each handler is `handler(state, request)` (app.py binds the state when it registers the routes). While the model
sleeps (--sleep-idle-seconds) /models, /props and /metrics answer from what `SleepCache` read on the way in
(llama-server's update_cached_responses): they never wake it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, JSONResponse, Response

from llamactx.api import protocol as P
from llamactx.server.config import ServerConfig, ServerState
from llamactx.server.metrics import CONTENT_TYPE as METRICS_TYPE
from llamactx.server.metrics import Snapshot

STATIC = Path(__file__).parent / "static"


class SleepCache:
    """The read-only routes' answers, taken when the model goes to sleep (it is gone until the next request wakes
    it); `get(name)` is None while it is awake."""

    def __init__(self, state: ServerState):
        self.state = state
        self.responses: dict[str, Any] = {}
        state.lifecycle.on_sleeping_state(self._on_sleeping)

    def _on_sleeping(self, is_sleeping: bool) -> None:
        if is_sleeping:
            self.responses.update(models=models_body(self.state), props=props_body(self.state, True),
                                  metrics=Snapshot.of(self.state.engine))

    def get(self, name: str):
        """The response cached on entering sleep, or None when awake."""
        return self.responses.get(name) if self.state.lifecycle.is_sleeping else None


def models_body(state: ServerState) -> dict:
    meta = {"n_vocab": state.model.hparams.n_vocab, "n_ctx_train": state.model.hparams.n_ctx_train,
            "n_embd": state.model.hparams.n_embd, "n_params": state.model.n_params, "size": state.model.size}
    data = [{"id": state.alias, "aliases": state.aliases or [state.alias], "tags": state.config.tags,
             "object": "model", "created": int(state.t_start), "owned_by": "llamactx",
             "meta": meta}]
    return {"object": "list", "data": data}


def props_body(state: ServerState, is_sleeping: bool) -> dict:
    cfg = state.config
    return {
        "default_generation_settings": {"n_ctx": state.n_ctx_slot(), "params": default_params(cfg)},
        "total_slots": cfg.runtime.n_slots, "model_path": str(state.model.path), "model_alias": state.alias,
        "chat_template": state.template.source, "modalities": {"vision": False, "audio": False},
        "build_info": "llamactx", "webui": cfg.webui, "is_sleeping": is_sleeping,
    }


def default_params(cfg: ServerConfig) -> dict:
    """A request's sampling fields when it gives none: the defaults, then the server's sampling flags (/props'
    default_generation_settings.params)."""
    req = P.validate(P.CompletionRequest, {"prompt": "x", **cfg.request_defaults})
    params = req.model_dump(exclude={"prompt", "model", "echo", "suffix", "logprobs", "stream_options",
                                     "response_format", "n"})
    params["seed"] = 0xFFFFFFFF if req.seed is None or req.seed == -1 else req.seed  # LLAMA_DEFAULT_SEED: random
    return params


async def health(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    return JSONResponse({"status": "ok"})


async def models(state: ServerState, asleep: SleepCache, request: HttpRequest) -> Response:
    state.check_ready()
    return JSONResponse(asleep.get("models") or models_body(state))


async def props(state: ServerState, asleep: SleepCache, request: HttpRequest) -> Response:
    state.check_ready()
    return JSONResponse(asleep.get("props") or props_body(state, False))


async def metrics(state: ServerState, asleep: SleepCache, request: HttpRequest) -> Response:
    state.check_ready()
    if not state.config.metrics:
        raise P.ProtocolError("This server does not support metrics endpoint. Start it with `--metrics`", 501,
                              "not_supported_error")
    snap = asleep.get("metrics") or Snapshot.of(state.engine)
    return Response(state.metrics.render(snap), media_type=METRICS_TYPE,
                    headers={"Process-Start-Time-Unix": str(int(state.t_start))})


async def index(state: ServerState, request: HttpRequest) -> Response:
    if not state.config.webui:
        raise HTTPException(404)
    return FileResponse(STATIC / "index.html")


async def tokenize(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    req = P.validate(P.TokenizeRequest, P.parse_json(await request.body()))
    vocab = state.model.vocab
    tokens = await asyncio.to_thread(vocab.tokenize, req.content, req.add_special, req.parse_special)
    if req.with_pieces:
        out = [{"id": t, "piece": _piece_json(vocab.token_to_piece(t))} for t in tokens]
        return JSONResponse({"tokens": out})
    return JSONResponse({"tokens": tokens})


async def detokenize(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    req = P.validate(P.DetokenizeRequest, P.parse_json(await request.body()))
    tokens = P.check_tokens(req.tokens, state.model.vocab.n_tokens, "tokens")
    return JSONResponse({"content": state.model.vocab.detokenize(tokens)})


async def apply_template(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    req = P.validate(P.ApplyTemplateRequest, P.parse_json(await request.body()))
    prompt = await asyncio.to_thread(state.template.render, req.messages, True, req.tools,
                                     req.chat_template_kwargs)
    return JSONResponse({"prompt": prompt})


def _piece_json(piece: bytes):
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)

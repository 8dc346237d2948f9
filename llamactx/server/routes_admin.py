"""The routes that read and set what the engine holds: GET /slots, POST /slots/{id_slot}?action=save|restore|erase
and GET / POST /lora-adapters (tools/server: server-context.cpp's `get_slots`, `post_slots`,
`get_lora_adapters`, `post_lora_adapters`).

Every change runs on the engine thread between two steps (EngineWorker.call); the slot actions themselves are
slots.py's. Each handler is `handler(state, request)`: app.py binds the state when it registers the routes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx.api import protocol as P
from llamactx.server import slots
from llamactx.server.config import ServerState


async def slots_get(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    if not state.config.slots:
        raise P.ProtocolError("This server does not support slots endpoint. Start it with `--slots`", 501,
                              "not_supported_error")
    return JSONResponse(await asyncio.wrap_future(state.worker.call(slots.slots_info)))


async def slots_post(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    cfg = state.config
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
        req = P.validate(P.SlotFileRequest, P.parse_json(await request.body()))
        path = slots.slot_path(Path(cfg.slot_save_path), req.filename)
        op = slots.save if action == "save" else slots.restore
        fn = lambda engine: op(engine, id_slot, path)  # noqa: E731
    else:
        raise P.ProtocolError(f"action: {action!r} is not one of save, restore, erase")
    return JSONResponse(await asyncio.wrap_future(state.worker.call(fn)))


async def lora_adapters_get(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    return JSONResponse([{"id": i, "path": str(a.path), "scale": s,
                          "task_name": a.meta.get("adapter.lora.task_name", ""),
                          "prompt_prefix": a.meta.get("adapter.lora.prompt_prefix", "")}
                         for i, (a, s) in enumerate(zip(state.loras, state.lora_scales, strict=True))])


async def lora_adapters_post(state: ServerState, request: HttpRequest) -> Response:
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

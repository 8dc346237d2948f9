"""Vertex AI's prediction protocol: llama-server's GCP compatibility (server.cpp, AIP_MODE=PREDICTION): POST
{"instances": [...]} runs each instance through this app's own routes, in-process, never streamed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.responses import JSONResponse
from starlette.routing import Route

from llamactx.api import protocol as P

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


def predict_route(routes: list):
    """The handler of Vertex AI's POST {"instances": [...]} over this app's `routes`: each instance is a request
    to the route its @requestFormat names (a path, or its camelCase alias: "chatCompletions"), never streamed."""

    async def predict(request):
        body = P.parse_json(await request.body())
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise P.ProtocolError("request body must include an array field named instances")
        if len(instances) > GCP_MAX_INSTANCES:
            raise P.ProtocolError(f"instances array exceeds maximum size of {GCP_MAX_INSTANCES}")
        auth = [(k.encode(), v.encode()) for k, v in request.headers.items() if k in ("authorization", "x-api-key")]
        posts = [r.path for r in routes if isinstance(r, Route) and "POST" in (r.methods or ())]
        targets = {_gcp_format(path): path for path in posts}

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

    return predict

"""The server's ASGI middlewares (llama-server's server-http.cpp: its API-key check, CORS and header writing):
API keys and the body bound, CORS with llama-server's answers, response header names in canonical case. Pure
ASGI, so streamed responses are never buffered."""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse

from llamactx.api import protocol as P

PUBLIC = ("/health", "/v1/health")  # and the web page: "/", "/static/..."


class Guard:
    """API keys (constant-time compare; /health and the web page stay open) and the body size bound (413 before
    anything is parsed). A pure ASGI middleware, so that streaming responses are not buffered."""

    def __init__(self, app, config):
        self.app, self.config = app, config  # ServerConfig: api_keys, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS":
            return await self.app(scope, receive, send)
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        cfg = self.config
        if cfg.api_keys and not _public(path) and not _key_ok(headers, cfg.api_keys):
            err = P.ProtocolError("Invalid API Key", 401, "authentication_error")
            return await JSONResponse(err.body(), err.status)(scope, receive, send)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > cfg.max_body_bytes):
            err = P.ProtocolError(f"request body of {length} bytes exceeds the limit of {cfg.max_body_bytes}", 413)
            return await JSONResponse(err.body(), err.status)(scope, receive, send)
        await self.app(scope, _bounded(receive, cfg.max_body_bytes), send)


class CanonicalHeaders:
    """Response header names in their canonical Title-Case, as llama-server (cpp-httplib) sends them: HTTP
    does not care, but clients that read headers into a plain dict do (Starlette writes them lowercase)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def titled(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(b"-".join(p.capitalize() for p in k.split(b"-")), v)
                                                  for k, v in message.get("headers", [])]}
            await send(message)

        await self.app(scope, receive, titled)


_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")


class Cors:
    """llama-server's CORS: a preflight (OPTIONS with Access-Control-Request-Method) is answered 200 with the
    methods and headers it allows, and an allowed origin is reflected with credentials, on preflights and
    responses alike; an origin not allowed gets no CORS header (the browser then blocks the page's request)."""

    def __init__(self, app, origins: list[str]):
        self.app, self.origins = app, origins

    def allowed(self, origin: str) -> bool:
        if "*" in self.origins or origin in self.origins:
            return True
        if "localhost" in self.origins:
            host = origin.split("://", 1)[-1]
            host = host.rsplit(":", 1)[0] if not host.endswith("]") and host.count(":") == 1 else host
            host = host.split("]:", 1)[0] + "]" if host.startswith("[") and "]:" in host else host
            return host in _LOCAL_HOSTS
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-allow-credentials", b"true"), (b"vary", b"Origin")] \
            if origin and self.allowed(origin) else []
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            allow = [(b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
                     (b"access-control-allow-headers", b"*"), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 200, "headers": cors + allow})
            return await send({"type": "http.response.body", "body": b""})

        async def send_with_cors(message):
            if message["type"] == "http.response.start" and cors:
                message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def _public(path: str) -> bool:
    return path in PUBLIC or path == "/" or path.startswith("/static/")


def _key_ok(headers: dict[str, str], keys: list[str]) -> bool:
    auth = headers.get("authorization", "")
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
    ok = False
    for key in keys:  # every key is compared, in constant time, whatever matches
        ok |= hmac.compare_digest(given.encode(), key.encode())
    return ok


class _BodyTooLarge(P.ProtocolError):
    def __init__(self) -> None:
        super().__init__("request body exceeds the size limit", 413)


def _bounded(receive, limit: int):
    """A receive() that stops a chunked body past `limit` bytes."""
    seen = 0

    async def wrapped():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge()
        return message

    return wrapped

"""The web UI's CORS proxy for remote MCP servers: GET/POST /cors-proxy?url=<http(s) URL> (llama.cpp's
tools/server/server-cors-proxy.h `proxy_request`, and `server_http_proxy` in server-models.cpp).

Off unless --ui-mcp-proxy: then 403, as llama-server. On, it forwards the request to `url` with only the
headers the caller names explicitly, "x-llama-server-proxy-header-<name>: <value>" -> "<name>: <value>" (never
the caller's own Authorization, Cookie or API key), follows redirects, and streams the answer back with its
status and headers (less hop-by-hop, CORS and cookie headers, which belong to this server). A URL that is not
http(s), has no host or carries a password is a 400; a target that cannot be reached a 502.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import ssl
from urllib.parse import urljoin, urlsplit

from starlette.requests import Request as HttpRequest
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from llamactx.api import protocol as P

PROXY_HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600  # llama-server's timeout_read / timeout_write for the proxy
MAX_REDIRECTS = 10
CHUNK = 64 * 1024
# hop-by-hop and this server's own: never copied from the target's answer
STRIPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection", "date",
                      "set-cookie", "content-type"})
NO_BODY = (204, 304)


def cors_proxy_routes(enabled: bool) -> list[Route]:
    return [Route("/cors-proxy", proxy if enabled else _disabled, methods=["GET", "POST"])]


async def _disabled(request):
    raise P.ProtocolError("this feature is disabled", 403, "feature_disabled")


def target_of(url: str | None) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of the `url` query parameter; ProtocolError (400) naming it when
    it is not an http(s) URL with a host and without a password."""
    if not url:
        raise P.ProtocolError("url: the query parameter is required (/cors-proxy?url=http://...)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise P.ProtocolError(f"url = {url!r}: unsupported URL scheme {parts.scheme!r} (http or https)")
    if not parts.hostname:
        raise P.ProtocolError(f"url = {url!r}: invalid target URL: missing host")
    if parts.password is not None:
        raise P.ProtocolError(f"url = {url!r}: authentication in target URL is not supported")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise P.ProtocolError(f"url = {url!r}: invalid port") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, path


def forwarded_headers(request: HttpRequest) -> dict[str, str]:
    """Only what the caller asked to forward, by the explicit prefix."""
    out = {}
    for key, value in request.headers.items():
        name = key.lower()
        if name.startswith(PROXY_HEADER_PREFIX) and len(name) > len(PROXY_HEADER_PREFIX):
            out[name[len(PROXY_HEADER_PREFIX):]] = value
    return out


def _open(method: str, url: str, headers: dict[str, str], body: bytes | None):
    """Send the request (following redirects); the connection and its response. Runs in a thread."""
    for _ in range(MAX_REDIRECTS + 1):
        scheme, host, port, path = target_of(url)
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        kw = {"context": ssl.create_default_context()} if scheme == "https" else {}
        conn = cls(host, port, timeout=TIMEOUT_S, **kw)
        conn.request(method, path, body=body if method == "POST" else None, headers=headers)
        resp = conn.getresponse()
        location = resp.getheader("location")
        if resp.status not in (301, 302, 303, 307, 308) or not location:
            return conn, resp
        conn.close()
        url = urljoin(url, location)
        if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
            method, body = "GET", None
    raise P.ProtocolError(f"url: more than {MAX_REDIRECTS} redirects", 502, "server_error")


async def proxy(request: HttpRequest) -> Response:
    url = request.query_params.get("url")
    target_of(url)  # a bad URL is the caller's: 400 before anything is sent
    body = await request.body() if request.method == "POST" else None
    try:
        conn, resp = await asyncio.to_thread(_open, request.method, url, forwarded_headers(request), body)
    except (OSError, http.client.HTTPException) as e:
        raise P.ProtocolError(f"proxy error: {e}", 502, "server_error") from None
    headers = {k: v for k, v in resp.getheaders()
               if k.lower() not in STRIPPED and not k.lower().startswith("access-control-")}
    media_type = resp.getheader("content-type")
    if resp.status in NO_BODY or request.method == "HEAD":
        conn.close()
        return Response(status_code=resp.status, headers=headers)

    async def chunks():
        try:
            while chunk := await asyncio.to_thread(resp.read1, CHUNK):
                yield chunk
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    return StreamingResponse(chunks(), status_code=resp.status, headers=headers, media_type=media_type)

"""One HTTP request carried from the ingress to an engine replica and run there by the single-process server's own
Starlette app (server/app.py), its response carried back message by message: every route, error and SSE stream of
`llamactx serve` is the same code behind Ray (what Ray Serve's ASGIAppReplicaWrapper does for the HTTP proxy's
requests, here for a request whose body the ingress has already read to route it).

    req = ForwardedRequest.of(scope, body, prefix_keys)     # the ingress: picklable
    async for message in relay(app, req): ...              # the replica: ASGI send messages as plain tuples

A message is ("start", status, headers) or ("body", bytes, more_body). When the consumer stops early (the client
went away: Ray cancels the replica's generator), the app sees `http.disconnect`, as under uvicorn, and cancels its
engine requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

Message = tuple  # ("start", status: int, headers: list[tuple[bytes, bytes]]) | ("body", data: bytes, more: bool)

APP_EXIT_S = 10.0  # how long a cancelled request's handler gets to finish (it cancels its engine requests)


@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """What the replica needs of an HTTP request (its ASGI scope's fields and the whole body), and its routing key
    (affinity.prefix_keys of its rendered prompt; () for none)."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    client: tuple[str, int] | None = None
    prefix_keys: tuple[int, ...] = ()

    @classmethod
    def of(cls, scope: dict, body: bytes, prefix_keys: tuple[int, ...] = ()) -> ForwardedRequest:
        client = scope.get("client")
        return cls(scope["method"], scope["path"], scope.get("query_string", b""),
                   tuple((bytes(k), bytes(v)) for k, v in scope.get("headers", ())), body,
                   tuple(client) if client else None, prefix_keys)

    def scope(self) -> dict:
        """An ASGI HTTP scope for the app on the replica (HTTP/1.1, no root path)."""
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                "method": self.method, "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
                "root_path": "", "query_string": self.query_string, "headers": list(self.headers),
                "client": self.client, "server": ("127.0.0.1", 0), "state": {}}


async def relay(app, req: ForwardedRequest, extra_headers: list[tuple[bytes, bytes]] = ()) -> AsyncIterator[Message]:
    """Run `app` on `req` and yield its response messages; `extra_headers` are added to the response's."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_read = False

    async def receive() -> dict:
        nonlocal body_read
        if not body_read:
            body_read = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if gone.is_set():
            raise OSError("the client went away")  # what uvicorn raises to a handler writing to a closed socket
        await sent.put(message)

    task = asyncio.create_task(app(req.scope(), receive, send))
    try:
        while True:
            message = await _next(sent, task)
            if message is None:
                return
            if message["type"] == "http.response.start":
                yield "start", message["status"], [*message.get("headers", ()), *extra_headers]
            elif message["type"] == "http.response.body":
                more = message.get("more_body", False)
                yield "body", bytes(message.get("body", b"")), more
                if not more:
                    return
    finally:
        gone.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, APP_EXIT_S)


async def _next(sent: asyncio.Queue, task: asyncio.Task) -> dict | None:
    """The app's next message; None once it returned without one (its exception raised)."""
    if not sent.empty() or not task.done():
        get = asyncio.ensure_future(sent.get())
        await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
    if not sent.empty():
        return sent.get_nowait()
    task.result()  # raises what the app raised
    return None

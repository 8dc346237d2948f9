"""The HTTP transport: uvicorn's HTTP/1.1 protocol (h11) with the bounds a public server needs (llama-server's
cpp-httplib settings: read timeout, keep-alive timeout, thread-pool bound).

    config = uvicorn_config(app, server_config, host="127.0.0.1", port=8080)
    uvicorn.Server(config).run()

- **Read deadline** (`--read-timeout`, 30 s): a request's line, headers and body must all arrive within it,
  counted from the connection's start or from the first byte after the previous response. A client that
  trickles bytes (slowloris), stops mid-headers or sends less body than its Content-Length gets a 408 and the
  connection is closed; its handler sees the client as gone.
- **Idle keep-alive** (5 s, httplib's): a connection with no request in flight is closed after it.
- **Connection bound** (`--max-connections`, 256): a connection past it is answered 503 (llama-server's error
  shape, Retry-After) once its request has arrived, and closed.

The handlers' own deadline (`--timeout`, how long a generation may run) is the engine worker's, not this.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

KEEP_ALIVE_S = 5.0
LARGE_BUFFER = 1 << 20  # request bodies and their decoded text: mapped alone, returned to the OS when freed


def return_large_buffers() -> None:
    """Have glibc's malloc map every block of LARGE_BUFFER bytes or more alone and unmap it when freed. By default
    its mmap threshold rises to the largest block freed so far (up to 32 MB), after which clients' multi-MB bodies
    come from the heap and RSS only grows. A no-op where malloc is not glibc's."""
    libc = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(libc), "mallopt", None) if libc else None
    if mallopt is not None:
        mallopt(-3, LARGE_BUFFER)  # M_MMAP_THRESHOLD (fixed: no more dynamic threshold)


def uvicorn_config(app, read_timeout: float, max_connections: int, **kw) -> uvicorn.Config:
    """A uvicorn.Config serving `app` over the bounded protocol; `kw` are uvicorn.Config's (host, port...)."""
    kw.setdefault("log_level", "warning")
    kw.setdefault("timeout_graceful_shutdown", 5)
    # asyncio's own loop and no WebSocket upgrades, whether or not uvloop and websockets are installed (the
    # cluster extra, Ray Serve, brings both): the server behaves the same with and without it
    kw.setdefault("loop", "asyncio")
    kw.setdefault("ws", "none")
    return uvicorn.Config(app, http=bounded_protocol(read_timeout, max_connections),
                          timeout_keep_alive=KEEP_ALIVE_S, **kw)


def _error(status: int, reason: bytes, message: str, kind: str, extra: bytes = b"") -> bytes:
    """A whole HTTP response in llama-server's error shape, closing the connection."""
    body = json.dumps({"error": {"code": status, "message": message, "type": kind}}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n%s"
            b"\r\n" % (status, reason, len(body), extra) + body)


def bounded_protocol(read_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a read deadline per request and a bound on open connections."""

    class BoundedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:  # answered once its request is read, then closed
                self.app = _over_capacity(max_connections)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE:  # bytes of a new request: its deadline starts now
                self._arm()
            super().data_received(data)
            self._reading_done()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._reading_done()

        # -- the deadline ------------------------------------------------------------------------------------

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(read_timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _reading_done(self) -> None:
            """The whole request is in (h11: the client is DONE): stop its clock."""
            if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
                self._disarm()

        def _timed_out(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
                self.transport.close()  # an idle connection (nothing of a request yet): just close it
                return
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(_error(408, b"Request Timeout", f"the request did not arrive within "
                                            f"--read-timeout = {read_timeout:g} s", "timeout_error"))
            self.transport.close()  # the handler, if one runs, sees the client gone

    return BoundedH11Protocol


def _over_capacity(max_connections: int):
    async def app(scope, receive, send) -> None:
        body = json.dumps({"error": {"code": 503, "type": "unavailable_error", "message":
                                     f"the server holds --max-connections = {max_connections} connections; "
                                     "try again later"}}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                (b"retry-after", b"1"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    return app

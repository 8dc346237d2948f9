"""Resumable streams: a streamed generation sent with an `X-Conversation-Id` header outlives its connection, and
its SSE bytes can be read again, from any offset, while it runs and for a while after (llama-server's
server-stream.cpp: stream_session, stream_session_manager and the /v1/stream routes).

    GET    /v1/stream?conv_id=ID&from=N    the session's bytes from offset N, then live ones until it ends
    DELETE /v1/stream?conv_id=ID           stop it and forget it (204, also for an unknown id)
    POST   /v1/streams/lookup              {"conversation_ids": [...]} -> what is known of those sessions

One conversation has at most one session: a new stream under the same id cancels the previous one. A session keeps
its last 4 MiB (older bytes are dropped, and a read from before them is a 400) and is forgotten 300 s after it
ended. Unlike llama-server, stopping a session also stops its generation at once (llama-server lets it run to its
own end, unread). The conversation id travels in the query string because it may hold a model name with slashes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llamactx.api import protocol as P

SESSION_TTL_S = 300  # STREAM_SESSION_TTL_SECONDS: a finished session is kept this long
SESSION_MAX_BYTES = 4 << 20  # STREAM_SESSION_MAX_BYTES: the bytes a session keeps (its tail)
HEADER = "x-conversation-id"


class StreamSession:
    """One generation's SSE bytes: appended by its producer, read from any offset by any number of readers
    (all on the event loop)."""

    def __init__(self, conversation_id: str, max_bytes: int = SESSION_MAX_BYTES):
        self.conversation_id = conversation_id
        self.started_at = int(time.time())
        self.completed_at = 0  # unix seconds once finished
        self.cancelled = False
        self.producer: asyncio.Task | None = None  # the task that runs the generation into this session
        self._buffer = bytearray()
        self._dropped = 0  # bytes dropped from the front
        self._max_bytes = max_bytes
        self._changed = asyncio.Event()

    @property
    def is_done(self) -> bool:
        return self.completed_at != 0

    @property
    def total_bytes(self) -> int:
        return self._dropped + len(self._buffer)

    @property
    def dropped_prefix(self) -> int:
        return self._dropped

    def append(self, data: bytes) -> None:
        if self.is_done or not data:
            return
        self._buffer += data
        excess = len(self._buffer) - self._max_bytes
        if excess > 0:
            del self._buffer[:excess]
            self._dropped += excess
        self._wake_readers()

    def finalize(self) -> None:
        if not self.is_done:
            self.completed_at = int(time.time())
            self._wake_readers()

    def cancel(self) -> None:
        """Stop the producer (and its generation) and end the readers."""
        self.cancelled = True
        if self.producer is not None and not self.producer.done():
            self.producer.cancel()
        self.finalize()

    async def read_from(self, offset: int) -> AsyncIterator[bytes]:
        """The bytes from `offset` on, as they come, until the session ends (or until the bytes to read next have
        been dropped: a reader that fell behind by SESSION_MAX_BYTES)."""
        while True:
            if offset < self._dropped:
                return
            if offset < self.total_bytes:
                chunk = bytes(self._buffer[offset - self._dropped:])
                offset += len(chunk)
                yield chunk
                continue
            if self.is_done:
                return
            changed = self._changed
            await changed.wait()

    def _wake_readers(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class StreamSessions:
    """The live sessions by conversation id (stream_session_manager); finished ones expire SESSION_TTL_S after
    they end, checked whenever the sessions are looked at (no collector thread)."""

    def __init__(self):
        self._sessions: dict[str, StreamSession] = {}

    def create_or_replace(self, conversation_id: str) -> StreamSession:
        self._expire()
        previous = self._sessions.get(conversation_id)
        fresh = self._sessions[conversation_id] = StreamSession(conversation_id)
        if previous is not None:
            previous.cancel()
        return fresh

    def get(self, conversation_id: str) -> StreamSession | None:
        self._expire()
        return self._sessions.get(conversation_id)

    def evict_and_cancel(self, conversation_id: str) -> None:
        session = self._sessions.pop(conversation_id, None)
        if session is not None:
            session.cancel()

    def lookup(self, ids: list[str]) -> list[StreamSession]:
        """The sessions of these ids: each matches its own key and any "<id>::<model>"."""
        self._expire()
        out = []
        for rid in ids:
            out += [s for key, s in self._sessions.items() if key == rid or key.startswith(rid + "::")]
        return out

    def close(self) -> None:
        for session in self._sessions.values():
            session.cancel()
        self._sessions.clear()

    def _expire(self) -> None:
        cutoff = time.time() - SESSION_TTL_S
        for key in [k for k, s in self._sessions.items() if s.is_done and s.completed_at <= cutoff]:
            del self._sessions[key]


def resumable(sessions: StreamSessions, http: HttpRequest, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`body` (an SSE stream) as is without the header; with it, run into a new session by a task of its own,
    which a client that leaves does not stop, and read back from it."""
    conversation_id = http.headers.get(HEADER, "")
    if not conversation_id:
        return body
    session = sessions.create_or_replace(conversation_id)
    session.producer = asyncio.get_running_loop().create_task(_produce(session, body))
    return session.read_from(0)


async def _produce(session: StreamSession, body: AsyncIterator[bytes]) -> None:
    try:
        async for chunk in body:
            session.append(chunk)
    finally:
        await body.aclose()  # a cancel stops the generation: its sequences are dropped
        session.finalize()


def stream_routes(sessions: StreamSessions) -> list[Route]:
    """GET and DELETE /v1/stream, POST /v1/streams/lookup."""

    def conv_id(request: HttpRequest) -> str:
        value = request.query_params.get("conv_id", "")
        if not value:
            raise P.ProtocolError("Missing conversation id in path: conv_id")
        return value

    async def get(request: HttpRequest) -> Response:
        session = sessions.get(conv_id(request))
        if session is None:
            raise P.ProtocolError("Stream not found or expired", 404, "not_found_error")
        raw = request.query_params.get("from", "") or "0"
        if not raw.isdigit():
            raise P.ProtocolError(f"Invalid 'from' offset: {raw!r} is not a byte offset >= 0")
        offset = int(raw)
        if offset < session.dropped_prefix:
            raise P.ProtocolError(f"Stream offset lost, please restart: from = {offset} is before the "
                                  f"{session.dropped_prefix} bytes dropped")
        return StreamingResponse(session.read_from(offset), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def delete(request: HttpRequest) -> Response:
        sessions.evict_and_cancel(conv_id(request))
        return Response(status_code=204)

    async def lookup(request: HttpRequest) -> Response:
        body = P.parse_json(await request.body())
        ids = body.get("conversation_ids")
        ids = [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []
        return JSONResponse([{"conversation_id": s.conversation_id, "is_done": s.is_done,
                              "total_bytes": s.total_bytes, "started_at": s.started_at,
                              "completed_at": s.completed_at} for s in sessions.lookup(ids)])

    return [Route("/v1/stream", get, methods=["GET"]), Route("/v1/stream", delete, methods=["DELETE"]),
            Route("/v1/streams/lookup", lookup, methods=["POST"])]

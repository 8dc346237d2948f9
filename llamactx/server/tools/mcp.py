"""The MCP client: stdio MCP servers as child processes, JSON-RPC 2.0 over newline-delimited JSON (llama.cpp's
tools/server/server-mcp.cpp and server-mcp.h: `server_mcp_transport`, `server_mcp_stdio`, `server_mcp`).

    servers = load_mcp_servers(config_path, inline_json)   # server/tools/mcp_config.py
    mcp = McpManager(servers)
    await mcp.warmup()                       # spawn each once, list its tools, stop it
    mcp.list_tools()                         # [McpToolDef]: exposed as "<server>_<tool>" by server/tools/toolbox.py
    await mcp.call_tool("echo", "echo", {"message": "hi"})   # {"plain_text_response": ...} or {"error": ...}
    mcp.shutdown(); await mcp.close()        # cancel in-flight calls, then stop every child

A server is respawned on demand after it dies; one that cannot be spawned is left alone for a cooldown. Every wait is
bounded (a call by its server's `timeout_ms`, warmup by 10 s per server) and ends at once on `shutdown()`.
Memory is bounded too: one NDJSON line is at most 8 MB, the stderr tail kept for diagnostics 4 KB, and
notifications are dropped, never queued. Children run in their own session, so stopping one kills the
grandchildren it left holding its pipes (which would otherwise keep the pipes open forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from llamactx.errors import LlamactxError
from llamactx.server.tools.mcp_config import McpServerConfig

log = logging.getLogger("llamactx.server.tools.mcp")

MCP_PROTOCOL_VERSION = "2024-11-05"
WARMUP_TIMEOUT_S = 10.0  # tool discovery per server at start-up (MCP_WARMUP_TIMEOUT_SECONDS)
COOLDOWN_S = 5.0  # after a failed spawn (MCP_COOLDOWN_SECONDS)
MAX_LINE_BYTES = 8 << 20  # a longer NDJSON line is dropped (mcp_pump_ndjson's max_line)
STDERR_TAIL_BYTES = 4096  # ERR_TAIL_MAX
MAX_PENDING = 256  # requests in flight on one server
MAX_WRITE_BUFFER = 8 << 20  # bytes queued for a child that does not read its stdin
STOP_GRACE_S = 0.5  # SIGTERM, then SIGKILL
EXIT_DRAIN_S = 0.2  # after the child exits, for its last replies still in the pipe


@dataclass(frozen=True, slots=True)
class McpToolDef:
    """A tool an MCP server advertises (server_mcp_tool_def); `name` has no "<server>_" prefix."""

    server_name: str
    name: str
    description: str = ""
    input_schema: Any = None


class McpError(LlamactxError):
    """A JSON-RPC exchange that failed: the message is what /tools reports as "error"."""


# -- one session: a child process ---------------------------------------------------------------------------------


class NdjsonFramer:
    """Bytes -> complete lines, bounded: a line longer than MAX_LINE_BYTES is dropped up to its newline."""

    def __init__(self, max_line: int = MAX_LINE_BYTES):
        self.buf, self.max_line, self.skipping = bytearray(), max_line, False

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        lines = []
        while (nl := self.buf.find(b"\n")) >= 0:
            line = bytes(self.buf[:nl]).rstrip(b"\r")
            del self.buf[:nl + 1]
            if self.skipping:
                self.skipping = False
            elif line:
                lines.append(line)
        if len(self.buf) > self.max_line:
            log.warning("MCP: dropping an oversized line (> %d bytes) from a child pipe", self.max_line)
            self.buf.clear()
            self.skipping = True
        return lines


class _ChildProtocol(asyncio.SubprocessProtocol):
    """The child's pipes, as asyncio delivers them, handed to its McpStdio."""

    def __init__(self, session: McpStdio):
        self.session = session

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.session.on_data(fd, data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:  # every reply the child wrote has been delivered
            self.session.on_closed("the MCP server closed its output")

    def process_exited(self) -> None:
        # replies written just before the exit may still be in the pipe: give them a moment, unless a
        # grandchild holds the pipe open and its EOF never comes
        code = self.session.transport.get_returncode() if self.session.transport else None
        asyncio.get_running_loop().call_later(EXIT_DRAIN_S, self.session.on_closed,
                                              f"the MCP server exited with status {code}")


class McpStdio:
    """One MCP server session over a child's stdin/stdout (server_mcp_stdio + server_mcp_transport). Requests
    run concurrently, matched to their replies by id; stderr is drained into a bounded tail."""

    def __init__(self, config: McpServerConfig):
        self.config = config
        self.transport: asyncio.SubprocessTransport | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.next_id = 1
        self.alive = False
        self.tools: list[McpToolDef] | None = None
        self.err_tail = b""
        self.last_error = ""
        self._out, self._err = NdjsonFramer(), NdjsonFramer()
        self._init_lock = asyncio.Lock()
        self._initialized = False

    async def start(self) -> bool:
        """Spawn the child; False (and `last_error`) when it cannot be."""
        cfg = self.config
        env = {**os.environ, **cfg.env} if cfg.env else None
        loop = asyncio.get_running_loop()
        try:
            self.transport, _ = await loop.subprocess_exec(
                lambda: _ChildProtocol(self), cfg.command, *cfg.args, env=env, cwd=cfg.cwd or None,
                start_new_session=True)
        except (OSError, ValueError) as e:
            self.last_error = f"failed to spawn {cfg.command!r}: {e.strerror if isinstance(e, OSError) else e}"
            return False
        self.alive = True
        return True

    def is_alive(self) -> bool:
        return self.alive and self.transport is not None and self.transport.get_returncode() is None

    def diagnostics(self) -> str:
        tail = self.err_tail.decode("utf-8", "replace").strip()
        return "; ".join(s for s in (self.last_error, f"last stderr: {tail}" if tail else "") if s)

    # -- the pipes (called by _ChildProtocol) ------------------------------------------------------------------

    def on_data(self, fd: int, data: bytes) -> None:
        if fd == 2:
            self.err_tail = (self.err_tail + data)[-STDERR_TAIL_BYTES:]
            return
        for line in self._out.feed(data):
            self._on_message(line)

    def on_closed(self, reason: str) -> None:
        """No reply can come any more: every request in flight fails with `reason`."""
        self.alive = False
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(McpError(f"transport closed: {reason}"))
        self.pending.clear()

    def _on_message(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.debug("MCP '%s': skipping a line that is not JSON", self.config.name)
            return
        if not isinstance(msg, dict):
            return
        if "method" in msg:  # from the server: a notification, or a request (answered: we offer nothing)
            if "id" in msg:
                reply = {"result": {}} if msg["method"] == "ping" else \
                    {"error": {"code": -32601, "message": f"Method not found: {msg['method']}"}}
                with contextlib.suppress(McpError):  # a child gone meanwhile: nobody to answer
                    self._write({"jsonrpc": "2.0", "id": msg["id"], **reply})
            return
        fut = self.pending.pop(msg.get("id"), None) if isinstance(msg.get("id"), int) else None
        if fut is not None and not fut.done():  # an unknown id: the late reply of a timed-out request
            fut.set_result(msg)

    def _write(self, msg: dict) -> None:
        pipe = self.transport.get_pipe_transport(0) if self.transport else None
        if pipe is None or pipe.is_closing():
            raise McpError("transport closed")
        if pipe.get_write_buffer_size() > MAX_WRITE_BUFFER:
            raise McpError(f"the MCP server does not read its input ({MAX_WRITE_BUFFER} bytes queued)")
        pipe.write(json.dumps(msg).encode() + b"\n")

    # -- JSON-RPC ------------------------------------------------------------------------------------------------

    async def request(self, method: str, params: dict | None, timeout_s: float, stop: asyncio.Event) -> dict:
        """Send a request and wait for its reply (a dict with "result" or "error"). Raises McpError when the
        transport closes, `timeout_s` passes or `stop` is set first."""
        if not self.is_alive():
            raise McpError("transport closed")
        if len(self.pending) >= MAX_PENDING:
            raise McpError(f"too many requests in flight ({MAX_PENDING})")
        req_id, self.next_id = self.next_id, self.next_id + 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[req_id] = fut
        try:
            self._write({"jsonrpc": "2.0", "id": req_id, "method": method, **({"params": params} if params else {})})
            return await _wait_or_stop(fut, timeout_s, stop)
        finally:
            self.pending.pop(req_id, None)

    async def ensure_init(self, timeout_s: float, stop: asyncio.Event) -> None:
        """The initialize handshake, once per spawn, then notifications/initialized."""
        async with self._init_lock:
            if self._initialized:
                return
            reply = await self.request("initialize", {
                "protocolVersion": MCP_PROTOCOL_VERSION, "capabilities": {},
                "clientInfo": {"name": "llamactx", "version": "1.0"}}, timeout_s, stop)
            if "result" not in reply:
                raise McpError(f"initialize failed: {_rpc_error(reply)}")
            self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})
            self._initialized = True

    async def list_tools(self, timeout_s: float, stop: asyncio.Event) -> list[McpToolDef]:
        if self.tools is None:
            await self.ensure_init(timeout_s, stop)
            reply = await self.request("tools/list", None, timeout_s, stop)
            if "result" not in reply:
                raise McpError(f"tools/list failed: {_rpc_error(reply)}")
            self.tools = _tool_defs(self.config.name, reply["result"])
        return self.tools

    async def call_tool(self, tool: str, arguments: dict, stop: asyncio.Event) -> dict:
        """tools/call, normalized to the /tools contract: {"plain_text_response"} or {"error"}."""
        timeout_s = self.config.timeout_ms / 1000
        try:
            await self.ensure_init(timeout_s, stop)
            reply = await self.request("tools/call", {"name": tool, "arguments": arguments}, timeout_s, stop)
        except McpError as e:
            self.last_error = str(e)
            return {"error": str(e)}
        if "error" in reply:
            return {"error": _rpc_error(reply)}
        if isinstance(reply.get("result"), dict):
            return _result_to_response(reply["result"])
        return {"error": "invalid response from MCP server"}

    async def close(self) -> None:
        """Stop the child and everything in its session: stdin closed, SIGTERM, then SIGKILL after a grace
        period; never waits for the pipes' EOF (a grandchild outside the session may hold them)."""
        transport, self.transport = self.transport, None
        self.on_closed("closed")
        if transport is None:
            return
        pid = transport.get_pid()
        with contextlib.suppress(Exception):
            transport.get_pipe_transport(0).close()
        for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
            if transport.get_returncode() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + grace
            while transport.get_returncode() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # what is left of the session: grandchildren holding the pipes
        transport.close()


async def _wait_or_stop(fut: asyncio.Future, timeout_s: float, stop: asyncio.Event) -> dict:
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({fut, stopper}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if fut in done:
        return fut.result()
    fut.cancel()
    raise McpError("cancelled" if stop.is_set() else "request timed out")


def _rpc_error(reply: dict) -> str:
    err = reply.get("error")
    if isinstance(err, dict):
        return str(err.get("message", "unknown error"))
    return err if isinstance(err, str) else "unknown error"


def _tool_defs(server: str, result: Any) -> list[McpToolDef]:
    tools = result.get("tools") if isinstance(result, dict) else None
    out = []
    for t in tools if isinstance(tools, list) else []:
        if isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"]:
            desc = t.get("description")
            out.append(McpToolDef(server, t["name"], desc if isinstance(desc, str) else "", t.get("inputSchema")))
    return out


def _result_to_response(result: dict) -> dict:
    """Text parts of result.content joined by newlines; an isError result is an error (mcp_result_to_response)."""
    content = result.get("content")
    parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"] \
        if isinstance(content, list) else []
    text = "\n".join(str(p) for p in parts)
    if result.get("isError"):
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


# -- the manager: every configured server ---------------------------------------------------------------------


class McpManager:
    """The configured MCP servers (server_mcp): their tools, discovered once at start-up, and a live session
    per server, (re)spawned on demand. One per app; lives on its event loop."""

    def __init__(self, configs: list[McpServerConfig]):
        self.configs = {c.name: c for c in configs}
        self.registry: list[McpToolDef] = []
        self.sessions: dict[str, McpStdio] = {}
        self.dead_until: dict[str, float] = {}  # spawn-failure cooldown
        self.stopping = False
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._spawn_lock: asyncio.Lock | None = None

    def empty(self) -> bool:
        return not self.configs

    def _bind(self) -> None:
        if self._loop is None:
            self._loop, self._stop, self._spawn_lock = asyncio.get_running_loop(), asyncio.Event(), asyncio.Lock()

    async def warmup(self) -> None:
        """Spawn every server at once, list its tools (at most WARMUP_TIMEOUT_S each), stop it. A server that
        cannot be spawned or answered in time contributes no tools; the others still do."""
        self._bind()
        found = await asyncio.gather(*(self._discover(c) for c in self.configs.values()))
        self.registry = [t for tools in found for t in tools]

    async def _discover(self, cfg: McpServerConfig) -> list[McpToolDef]:
        session = McpStdio(cfg)
        if not await session.start():
            log.warning("MCP warmup: failed to spawn '%s': %s", cfg.name, session.diagnostics())
            return []
        try:
            tools = await session.list_tools(WARMUP_TIMEOUT_S, self._stop)
            log.info("MCP warmup: '%s' discovered %d tools", cfg.name, len(tools))
            return tools
        except McpError as e:
            session.last_error = str(e)
            log.warning("MCP warmup: '%s' listed no tools: %s", cfg.name, session.diagnostics())
            return []
        finally:
            await session.close()

    def list_tools(self) -> list[McpToolDef]:
        return list(self.registry)

    async def call_tool(self, server: str, tool: str, arguments: dict) -> dict:
        """{"plain_text_response": text} or {"error": message}; never raises for the server's failures.
        A call sent to a reused child that then dies without replying (it was already exiting: a crash after its
        last reply is not yet reaped when the next call is written) is sent once more to a fresh child. A call
        that kills a fresh child is not repeated."""
        self._bind()
        for _ in range(2):  # a second time only after a reused child died without replying
            session, reused = await self._get_or_spawn(server)
            if session is None:
                return {"error": f"MCP server unavailable: {server}"}
            reply = await session.call_tool(tool, arguments, self._stop)
            if not (reused and not session.is_alive() and reply.get("error", "").startswith("transport closed")):
                break
        return reply

    async def _get_or_spawn(self, name: str) -> tuple[McpStdio | None, bool]:
        """The server's live session, and whether it was already running (False: spawned now)."""
        async with self._spawn_lock:
            if self.stopping or name not in self.configs or time.monotonic() < self.dead_until.get(name, 0.0):
                return None, False
            session = self.sessions.get(name)
            if session is not None and session.is_alive():
                return session, True
            if session is not None:
                log.warning("MCP '%s' is no longer alive: %s", name, session.diagnostics())
                del self.sessions[name]
                asyncio.ensure_future(session.close())
            fresh = McpStdio(self.configs[name])
            if not await fresh.start():
                log.warning("MCP '%s': failed to start: %s", name, fresh.diagnostics())
                self.dead_until[name] = time.monotonic() + COOLDOWN_S
                return None, False
            self.sessions[name] = fresh
            return fresh, False

    def shutdown(self) -> None:
        """Fail every in-flight call at once ("cancelled") and refuse new ones. Safe from a signal handler or
        another thread; idempotent. `close()` then stops the children."""
        self.stopping = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)

    async def close(self) -> None:
        self.shutdown()
        sessions, self.sessions = list(self.sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions))

"""The server tools over HTTP: GET /tools lists them, POST /tools invokes one (llama.cpp's
tools/server/server-tools.cpp `server_tools::setup`, `handle_get`, `handle_post`, `server_mcp_tool`, and the
wiring in server.cpp). The tools are llama-server's built-in ones that --tools names (server/tools/builtin.py) and those
of the MCP servers of --mcp-servers-config / --mcp-servers-json (server/tools/mcp.py), as "<server>_<tool>".

    toolbox = Toolbox(AgentConfig(tools=["read_file"], mcp_servers=load_mcp_servers(None, text)))
    await toolbox.start()         # MCP warmup, --tools-runtime; then the routes of agent_routes(toolbox)
    await toolbox.stop()

    POST /tools {"tool": "read_file", "params": {"path": "a.txt"}, "stream": false}
      headers: x-tool-cwd (the directory relative paths resolve against; overrides any "cwd" param),
               x-tool-runtime (an isolate: "docker-container:<id>", "podman-container:<id>", "ssh:<target>"),
               x-resp-type: base64 (read_file returns the bytes)
      -> 200 {"plain_text_response": ...} | {"result": ...} | {"error": "<the tool's failure>"}
      -> stream: text/event-stream of {"chunk": ...} then {"done": true[, "error"]} (exec_shell_command)

Everything here is off unless a flag turns it on: without --tools and MCP servers both routes answer 403, as
llama-server's. A tool that is unknown is a 404, a body or parameter of the wrong shape a 400 naming the field,
and an unusable x-tool-runtime header a 400 "unknown tool runtime" / "invalid container id" / "invalid ssh
target" (llama-server answers those 500, and its suite checks for 500; a client's bad header is a 4xx here, as every
other bad input).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
from dataclasses import dataclass, field

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from llamactx.api import protocol as P
from llamactx.server.cors_proxy import cors_proxy_routes
from llamactx.server.tools.builtin import BUILTIN_TOOLS, ServerTool, ToolParamError, ToolStream
from llamactx.server.tools.isolates import ToolRuntimeError
from llamactx.server.tools.mcp import McpManager, McpToolDef
from llamactx.server.tools.mcp_config import McpServerConfig
from llamactx.server.tools.tools_runtime import make_tools_runtime

log = logging.getLogger("llamactx.server.tools")

CALLER_PARAMS = ("cwd", "runtime", "resp_type")  # set from headers only, never by the model


@dataclass(slots=True)
class AgentConfig:
    """The agent features of `llamactx serve`, each off by default (llama-server's flag names)."""

    tools: list[str] = field(default_factory=list)  # --tools: built-in tool names, or "all"
    tools_runtime: str = ""  # --tools-runtime: docker:<image>, docker-container:<id>, ssh:<target>, ...
    mcp_servers: list[McpServerConfig] = field(default_factory=list)  # --mcp-servers-config / --mcp-servers-json
    ui_mcp_proxy: bool = False  # --ui-mcp-proxy: GET/POST /cors-proxy?url=...

    def tools_enabled(self) -> bool:
        return bool(self.tools or self.mcp_servers)


def select_tools(names: list[str]) -> list[ServerTool]:
    """The built-in tools `names` enables ("all": every one), in llama-server's order. Raises ValueError for a
    name that is not a tool, listing those that are."""
    for name in names:
        if name != "all" and name not in BUILTIN_TOOLS:
            raise ValueError(f"--tools: unknown tool \"{name}\". available tools: {', '.join(BUILTIN_TOOLS)}")
    return [cls() for name, cls in BUILTIN_TOOLS.items() if "all" in names or name in names]


class McpTool(ServerTool):
    """One tool of an MCP server, as "<server>_<tool>" (server_mcp_tool)."""

    uses_cwd = False

    def __init__(self, tool: McpToolDef, mcp: McpManager):
        self.tool, self.mcp = tool, mcp
        self.name = self.display_name = f"{tool.server_name}_{tool.name}"
        self.description = tool.description

    def definition(self) -> dict:
        schema = self.tool.input_schema if isinstance(self.tool.input_schema, dict) else {}
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": schema}}

    def to_json(self) -> dict:
        return {**super().to_json(), "type": "mcp"}

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        arguments = {k: v for k, v in params.items() if k not in CALLER_PARAMS}
        return await self.mcp.call_tool(self.tool.server_name, self.tool.name, arguments)


class Toolbox:
    """The tools this server offers and what they need running: the MCP manager and the --tools-runtime."""

    def __init__(self, config: AgentConfig):
        self.config = config
        self.tools: dict[str, ServerTool] = {t.name: t for t in select_tools(config.tools)}
        self.mcp = McpManager(config.mcp_servers) if config.mcp_servers else None
        self.runtime = make_tools_runtime(config.tools_runtime) if config.tools_runtime else None
        self._signals: dict[int, object] = {}

    async def start(self) -> None:
        """MCP warmup (their tools join the list; a name that collides with one already there is skipped),
        the runtime's container, and the exit signals chained to cancel in-flight MCP calls at once."""
        if self.runtime is not None:
            await self.runtime.start()
        if self.mcp is None:
            return
        await self.mcp.warmup()
        added = 0
        for tool in self.mcp.list_tools():
            mcp_tool = McpTool(tool, self.mcp)
            if mcp_tool.name in self.tools:
                log.warning("MCP tool \"%s\" from server \"%s\" collides with an existing tool, skipping",
                            mcp_tool.name, tool.server_name)
                continue
            self.tools[mcp_tool.name] = mcp_tool
            added += 1
        log.info("added %d MCP tools", added)
        self._chain_exit_signals()

    def _chain_exit_signals(self) -> None:
        """SIGINT/SIGTERM first cancel the MCP calls in flight (llama-server's shutdown_handler calls
        mcp_mgr.shutdown() before the HTTP server drains), then do what they did before (uvicorn's exit)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            if not callable(previous):
                continue

            def handler(signum, frame, previous=previous):
                self.mcp.shutdown()
                previous(signum, frame)

            self._signals[sig] = previous
            signal.signal(sig, handler)

    async def stop(self) -> None:
        """Stop every MCP child and the runtime's container; restore the signal handlers."""
        for sig, previous in self._signals.items():
            signal.signal(sig, previous)
        self._signals.clear()
        if self.mcp is not None:
            await self.mcp.close()
        if self.runtime is not None:
            await self.runtime.close()

    def find(self, name: str, stream: bool) -> ServerTool:
        tool = self.tools.get(name)
        if tool is None:
            raise P.ProtocolError(f"unknown tool \"{name}\"", 404, "not_found_error")
        if stream and not tool.support_stream:
            raise P.ProtocolError(f"tool \"{name}\" does not support stream = true")
        return tool

    async def caller_params(self, body: dict, request: HttpRequest) -> dict:
        """The body's "params" with "cwd", "runtime" and "resp_type" taken from the headers (or the
        --tools-runtime), whatever the params said."""
        params = body.get("params", {})
        if not isinstance(params, dict):
            raise P.ProtocolError(f"params must be an object, got {type(params).__name__}")
        params = {k: v for k, v in params.items() if k not in CALLER_PARAMS}
        headers = request.headers
        if headers.get("x-tool-cwd"):
            params["cwd"] = headers["x-tool-cwd"]
        if headers.get("x-tool-runtime"):
            params["runtime"] = headers["x-tool-runtime"]
        elif self.runtime is not None:
            params["runtime"] = await self.runtime.spec()
        if headers.get("x-resp-type"):
            params["resp_type"] = headers["x-resp-type"]
        return params


def agent_routes(toolbox: Toolbox) -> list[Route]:
    """GET/POST /tools and GET/POST /cors-proxy: the handlers when their flags are on, 403 when off."""
    if not toolbox.config.tools_enabled():
        routes = [Route("/tools", _feature_disabled, methods=["GET", "POST"])]
    else:
        async def list_tools(request):
            return JSONResponse([t.to_json() for t in toolbox.tools.values()])

        async def call_tool(request):
            return await _call_tool(toolbox, request)

        routes = [Route("/tools", list_tools, methods=["GET"]), Route("/tools", call_tool, methods=["POST"])]
    return routes + cors_proxy_routes(toolbox.config.ui_mcp_proxy)


async def _feature_disabled(request):
    raise P.ProtocolError("this feature is disabled", 403, "feature_disabled")


async def _call_tool(toolbox: Toolbox, request: HttpRequest):
    body = P.parse_json(await request.body())
    name, stream = body.get("tool"), body.get("stream", False)
    if not isinstance(name, str):
        raise P.ProtocolError(f"tool must be a string naming the tool, got {name!r}")
    if not isinstance(stream, bool):
        raise P.ProtocolError(f"stream must be a boolean, got {stream!r}")
    tool = toolbox.find(name, stream)
    params = await toolbox.caller_params(body, request)
    if stream:
        return StreamingResponse(_stream(tool, params), media_type="text/event-stream")
    try:
        return JSONResponse(await tool.invoke(params))
    except ToolParamError as e:
        raise P.ProtocolError(str(e)) from None
    except ToolRuntimeError as e:
        raise P.ProtocolError(str(e), 400, "invalid_request_error") from None


async def _stream(tool: ServerTool, params: dict):
    """SSE: {"chunk": text} as the tool writes, then {"done": true} (with "error" when it failed). The tool is
    cancelled, and its child killed, when the client leaves."""
    queue: asyncio.Queue[dict] = asyncio.Queue()
    gone = False

    async def run() -> None:
        done: dict = {"done": True}
        try:
            await tool.invoke(params, ToolStream(lambda c: queue.put_nowait({"chunk": c}), lambda: not gone))
        except (ToolParamError, ToolRuntimeError) as e:
            done["error"] = str(e)
        except Exception as e:  # a bug: logged, and reported in the stream that already answered 200
            log.exception("tool %s failed", tool.name)
            done["error"] = f"internal error: {type(e).__name__}"
        queue.put_nowait(done)

    task = asyncio.create_task(run())
    try:
        while True:
            item = await queue.get()
            yield f"data: {json.dumps(item)}\n\n"
            if item.get("done"):
                return
    finally:
        gone = True
        task.cancel()

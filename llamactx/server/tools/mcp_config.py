"""The MCP servers' configuration: Cursor's `{"mcpServers": {name: {command, args, env, cwd, timeout_ms}}}` from
--mcp-servers-config (a file) and --mcp-servers-json (llama.cpp's tools/server/server-mcp.cpp:
`server_mcp_server_config::parse_cursor_format`, and the config half of `server_mcp::start`).

    servers = load_mcp_servers("mcp.json", None)     # [McpServerConfig]; McpConfigError: the server does not start
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from llamactx.errors import LlamactxError

log = logging.getLogger("llamactx.server.tools.mcp")

DEFAULT_TIMEOUT_MS = 30000  # per tool call (server_mcp_server_config::timeout_ms)


class McpConfigError(LlamactxError, ValueError):
    """The MCP configuration cannot be read or is not JSON: the server does not start (llama-server exits 1)."""


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """One entry of "mcpServers" (server_mcp_server_config)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # merged over the server's environment
    cwd: str = ""
    timeout_ms: int = DEFAULT_TIMEOUT_MS


def parse_mcp_servers(text: str, source: str) -> list[McpServerConfig]:
    """The servers of one Cursor-format JSON document (parse_cursor_format). A document without "mcpServers"
    has none; an entry without a "command" is skipped with a warning. Raises McpConfigError naming `source` for
    text that is not JSON or an entry whose fields have the wrong types."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise McpConfigError(f"{source}: failed to parse MCP config JSON: {e}") from None
    servers = doc.get("mcpServers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        return []
    out = []
    for name, entry in servers.items():
        if not isinstance(entry, dict):
            raise McpConfigError(f"{source}: mcpServers.{name} must be an object, got {type(entry).__name__}")
        if not entry.get("command"):
            log.warning("MCP server '%s' has no command, skipping", name)
            continue
        out.append(_server_config(name, entry, source))
    return out


def _server_config(name: str, entry: dict, source: str) -> McpServerConfig:
    where = f"{source}: mcpServers.{name}"
    command, args, env = entry["command"], entry.get("args", []), entry.get("env", {})
    cwd, timeout_ms = entry.get("cwd", ""), entry.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if not isinstance(command, str):
        raise McpConfigError(f"{where}.command must be a string, got {command!r}")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}.args must be an array of strings, got {args!r}")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise McpConfigError(f"{where}.env must be an object of strings")
    if not isinstance(cwd, str):
        raise McpConfigError(f"{where}.cwd must be a string, got {cwd!r}")
    if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
        raise McpConfigError(f"{where}.timeout_ms = {timeout_ms!r} must be a positive integer")
    return McpServerConfig(name, command, tuple(args), dict(env), cwd, timeout_ms)


def load_mcp_servers(config_path: str | None, inline_json: str | None) -> list[McpServerConfig]:
    """--mcp-servers-config (a file) then --mcp-servers-json, names unique across both (server_mcp::start); a
    duplicate name is skipped with a warning. Raises McpConfigError for a missing file or bad JSON."""
    docs = []
    if config_path:
        try:
            docs.append((Path(config_path).read_text(encoding="utf-8"), config_path))
        except OSError as e:
            raise McpConfigError(f"failed to open MCP config file {config_path!r}: {e.strerror or e}") from None
    if inline_json:
        docs.append((inline_json, "--mcp-servers-json"))
    out: dict[str, McpServerConfig] = {}
    for text, source in docs:
        parsed = parse_mcp_servers(text, source)
        if not parsed:
            log.warning("MCP config %s: no servers found", source)
        for server in parsed:
            if server.name in out:
                log.warning("MCP config: duplicate server name '%s', skipping", server.name)
                continue
            out[server.name] = server
    return list(out.values())

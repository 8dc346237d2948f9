"""A tiny stdio MCP server for tests/server/test_tools.py: NDJSON JSON-RPC 2.0 on stdin/stdout. Tools: echo,
add, fail (an isError result), sleep (seconds), crash (exits 0.3 s after its reply), notify (a notification before
the reply). Run as `python mcp_stdio_server.py`; stdlib only."""

import json
import os
import sys
import time

TOOLS = [
    {"name": "echo", "description": "Echo the message", "inputSchema": {
        "type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}},
    {"name": "add", "description": "Add two numbers", "inputSchema": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}},
    {"name": "fail", "description": "Always an error result", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "sleep", "description": "Sleep, then answer", "inputSchema": {
        "type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "crash", "description": "Reply, then exit", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "notify", "description": "A notification, then the reply", "inputSchema": {"type": "object"}},
]


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def text(req_id, value: str, is_error: bool = False) -> dict:
    return {"jsonrpc": "2.0", "id": req_id,
            "result": {"content": [{"type": "text", "text": value}], "isError": is_error}}


def call(req_id, name: str, args: dict) -> dict:
    if name == "echo":
        return text(req_id, f"echo: {args.get('message', '')}")
    if name == "add":
        return text(req_id, str(args.get("a", 0) + args.get("b", 0)))
    if name == "fail":
        return text(req_id, "it failed", is_error=True)
    if name == "sleep":
        time.sleep(args.get("seconds", 1))
        return text(req_id, "slept")
    if name == "crash":
        send(text(req_id, "crashing"))
        time.sleep(0.3)  # dying but not yet reaped: the client's next call is written to this child
        os._exit(1)
    if name == "notify":
        send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}})
        return text(req_id, "notified")
    return {"jsonrpc": "2.0", "id": req_id, "error": {"code": -32602, "message": f"Unknown tool: {name}"}}


def main() -> None:
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except json.JSONDecodeError:
            continue
        req_id, method, params = req.get("id"), req.get("method"), req.get("params") or {}
        if req_id is None:
            continue  # a notification: no reply
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": req_id, "result": {
                "protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                "serverInfo": {"name": "fixture", "version": "1"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            send(call(req_id, params.get("name"), params.get("arguments") or {}))
        else:
            send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": f"Method not found: {method}"}})


if __name__ == "__main__":
    main()

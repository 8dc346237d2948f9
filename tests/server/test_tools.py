"""The server tools (GET/POST /tools), the MCP client and the CORS proxy: off by default, llama-server's shapes,
a real stdio MCP server (tests/server/mcp_stdio_server.py) that echoes, fails, sleeps past its timeout and
crashes, and bad bodies answered 400 naming the field."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llamactx.server.tools.file_edit import EditError, apply_edits
from llamactx.server.tools.mcp_config import McpConfigError, load_mcp_servers, parse_mcp_servers
from llamactx.server.tools.path_glob import glob_match, path_glob_match
from llamactx.server.tools.toolbox import AgentConfig, select_tools
from tests.server.conftest import running_server

FIXTURE = str(Path(__file__).with_name("mcp_stdio_server.py"))


def mcp_json(**servers) -> str:
    return json.dumps({"mcpServers": servers})


@pytest.fixture(scope="module")
def agent():
    """A server with every built-in tool, the fixture MCP server twice (one with a 300 ms call timeout), a
    command that does not exist, and the CORS proxy on."""
    servers = load_mcp_servers(None, mcp_json(
        fix={"command": sys.executable, "args": [FIXTURE]},
        quick={"command": sys.executable, "args": [FIXTURE], "timeout_ms": 300},
        bad={"command": "this_executable_does_not_exist_12345"}))
    config = AgentConfig(tools=["all"], mcp_servers=servers, ui_mcp_proxy=True)
    with running_server(model="smollm2", n_slots=1, n_ctx=512, agent=config) as running:
        yield running


def call(client, tool: str, params: dict, headers: dict | None = None) -> dict:
    res = client.post("/tools", json={"tool": tool, "params": params}, headers=headers or {})
    assert res.status_code == 200, res.text
    return res.json()


def test_everything_is_off_by_default(server):
    with server.client() as c:
        for method in ("GET", "POST"):
            for path in ("/tools", "/cors-proxy?url=http://127.0.0.1:1/"):
                res = c.request(method, path, json={"tool": "read_file", "params": {"path": "/etc/hostname"}})
                assert res.status_code == 403, (method, path, res.text)
                assert res.json()["error"]["type"] == "feature_disabled"


def test_listing_has_builtin_and_mcp_tools(agent):
    with agent.client() as c:
        tools = {t["tool"]: t for t in c.get("/tools").json()}
    assert {"read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file", "edit_file",
            "get_info"} <= set(tools)
    assert {"fix_echo", "fix_add", "quick_sleep"} <= set(tools)
    assert not [name for name in tools if name.startswith("bad_")]
    echo = tools["fix_echo"]
    assert echo["type"] == "mcp" and tools["read_file"]["type"] == "server"
    assert tools["write_file"]["permissions"] == {"write": True}
    fn = echo["definition"]["function"]
    assert echo["definition"]["type"] == "function" and fn["name"] == "fix_echo"
    assert fn["parameters"]["properties"] == {"message": {"type": "string"}}


def test_builtin_tools_in_a_tmp_dir(agent, tmp_path):
    cwd = {"x-tool-cwd": str(tmp_path)}
    with agent.client() as c:
        res = call(c, "write_file", {"path": "sub/notes.txt", "content": "one\ntwo\nthree\n", "cwd": "/nowhere"}, cwd)
        assert res == {"result": "file written successfully", "path": "sub/notes.txt", "bytes": 14}
        assert (tmp_path / "sub" / "notes.txt").read_text() == "one\ntwo\nthree\n"
        res = call(c, "edit_file", {"path": "sub/notes.txt", "edits": [{"old_text": "two", "new_text": "2"}]}, cwd)
        assert res["edits_applied"] == 1
        res = call(c, "read_file", {"path": "sub/notes.txt", "start_line": 2, "append_loc": True}, cwd)
        assert res["plain_text_response"] == "2\u21922\n3\u2192three\n"
        res = call(c, "grep_search", {"path": ".", "pattern": "thr+ee", "return_line_numbers": True}, cwd)
        assert "sub/notes.txt:3:three" in res["plain_text_response"]
        assert "Total matches: 1" in res["plain_text_response"]
        res = call(c, "file_glob_search", {"path": ".", "include": "*.txt"}, cwd)
        assert res["entries"] == [{"path": "sub/notes.txt", "type": "file"}] and res["base"] == str(tmp_path)
        res = call(c, "exec_shell_command", {"command": "cat sub/notes.txt; exit 3"}, cwd)
        assert res["plain_text_response"] == "one\n2\nthree\n\n[exit code: 3]"
        assert "unique" in call(c, "edit_file", {"path": "sub/notes.txt", "edits": [
            {"old_text": "e", "new_text": "E"}]}, cwd)["error"]
        assert "invalid type" in call(c, "file_glob_search", {"path": ".", "type": "bogus"}, cwd)["error"]


def test_exec_shell_command_streams(agent):
    with agent.client() as c, c.stream("POST", "/tools", json={
            "tool": "exec_shell_command", "params": {"command": "echo hello"}, "stream": True}) as res:
        assert res.status_code == 200
        events = [json.loads(line[6:]) for line in res.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"done": True}
    assert "".join(e["chunk"] for e in events[:-1]) == "hello\n\n[exit code: 0]"


def test_mcp_calls(agent):
    with agent.client() as c:
        assert call(c, "fix_echo", {"message": "hi"}) == {"plain_text_response": "echo: hi"}
        assert call(c, "fix_add", {"a": 2, "b": 3}) == {"plain_text_response": "5"}
        assert call(c, "fix_fail", {}) == {"error": "it failed"}
        assert call(c, "fix_notify", {}) == {"plain_text_response": "notified"}
        assert call(c, "quick_sleep", {"seconds": 1}) == {"error": "request timed out"}
        time.sleep(1)  # its late reply is then dropped: the next call gets its own
        assert call(c, "quick_echo", {"message": "after"}) == {"plain_text_response": "echo: after"}


def test_mcp_server_respawns_after_a_crash(agent):
    with agent.client() as c:
        assert call(c, "fix_crash", {}) == {"plain_text_response": "crashing"}
        assert call(c, "fix_echo", {"message": "again"}) == {"plain_text_response": "echo: again"}


def test_concurrent_mcp_calls_get_their_own_replies(agent):
    results = {}

    def one(i: int) -> None:
        with agent.client() as c:
            results[i] = call(c, "fix_echo", {"message": f"m{i}"})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: {"plain_text_response": f"echo: m{i}"} for i in range(8)}


def test_bad_mcp_command_leaves_the_server_up(agent):
    with agent.client() as c:
        assert c.get("/health").status_code == 200
        res = c.post("/tools", json={"tool": "bad_anything", "params": {}})
        assert res.status_code == 404 and "bad_anything" in res.json()["error"]["message"]


@pytest.mark.parametrize("body, status, text", [
    (b"{not json", 400, "not valid JSON"),
    ({"params": {}}, 400, "tool must be a string"),
    ({"tool": "read_file", "params": [1]}, 400, "params must be an object"),
    ({"tool": "read_file", "params": {"path": 7}}, 400, "params.path must be a string"),
    ({"tool": "read_file", "params": {}}, 400, "params.path is required"),
    ({"tool": "edit_file", "params": {"path": "x", "edits": "no"}}, 400, "params.edits must be an array"),
    ({"tool": "exec_shell_command", "params": {"command": "true", "timeout": 0}}, 400, "params.timeout"),
    ({"tool": "read_file", "params": {"path": "x"}, "stream": True}, 400, "does not support stream"),
    ({"tool": "read_file", "params": {"path": "x"}, "stream": "yes"}, 400, "stream must be a boolean"),
    ({"tool": "no_such_tool", "params": {}}, 404, "unknown tool"),
])
def test_bad_bodies(agent, body, status, text):
    with agent.client() as c:
        res = c.post("/tools", content=body) if isinstance(body, bytes) else c.post("/tools", json=body)
    assert res.status_code == status, res.text
    assert text in res.json()["error"]["message"]


@pytest.mark.parametrize("runtime, text", [
    ("fake:does-not-exist", "unknown tool runtime"),
    ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
    ("docker-container:--privileged", "invalid container id"),
])
def test_unsafe_runtimes_are_refused_never_run_on_the_host(agent, runtime, text):
    with agent.client() as c:
        res = c.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi"}},
                     headers={"x-tool-runtime": runtime})
    assert res.status_code == 400 and text in res.json()["error"]["message"]  # llama-server: 500


def test_cors_proxy_forwards_only_explicit_headers(agent):
    seen = {}

    class Capture(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.update({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"proxied")

        def log_message(self, *args):
            pass

    target = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    try:
        with agent.client() as c:
            res = c.get(f"/cors-proxy?url=http://127.0.0.1:{target.server_port}/x",
                        headers={"Cookie": "secret", "x-llama-server-proxy-header-accept": "text/plain"})
            assert res.status_code == 200 and res.text == "proxied"
            assert seen["accept"] == "text/plain" and "cookie" not in seen
            bad = c.get("/cors-proxy?url=file:///etc/passwd")
            assert bad.status_code == 400 and "url" in bad.json()["error"]["message"]
    finally:
        target.shutdown()
        target.server_close()


# -- without a server --------------------------------------------------------------------------------------------


def test_mcp_config_errors_name_the_source(tmp_path):
    with pytest.raises(McpConfigError, match="--mcp-servers-json"):
        load_mcp_servers(None, "not valid json")
    with pytest.raises(McpConfigError, match="failed to open MCP config file"):
        load_mcp_servers(str(tmp_path / "missing.json"), None)
    with pytest.raises(McpConfigError, match="timeout_ms"):
        parse_mcp_servers(mcp_json(a={"command": "x", "timeout_ms": -1}), "cfg")
    assert parse_mcp_servers(mcp_json(a={"args": []}), "cfg") == []  # no command: skipped
    path = tmp_path / "mcp.json"
    path.write_text(mcp_json(a={"command": "x"}))
    assert [s.name for s in load_mcp_servers(str(path), mcp_json(a={"command": "y"}, b={"command": "z"}))] == [
        "a", "b"]  # names unique across both sources: the file's first


def test_unknown_tool_flag_lists_the_tools():
    with pytest.raises(ValueError, match="unknown tool \"frobnicate\". available tools: read_file"):
        select_tools(["frobnicate"])
    assert [t.name for t in select_tools(["grep_search", "read_file"])] == ["read_file", "grep_search"]


def test_glob():
    assert glob_match("*.py", "a.py") and not glob_match("*.py", "d/a.py")
    assert glob_match("src/**/*.cpp", "src/a/b/c.cpp") and glob_match("[!a]x", "bx") and not glob_match("[a-c]x", "dx")
    assert path_glob_match("*.py", "deep/dir/a.py") and path_glob_match("dir/*.py", "deep/dir/a.py")
    assert not path_glob_match("/dir/*.py", "deep/dir/a.py")


def test_edit_fuzzy_match_keeps_untouched_lines():
    original = "keep  \n\u201cquoted\u201d line\t\nlast\n"
    assert apply_edits(original, [('"quoted" line', "plain")], "f") == "keep  \nplain\nlast\n"
    with pytest.raises(EditError, match="could not find edits\\[0\\]"):
        apply_edits(original, [("absent", "x")], "f")
    with pytest.raises(EditError, match="no changes made"):
        apply_edits(original, [("last", "last")], "f")

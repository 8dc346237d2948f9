"""llama-server's built-in tools for agents (llama.cpp's tools/server/server-tools.cpp: `server_tool_read_file`,
`server_tool_file_glob_search`, `server_tool_grep_search`, `server_tool_exec_shell_command`,
`server_tool_write_file`, `server_tool_edit_file`, `server_tool_get_info`, `glob_match`).

    tool = BUILTIN_TOOLS["read_file"]()
    await tool.invoke({"path": "notes.txt", "cwd": "/work"})     # {"plain_text_response": ...} or {"error": ...}

They read, write and run things with the server's privileges, so none is on unless `--tools` names it
(server/tools_http.py). A tool's failure is a result, {"error": message}, as llama-server's; a parameter of the
wrong type is a ToolParamError (400, naming the field). `params` carries the caller's "cwd", "runtime" and
"resp_type", which the HTTP layer takes from headers, never from the model.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
from collections.abc import Callable
from typing import Any

from llamactx.errors import LlamactxError
from llamactx.server.tools.file_edit import EditError, apply_edits
from llamactx.server.tools.isolates import make_tools_io
from llamactx.server.tools.path_glob import path_glob_match

READ_FILE_MAX = 16 * 1024  # SERVER_TOOL_READ_FILE_MAX_SIZE
READ_FILE_MAX_BASE64 = 32 << 20  # SERVER_TOOL_READ_FILE_MAX_SIZE_BASE64
FILE_SEARCH_MAX_RESULTS = 100  # SERVER_TOOL_FILE_SEARCH_MAX_RESULTS
GREP_MAX_RESULTS = 100  # SERVER_TOOL_GREP_SEARCH_MAX_RESULTS
GREP_MAX_FILE = 16 << 20  # a larger file is skipped by grep_search (llamactx's bound: files are read whole)
EXEC_MAX_OUTPUT = 16 * 1024  # SERVER_TOOL_EXEC_SHELL_COMMAND_MAX_OUTPUT_SIZE
EXEC_MAX_TIMEOUT_S = 60  # SERVER_TOOL_EXEC_SHELL_COMMAND_MAX_TIMEOUT
GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT_S = 4096, 5


class ToolParamError(LlamactxError, ValueError):
    """A tool parameter that is missing or of the wrong type: a 400 naming it."""


def _param(params: dict, name: str, kind: type, default: Any = ...) -> Any:
    value = params.get(name, default)
    if value is ...:
        raise ToolParamError(f"params.{name} is required")
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if value is not default and not ok:
        raise ToolParamError(f"params.{name} must be {_KIND_NAMES[kind]}, got {value!r}")
    return value


_KIND_NAMES = {str: "a string", int: "an integer", bool: "a boolean", list: "an array"}


class ToolStream:
    """Where a streaming tool pushes its output as it comes; `alive()` is False once the client has left."""

    def __init__(self, push: Callable[[str], None], alive: Callable[[], bool]):
        self.push, self.alive = push, alive


class ServerTool:
    """One tool: its OpenAI function definition and `invoke` (server_tool)."""

    name = display_name = description = ""
    permission_write = False
    support_stream = False
    uses_cwd = True
    parameters: dict = {}
    required: tuple[str, ...] = ()

    def definition(self) -> dict:
        params = {"type": "object", "properties": self.parameters}
        if self.required:
            params["required"] = list(self.required)
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": params}}

    def to_json(self) -> dict:
        """The entry of GET /tools (server_tool::to_json)."""
        return {"display_name": self.display_name, "tool": self.name, "type": "server",
                "permissions": {"write": self.permission_write}, "uses_cwd": self.uses_cwd,
                "definition": self.definition()}

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        raise NotImplementedError


def _io(params: dict):
    return make_tools_io(params.get("cwd", ""), params.get("runtime", ""))


def _prop(kind: str, description: str, **extra) -> dict:
    return {"type": kind, "description": description, **extra}


def split_lines(text: str) -> list[str]:
    """std::getline's lines: split on '\\n', no empty line after a final '\\n'."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


# -- the tools ------------------------------------------------------------------------------------------------


class ReadFile(ServerTool):
    name, display_name = "read_file", "Read file"
    description = ("Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, "
                   "each line is prefixed with its line number (e.g. \"1\u2192...\").")
    parameters = {"path": _prop("string", "Path to the file"),
                  "start_line": _prop("integer", "First line to read, 1-based (default: 1)"),
                  "end_line": _prop("integer", "Last line to read, 1-based inclusive (default: end of file)"),
                  "append_loc": _prop("boolean", "Prefix each line with its line number")}
    required = ("path",)

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        path = _param(params, "path", str)
        start, end = _param(params, "start_line", int, 1), _param(params, "end_line", int, -1)
        append_loc = _param(params, "append_loc", bool, False)
        io = _io(params)
        size = await io.file_size(path)
        if size is None:
            return {"error": f"cannot stat file: {path}"}
        if params.get("resp_type") == "base64":  # from the x-resp-type header: the model cannot ask for it
            if size > READ_FILE_MAX_BASE64:
                return {"error": f"file too large ({size} bytes, max {READ_FILE_MAX_BASE64})"}
            data = await io.read_file(path)
            if data is None:
                return {"error": f"failed to open file: {path}"}
            return {"base64": base64.b64encode(data).decode(), "size_bytes": len(data)}
        if size > READ_FILE_MAX and end == -1:
            return {"error": f"file too large ({size} bytes, max {READ_FILE_MAX}). Use start_line/end_line to read "
                             "a portion."}
        data = await io.read_file(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        return {"plain_text_response": _line_range(data.decode("utf-8", "replace"), start, end, append_loc)}


def _line_range(text: str, start: int, end: int, append_loc: bool) -> str:
    out, size = [], 0
    for lineno, line in enumerate(split_lines(text), 1):
        if lineno < start:
            continue
        if end != -1 and lineno > end:
            break
        piece = f"{lineno}\u2192{line}\n" if append_loc else line + "\n"
        if size + len(piece.encode()) > READ_FILE_MAX:
            out.append("[output truncated]")
            break
        out.append(piece)
        size += len(piece.encode())
    return "".join(out)


class FileGlobSearch(ServerTool):
    name, display_name = "file_glob_search", "File search"
    description = (
        "Recursively search for files matching a glob pattern under a directory. Automatically skips files "
        "ignored by .gitignore (when the directory is inside a git repo) and common junk directories (.git, "
        "node_modules, build, dist, etc.) otherwise. A pattern with no '/' (e.g. \"*.cpp\") matches the file's "
        "basename at any depth. A pattern containing '/' matches the full relative path; unless already anchored "
        "with \"**/\" or a leading '/', it is automatically prefixed with \"**/\". Use type=\"dir\" or \"all\" to "
        "also list directories; directory entries are suffixed with '/' in the output. Note: directory listings "
        "do not apply .gitignore filtering.")
    parameters = {
        "path": _prop("string", "Base directory to search in"),
        "include": _prop("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). "
                                   "Default: **"),
        "exclude": _prop("string", "Glob pattern for files to exclude"),
        "type": _prop("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
        "max_depth": _prop("integer", "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = "
                                      "direct children only)"),
        "limit": _prop("integer", f"Maximum number of results to return, capped at {FILE_SEARCH_MAX_RESULTS} "
                                  f"(default {FILE_SEARCH_MAX_RESULTS})")}
    required = ("path",)

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        io = _io(params)
        path = _param(params, "path", str)
        base = io.resolve(path)
        include, exclude = _param(params, "include", str, "**"), _param(params, "exclude", str, "")
        kind = _param(params, "type", str, "file")
        max_depth = max(0, _param(params, "max_depth", int, 0))
        limit = _param(params, "limit", int, FILE_SEARCH_MAX_RESULTS)
        if limit < 1:
            return {"error": f"invalid limit: {limit} (expected 1 or more)"}
        if kind not in ("file", "dir", "all"):
            return {"error": f"invalid type: {kind} (expected \"file\", \"dir\" or \"all\")"}
        listing = await io.list_entries(base, max_depth, kind)
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        matches = [(rel, is_dir) for rel, is_dir in listing.entries
                   if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]
        shown = matches[:min(limit, FILE_SEARCH_MAX_RESULTS)]
        text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
        text += f"\n---\nTotal matches: {len(matches)}\n"
        if len(matches) > len(shown):
            text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). Refine the glob pattern "
                     "to narrow the search.]\n")
        if listing.truncated:
            text += "[results truncated: time budget or unreadable directory]\n"
        # `entries` and `base` (absolute) are the same data for the web UI's picker
        return {"plain_text_response": text, "base": base,
                "entries": [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown]}


class GrepSearch(ServerTool):
    name, display_name = "grep_search", "Grep search"
    description = (
        "Search for a pattern in files under a path. Returns matching lines with file paths (and, unless "
        "searching a single file, paths relative to the given directory). Automatically skips files ignored by "
        ".gitignore (when the directory is inside a git repo) and common junk directories (.git, node_modules, "
        "build, dist, etc.) otherwise. include/exclude: a pattern with no '/' matches the basename at any depth; "
        "a pattern containing '/' matches the full relative path (auto-anchored with \"**/\" unless already "
        "anchored).")
    parameters = {
        "path": _prop("string", "File or directory to search in"),
        "pattern": _prop("string", "Pattern to search for (regular expression unless literal is true)"),
        "include": _prop("string", "Glob pattern to filter files (default: **)"),
        "exclude": _prop("string", "Glob pattern to exclude files"),
        "return_line_numbers": _prop("boolean", "If true, include line numbers in results"),
        "literal": _prop("boolean", "Treat pattern as a literal string instead of a regular expression (default: "
                                    "false)"),
        "ignore_case": _prop("boolean", "Case-insensitive search (default: false)"),
        "context_lines": _prop("integer", "Number of lines of context to show before and after each match "
                                          "(default: 0)")}
    required = ("path", "pattern")

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        path, source = _param(params, "path", str), _param(params, "pattern", str)
        include, exclude = _param(params, "include", str, "**"), _param(params, "exclude", str, "")
        show_num = _param(params, "return_line_numbers", bool, False)
        ctx = max(0, _param(params, "context_lines", int, 0))
        try:
            pattern = re.compile(re.escape(source) if _param(params, "literal", bool, False) else source,
                                 re.IGNORECASE if _param(params, "ignore_case", bool, False) else 0)
        except re.error as e:
            return {"error": f"invalid regex: {e}"}
        io = _io(params)
        files = await _grep_files(io, path, include, exclude)
        if isinstance(files, str):
            return {"error": files}
        out, total = [], 0
        for full, shown in files:
            size = await io.file_size(full)
            data = await io.read_file(full) if size is not None and size <= GREP_MAX_FILE else None
            if data is None:
                continue
            text, n = await asyncio.to_thread(_grep_text, data.decode("utf-8", "replace"), pattern, shown,
                                              show_num or ctx > 0, ctx, GREP_MAX_RESULTS - total)
            out.append(text)
            total += n
            if total >= GREP_MAX_RESULTS:
                break
        result = "".join(out) + f"\n---\nTotal matches: {total}\n"
        if total >= GREP_MAX_RESULTS:
            result += f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
        return {"plain_text_response": result}


async def _grep_files(io, path: str, include: str, exclude: str) -> list[tuple[str, str]] | str:
    """(absolute path, path shown) of every file to search, or the error message."""
    full = io.resolve(path)
    if await io.is_regular_file(full):
        return [(full, path)]
    if not await io.is_directory(full):
        return f"path does not exist: {path}"
    listing = await io.list_entries(full, 0, "file")
    if listing.err:
        return f"{listing.err}: {path}"
    return [(f"{full.rstrip('/')}/{rel}", rel) for rel, _ in listing.entries
            if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]


def _grep_text(text: str, pattern: re.Pattern, shown: str, show_num: bool, ctx: int, budget: int) -> tuple[str, int]:
    lines, out, n = split_lines(text), [], 0
    for i, line in enumerate(lines):
        if n >= budget:
            break
        if not pattern.search(line):
            continue
        for j in range(max(0, i - ctx), min(len(lines) - 1, i + ctx) + 1):
            mark = ":" if j == i else "-"
            out.append(f"{shown}{mark}{f'{j + 1}{mark}' if show_num else ''}{lines[j]}\n")
        if ctx > 0:
            out.append("--\n")
        n += 1
    return "".join(out), n


class ExecShellCommand(ServerTool):
    name, display_name = "exec_shell_command", "Execute shell command"
    description = "Execute a shell command and return its output (stdout and stderr combined)."
    permission_write = support_stream = True
    parameters = {
        "command": _prop("string", "Shell command to execute"),
        "timeout": _prop("integer", f"Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT_S})"),
        "max_output_size": _prop("integer", f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT})")}
    required = ("command",)

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        command = _param(params, "command", str)
        timeout = min(_param(params, "timeout", int, 10), EXEC_MAX_TIMEOUT_S)
        max_output = min(_param(params, "max_output_size", int, EXEC_MAX_OUTPUT), EXEC_MAX_OUTPUT)
        if timeout < 1:
            raise ToolParamError(f"params.timeout = {timeout} must be >= 1")
        if max_output < 0:
            raise ToolParamError(f"params.max_output_size = {max_output} must be >= 0")
        io = _io(params)
        on_chunk = None
        if stream is not None:
            def on_chunk(chunk: str) -> bool:
                stream.push(chunk)
                return stream.alive()
        res = await io.run(["sh", "-c", command], max_output, timeout, on_chunk)
        tail = f"\n[exit code: {res.exit_code}]" + (" [exit due to timed out]" if res.timed_out else "")
        if stream is not None:
            if stream.alive():
                stream.push(tail)
            return {}
        return {"plain_text_response": res.output + tail}


class WriteFile(ServerTool):
    name, display_name = "write_file", "Write file"
    description = ("Write content to a file, creating it (including parent directories) if it does not exist. "
                   "May use with edit_file for more complex edits.")
    permission_write = True
    parameters = {"path": _prop("string", "Path of the file to write"), "content": _prop("string", "Content to write")}
    required = ("path", "content")

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        path, content = _param(params, "path", str), _param(params, "content", str)
        data = content.encode("utf-8", "surrogateescape")
        if not await _io(params).write_file(path, data):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file written successfully", "path": path, "bytes": len(data)}


class EditFile(ServerTool):
    name, display_name = "edit_file", "Edit file"
    description = ("Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and "
                   "is matched against the original content, not incrementally. Merge nearby changes into one edit "
                   "instead of overlapping edits. Use write_file to replace the whole file.")
    permission_write = True
    parameters = {
        "path": _prop("string", "Path to the file to edit"),
        "edits": _prop("array", "One or more exact text replacements to apply", items={
            "type": "object", "required": ["old_text", "new_text"], "properties": {
                "old_text": _prop("string", "Exact text to find; must be unique in the file and must not overlap "
                                            "with other edits"),
                "new_text": _prop("string", "Text to replace old_text with")}})}
    required = ("path", "edits")

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        path, raw = _param(params, "path", str), _param(params, "edits", list)
        if not raw:
            return {"error": "\"edits\" must be a non-empty array"}
        edits = []
        for i, e in enumerate(raw):
            if not isinstance(e, dict):
                raise ToolParamError(f"params.edits[{i}] must be an object, got {e!r}")
            old, new = _param(e, "old_text", str), _param(e, "new_text", str)
            if not old:
                return {"error": f"edits[{i}].old_text must not be empty"}
            edits.append((old, new))
        io = _io(params)
        data = await io.read_file(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        try:
            content = apply_edits(data.decode("utf-8", "surrogateescape"), edits, path)
        except EditError as e:
            return {"error": str(e)}
        if not await io.write_file(path, content.encode("utf-8", "surrogateescape")):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


class GetInfo(ServerTool):
    name, display_name = "get_info", "Get Runtime Info"
    description = "Returns runtime info: the OS name/version and the current working directory"

    async def invoke(self, params: dict, stream: ToolStream | None = None) -> dict:
        io = _io(params)
        res = await io.run(["uname", "-a"], GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT_S)
        os_info = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
        cwd = params.get("cwd", "")
        if not cwd and not params.get("runtime"):
            cwd = os.getcwd()
        elif not cwd:
            pwd = await io.run(["pwd"], GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT_S)
            cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        return {"os": os_info, "cwd": cwd}


# llama-server's build_tools(), in its order: minimal i/o and shell tools only; anything else belongs in MCP
BUILTIN_TOOLS: dict[str, type[ServerTool]] = {t.name: t for t in (
    ReadFile, FileGlobSearch, GrepSearch, ExecShellCommand, WriteFile, EditFile, GetInfo)}

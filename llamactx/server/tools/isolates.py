"""Where the server tools read, write and run (llama.cpp's tools/server/server-tools.cpp: `tools_io`,
`tools_io_basic`, `tools_io_isolate`, `tools_io_container`, `tools_io_ssh`, `run_subprocess`, `make_tools_io`,
`container_runtime_spec`).

    io = make_tools_io(cwd="/work", runtime="")          # the host; "docker-container:<id>", "ssh:<host>": an isolate
    await io.read_file("notes.txt")                      # relative paths resolve against cwd
    await io.run(["sh", "-c", "ls"], max_output=16384, timeout_s=10)

A runtime names an isolate that every operation runs in as a command: a running container (`<engine> exec`)
or a host reached over ssh. A runtime this module does not know, or a container id / ssh target that would
reach the command line as an option, is refused (ToolRuntimeError): never a silent fallback to the host.
Every command runs in its own session, bounded in time and output, and its whole session is killed on timeout
or cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llamactx.errors import LlamactxError

GIT_LS_FILES_MAX_OUTPUT = 8 << 20  # SERVER_TOOL_GIT_LS_FILES_MAX_OUTPUT
LIST_ENTRIES_TIMEOUT_S = 15  # SERVER_TOOL_LIST_ENTRIES_TIMEOUT: one listing, git and walker together
ISOLATE_EXEC_TIMEOUT_S = 15  # SERVER_TOOL_ISOLATE_EXEC_TIMEOUT: the auxiliary commands of an isolate
ISOLATE_READ_FILE_MAX = 64 << 20  # SERVER_TOOL_ISOLATE_READ_FILE_MAX_SIZE
READ_CHUNK = 4096
# listed, never descended into: they can be enormous (SERVER_TOOL_JUNK_DIR_NAMES)
JUNK_DIR_NAMES = frozenset({".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build",
                            "target", ".cache", ".idea", ".vscode"})
ENGINES = ("docker", "podman")


class ToolRuntimeError(LlamactxError, ValueError):
    """A tool runtime that cannot be used (unknown scheme, an id or target that is not safe on a command line)."""


@dataclass(slots=True)
class ExecResult:
    output: str = ""
    exit_code: int = -1
    timed_out: bool = False


@dataclass(slots=True)
class ListResult:
    entries: list[tuple[str, bool]] = field(default_factory=list)  # ('/'-separated path relative to base, is_dir)
    err: str = ""  # set when base is not a directory
    truncated: bool = False  # the walk could not see everything (time budget, unreadable directory)


async def run_subprocess(args: list[str], max_output: int, timeout_s: float,
                         on_chunk: Callable[[str], bool] | None = None, combine_stderr: bool = True,
                         cwd: str | None = None, stdin_data: bytes | None = None) -> ExecResult:
    """Run `args` (no shell of ours), reading at most `max_output` bytes of its output (then "[output truncated]",
    still draining so the child never blocks). `on_chunk` gets each piece as it arrives; False from it stops the
    child. Past `timeout_s` the child's whole session is killed and `timed_out` set. A command that cannot be
    spawned is reported in `output` with exit code -1, as llama-server does."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT if combine_stderr else
            asyncio.subprocess.DEVNULL, cwd=cwd or None, start_new_session=True)
    except (OSError, ValueError):
        return ExecResult("failed to spawn process")
    res, out, truncated, stopped = ExecResult(), bytearray(), False, False
    deadline = time.monotonic() + timeout_s
    try:
        if stdin_data is not None:
            proc.stdin.write(stdin_data)
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(proc.stdin.drain(), max(0.0, deadline - time.monotonic()))
            proc.stdin.close()
        while True:
            try:
                chunk = await asyncio.wait_for(proc.stdout.read(READ_CHUNK), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                res.timed_out = True
                break
            if not chunk:
                break
            if truncated:
                continue
            keep = chunk[:max_output - len(out)]
            out += keep
            truncated = len(keep) < len(chunk)
            if on_chunk and keep and not on_chunk(keep.decode("utf-8", "replace")):
                stopped = True
                break
        if not (res.timed_out or stopped):
            try:  # its output is closed; the child itself still has until the deadline
                await asyncio.wait_for(proc.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                res.timed_out = True
    finally:  # timed out, stopped, cancelled (the client left) or failed: no child outlives its call
        res.exit_code = await _kill(proc)
    res.output = out.decode("utf-8", "replace") + ("\n[output truncated]" if truncated else "")
    return res


async def _kill(proc: asyncio.subprocess.Process) -> int:
    """Kill what is left of the child's session and reap it; its exit code. Bounded: a grandchild outside the
    session holding the pipes cannot stall it (asyncio's wait() also waits for the pipes to close)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # background jobs it left too
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return await asyncio.wait_for(proc.wait(), 2.0)
    except TimeoutError:
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()
        return proc.returncode if proc.returncode is not None else -1


def expand_home(path: str) -> str:
    """A leading "~" or "~/" is the home directory (llama.cpp's expand_home); "~user" is left as is."""
    if path == "~" or path.startswith(("~/", "~\\")):
        home = os.environ.get("HOME", "")
        return home + path[1:] if home else path
    return path


class HostIO:
    """The tools on this machine (tools_io_basic); `cwd` resolves relative paths and is run()'s directory."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        """Absolute and normalized ("." and ".." dropped) so they never reach git or the client."""
        p = expand_home(path)
        if not os.path.isabs(p):
            p = os.path.join(self.cwd or os.getcwd(), p)
        return os.path.normpath(p)

    async def is_directory(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    async def is_regular_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    async def file_size(self, path: str) -> int | None:
        try:
            return os.stat(self.resolve(path)).st_size
        except OSError:
            return None

    async def read_file(self, path: str) -> bytes | None:
        try:
            return await asyncio.to_thread(Path(self.resolve(path)).read_bytes)
        except OSError:
            return None

    async def write_file(self, path: str, content: bytes) -> bool:
        full = Path(self.resolve(path))

        def write() -> None:
            full.parent.mkdir(parents=True, exist_ok=True)
            full.write_bytes(content)

        try:
            await asyncio.to_thread(write)
            return True
        except OSError:
            return False

    async def list_entries(self, base: str, max_depth: int, kind: str) -> ListResult:
        """Entries under `base` (already absolute); kind "file", "dir" or "all"; max_depth 0 = unlimited. Files
        alone come from `git ls-files` where base is in a repository (so .gitignore applies), else the walker."""
        if not os.path.isdir(base):
            return ListResult(err="path does not exist or is not a directory")
        deadline = time.monotonic() + LIST_ENTRIES_TIMEOUT_S
        if kind == "file":
            res = await self.run(["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                                 GIT_LS_FILES_MAX_OUTPUT, LIST_ENTRIES_TIMEOUT_S)
            if res.exit_code == 0 and not res.timed_out:
                rels = [ln.rstrip("\r").replace("\\", "/") for ln in res.output.split("\n") if ln.strip()]
                return ListResult([(r, False) for r in rels if (max_depth <= 0 or entry_depth(r) <= max_depth)
                                   and os.path.isfile(os.path.join(base, r))])
        return await asyncio.to_thread(walk_entries, base, max_depth, kind, deadline)

    async def run(self, args: list[str], max_output: int, timeout_s: float,
                  on_chunk: Callable[[str], bool] | None = None) -> ExecResult:
        return await run_subprocess(args, max_output, timeout_s, on_chunk, cwd=self.cwd or None)


def entry_depth(rel: str) -> int:
    """Depth of a '/'-separated relative path: "a/b/c" is 3."""
    return 1 + rel.count("/")


def walk_entries(base: str, max_depth: int, kind: str, deadline: float) -> ListResult:
    """The walker (list_entries_fallback): depth-first, junk directories listed but never entered, links to
    directories never followed (one can point back at an ancestor)."""
    out = ListResult()
    stack: list[tuple[str, str, int]] = [(base, "", 0)]
    while stack:
        directory, rel_dir, depth = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            out.truncated = True
            continue
        below = []
        for entry in entries:
            if time.monotonic() >= deadline:
                out.truncated = True
                return out
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
            except OSError:
                continue
            if is_dir:
                if kind in ("dir", "all"):
                    out.entries.append((rel, True))
                if entry.name not in JUNK_DIR_NAMES and not entry.is_symlink() and (
                        max_depth <= 0 or depth + 1 < max_depth):
                    below.append((entry.path, rel, depth + 1))
            elif is_file and kind in ("file", "all"):
                out.entries.append((rel, False))
        stack.extend(reversed(below))
    return out


# -- isolates -----------------------------------------------------------------------------------------------------


class IsolateIO:
    """Every operation as a command inside an isolate with a POSIX userland (sh, cat, wc, mkdir, dirname, find,
    timeout): tools_io_isolate. Subclasses wrap a command into the host-side argv that runs it there."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        return path if not self.cwd or path.startswith("/") else f"{self.cwd}/{path}"

    async def _exec(self, inner: list[str], max_output: int, combine_stderr: bool = True) -> ExecResult:
        return await run_subprocess(self.build_argv(inner, False), max_output, ISOLATE_EXEC_TIMEOUT_S,
                                    combine_stderr=combine_stderr)

    async def _test(self, flag: str, path: str) -> bool:
        res = await self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", self.resolve(path)], 4096)
        return res.exit_code == 0 and not res.timed_out

    async def is_directory(self, path: str) -> bool:
        return await self._test("-d", path)

    async def is_regular_file(self, path: str) -> bool:
        return await self._test("-f", path)

    async def file_size(self, path: str) -> int | None:
        res = await self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        return int(res.output.strip()) if res.exit_code == 0 and res.output.strip().isdigit() else None

    async def read_file(self, path: str) -> bytes | None:
        res = await self._exec(["cat", "--", self.resolve(path)], ISOLATE_READ_FILE_MAX, combine_stderr=False)
        return res.output.encode() if res.exit_code == 0 and not res.timed_out else None

    async def write_file(self, path: str, content: bytes) -> bool:
        # the content travels on stdin: no argv for the far side to re-parse, no temporary file on the host
        argv = self.build_argv(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.resolve(path)],
                               True)
        res = await run_subprocess(argv, 4096, ISOLATE_EXEC_TIMEOUT_S, stdin_data=content)
        return res.exit_code == 0 and not res.timed_out

    async def list_entries(self, base: str, max_depth: int, kind: str) -> ListResult:
        base = self.resolve(base)
        if not await self.is_directory(base):
            return ListResult(err="path does not exist or is not a directory")
        if kind == "file":
            res = await self._exec(["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard', "_",
                                    base], GIT_LS_FILES_MAX_OUTPUT)
            if res.exit_code == 0 and not res.timed_out:
                return ListResult([(r, False) for r in _lines(res.output, False)
                                   if max_depth <= 0 or entry_depth(r) <= max_depth])
        out = ListResult()
        for dirs in ((True,) if kind == "dir" else (False,) if kind == "file" else (True, False)):
            res = await self._exec(["sh", "-c", _find_command(max_depth, dirs), "_", base], GIT_LS_FILES_MAX_OUTPUT)
            out.truncated |= res.timed_out
            out.entries += [(r, dirs) for r in _lines(res.output, True)]
        return out

    async def run(self, args: list[str], max_output: int, timeout_s: float,
                  on_chunk: Callable[[str], bool] | None = None) -> ExecResult:
        # an in-isolate `timeout`: killing the host-side client does not kill what runs in the isolate
        inner = ["timeout", f"{int(timeout_s)}s", *args]
        if self.cwd:
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return await run_subprocess(self.build_argv(inner, True), max_output, timeout_s + 5, on_chunk)


def _find_command(max_depth: int, dirs: bool) -> str:
    prune = " -o ".join(f"-name {n}" for n in sorted(JUNK_DIR_NAMES))
    cmd = 'cd "$1" && find . -mindepth 1' + (f" -maxdepth {max_depth}" if max_depth > 0 else "")
    return cmd + f" \\( {prune} \\) -prune" + (" -print -o -type d -print" if dirs else " -o -type f -print")


def _lines(text: str, strip_dot_slash: bool) -> list[str]:
    out = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if strip_dot_slash and line.startswith("./"):
            line = line[2:]
        if line:
            out.append(line.replace("\\", "/"))
    return out


class ContainerIO(IsolateIO):
    """A running container, through `<engine> exec` (docker and podman take the same verbs)."""

    def __init__(self, engine: str, container_id: str, cwd: str = ""):
        super().__init__(cwd)
        self.engine, self.container_id = engine, container_id

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container_id, *inner]


SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
               "-o", "StrictHostKeyChecking=yes"]  # no console: a prompt would hang the call


class SshIO(IsolateIO):
    """A remote POSIX host over ssh: remoting, not isolation (the tools can do what the account can)."""

    def __init__(self, target: str, cwd: str = ""):
        super().__init__(cwd)
        self.target = target

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        # the remote shell re-parses the command line, so `inner` travels as one quoted word
        return ["ssh", *SSH_OPTIONS, *([] if needs_stdin else ["-n"]), self.target, shell_quote_join(inner)]


def shell_quote_join(argv: list[str]) -> str:
    """One string a POSIX shell re-parses into exactly `argv`."""
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


_SSH_TARGET = re.compile(r"[A-Za-z0-9._@-]+")
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_container_spec(spec: str) -> tuple[str, str, bool] | None:
    """"<engine>-container:<id>" -> (engine, id, True); "<engine>:<image>" -> (engine, image, False); else None."""
    for engine in ENGINES:
        if spec.startswith(f"{engine}-container:"):
            return engine, spec[len(engine) + len("-container:"):], True
        if spec.startswith(f"{engine}:"):
            return engine, spec[len(engine) + 1:], False
    return None


def make_tools_io(cwd: str = "", runtime: str = "") -> HostIO | IsolateIO:
    """The IO for one tool call. Raises ToolRuntimeError for a runtime that is unknown, names an image instead
    of a running container, or carries an id / ssh target starting with '-' (it would become an option of
    `<engine> exec` or ssh, e.g. --privileged or -oProxyCommand=...)."""
    if not runtime:
        return HostIO(cwd)
    container = parse_container_spec(runtime)
    if container is not None:
        engine, arg, attach = container
        if not attach:
            raise ToolRuntimeError(f"tool runtime must name a running container: {runtime}")
        if not _CONTAINER_ID.fullmatch(arg):
            raise ToolRuntimeError(f"invalid container id: {arg}")
        return ContainerIO(engine, arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[len("ssh:"):]
        if not _SSH_TARGET.fullmatch(target) or target.startswith("-"):
            raise ToolRuntimeError(f"invalid ssh target: {target}")
        return SshIO(target, cwd)
    raise ToolRuntimeError(f"unknown tool runtime: {runtime}")

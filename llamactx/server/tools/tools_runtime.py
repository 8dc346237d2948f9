"""--tools-runtime: the isolate every tool call runs in unless a request names its own (llama.cpp's
tools/server/server-tools.cpp: `server_tools_runtime`, `server_tools_static_runtime`,
`server_tools_container_runtime`, `make_tools_runtime`).

    runtime = make_tools_runtime("docker:busybox")    # spawns a container now, stopped at close()
    await runtime.start(); await runtime.spec()       # "docker-container:<id>", for make_tools_io
    await runtime.close()

"<engine>:<image>" owns a container: `<engine> run --rm -i <image> sh`, whose shell blocks on its stdin, so the
container lives until that stdin is closed at shutdown (--rm then removes it), and is respawned if it dies.
Anything else ("docker-container:<id>", "ssh:<target>") names a target that exists already: it is only checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time

from llamactx.server.tools.isolates import ToolRuntimeError, make_tools_io, parse_container_spec

log = logging.getLogger("llamactx.server.tools")

CONTAINER_START_TIMEOUT_S = 10.0
CONTAINER_STOP_TIMEOUT_S = 10.0


class StaticRuntime:
    """A target with no lifecycle: the spec, checked once at start-up, passed straight through."""

    def __init__(self, spec: str):
        make_tools_io("", spec)  # ToolRuntimeError now rather than at every call
        self._spec = spec

    async def start(self) -> None:
        pass

    async def spec(self) -> str:
        return self._spec

    async def close(self) -> None:
        pass


class ContainerRuntime:
    """A container this server spawns for the tools and stops when it exits."""

    def __init__(self, engine: str, image: str):
        if not image:
            raise ToolRuntimeError(f"--tools-runtime {engine}:<image> requires an image name")
        self.engine, self.image = engine, image
        self.proc: asyncio.subprocess.Process | None = None
        self.container_id = ""
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Spawn the container; ToolRuntimeError when it cannot be or does not come up in time."""
        fd, cidfile = tempfile.mkstemp(prefix="llamactx-tools-runtime-cid-")
        os.close(fd)
        os.unlink(cidfile)  # the engine refuses to write a cidfile that exists
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        except OSError as e:
            raise ToolRuntimeError(f"failed to spawn {self.engine} container for tools runtime (image: "
                                   f"{self.image}): {e.strerror or e}") from None
        self.container_id = await _read_cid(cidfile, self.proc)
        if not self.container_id:
            await self.close()
            raise ToolRuntimeError(f"timed out waiting for {self.engine} container to start (image: {self.image})")
        log.info("tools runtime: %s container %s (image %s)", self.engine, self.container_id, self.image)

    async def spec(self) -> str:
        """The running container, respawned first if it died on its own."""
        async with self._lock:
            if self.proc is None or self.proc.returncode is not None:
                log.warning("%s tools runtime container %r died, respawning", self.engine, self.container_id)
                await self.start()
            return f"{self.engine}-container:{self.container_id}"

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(Exception):
            proc.stdin.close()  # the container's shell (its pid 1) reads EOF and exits; --rm removes it
        try:
            await asyncio.wait_for(proc.wait(), CONTAINER_STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()


async def _read_cid(cidfile: str, proc: asyncio.subprocess.Process) -> str:
    deadline = time.monotonic() + CONTAINER_START_TIMEOUT_S
    try:
        while time.monotonic() < deadline and proc.returncode is None:
            with contextlib.suppress(OSError):
                cid = open(cidfile, encoding="utf-8").read().strip()
                if cid:
                    return cid
            await asyncio.sleep(0.1)
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.unlink(cidfile)


def make_tools_runtime(spec: str) -> StaticRuntime | ContainerRuntime:
    """The runtime of --tools-runtime. Raises ToolRuntimeError for a spec make_tools_io refuses."""
    container = parse_container_spec(spec)
    if container is not None and not container[2]:
        return ContainerRuntime(container[0], container[1])
    return StaticRuntime(spec)

"""Router mode: one server, many models (llama-server's router: tools/server/server-models.cpp `server_models`,
the instances with their status and the --models-max LRU rule, and `server_models_routes`: /models, /models/load,
/models/unload, and every other route forwarded by the request's "model"; common/preset.cpp
`load_from_models_dir` and the INI presets of --models-preset).

llama-server runs each model as a child process and proxies HTTP to it. Here each model is a whole `create_app`
app in this process (its own ServerState: Runtime, engine thread, slots, caches) started and stopped through its
ASGI lifespan, and the router calls it with the request it has read: app.py knows nothing of the router. One
read-only Model per file is shared by every entry naming it (SharedModels), so two names for one file map it once.

    unloaded --a request / POST /models/load--> loading --> loaded --LRU / POST /models/unload--> unloaded
                                                   +--fails--> unloaded, failed (the error names the file)

At most --models-max models are resident (loading, loaded or unloading); a model that is needed when all are
resident takes the place of the least recently used one that serves no request, else it waits (in arrival order)
for one to go idle. Requests for a model that is loading wait for that one load.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamactx.api import protocol as P
from llamactx.embedded import resolve_model_path
from llamactx.model import Model
from llamactx.server.lifecycle import Phase

log = logging.getLogger("llamactx.server")

UNLOADED, LOADING, LOADED, UNLOADING = "unloaded", "loading", "loaded", "unloading"


def models_in_dir(models_dir: str | Path) -> dict[str, Path]:
    """llama-server's load_from_models_dir: each `NAME.gguf` is model NAME, each subdirectory NAME holding GGUF
    files is model NAME (its first shard, else its one model file; mmproj and draft companions are skipped).
    ValueError when the directory does not exist."""
    root = Path(models_dir)
    if not root.is_dir():
        raise ValueError(f"--models-dir {str(models_dir)!r} does not exist or is not a directory")
    out: dict[str, Path] = {}
    for path in sorted(root.iterdir()):
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.name.endswith(".gguf") and not _companion(p.name))
            first = [p for p in files if "-00001-of-" in p.name]
            if first or files:
                out[path.name] = (first or files)[-1 if not first else 0]
        elif path.name.endswith(".gguf") and not _companion(path.name):
            out[path.name.removesuffix(".gguf")] = path
    return out


def _companion(name: str) -> bool:
    return name.startswith("mmproj") or "draft" in name.lower()


def read_preset(path: str | Path) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """An INI preset file (--models-preset): ({global [*] options}, {section: options}); keys are flag names
    without dashes, as llama-server reads them. ValueError for a file that does not parse."""
    import configparser

    parser = configparser.ConfigParser(interpolation=None, default_section="\x00none", strict=False)
    parser.optionxform = str  # flag names keep their case
    try:
        parser.read_string("[\x00top]\n" + Path(path).read_text(encoding="utf-8"))
    except (OSError, configparser.Error) as e:
        raise ValueError(f"--models-preset {str(path)!r}: {e}") from None
    sections = {s: dict(parser[s]) for s in parser.sections() if s not in ("\x00top", "*")}
    return (dict(parser["*"]) if parser.has_section("*") else {}), sections


class SharedModels:
    """One Model per resolved file, shared by every router entry that names it while any holds it (weak
    references: the last entry unloaded frees the mapping)."""

    def __init__(self):
        self._models: weakref.WeakValueDictionary[Path, Model] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def get(self, model: str | None) -> Model:
        path = resolve_model_path(model).resolve()
        with self._lock:  # two entries of one file loading at once map it once
            found = self._models.get(path)
            if found is None:
                found = self._models[path] = Model.load(path)
            return found


@dataclass(slots=True)
class ModelSpec:
    """One model the router can serve: its name, file, and the config its app is built from."""

    name: str
    path: Path
    config: Any  # ServerConfig
    aliases: list[str] = field(default_factory=list)
    source: str = "models_dir"  # or "preset" (llama-server's server_model_source)
    preset: dict[str, str] = field(default_factory=dict)
    load_on_startup: bool = False


class RouterError(P.ProtocolError):
    """A routing failure, in llama-server's error format."""


class ModelEntry:
    """A model's place in the router: its status, its app while resident, and the requests it serves."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.status = UNLOADED
        self.app = self.lifespan = None
        self.error: str | None = None
        self.n_active = 0
        self.t_used = 0.0

    @property
    def state(self):
        """The model's ServerState while it is resident, else None."""
        return None if self.app is None else self.app.state.llamactx

    @property
    def resident(self) -> bool:
        return self.status in (LOADING, LOADED, UNLOADING)

    def status_json(self) -> dict[str, Any]:
        """/models' "status" of the model, as llama-server's get_router_models writes it."""
        value = self.status
        state = self.state
        if value == LOADED and state is not None and state.lifecycle.phase is Phase.SLEEPING:
            value = "sleeping"
        out: dict[str, Any] = {"value": LOADED if value == UNLOADING else value, "args": ["-m", str(self.spec.path)]}
        if self.spec.preset:
            out["preset"] = "".join(f"{k} = {v}\n" for k, v in self.spec.preset.items())
        if self.error is not None:
            out.update(failed=True, exit_code=1, error=self.error)
        return out


class ModelRouter:
    """The entries, the --models-max rule and the loads; runs on the server's event loop. `build_app(spec)`
    makes a model's app (app.py's create_app for its config)."""

    def __init__(self, specs: list[ModelSpec], models_max: int, autoload: bool, build_app: Callable,
                 debug_delay_s: float = 0.0):
        self.entries = {s.name: ModelEntry(s) for s in specs}
        # LLAMA_SERVER_DEBUG_FAKE_TIMING (llama-server's test knob): every load and every forwarded request
        # waits this long first, a request counted on its model meanwhile, so the suite can catch models busy
        self.debug_delay_s = debug_delay_s
        self.models_max, self.autoload = models_max, autoload
        self._build_app = build_app
        self._names = {a: s.name for s in specs for a in (s.name, *s.aliases)}
        self._cond: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def cond(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def names(self) -> list[str]:
        """Every name a request may give: the models' names and their aliases."""
        return list(self._names)

    def entry(self, name: Any) -> ModelEntry:
        """The entry `name` (a model's name or alias) means; RouterError (400) as llama-server's
        router_validate_model."""
        if not isinstance(name, str) or not name:
            raise RouterError("model name is missing from the request")
        if name not in self._names:
            raise RouterError(f"model '{name}' not found; this server has: {', '.join(self.entries)}")
        return self.entries[self._names[name]]

    # -- using a model -------------------------------------------------------------------------------------------

    async def acquire(self, entry: ModelEntry) -> None:
        """Wait until `entry` is loaded (loading it, and unloading the least recently used idle model for room,
        when needed) and count a request on it. RouterError (503) naming the file when it fails to load."""
        attempted = False
        async with self.cond:
            while True:
                if entry.status == LOADED:
                    entry.n_active += 1
                    entry.t_used = time.monotonic()
                    return
                if entry.status == UNLOADED and entry.error is not None and attempted:
                    raise RouterError(f"model '{entry.spec.name}' failed to load: {entry.error}", 503,
                                      "unavailable_error")
                if entry.status == UNLOADED:
                    victim = self._room_for(entry)
                    if victim is not False:
                        attempted = True
                        entry.status, entry.error = LOADING, None
                        self._spawn(self._load(entry, victim))
                elif entry.status == LOADING:
                    attempted = True
                await self.cond.wait()

    async def release(self, entry: ModelEntry) -> None:
        async with self.cond:
            entry.n_active -= 1
            entry.t_used = time.monotonic()
            self.cond.notify_all()

    def _room_for(self, entry: ModelEntry):
        """None when there is room, the idle least recently used model to unload for it, or False (wait)."""
        resident = [e for e in self.entries.values() if e.resident]
        if self.models_max <= 0 or len(resident) < self.models_max:
            return None
        idle = [e for e in resident if e.status == LOADED and e.n_active == 0]
        if not idle:
            return False
        victim = min(idle, key=lambda e: e.t_used)
        victim.status = UNLOADING
        return victim

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- loading and unloading -----------------------------------------------------------------------------------

    async def _load(self, entry: ModelEntry, victim: ModelEntry | None) -> None:
        await asyncio.sleep(self.debug_delay_s)
        if victim is not None:
            log.info("models-max %d reached: unloading %s (least recently used)", self.models_max, victim.spec.name)
            await self._stop(victim)
        log.info("loading model %s from %s", entry.spec.name, entry.spec.path)
        error = None
        try:
            app = self._build_app(entry.spec)
            lifespan = await Lifespan.start(app)
            error = app.state.llamactx.load_error
            if error is not None:
                await lifespan.stop()
        except Exception as e:  # noqa: BLE001 (the model fails, the others keep serving)
            error = f"{type(e).__name__}: {e}"
        async with self.cond:
            if error is None:
                entry.app, entry.lifespan, entry.status = app, lifespan, LOADED
                entry.t_used = time.monotonic()
            else:
                entry.status, entry.error = UNLOADED, f"{entry.spec.path}: {error}"
                log.error("model %s failed to load: %s", entry.spec.name, entry.error)
            self.cond.notify_all()

    async def _stop(self, entry: ModelEntry) -> None:
        """Stop `entry`'s app once it serves no request (it is UNLOADING: no new request takes it)."""
        async with self.cond:
            await self.cond.wait_for(lambda: entry.n_active == 0)
        lifespan = entry.lifespan
        await lifespan.stop()
        async with self.cond:
            entry.app = entry.lifespan = None
            entry.status = UNLOADED
            self.cond.notify_all()
        await asyncio.to_thread(gc.collect)  # the engine's KV cells and, with no other name for it, the mapping
        log.info("unloaded model %s", entry.spec.name)

    async def load(self, entry: ModelEntry) -> None:
        """POST /models/load: load in the background (RouterError if it is already running)."""
        if entry.status != UNLOADED:
            raise RouterError("model is already running")
        entry.error = None

        async def ensure():
            try:
                await self.acquire(entry)
            except RouterError:
                return
            await self.release(entry)

        self._spawn(ensure())
        await asyncio.sleep(0)  # the load has started (or queued) when the answer goes out

    async def unload(self, entry: ModelEntry) -> None:
        """POST /models/unload: unload once its requests are answered (RouterError if it is not running)."""
        async with self.cond:
            if entry.status != LOADED:
                raise RouterError("model is not running")
            entry.status = UNLOADING
        self._spawn(self._stop(entry))
        await asyncio.sleep(0)

    async def update(self, specs: list[ModelSpec]) -> None:
        """GET /models?reload=1: the models read again. New names are added, a model no longer listed is
        dropped once it is not resident (a resident one stays until unloaded), an unloaded one takes its new
        spec."""
        async with self.cond:
            given = {s.name: s for s in specs}
            for name in [n for n, e in self.entries.items() if n not in given and not e.resident]:
                del self.entries[name]
            for name, spec in given.items():
                entry = self.entries.get(name)
                if entry is None:
                    self.entries[name] = ModelEntry(spec)
                elif not entry.resident:
                    entry.spec = spec
            self._names = {a: e.spec.name for e in self.entries.values() for a in (e.spec.name, *e.spec.aliases)}

    async def start(self) -> None:
        """The presets' load-on-startup models."""
        for entry in self.entries.values():
            if entry.spec.load_on_startup:
                await self.load(entry)

    async def close(self) -> None:
        """Stop every resident model (server shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        for entry in self.entries.values():
            if entry.lifespan is not None:
                await entry.lifespan.stop()
                entry.app = entry.lifespan = None
                entry.status = UNLOADED


class Lifespan:
    """Drives an ASGI app's lifespan protocol: `start` runs its startup (for a model's app: the load, off the
    event loop), `stop` its shutdown (the engine thread stopped)."""

    def __init__(self, app):
        self._to_app: asyncio.Queue = asyncio.Queue()
        self._from_app: asyncio.Queue = asyncio.Queue()
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self._task = asyncio.get_running_loop().create_task(app(scope, self._to_app.get, self._from_app.put))

    @classmethod
    async def start(cls, app) -> Lifespan:
        life = cls(app)
        await life._to_app.put({"type": "lifespan.startup"})
        msg = await life._from_app.get()
        if msg["type"] != "lifespan.startup.complete":
            raise RuntimeError(msg.get("message") or "the model's app failed to start")
        return life

    async def stop(self) -> None:
        await self._to_app.put({"type": "lifespan.shutdown"})
        await self._from_app.get()
        await self._task


def body_model(method: str, query: dict[str, str], body: bytes) -> Any:
    """The model a request names: its JSON body's "model" (Ollama's older "name"), or for GET / DELETE the
    `model` query parameter (llama-server's proxy_get / proxy_post)."""
    if method in ("GET", "DELETE", "HEAD") or not body.strip():
        return query.get("model")
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RouterError("request body is not valid JSON") from None
    if not isinstance(parsed, dict):
        return query.get("model")
    return parsed.get("model") or parsed.get("name") or query.get("model")

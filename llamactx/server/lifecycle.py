"""The model's life in the server: loading, ready, asleep (llama-server's --sleep-idle-seconds: server-queue.cpp
`start_loop`'s sleeping state and `wait_until_no_sleep`, server-context.cpp `handle_sleeping_state`, and
server_routes' `update_cached_responses`, which runs on entering and leaving it).

    LOADING --loaded--> READY --idle for N s--> SLEEPING --a request that needs the model--> READY
       |                                           (the model, engine and their memory freed; reloaded on waking)
       +--fails--> FAILED

A request that needs the model `hold`s it from before its handler runs until its response is sent (a stream
included): holding wakes a sleeping server first, and a held model never goes to sleep. The read-only routes
(/health, /props, /models, /metrics) hold nothing and answer from what was cached on entering sleep, so they never
wake it. The idle clock restarts whenever a hold ends, and while the engine still works with nobody holding (a
resumable stream whose client left). Transitions run under one lock, so a wake-up and a fall into sleep never
interleave; the sleep callbacks run before the unload and, in reverse order, after the reload, as llama-server's.

Ollama's `keep_alive` (server/ollama_routes.py) sets the idle time per request: the request's release says how long
the model stays loaded after it (0: unload now, < 0: never), until a later request says otherwise; a request
without one goes back to --sleep-idle-seconds. So every request holds the model, sleeping on or not.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("llamactx.server")

POLL_S = 0.1  # how often the idle clock is read


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    SLEEPING = "sleeping"
    FAILED = "failed"


class Lifecycle:
    """The state machine above. `load()` builds the model (True when it worked), `unload()` frees it, `busy()`
    says whether the engine still has work; `idle_s` < 0 never sleeps (llama-server's default, -1)."""

    def __init__(self, load: Callable[[], bool], unload: Callable[[], None], busy: Callable[[], bool],
                 idle_s: float = -1):
        self._load, self._unload, self._busy = load, unload, busy
        self.idle_s = idle_s
        self._sleep_after = idle_s  # idle seconds before sleeping (< 0: never): idle_s, or the last keep_alive
        self.phase = Phase.LOADING
        self._lock = threading.Lock()
        self._n_held = 0
        self._t_idle = time.monotonic()
        self._callbacks: list[Callable[[bool], None]] = []
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    @property
    def can_sleep(self) -> bool:
        return self.idle_s >= 0

    @property
    def is_sleeping(self) -> bool:
        return self.phase is Phase.SLEEPING

    def on_sleeping_state(self, fn: Callable[[bool], None]) -> None:
        """Call `fn(True)` right before the model is freed, `fn(False)` right after it is back."""
        self._callbacks.append(fn)

    def start(self) -> None:
        """Load the model (in the calling thread: the server's loader) and, with sleeping on, watch the idle
        clock."""
        ok = self._load()
        with self._lock:
            self.phase = Phase.READY if ok else Phase.FAILED
            self._t_idle = time.monotonic()
        if ok and self.can_sleep:
            self._start_watch()

    def _start_watch(self) -> None:
        self._watch = threading.Thread(target=self._watch_idle, name="llamactx-sleep", daemon=True)
        self._watch.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=10)

    def hold(self) -> None:
        """Keep the model loaded until `release`; wakes it first if it sleeps (blocking while it reloads: call it
        off the event loop)."""
        with self._lock:
            self._n_held += 1
            if self.phase is Phase.SLEEPING:
                self._wake()

    def try_hold(self) -> bool:
        """`hold` without blocking: False when the model sleeps or a transition is under way."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.phase is Phase.SLEEPING:
                return False
            self._n_held += 1
            return True
        finally:
            self._lock.release()

    def release(self, keep_alive: float | None = None) -> None:
        """End a hold. `keep_alive` (Ollama's, in seconds; 0: unload now, < 0: never) is how long the model stays
        loaded once idle, until a later release says otherwise; None: --sleep-idle-seconds."""
        with self._lock:
            self._n_held -= 1
            self._t_idle = time.monotonic()
            self._sleep_after = self.idle_s if keep_alive is None else keep_alive
            start = self._sleep_after >= 0 and self._watch is None and not self._stop.is_set()
        if start:
            self._start_watch()

    def expires_in(self) -> float | None:
        """Seconds until the model sleeps if no request comes (counted from now while requests hold it); None:
        never."""
        with self._lock:
            if self._sleep_after < 0:
                return None
            idle = 0.0 if self._n_held else time.monotonic() - self._t_idle
            return max(self._sleep_after - idle, 0.0)

    # -- the transitions (under the lock) -------------------------------------------------------------------------

    def _watch_idle(self) -> None:
        while not self._stop.wait(POLL_S):
            with self._lock:
                if self.phase is not Phase.READY or self._n_held:
                    continue
                if self._busy():
                    self._t_idle = time.monotonic()
                elif self._sleep_after >= 0 and time.monotonic() - self._t_idle >= self._sleep_after:
                    self._sleep()

    def _sleep(self) -> None:
        log.info("entering sleeping state: the model is unloaded until the next request")
        for fn in self._callbacks:
            fn(True)
        self.phase = Phase.SLEEPING  # before the unload: from now on the read-only routes answer from the cache
        self._unload()

    def _wake(self) -> None:
        log.info("exiting sleeping state: reloading the model")
        if not self._load():
            self.phase = Phase.FAILED  # every route answers 503 with the reason (llama-server aborts instead)
            return
        self.phase = Phase.READY
        for fn in reversed(self._callbacks):
            fn(False)
        self._t_idle = time.monotonic()


class HoldModel:
    """ASGI middleware: a request to any route but `free` ones (exact paths, or prefixes ending in "/" other than
    the root) holds the model for as long as its response takes (llama-server's create_response without
    bypass_sleep). A handler may leave a keep_alive for the release in scope["llamactx.keep_alive"]; the time
    spent waiting for the model to load is left in scope["llamactx.load_s"]."""

    def __init__(self, app, lifecycle: Lifecycle, free: tuple[str, ...]):
        self.app, self.lifecycle, self.free = app, lifecycle, free

    async def __call__(self, scope, receive, send):
        lc = self.lifecycle
        if scope["type"] != "http" or self._is_free(scope["path"]):
            return await self.app(scope, receive, send)
        if not lc.try_hold():
            t0 = time.monotonic()
            await asyncio.to_thread(lc.hold)  # a reload takes seconds: off the event loop
            scope["llamactx.load_s"] = time.monotonic() - t0
        try:
            await self.app(scope, receive, send)
        finally:
            lc.release(scope.get("llamactx.keep_alive"))

    def _is_free(self, path: str) -> bool:
        return any(path == f or (len(f) > 1 and f.endswith("/") and path.startswith(f)) for f in self.free)

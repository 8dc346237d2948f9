"""The engine's own thread: the only thread that touches the Context (llama-server's `server_queue` /
`server_response` around `update_slots`).

HTTP handlers never call the engine. They `submit` requests and `cancel` them; both travel to the engine thread
through a queue, which it drains between steps. Each step's output goes back to the handler's asyncio queue with
`call_soon_threadsafe`. Short work that must run beside the engine (slot files, /slots) goes through `call`;
long work (embeddings) through `run`, as a `Job` of slices that shares the engine thread with generation: after
each generation step, jobs get as much time as that step took (at least one slice), round-robin, so a stream
waits at most one step's worth of other work (llama-server batches embedding tasks with generation).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from llamactx.engine import Chunk, Engine, Limits, RequestOptions, Sequence
from llamactx.errors import LlamactxError
from llamactx.sampling import SamplerChain

log = logging.getLogger("llamactx.server")


@dataclass(eq=False)
class Request:
    """One sequence submitted by a handler: its events arrive on `events` (which several requests of one HTTP
    request may share) as (index, chunks, finished), or (index, exception, True) if the engine refused it."""

    prompt: list[int]
    sampler: SamplerChain
    limits: Limits
    options: RequestOptions
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    index: int = 0
    seq: Sequence | None = None
    deadline: float = float("inf")

    def _post(self, payload, finished: bool) -> None:
        _post_all([(self, payload, finished)])


def _post_all(posts: list[tuple[Request, Any, bool]]) -> None:
    """Hand (request, payload, finished) events to their handlers: one wake-up per event loop (a step's eight
    streams cost one write to the loop's self-pipe, not eight), in order."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for req, payload, finished in posts:
        by_loop.setdefault(req.loop, []).append((req.events, (req.index, payload, finished)))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # the event loop has closed (server shutdown): nobody is listening
            pass


def _put_all(items: list[tuple[asyncio.Queue, tuple]]) -> None:
    for events, item in items:
        events.put_nowait(item)


class Job:
    """Long work on the engine thread in slices: `slices(engine)` is a generator that yields after each slice and
    returns the result. `future` gets the result (or the exception); `cancel()` (any thread) drops the job at its
    next slice (the client went away)."""

    def __init__(self, slices: Callable[[Engine], Iterator[Any]]):
        self.slices = slices
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.cancelled = False
        self._gen: Iterator[Any] | None = None

    def cancel(self) -> None:
        self.cancelled = True

    def advance(self, engine: Engine) -> bool:
        """Run one slice; True when the job is over (done, failed or cancelled)."""
        if self.cancelled:
            if self._gen is not None:
                self._gen.close()
            if not self.future.cancel():  # already running: whoever still waits hears it was cancelled
                self.future.set_exception(concurrent.futures.CancelledError())
            return True
        try:
            if self._gen is None:
                self.future.set_running_or_notify_cancel()
                self._gen = self.slices(engine)
            next(self._gen)
        except StopIteration as stop:
            self.future.set_result(stop.value)
            return True
        except Exception as e:  # noqa: BLE001 - handed to the caller (an EmbeddingError is the user's 400)
            self.future.set_exception(e)
            return True
        return False


JOB_SLICE_S = 0.05  # with no generation running, jobs run this long before the worker looks at its queue again


class QueueFull(LlamactxError, RuntimeError):
    """More requests are in flight than the slots plus --max-queue (the handler answers 503)."""


class EngineWorker:
    """Runs `engine` in a daemon thread. `max_in_flight` bounds submitted, unfinished requests."""

    def __init__(self, engine: Engine, max_in_flight: int, timeout: float = 0.0, prompt_cache=None):
        self.engine = engine
        self.prompt_cache = prompt_cache  # --cache-ram: the server chooses slots and keeps prompts in RAM
        self.max_in_flight = max_in_flight
        self.timeout = timeout
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[Sequence, Request] = {}
        self._jobs: deque[Job] = deque()
        self._in_flight = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llamactx-engine", daemon=True)
        self.t_last_step = 0.0

    # -- handler side (any thread) ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._commands.put(("wake", None))
        self._thread.join(timeout=10)

    def submit(self, req: Request) -> None:
        """Queue `req` for the engine; raises QueueFull past the bound (the handler answers 503)."""
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                raise QueueFull(f"{self._in_flight} requests are in flight (slots + --max-queue = "
                                f"{self.max_in_flight})")
            self._in_flight += 1
        if self.timeout > 0:
            req.deadline = time.monotonic() + self.timeout
        self._commands.put(("add", req))

    def cancel(self, req: Request) -> None:
        """Stop `req` at the next step (a client went away): it is never decoded further."""
        self._commands.put(("abort", req))

    def call(self, fn: Callable[[Engine], Any]) -> concurrent.futures.Future:
        """Run `fn(engine)` on the engine thread between two steps."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("call", (fn, fut)))
        return fut

    @property
    def busy(self) -> bool:
        """Requests in flight or jobs queued: the engine has work, whoever waits for it."""
        return self._in_flight > 0 or bool(self._jobs)

    @property
    def n_jobs(self) -> int:
        """Jobs queued or running on the engine thread."""
        return len(self._jobs)

    def run(self, job: Job) -> Job:
        """Queue a long job (see Job); await `job.future` for its result."""
        self._commands.put(("job", job))
        return job

    # -- engine thread --------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not (self.engine.has_work or self._jobs))
            if self._stop.is_set():
                break
            t_step = JOB_SLICE_S
            if self.engine.has_work:
                t0 = time.monotonic()
                self._step()
                t_step = time.monotonic() - t0
            if self._jobs:
                self._run_jobs(t_step)
        for job in self._jobs:
            job.cancel()
            job.advance(self.engine)

    def _step(self) -> None:
        self._expire()
        try:
            outputs = self.engine.step()
        except Exception:  # a bug, not a user's input: fail the running requests, keep serving
            log.exception("engine step failed")
            self._fail_all("internal error in the engine step")
            return
        self.t_last_step = time.monotonic()
        if self.prompt_cache is not None:
            self.prompt_cache.stepped()
        posts: list[tuple[Request, Any, bool]] = []
        for out in outputs:
            self._deliver(out.seq, out.chunks, posts)
        _post_all(posts)

    def _run_jobs(self, budget_s: float) -> None:
        """Slices of the queued jobs, round-robin, for about `budget_s` (at least one slice)."""
        t0 = time.monotonic()
        while self._jobs:
            if self._jobs[0].advance(self.engine):
                self._jobs.popleft()
            else:
                self._jobs.rotate(-1)
            if time.monotonic() - t0 >= budget_s:
                return

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, arg) -> None:
        if kind == "add":
            self._add(arg)
        elif kind == "abort":
            if arg.seq is not None and arg.seq in self._live:
                self._deliver(arg.seq, self.engine.abort(arg.seq))
        elif kind == "job":
            self._jobs.append(arg)
        elif kind == "call":
            fn, fut = arg
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.engine))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

    def _add(self, req: Request) -> None:
        try:
            if self.prompt_cache is not None and req.options.cache_prompt:
                id_slot = self.prompt_cache.launch(self.engine, req.prompt, req.options.id_slot)
                req.options = replace(req.options, id_slot=id_slot)
            req.seq = self.engine.add_request(req.prompt, req.sampler, req.limits, req.options)
        except Exception as e:  # noqa: BLE001 - reported to the handler, which answers 400
            self._done()
            req._post(e, True)
            return
        self._live[req.seq] = req

    def _deliver(self, seq: Sequence, chunks: list[Chunk], posts: list | None = None) -> None:
        """Send `seq`'s chunks to its handler, now or (`posts`) with the rest of the step's."""
        req = self._live.get(seq)
        if req is None:
            return
        if seq.is_finished:
            del self._live[seq]
            self._done()
        if posts is None:
            req._post(chunks, seq.is_finished)
        else:
            posts.append((req, chunks, seq.is_finished))

    def _expire(self) -> None:
        now = time.monotonic()
        for seq, req in list(self._live.items()):
            if req.deadline < now:
                chunks = self.engine.abort(seq, "length")  # the client gets what was generated before the deadline
                self._deliver(seq, chunks)

    def _fail_all(self, message: str) -> None:
        for seq in list(self._live):
            seq.error, seq.error_internal = message, True
            self.engine.abort(seq, "error")
            self._deliver(seq, [])

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1

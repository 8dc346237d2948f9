"""One engine replica: a Ray Serve replica (one process) running the single-process server's Starlette app
(server/app.py: its own mmap of the model, its engine thread, slots, caches and, with the session tier's flags,
its view of the shared disk tier), reached only through the ingress (ingress.py), never by Ray's HTTP proxy.

    forward(req)     a ForwardedRequest run by the app; streams its response messages (forward.py)
    call(req, only)  the same run to its end -> (replica id, status, body), or None on a replica other than `only`
                     (the ingress's fan-out routes: /slots, POST /lora-adapters)
    health()         this replica's /health, with its id and pid (the ingress's /health lists every replica)
    metrics_rows()   its /metrics rows (the ingress's /metrics adds them up, and lists each)
    check_health()   Ray Serve's health check: a replica whose model failed to load (a wake from
                     --sleep-idle-seconds included) is restarted by the controller
    record_routing_stats()   Ray Serve's routing stats: {"held": the prefix keys of every history this replica
                     holds (its slots, its session tier's RAM, its --cache-ram), "at": when}, which the router
                     reconciles its table with (router.py, affinity.py)

Its responses carry `X-Llamactx-Replica: <replica id>`. The model is loaded before the constructor returns, so
Ray routes nothing to a replica that is still loading.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from ray import serve

from llamactx.api import protocol as P
from llamactx.cluster.affinity import history_bytes, prefix_keys
from llamactx.cluster.forward import ForwardedRequest, relay
from llamactx.cluster.loopback import keep_replica_grpc_on_loopback
from llamactx.server.metrics import Snapshot

log = logging.getLogger("llamactx.cluster")

REPLICA_HEADER = b"x-llamactx-replica"


class EngineReplica:
    """The deployment's class; `config`: the ServerConfig every replica runs (launch.replica_config)."""

    async def __init__(self, config):
        from llamactx.server.app import create_app

        keep_replica_grpc_on_loopback()
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.app = create_app(config, load_in_background=False)
        self.state = self.app.state.llamactx
        self._keys: dict[tuple[int, ...], tuple[int, ...]] = {}  # a history's tokens -> its prefix keys
        lifespan = self.app.router.lifespan_context(self.app)
        await lifespan.__aenter__()  # loads the model (in its thread) and starts the engine thread
        self._lifespan = lifespan  # only now: a replica stopped while loading has nothing to exit
        if self.state.load_error:
            raise RuntimeError(f"replica {self.replica_id}: {self.state.load_error}")
        log.info("replica %s (pid %d) ready", self.replica_id, os.getpid())

    async def forward(self, req: ForwardedRequest):
        async for message in relay(self.app, req, [(REPLICA_HEADER, self.replica_id.encode())]):
            yield message

    async def call(self, req: ForwardedRequest, only: str | None = None) -> tuple[str, int, bytes] | None:
        if only is not None and only != self.replica_id:
            return None
        status, body = 500, []
        async for kind, *fields in relay(self.app, req):
            if kind == "start":
                status = fields[0]
            else:
                body.append(fields[0])
        return self.replica_id, status, b"".join(body)

    async def health(self) -> dict:
        """{"replica", "pid", "status"}: "ok", or llama-server's error message (loading, failed)."""
        try:
            self.state.check_ready()
        except P.ProtocolError as e:
            return {"replica": self.replica_id, "pid": os.getpid(), "status": "error", "error": e.body()["error"]}
        return {"replica": self.replica_id, "pid": os.getpid(), "status": "ok"}

    async def metrics_rows(self) -> tuple[str, list[tuple[str, str, str, float]]]:
        """(replica id, server/metrics.collect's rows); no rows while the model sleeps (--sleep-idle-seconds)."""
        engine = self.state.engine
        return self.replica_id, ([] if engine is None else self.state.metrics.rows(Snapshot.of(engine)))

    def check_health(self) -> None:
        if self.state.load_error:
            raise RuntimeError(f"the model could not be loaded: {self.state.load_error}")

    async def record_routing_stats(self) -> dict:
        """{"held": the prefix keys of every history held now, "at": time.time() before they were read}; none while
        the model sleeps."""
        at, worker = time.time(), self.state.worker
        if worker is None:
            return {"held": [], "at": at}
        histories = await asyncio.wrap_future(worker.call(lambda engine: held_histories(engine, worker.prompt_cache)))
        return {"held": await asyncio.to_thread(self._held_keys, histories), "at": at}

    def _held_keys(self, histories: list[tuple[int, ...]]) -> list[int]:
        """The union of the histories' prefix keys (affinity.prefix_keys of history_bytes), each history's keys
        computed once while it stays held."""
        vocab, known = self.state.model.vocab, self._keys
        self._keys = {h: known.get(h) or prefix_keys(history_bytes(vocab, h)) for h in histories}
        return sorted({k for keys in self._keys.values() for k in keys})

    async def __del__(self):  # Ray Serve awaits it when it stops the replica: the engine thread stops
        lifespan = getattr(self, "_lifespan", None)
        if lifespan is not None:
            await lifespan.__aexit__(None, None, None)


def held_histories(engine, prompt_cache=None) -> list[tuple[int, ...]]:
    """The token histories an engine holds, on its thread: each slot's (a running request's whole prompt and
    output, an idle slot's cache), the states in its session tier's RAM, and those in --cache-ram's store."""
    out = []
    for i in range(engine.n_slots):
        seq = engine.slot_request(i)
        out.append(tuple(seq.tokens) if seq is not None else tuple(engine.slot_tokens(i)))
    if engine.session is not None:
        out += engine.session.held()
    if prompt_cache is not None:
        out += [entry.tokens for _, entry in prompt_cache.states.items()]
    return [h for h in dict.fromkeys(out) if h]

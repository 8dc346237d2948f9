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

Its responses carry `X-Llamactx-Replica: <replica id>`. The model is loaded before the constructor returns, so
Ray routes nothing to a replica that is still loading.
"""

from __future__ import annotations

import logging
import os

from ray import serve

from llamactx.api import protocol as P
from llamactx.cluster.forward import ForwardedRequest, relay
from llamactx.cluster.launch import keep_replica_grpc_on_loopback
from llamactx.server.metrics import Snapshot

log = logging.getLogger("llamactx.cluster")

REPLICA_HEADER = b"x-llamactx-replica"


class EngineReplica:
    """The deployment's class; `args`: the parsed `llamactx serve` flags (argparse.Namespace), as every replica
    and the ingress read them."""

    async def __init__(self, args):
        from llamactx.cli.serve import config_from_args
        from llamactx.server.app import create_app

        keep_replica_grpc_on_loopback()
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        config = config_from_args(args)
        self.app = create_app(config, load_in_background=False)
        self.state = self.app.state.llamactx
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

    async def __del__(self):  # Ray Serve awaits it when it stops the replica: the engine thread stops
        lifespan = getattr(self, "_lifespan", None)
        if lifespan is not None:
            await lifespan.__aexit__(None, None, None)

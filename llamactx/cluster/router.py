"""The request routers of the engine deployment: Ray Serve's custom RequestRouter API (ray.serve.request_router;
anchor: ray.serve.llm's PrefixCacheAffinityRouter), run by every DeploymentHandle to the engine, i.e. inside the
ingress replica (ingress.py).

- `PrefixAffinityRouter` (--routing affinity, the default): the next turn of a conversation goes to the replicas
  that were sent its previous turn and still hold it (affinity.py), the least loaded of them; a saturated holder
  (its `max_ongoing_requests`, = -np, all taken) spills over to the others. A new conversation (no match, or only
  a shared prefix such as a system prompt) goes to the replica holding the fewest histories, so that
  conversations spread even when requests come one at a time. What each replica still holds comes from its
  routing stats (replica.py's `record_routing_stats`, every ROUTING_STATS_PERIOD_S via Ray's controller):
  `AffinityTable.reconcile` drops what it evicted.
- `RoundRobinRouter` (--routing round-robin): each request to the next replica in turn (the same spill-over);
  the baseline bench/cluster_bench.py compares affinity with.

A request's routing key travels in its `ForwardedRequest` (forward.py): `prefix_keys`, computed by the ingress from
the rendered prompt, or () for requests without a prompt (those go where the fewest histories are).
"""

from __future__ import annotations

import itertools
import random
import time

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from llamactx.cluster.affinity import MAX_KEYS, AffinityTable
from llamactx.cluster.forward import ForwardedRequest

CHOICES = 2  # replicas of one rank whose load is compared (Ray's default router: the power of two choices)


def _keys(pending_request: PendingRequest | None) -> tuple[int, ...]:
    args = pending_request.args if pending_request is not None else ()
    return args[0].prefix_keys if args and isinstance(args[0], ForwardedRequest) else ()


class PrefixAffinityRouter(RequestRouter):
    """affinity.AffinityTable's ranks (at most CHOICES replicas each); Ray takes the least loaded replica with room
    in the first rank that has one (its queue lengths: probed, or cached from the replicas' replies)."""

    def initialize_state(self, max_keys: int = MAX_KEYS) -> None:
        self.table = AffinityTable(max_keys)
        self._reported: dict[str, float] = {}  # replica id -> the time of its last report applied

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        for rid, replica in by_id.items():
            self._apply_report(rid, replica.routing_stats)
        return [[by_id[i] for i in _few(rank)] for rank in self.table.rank(_keys(pending_request), list(by_id))]

    def _apply_report(self, rid: str, stats: dict | None) -> None:
        """A replica's routing stats ({"held": keys, "at": time}), once each: what it no longer holds is dropped."""
        at = (stats or {}).get("at")
        if at is not None and at > self._reported.get(rid, 0.0):
            self._reported[rid] = at
            self.table.reconcile(rid, frozenset(stats.get("held", ())), at)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        keys = _keys(pending_request)
        if keys:
            self.table.record(keys, replica_id.unique_id, time.time())

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = self._replica_id_set - {r.replica_id for r in replicas}
        super().update_replicas(replicas)
        for replica_id in gone:
            self.table.forget(replica_id.unique_id)
            self._reported.pop(replica_id.unique_id, None)


def _few(rank: list[str]) -> list[str]:
    """At most CHOICES of a rank: its first (a holder, when it has one) and others drawn at random. Ray probes the
    queue length of every replica of a rank it has no fresh length for, so a rank of many (the others, at 100
    replicas) is cut to Ray's power of two choices."""
    return rank if len(rank) <= CHOICES else [rank[0], *random.sample(rank[1:], CHOICES - 1)]


class RoundRobinRouter(RequestRouter):
    """Each request to the next replica (in the order of their ids), the others after it when it is full."""

    def initialize_state(self) -> None:
        self._turn = itertools.count()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        i = next(self._turn) % len(ordered)
        rest = ordered[i + 1 :] + ordered[:i]
        return [[ordered[i]], rest] if rest else [[ordered[i]]]


ROUTERS = {"affinity": PrefixAffinityRouter, "round-robin": RoundRobinRouter}

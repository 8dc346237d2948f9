"""What the cluster adds to a server's config: how many engine replicas run, how they scale and which one a request
goes to (`llamactx serve --replicas N --max-replicas M --target-ongoing R --routing ...`; Ray Serve's
num_replicas, autoscaling_config and request_router_config). No Ray here and nothing of the command line: cli/serve.py
builds a `ServerConfig` (server/config.py, what every replica runs) and a `ClusterOptions`, and hands both to
launch.py; the replicas and the ingress receive the built config, never flags.

    options = ClusterOptions(replicas=2, max_replicas=6, routing="affinity")   # ClusterError for a bad value
    options.n_max, options.autoscaling, options.target(n_slots)
"""

from __future__ import annotations

from dataclasses import dataclass

from llamactx.errors import LlamactxError

ROUTINGS = ("affinity", "round-robin")  # cluster/router.py's ROUTERS, by name
DEFAULT_ROUTING = "affinity"
# each replica's RAM tier for the histories it was routed beyond its slots (engine/session_tier.py), unless
# --session-ram / --session-dir set one (a bound, not an allocation): SmolLM2-135M's f16 KV takes 23 KiB a token,
# so about 45 000 tokens of histories
REPLICA_SESSION_RAM_MIB = 1024


class ClusterError(LlamactxError, ValueError):
    """A cluster option out of its bounds (the message names the flag, the value and the bound), or a cluster that
    cannot start (Ray missing)."""


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """The replicas of `llamactx serve --replicas`: `replicas` (the fixed count, or the autoscaler's minimum),
    `max_replicas` (None: = replicas, no autoscaling), `target_ongoing` (the requests per replica autoscaling aims
    at; None: the replica's slots) and `routing` (one of ROUTINGS)."""

    replicas: int = 1
    max_replicas: int | None = None
    target_ongoing: int | None = None
    routing: str = DEFAULT_ROUTING

    def __post_init__(self):
        for name, value, lo in (("--replicas", self.replicas, 1), ("--max-replicas", self.n_max, self.replicas),
                                ("--target-ongoing", 1 if self.target_ongoing is None else self.target_ongoing, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ClusterError(f"{name} = {value!r} must be an integer >= {lo}")
        if self.routing not in ROUTINGS:
            raise ClusterError(f"--routing = {self.routing!r} must be one of {', '.join(ROUTINGS)}")

    @property
    def n_max(self) -> int:
        """The most replicas that may run."""
        return self.replicas if self.max_replicas is None else self.max_replicas

    @property
    def autoscaling(self) -> bool:
        return self.n_max > self.replicas

    def target(self, n_slots: int) -> int:
        """Autoscaling's target of ongoing requests per replica: --target-ongoing, else every slot busy."""
        return n_slots if self.target_ongoing is None else self.target_ongoing

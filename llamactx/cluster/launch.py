"""`llamactx serve --replicas N`: the server as a Ray Serve application (an ingress and N engine replicas), on a
local Ray started here (bound to 127.0.0.1 unless --host says otherwise) or on the cluster RAY_ADDRESS names. It
takes what the command line built (cli/serve.py): the `ServerConfig` every replica runs and the `ClusterOptions`
(options.py); nothing here reads flags.

    build_app(config, options)   the Serve application: serve.run(build_app(config, options))
    serve_replicas(config, options, host, port)   what `llamactx serve --replicas N` runs: Ray, Serve, the app,
                                 until Ctrl-C
    (Ray's CLI on an existing cluster: RAY_ADDRESS=... serve run llamactx.cli.serve:app_builder flags="...")

Scaling: a fixed N (--replicas N), or Ray Serve's autoscaling between --replicas and --max-replicas on the requests
per replica (running plus queued, at the replicas and at the ingress's handle), with --target-ongoing as the target
(default -np: every slot busy and nothing queued). Each replica takes -t CPUs of Ray's, the ingress none.

Each replica keeps the histories it was routed beyond its slots: unless the config keeps some already (a session
tier: --session-ram / --session-dir; or --cache-ram), every replica gets a RAM tier of REPLICA_SESSION_RAM_MIB
(replica_config), where its slots' evicted states go and come back from (engine/session_tier.py), and it tells the
router which prefixes it still holds (replica.py's record_routing_stats, router.py).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from dataclasses import replace

from llamactx.cluster.loopback import start_local_ray
from llamactx.cluster.options import REPLICA_SESSION_RAM_MIB, ClusterError, ClusterOptions

INGRESS = "ingress"
ENGINE = "engine"
APP_NAME = "llamactx"
UPSCALE_DELAY_S = 5.0  # Ray Serve's autoscaling delays, shorter than its defaults (30 s / 600 s) for an engine
DOWNSCALE_DELAY_S = 60.0  # that loads in seconds
HEALTH_CHECK_PERIOD_S = 2.0  # how soon Ray's controller notices a replica that stopped answering
GRACEFUL_SHUTDOWN_S = 5.0
ROUTING_STATS_PERIOD_S = 2.0  # how often each replica tells the router what it still holds (Ray's default: 10 s)


def scaling_options(options: ClusterOptions, n_slots: int) -> dict:
    """Ray Serve's num_replicas, or its autoscaling_config when --max-replicas is above --replicas."""
    if not options.autoscaling:
        return {"num_replicas": options.replicas}
    return {"autoscaling_config": {"min_replicas": options.replicas, "max_replicas": options.n_max,
                                   "initial_replicas": options.replicas,
                                   "target_ongoing_requests": options.target(n_slots),
                                   "upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": DOWNSCALE_DELAY_S}}


def thread_env(runtime) -> dict[str, str]:
    """Each replica's numba pool: its -t / -tb threads (RuntimeParams'); the BLAS pools: one thread."""
    n = max(runtime.n_threads, runtime.n_threads_batch or 0, 1)
    return {"NUMBA_NUM_THREADS": str(n), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def replica_config(config):
    """The config each engine replica runs: `config`, with a RAM session tier of REPLICA_SESSION_RAM_MIB when it
    keeps nothing beyond its slots (no session tier, no --cache-ram), so that a replica keeps the histories it was
    routed beyond its slots."""
    if config.runtime.session is not None or config.cache_ram:
        return config
    from llamactx.engine.session_tier import SessionParams

    session = SessionParams(ram_bytes=REPLICA_SESSION_RAM_MIB << 20)
    return replace(config, runtime=replace(config.runtime, session=session))


def build_app(config, options: ClusterOptions):
    """The Serve application: the ingress bound to the engine deployment (`config`: the ServerConfig each replica
    runs; routing, scaling and threads from `options` and the config). Imports Ray."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from llamactx.cluster.ingress import Ingress
    from llamactx.cluster.replica import EngineReplica
    from llamactx.cluster.router import ROUTERS

    rt = config.runtime
    engine = serve.deployment(EngineReplica, name=ENGINE).options(
        max_ongoing_requests=rt.n_slots,  # a request beyond the slots waits at the ingress, free to go anywhere
        ray_actor_options={"num_cpus": rt.n_threads, "runtime_env": {"env_vars": thread_env(rt)}},
        request_router_config=RequestRouterConfig(request_router_class=ROUTERS[options.routing],
                                                  request_routing_stats_period_s=ROUTING_STATS_PERIOD_S),
        health_check_period_s=HEALTH_CHECK_PERIOD_S, graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
        **scaling_options(options, rt.n_slots))
    ingress = serve.deployment(Ingress, name=INGRESS).options(
        num_replicas=1, max_ongoing_requests=config.max_connections, ray_actor_options={"num_cpus": 0})
    return ingress.bind(engine.bind(replica_config(config)), config)


def serve_replicas(config, options: ClusterOptions, host: str, port: int, verbose: bool = False) -> int:
    """Start (or join: RAY_ADDRESS) Ray, run the app behind Ray's HTTP proxy on host:port, and keep it up until
    Ctrl-C or SIGTERM; a Ray started here is shut down on the way out, on a joined cluster only the app is
    deleted. ClusterError without Ray."""
    if importlib.util.find_spec("ray") is None:
        raise ClusterError("--replicas needs Ray Serve: pip install 'llamactx[cluster]'")
    joined = bool(os.environ.get("RAY_ADDRESS"))
    start_ray(max(os.cpu_count() or 1, options.n_max * config.runtime.n_threads), joined, verbose)
    import ray
    from ray import serve

    try:
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
        print(f"llamactx serve: starting {options.replicas} replica(s) of {config.runtime.model or 'smollm2'}",
              file=sys.stderr, flush=True)
        serve.run(build_app(config, options), name=APP_NAME, route_prefix="/")
        print(f"llamactx serve: ready at http://{host}:{port}/ ({options.routing} routing)", file=sys.stderr,
              flush=True)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        while True:
            time.sleep(1)
    finally:
        if joined:
            serve.delete(APP_NAME)
        else:
            serve.shutdown()
        ray.shutdown()


def _exit_on_sigterm(signum, frame):
    raise SystemExit(0)  # through serve_replicas' finally: Ray is shut down


def start_ray(n_cpus: int, joined: bool, verbose: bool = False) -> None:
    """ray.init: the RAY_ADDRESS cluster, or a local one on 127.0.0.1 without a dashboard, with `n_cpus` CPUs (the
    replicas' -t each, at least this machine's)."""
    import logging

    if joined:
        import ray

        ray.init(logging_level=logging.WARNING, log_to_driver=verbose)
        return
    start_local_ray(n_cpus, log_to_driver=verbose)

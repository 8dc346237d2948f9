"""`llamactx serve --replicas N`: the server as a Ray Serve application (an ingress and N engine replicas), on a
local Ray started here (bound to 127.0.0.1 unless --host says otherwise) or on the cluster RAY_ADDRESS names.

    build_app(args)          the Serve application for parsed `llamactx serve` flags: serve.run(build_app(args))
    app_builder({"flags": "-m MODEL --replicas 4 ..."})   the same for Ray's CLI on an existing cluster:
                             RAY_ADDRESS=... serve run llamactx.cluster.launch:app_builder flags="..."
    serve_replicas(args)     what `llamactx serve --replicas N` runs: Ray, Serve, the app, until Ctrl-C

Scaling: a fixed N (--replicas N), or Ray Serve's autoscaling between --replicas and --max-replicas on the requests
per replica (running plus queued, at the replicas and at the ingress's handle), with --target-ongoing as the target
(default -np: every slot busy and nothing queued). Each replica takes -t CPUs of Ray's, the ingress none.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import sys
import time

from llamactx.cli.args import CommandError

INGRESS = "ingress"
ENGINE = "engine"
APP_NAME = "llamactx"
UPSCALE_DELAY_S = 5.0  # Ray Serve's autoscaling delays, shorter than its defaults (30 s / 600 s) for an engine
DOWNSCALE_DELAY_S = 60.0  # that loads in seconds
HEALTH_CHECK_PERIOD_S = 2.0  # how soon Ray's controller notices a replica that stopped answering
GRACEFUL_SHUTDOWN_S = 5.0


def n_slots(args) -> int:
    return 4 if args.parallel is None else args.parallel


def check_args(args) -> None:
    """The cluster flags' bounds; CommandError names the flag, its value and the bound."""
    max_replicas = args.max_replicas or args.replicas
    for name, value, lo in (("--replicas", args.replicas, 1), ("--max-replicas", max_replicas, args.replicas),
                            ("--target-ongoing", 1 if args.target_ongoing is None else args.target_ongoing, 1)):
        if value < lo:
            raise CommandError(f"{name} = {value} must be >= {lo}")


def scaling_options(args) -> dict:
    """Ray Serve's num_replicas, or its autoscaling_config when --max-replicas is above --replicas."""
    max_replicas = args.max_replicas or args.replicas
    if max_replicas == args.replicas:
        return {"num_replicas": args.replicas}
    return {"autoscaling_config": {"min_replicas": args.replicas, "max_replicas": max_replicas,
                                   "initial_replicas": args.replicas,
                                   "target_ongoing_requests": args.target_ongoing or n_slots(args),
                                   "upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": DOWNSCALE_DELAY_S}}


def thread_env(args) -> dict[str, str]:
    """Each replica's numba pool: its -t / -tb threads; the BLAS pools: one thread."""
    n = max(args.threads, args.threads_batch or 0, 1)
    return {"NUMBA_NUM_THREADS": str(n), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def build_app(args):
    """The Serve application: the ingress bound to the engine deployment (routing, scaling and threads from the
    flags). Imports Ray."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from llamactx.cluster.ingress import Ingress
    from llamactx.cluster.replica import EngineReplica
    from llamactx.cluster.router import ROUTERS

    check_args(args)
    engine = serve.deployment(EngineReplica, name=ENGINE).options(
        max_ongoing_requests=n_slots(args),  # a request beyond the slots waits at the ingress, free to go anywhere
        ray_actor_options={"num_cpus": args.threads, "runtime_env": {"env_vars": thread_env(args)}},
        request_router_config=RequestRouterConfig(request_router_class=ROUTERS[args.routing]),
        health_check_period_s=HEALTH_CHECK_PERIOD_S, graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
        **scaling_options(args))
    ingress = serve.deployment(Ingress, name=INGRESS).options(
        num_replicas=1, max_ongoing_requests=args.max_connections, ray_actor_options={"num_cpus": 0})
    return ingress.bind(engine.bind(args), args)


def parse_flags(flags: str | list[str]):
    """`llamactx serve` flags (a shell-quoted string or a list) as the parsed Namespace."""
    from llamactx.cli.commands import build_parser

    argv = shlex.split(flags) if isinstance(flags, str) else list(flags)
    args = build_parser().parse_args(["serve", *argv])
    if args.replicas is None:
        args.replicas = 1
    return args


def app_builder(builder_args: dict):
    """Ray's application builder (`serve run llamactx.cluster.launch:app_builder flags="..."`)."""
    return build_app(parse_flags(builder_args.get("flags", "")))


def serve_replicas(args) -> int:
    """Start (or join: RAY_ADDRESS) Ray, run the app behind Ray's HTTP proxy on --host:--port, and keep it up
    until Ctrl-C or SIGTERM; a Ray started here is shut down on the way out, on a joined cluster only the app is
    deleted."""
    check_args(args)
    if importlib.util.find_spec("ray") is None:
        raise CommandError("--replicas needs Ray Serve: pip install 'llamactx[cluster]'")
    host = args.host.split(",")[0].strip()
    joined = bool(os.environ.get("RAY_ADDRESS"))
    start_ray(args, joined)
    import ray
    from ray import serve

    try:
        serve.start(http_options={"host": host, "port": args.port}, logging_config={"log_level": "WARNING"})
        print(f"llamactx serve: starting {args.replicas} replica(s) of {args.model or 'smollm2'}", file=sys.stderr,
              flush=True)
        serve.run(build_app(args), name=APP_NAME, route_prefix="/")
        print(f"llamactx serve: ready at http://{host}:{args.port}/ ({args.routing} routing)", file=sys.stderr,
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


def start_ray(args, joined: bool) -> None:
    """ray.init: the RAY_ADDRESS cluster, or a local one on 127.0.0.1 without a dashboard, with the CPUs the
    replicas ask for (at least this machine's)."""
    import logging

    if joined:
        import ray

        ray.init(logging_level=logging.WARNING, log_to_driver=args.verbose)
        return
    n_cpus = max(os.cpu_count() or 1, (args.max_replicas or args.replicas) * args.threads)
    start_local_ray(n_cpus, log_to_driver=args.verbose)


def start_local_ray(num_cpus: int, log_to_driver: bool = False) -> None:
    """A one-node Ray whose every process binds and talks on 127.0.0.1 (Ray's single-node mode, which it otherwise
    uses on macOS and Windows: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, read when ray is first imported, so before
    any import of ray in this process), without a dashboard."""
    import logging

    if "ray" not in sys.modules:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants

    if ray_constants.ENABLE_RAY_CLUSTER:
        raise CommandError("ray was imported before start_local_ray: its node would listen beyond 127.0.0.1 (set "
                           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before importing ray)")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=log_to_driver)


def keep_replica_grpc_on_loopback() -> None:
    """Ray Serve starts each replica's inter-deployment gRPC server on [::]:0, every interface, whatever the
    node's address (ray/serve/_private/replica.py `_on_initialized`). On a node whose address is loopback (the
    local Ray of start_local_ray) it binds 127.0.0.1 instead, so nothing of that cluster listens beyond this
    machine. Called by each replica's constructor, which runs before that server starts."""
    import ipaddress

    from ray.serve._private import replica as serve_replica
    from ray.util import get_node_ip_address

    add_port = serve_replica.add_port_to_grpc_server
    if getattr(add_port, "loopback_only", False) or not ipaddress.ip_address(get_node_ip_address()).is_loopback:
        return

    def add_port_on_loopback(server, address: str):
        return add_port(server, address.replace("[::]", "127.0.0.1"))

    add_port_on_loopback.loopback_only = True
    serve_replica.add_port_to_grpc_server = add_port_on_loopback

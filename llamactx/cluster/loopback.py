"""A Ray that stays on this machine's loopback: a one-node local Ray whose every process binds 127.0.0.1, and each
replica's inter-deployment gRPC server kept on 127.0.0.1 on such a node (Ray Serve binds it on every interface).
Used by launch.py (the local Ray of `llamactx serve --replicas`), by ingress.py and replica.py (each deployment's
constructor) and by the tests' clusters.
"""

from __future__ import annotations

import os
import sys

from llamactx.cluster.options import ClusterError


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
        raise ClusterError("ray was imported before start_local_ray: its node would listen beyond 127.0.0.1 (set "
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

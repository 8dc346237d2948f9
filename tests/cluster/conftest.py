"""A real `llamactx serve --replicas N` in this process: a local Ray (every process on 127.0.0.1), Ray Serve's HTTP
proxy on a free port, the app built from `llamactx serve` flags. Every wait is bounded, and the fixture shuts
Serve and Ray down and checks that none of Ray's processes outlive it."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil
import pytest

from tests.server.conftest import free_port

START_TIMEOUT_S = 600  # Ray (~10 s), then each replica loads the model (~5 s with the numba cache warm)
STOP_TIMEOUT_S = 30  # Ray's processes must be gone by then

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray Serve is not installed (pip install 'llamactx[cluster]'; make test does)")


class Cluster:
    def __init__(self, url: str, config, options):
        self.url, self.config, self.options = url, config, options

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kw)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=30).json()


@contextmanager
def running_cluster(*flags: str) -> Iterator[Cluster]:
    """`llamactx serve --replicas ... <flags>` on 127.0.0.1 and a free port, ready (every replica loaded)."""
    from llamactx.cli.serve import parse_flags
    from llamactx.cluster.launch import APP_NAME, build_app
    from llamactx.cluster.loopback import start_local_ray

    port = free_port()
    config, options = parse_flags([*flags, "--host", "127.0.0.1", "--port", str(port)])
    _warm_kernels(config)
    ours = set(psutil.Process().children(recursive=True))
    start_local_ray(num_cpus=max(2, options.n_max * config.runtime.n_threads))
    import ray
    from ray import serve

    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING"})
        deploy = threading.Thread(target=serve.run, args=(build_app(config, options),),
                                  kwargs={"name": APP_NAME, "route_prefix": "/"}, daemon=True)
        deploy.start()
        deploy.join(START_TIMEOUT_S)
        if deploy.is_alive():
            raise RuntimeError(f"the replicas did not start within {START_TIMEOUT_S} s")
        yield Cluster(f"http://127.0.0.1:{port}", config, options)
    finally:
        ray_procs = [p for p in psutil.Process().children(recursive=True) if p not in ours]
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            _gone(ray_procs)


def _warm_kernels(config) -> None:
    """Compile (or load) the numba kernels a replica's start-up runs, here, once: replicas that each compiled a
    cold cache at the same time would take minutes on two cores."""
    from llamactx.runtime import Runtime

    rt = Runtime(config.runtime)
    rt.engine.warmup()
    rt.embedder.embed([[0]])


def _gone(procs: list[psutil.Process]) -> None:
    """Wait for Ray's processes to exit; kill (by pid) and fail on any still there after STOP_TIMEOUT_S."""
    _, alive = psutil.wait_procs(procs, timeout=STOP_TIMEOUT_S)
    for p in alive:
        p.kill()
    assert not alive, f"Ray processes still running after ray.shutdown(): {[p.pid for p in alive]}"


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.5):
    """predicate()'s first truthy value within timeout_s, else AssertionError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"{what}: not within {timeout_s} s")

"""A real `llamactx serve` app in this process: uvicorn on 127.0.0.1 and a free port, in a thread, stopped by the
fixture. Every wait is bounded."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from llamactx.server.app import create_app
from llamactx.server.config import ServerConfig
from llamactx.server.http import uvicorn_config

START_TIMEOUT_S = 600  # a cold numba cache compiles every kernel first: ~4 min on a 2-core Zen 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    def __init__(self, url: str, app, config: ServerConfig):
        self.url, self.app, self.config = url, app, config

    @property
    def state(self):
        return self.app.state.llamactx

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kw)


@contextmanager
def running_server(**config) -> Iterator[Running]:
    cfg = ServerConfig.of(**config)
    app = create_app(cfg)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, cfg.read_timeout, cfg.max_connections, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"the server did not become healthy within {START_TIMEOUT_S} s")
            time.sleep(0.1)
        yield Running(url, app, cfg)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="package")
def server(tmp_path_factory) -> Iterator[Running]:
    """The shared server of the suite: SmolLM2, 4 slots, metrics and slot files on."""
    slots_dir = tmp_path_factory.mktemp("slots")
    with running_server(model="smollm2", alias="smollm2", n_slots=4, n_ctx=4096, metrics=True,
                        slot_save_path=str(slots_dir)) as running:
        yield running

"""--sleep-idle-seconds from a client's view: an idle server unloads its model, answers the read-only routes from
what it cached without waking, and the next request reloads it transparently, with the same greedy answer and
the same counters."""

from __future__ import annotations

import gc
import time
import weakref

import httpx

from tests.server.conftest import running_server

ASK = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}


def _sleeping(http: httpx.Client) -> bool:
    res = http.get("/props")
    assert res.status_code == 200
    return res.json()["is_sleeping"]


def _wait_for_sleep(http: httpx.Client, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not _sleeping(http):
        assert time.monotonic() < deadline, "the server did not go to sleep"
        time.sleep(0.1)


def _metric(text: str, name: str) -> float:
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"llamacpp:{name} ")))


def test_sleep_frees_the_model_and_a_request_wakes_it():
    with running_server(model="smollm2", alias="smollm2", n_slots=1, n_ctx=512, sleep_idle_seconds=1,
                        metrics=True) as srv, srv.client() as http:
        awake = http.post("/completion", json=ASK).json()
        assert not _sleeping(http)
        state = srv.state
        model, engine = weakref.ref(state.model), weakref.ref(state.engine)
        _wait_for_sleep(http)
        assert state.model is None and state.engine is None and state.worker is None
        gc.collect()
        assert model() is None and engine() is None  # nothing keeps them: their memory is freed
        # the read-only routes answer from the cache and do not wake it
        assert http.get("/health").status_code == 200
        models = http.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        metrics = http.get("/metrics").text
        assert _metric(metrics, "tokens_predicted_total") == 8
        assert _sleeping(http) and state.model is None
        # a request wakes it, and the model answers as before
        again = http.post("/completion", json=ASK).json()
        assert not _sleeping(http) and state.model is not None
        assert again["content"] == awake["content"] and again["tokens_predicted"] == 8
        assert _metric(http.get("/metrics").text, "tokens_predicted_total") == 16  # counters survive the sleep


def test_tokenize_wakes_and_the_server_sleeps_again():
    with running_server(model="smollm2", n_slots=1, n_ctx=512, sleep_idle_seconds=0.5) as srv, \
            srv.client() as http:
        _wait_for_sleep(http)
        tokens = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert tokens and not _sleeping(http)
        _wait_for_sleep(http)
        assert http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"] == tokens


def test_no_sleep_by_default(server):
    with server.client() as http:
        assert http.get("/props").json()["is_sleeping"] is False
    assert server.state.lifecycle.can_sleep is False

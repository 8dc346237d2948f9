"""What a hostile client does to the server (issue 23): slow and vanishing clients, too many connections, huge
words, embedding floods, tampered slot files. Each gets a bounded, named answer, and the server afterwards
answers a fixed greedy request with the same text as before."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import re
import socket
import struct
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from llamactx import Batch, Context, ContextParams
from tests.server.conftest import running_server

GREEDY = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def greedy(url: str) -> str:
    res = httpx.post(url + "/v1/completions", json=GREEDY, timeout=120)
    assert res.status_code == 200, res.text
    return res.json()["choices"][0]["text"]


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (bounded by `timeout`)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


@pytest.fixture(scope="module")
def strict():
    """A server with a 2 s read deadline and at most 3 connections."""
    with running_server(model="smollm2", n_slots=2, n_ctx=1024, read_timeout=2.0, max_connections=3) as srv:
        yield srv


def test_slow_and_short_requests_get_408_and_are_closed(strict):
    before = greedy(strict.url)
    partial_headers = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app"
    short_body = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": ")
    for payload in (partial_headers, short_body):
        with connect(strict.url) as sock:
            t0 = time.monotonic()
            sock.sendall(payload)
            answer = read_all(sock, timeout=30)
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert b'"type": "timeout_error"' in answer and b"--read-timeout = 2 s" in answer
            assert 1.5 < time.monotonic() - t0 < 20
    with connect(strict.url) as sock:  # a trickle: one byte at a time, never finishing the headers
        sock.settimeout(10)
        t0, closed = time.monotonic(), False
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            try:
                sock.sendall(bytes([byte]))
                time.sleep(0.25)
            except OSError:
                closed = True
                break
            if time.monotonic() - t0 > 8:
                break
        assert closed or read_all(sock, timeout=5).startswith(b"HTTP/1.1 408 ")
    with connect(strict.url) as sock:  # nothing at all: closed silently
        assert read_all(sock, timeout=30) == b""
    assert greedy(strict.url) == before


def test_connections_past_the_bound_get_503(strict):
    held = [connect(strict.url) for _ in range(3)]  # three silent connections fill the bound
    try:
        res = httpx.get(strict.url + "/health", timeout=30)
        assert res.status_code == 503 and res.headers["Retry-After"] == "1", res.text
        assert res.json()["error"]["type"] == "unavailable_error" and "--max-connections = 3" in res.text
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 30
    while httpx.get(strict.url + "/health", timeout=30).status_code != 200:  # closed sockets leave the count
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_client_that_leaves_mid_body_is_not_an_error(strict, caplog):
    caplog.set_level(logging.DEBUG, logger="llamactx.server")
    with connect(strict.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"prompt\": \"abc")
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while not any("client left" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.05)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert greedy(strict.url)


def test_huge_words_are_refused_without_keeping_memory(strict):
    """Distinct 6 MB single-word prompts are refused from their length before tokenizing: RSS stays flat."""
    proc = psutil.Process()
    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    with httpx.Client(base_url=strict.url, timeout=120) as http:
        def refuse(i: int) -> None:
            word = letters[rng.integers(0, 26, 6_000_000)].tobytes().decode()
            res = http.post("/completion", json={"prompt": word, "n_predict": 4})
            assert res.status_code == 400, res.text
            err = res.json()["error"]
            assert err["type"] == "exceed_context_size_error" and "at least" in err["message"]

        rss = []  # after each request: the floor is what stays, the rest is requests in flight
        for i in range(103):
            refuse(i)
            rss.append(proc.memory_info().rss)
    grown = min(rss[-10:]) - min(rss[:3])
    assert grown < 100 << 20, f"RSS grew by {grown >> 20} MB"


def test_an_embedding_flood_shares_the_engine_with_streams(server):
    """A 4000-input embeddings request runs in slices between generation steps: a stream started while it runs
    finishes long before it does."""
    before = greedy(server.url)
    worker = server.state.worker
    assert httpx.post(server.url + "/v1/embeddings", json={"input": "warm"}, timeout=600).status_code == 200
    with cf.ThreadPoolExecutor(2) as pool:
        flood = pool.submit(httpx.post, server.url + "/v1/embeddings", json={"input": ["hi"] * 4000}, timeout=600)
        deadline = time.monotonic() + 60
        while not worker.n_jobs:  # the job is queued on the engine thread
            assert time.monotonic() < deadline and not flood.done(), "the embeddings job never started"
            time.sleep(0.01)
        body = {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
        res = httpx.post(server.url + "/v1/completions", json=body, timeout=600)
        assert res.status_code == 200 and res.json()["usage"]["completion_tokens"] == 32
        assert not flood.done(), "the stream waited for the whole embeddings request"
        vecs = flood.result().json()["data"]
    assert len(vecs) == 4000 and vecs[0]["embedding"] == vecs[-1]["embedding"]
    assert greedy(server.url) == before


def test_embedding_limits(server):
    with server.client() as http:
        res = http.post("/v1/embeddings", json={"input": ["a"] * 8193})
        assert res.status_code == 400 and "--embd-max-inputs = 8192" in res.json()["error"]["message"]
        res = http.post("/v1/embeddings", json={"input": ["ok", "word " * 600]})
        assert res.status_code == 400
        assert re.search(r"input\[1\] has \d+ tokens, more than the embedding context's n_ctx = 512", res.text)
        res = http.post("/v1/embeddings", json={"input": "x" * 200_000})  # refused from its length
        assert res.status_code == 400 and "input[0] has at least" in res.text


def test_tampered_and_poisoned_slot_files_are_refused(server):
    """A slot file spliced from two (text B's tokens over text A's KV) fails its checksum; one whose KV holds a
    NaN is refused even with a valid checksum. The slot keeps what it had."""
    slot_dir = Path(server.config.slot_save_path)
    model = server.state.model
    with server.client() as http:
        for i, text in enumerate(["The cat sat on the mat.", "A dog slept on the rug!"]):
            res = http.post("/completion", json={"prompt": text, "id_slot": 3, "n_predict": 1, "temperature": 0})
            assert res.status_code == 200
            assert http.post("/slots/3?action=save", json={"filename": f"t{i}.bin"}).status_code == 200
        a, b = (slot_dir / "t0.bin").read_bytes(), (slot_dir / "t1.bin").read_bytes()
        n_a, n_b = struct.unpack("<I", a[12:16])[0], struct.unpack("<I", b[12:16])[0]
        (slot_dir / "spliced.bin").write_bytes(b[: 16 + 4 * n_b + 32] + a[16 + 4 * n_a + 32 :])
        held = http.get("/slots").json()[3]["n_tokens"]
        res = http.post("/slots/3?action=restore", json={"filename": "spliced.bin"})
        assert res.status_code == 400 and "fails its checksum" in res.json()["error"]["message"], res.text

        tokens = model.vocab.tokenize("The cat sat on the mat.", add_special=True)
        ctx = Context(model, ContextParams(n_ctx=256))
        assert ctx.decode(Batch.get_one(tokens)) == 0
        ctx.memory.k[0, 1, 0] = np.nan
        ctx.state_seq_save_file(slot_dir / "nan.bin", 0, tokens)
        res = http.post("/slots/3?action=restore", json={"filename": "nan.bin"})
        assert res.status_code == 400 and "non-finite" in res.json()["error"]["message"], res.text
        assert http.get("/slots").json()[3]["n_tokens"] == held
        assert http.post("/slots/3?action=restore", json={"filename": "t0.bin"}).json()["n_restored"] == n_a


def test_the_read_deadline_never_cuts_a_response(strict):
    """The deadline covers reading a request; a stream that runs longer than it, and the next request on the
    same keep-alive connection, are untouched."""
    body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=strict.url, timeout=120) as http:
        t0 = time.monotonic()
        with http.stream("POST", "/v1/completions", json=body) as res:
            lines = [line for line in res.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and time.monotonic() - t0 > 2.0  # longer than --read-timeout
        assert http.get("/health").status_code == 200  # the same connection, right after

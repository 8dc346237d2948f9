"""Resumable streams (X-Conversation-Id, /v1/stream): a streamed generation is read again from any offset, lives
on when its client leaves, and stops when asked."""

from __future__ import annotations

import json
import time

from tests.server.conftest import running_server

CHAT = {"messages": [{"role": "user", "content": "Count from one to ten."}], "max_tokens": 24, "temperature": 0,
        "stream": True}


def _session(http, conv_id: str) -> dict | None:
    found = http.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json()
    return found[0] if found else None


def test_a_stream_replays_resumes_and_stops():
    with running_server(model="smollm2", n_slots=2, n_ctx=1024) as srv, srv.client() as http:
        conv = "conv-1::org/model:Q8_0"  # slashes and colons travel in the query string
        with http.stream("POST", "/v1/chat/completions", json=CHAT, headers={"X-Conversation-Id": conv}) as res:
            assert res.status_code == 200
            live = b"".join(res.iter_bytes())
        assert live.endswith(b"data: [DONE]\n\n")
        replay = http.get("/v1/stream", params={"conv_id": conv, "from": 0})
        assert replay.status_code == 200 and replay.headers["content-type"].startswith("text/event-stream")
        assert replay.content == live
        assert http.get("/v1/stream", params={"conv_id": conv, "from": 10}).content == live[10:]
        info = _session(http, "conv-1")  # an id matches its "<id>::<model>" sessions too
        assert info["conversation_id"] == conv and info["is_done"] and info["total_bytes"] == len(live)
        assert http.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
        gone = http.get("/v1/stream", params={"conv_id": conv, "from": 0})
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
        assert http.delete("/v1/stream", params={"conv_id": conv}).status_code == 204  # idempotent


def test_the_generation_outlives_a_client_that_leaves():
    with running_server(model="smollm2", n_slots=1, n_ctx=1024) as srv, srv.client() as http:
        with http.stream("POST", "/v1/chat/completions", json=CHAT) as res:
            plain = b"".join(res.iter_bytes())
        with http.stream("POST", "/v1/chat/completions", json=CHAT, headers={"X-Conversation-Id": "c2"}) as res:
            next(res.iter_bytes())  # the first event, then the client goes away
        deadline = time.monotonic() + 120
        while not _session(http, "c2")["is_done"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        replay = http.get("/v1/stream", params={"conv_id": "c2"}).content
        assert replay.endswith(b"data: [DONE]\n\n")
        assert _content(replay) == _content(plain)  # the whole generation, as a client that stayed got it


def test_bad_stream_requests():
    with running_server(model="smollm2", n_slots=1, n_ctx=512) as srv, srv.client() as http:
        assert http.get("/v1/stream").status_code == 400
        assert http.delete("/v1/stream").status_code == 400
        assert http.get("/v1/stream", params={"conv_id": "nobody"}).status_code == 404
        with http.stream("POST", "/v1/chat/completions", json=CHAT, headers={"X-Conversation-Id": "c3"}) as res:
            b"".join(res.iter_bytes())
        res = http.get("/v1/stream", params={"conv_id": "c3", "from": "-1"})
        assert res.status_code == 400 and "from" in res.json()["error"]["message"]


def _content(sse: bytes) -> str:
    out = ""
    for line in sse.decode().splitlines():
        if line.startswith("data: {"):
            choices = json.loads(line[6:])["choices"]
            if choices:
                out += choices[0]["delta"].get("content") or ""
    return out

"""Bad input gets llama-server's error format with the right status and type, names the field, and disturbs
nothing; API keys, CORS, slot files and metrics."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.server.conftest import running_server

OK_CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}

BAD = [
    # (path, raw body or JSON, status, error type, text the message must contain)
    ("/v1/completions", b"{not json", 400, "invalid_request_error", "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "invalid_request_error", "JSON object"),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400, "invalid_request_error", "NaN"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "invalid_request_error", "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "invalid_request_error", "top_p"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -5}, 400, "invalid_request_error", "max_tokens"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "invalid_request_error", "n:"),
    ("/v1/completions", {"prompt": "x", "n": 1000}, 400, "invalid_request_error", "n:"),
    ("/v1/completions", {"prompt": "x", "seed": 2**40}, 400, "invalid_request_error", "seed"),
    ("/v1/completions", {"prompt": [1, 2, 10**9]}, 400, "invalid_request_error", "outside the vocab"),
    ("/v1/completions", {"prompt": [-1]}, 400, "invalid_request_error", "outside the vocab"),
    ("/v1/completions", {"prompt": ""}, 400, "invalid_request_error", "prompt"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999999": 1}}, 400, "invalid_request_error", "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 1e9}}, 400, "invalid_request_error", "logit_bias"),
    ("/v1/completions", {"prompt": "x", "grammar": "root ::= undefined_rule"}, 400, "invalid_request_error",
     "grammar"),
    ("/v1/completions", {"prompt": "x", "json_schema": {"type": "frobnicate"}}, 400, "invalid_request_error",
     "json_schema"),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400, "invalid_request_error", "suffix"),
    ("/v1/completions", {"prompt": "x", "stop": ["a"] * 100}, 400, "invalid_request_error", "stop"),
    ("/v1/completions", {"prompt": "hello " * 5000}, 400, "exceed_context_size_error", "exceeds the available"),
    ("/v1/chat/completions", {"messages": []}, 400, "invalid_request_error", "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "invalid_request_error", "role"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "invalid_request_error", "messages"),
    ("/v1/embeddings", {"input": []}, 400, "invalid_request_error", "input"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 400, "invalid_request_error", "encoding_format"),
    ("/tokenize", {"content": 5}, 400, "invalid_request_error", "content"),
    ("/detokenize", {"tokens": [10**9]}, 400, "invalid_request_error", "outside the vocab"),
    ("/apply-template", {"messages": [{"role": "user"}]}, 400, "invalid_request_error", "content"),
    ("/slots/0?action=fly", {}, 400, "invalid_request_error", "action"),
    # more choices than the server ever holds (4 slots + 64 queued) can never be admitted: not a 503 to retry
    ("/v1/completions", {"prompt": ["a"] * 16, "n": 16}, 400, "invalid_request_error", "ever holds at once"),
    ("/completion", {"prompt": "x", "n": 4}, 400, "invalid_request_error", "n: /completion returns one"),
    ("/v1/chat/completions", {**OK_CHAT, "chat_template_kwargs": {"tools": []}}, 400, "invalid_request_error",
     "chat_template_kwargs: 'tools'"),
    ("/apply-template", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": 1}},
     400, "invalid_request_error", "chat_template_kwargs: 'messages'"),
    ("/apply-template", {"messages": [{"role": "user", "content": "x"}],
                         "chat_template_kwargs": {"add_generation_prompt": False}}, 400, "invalid_request_error",
     "chat_template_kwargs: 'add_generation_prompt'"),
    ("/no/such/endpoint", {}, 404, "not_found_error", ""),
    ("/v1/embeddings", {"input": {"content": "string"}}, 400, "invalid_request_error", "input[0].content"),
    ("/v1/embeddings", {"input": {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}}, 400,
     "invalid_request_error", "media input is not supported"),
    # without --reranking, as llama-server (its bad bodies: tests/server/test_rerank.py)
    ("/rerank", {"query": "q", "documents": ["a"]}, 501, "not_supported_error", "--reranking"),
    # refused from their length before tokenizing (issue 23: huge words cost no tokenizer time or memory)
    ("/v1/completions", {"prompt": "x" * 1_000_000}, 400, "exceed_context_size_error", "at least"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * 1_000_000}]}, 400,
     "exceed_context_size_error", "at least"),
    ("/v1/embeddings", {"input": ["a"] * 8193}, 400, "invalid_request_error", "--embd-max-inputs = 8192"),
    ("/v1/embeddings", {"input": ["ok", "z" * 100_000]}, 400, "invalid_request_error", "input[1] has at least"),
]


@pytest.fixture(scope="module")
def undisturbed(server) -> str:
    """The fixed greedy answer every row of the table must leave unchanged."""
    with server.client() as http:
        return http.post("/v1/chat/completions", json=OK_CHAT).json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(("path", "body", "status", "kind", "text"), BAD, ids=[f"{b[0]}-{i}" for i, b in
                                                                             enumerate(BAD)])
def test_bad_input_table(server, undisturbed, path, body, status, kind, text):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with server.client() as http:
        res = http.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert res.status_code == status, res.text
        err = res.json()["error"]
        assert err["type"] == kind and err["code"] == status and text in err["message"], err
        if kind == "exceed_context_size_error":
            assert err["n_prompt_tokens"] > err["n_ctx"] == 4096
        after = http.post("/v1/chat/completions", json=OK_CHAT)  # nothing was disturbed
        assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] == undisturbed


def test_a_huge_body_is_refused_before_it_is_read(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:  # announces 10^8 bytes, sends none
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000000\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            part = s.recv(4096)
            if not part:
                break
            reply += part
    head, _, body = reply.decode("latin-1").partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413") and json.loads(body)["error"]["code"] == 413
    with server.client() as http:  # a chunked body that grows past the bound is cut off too
        res = http.post("/v1/completions", content=iter([b'{"prompt": "'] + [b"a" * (1 << 20)] * 9 + [b'"}']))
        assert res.status_code == 413
        assert http.post("/v1/chat/completions", json=OK_CHAT).status_code == 200


def test_metrics_count_what_the_requests_report(server):
    with server.client() as http:
        before = _metrics(http)
        res = http.post("/completion", json={"prompt": "I believe", "n_predict": 8, "temperature": 0}).json()
        after = _metrics(http)
    assert res["stop"] is True and res["timings"]["predicted_n"] == 8
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 8
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == res["timings"]["prompt_n"]
    assert after["llamacpp:n_decode_total"] > before["llamacpp:n_decode_total"]
    assert after["llamacpp:requests_processing"] == 0 and 0 < after["llamacpp:kv_cache_usage_ratio"] <= 1


def _metrics(http) -> dict[str, float]:
    res = http.get("/metrics")
    assert res.status_code == 200 and "Process-Start-Time-Unix" in res.headers
    out = {}
    for line in res.text.splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.split(" ", 1)
            out[name] = float(value)
    assert "# TYPE llamacpp:n_busy_slots_per_decode gauge" in res.text
    return out


def test_slot_files_round_trip_and_stay_in_their_directory(server, tmp_path):
    prompt = "What is the capital of France? Answer in one word."
    with server.client() as http:
        first = http.post("/completion", json={"prompt": prompt, "id_slot": 1, "n_predict": 4, "temperature": 0})
        assert first.status_code == 200 and first.json()["id_slot"] == 1
        saved = http.post("/slots/1?action=save", json={"filename": "slot1.bin"}).json()
        assert saved["n_saved"] > 0
        assert http.post("/slots/2?action=restore", json={"filename": "slot1.bin"}).json()["n_restored"] == \
            saved["n_saved"]
        again = http.post("/completion", json={"prompt": prompt, "id_slot": 2, "n_predict": 4, "temperature": 0})
        assert again.json()["content"] == first.json()["content"]
        assert again.json()["timings"]["prompt_n"] == 1  # everything but the last token came from the file
        assert http.post("/slots/2?action=erase").json()["n_erased"] == saved["n_saved"]
        outside = tmp_path / "escape.bin"
        for name in ["../escape.bin", str(outside), "a/b.bin", "..", ".hidden", "x" * 300]:
            res = http.post("/slots/1?action=save", json={"filename": name})
            assert res.status_code == 400 and "filename" in res.json()["error"]["message"], name
        assert not outside.exists() and not (tmp_path.parent / "escape.bin").exists()
        (Path(server.config.slot_save_path) / "a_dir").mkdir()
        res = http.post("/slots/1?action=save", json={"filename": "a_dir"})
        assert res.status_code == 400 and "names a directory" in res.json()["error"]["message"]
        res = http.post("/slots/1?action=restore", json={"filename": "a_dir"})
        assert res.status_code == 404
        corrupt = server.config.slot_save_path + "/corrupt.bin"
        with open(corrupt, "wb") as f:
            f.write(b"LLCTXSF\0garbage")
        res = http.post("/slots/1?action=restore", json={"filename": "corrupt.bin"})
        assert res.status_code == 400 and "session file version" in res.json()["error"]["message"]
        with open(corrupt, "wb") as f:
            f.write(b"not a session file at all")
        res = http.post("/slots/1?action=restore", json={"filename": "corrupt.bin"})
        message = res.json()["error"]["message"]
        assert res.status_code == 400 and "'corrupt.bin' is not" in message
        assert server.config.slot_save_path not in message  # no server path in an error
        res = http.post("/slots/1?action=restore", json={"filename": "missing.bin"})
        assert res.status_code == 404
        assert http.post("/slots/9?action=erase").status_code == 404
        slots = http.get("/slots").json()
        assert len(slots) == 4 and not any(s["is_processing"] for s in slots)


def test_api_keys_and_cors():
    with running_server(model="smollm2", n_slots=1, n_ctx=512, api_keys=["secret"],
                        cors_origins=["http://allowed.example"], metrics=False) as srv, srv.client() as http:
        assert http.get("/health").status_code == 200
        assert http.get("/").status_code == 200  # the page stays open
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "secret"}):
            res = http.post("/v1/chat/completions", json=OK_CHAT, headers=headers)
            assert res.status_code == 401 and res.json()["error"]["type"] == "authentication_error"
        assert http.get("/v1/models").status_code == 401
        ok = http.post("/v1/chat/completions", json=OK_CHAT, headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 200
        assert http.get("/v1/models", headers={"X-Api-Key": "secret"}).status_code == 200
        pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
        allowed = http.options("/v1/chat/completions", headers={"Origin": "http://allowed.example", **pre})
        assert allowed.headers.get("access-control-allow-origin") == "http://allowed.example"
        denied = http.options("/v1/chat/completions", headers={"Origin": "http://evil.example", **pre})
        assert "access-control-allow-origin" not in denied.headers
        res = http.get("/v1/models", headers={"Origin": "http://evil.example", "Authorization": "Bearer secret"})
        assert res.status_code == 200 and "access-control-allow-origin" not in res.headers
        assert http.get("/metrics", headers={"Authorization": "Bearer secret"}).status_code == 501


@pytest.mark.parametrize("field", ["max_tokens", "n_predict"])
def test_zero_tokens_asked_for_generate_none(server, field):
    """`max_tokens: 0` / `n_predict: 0`: the prompt is processed and nothing is generated (llama-server)."""
    with server.client() as http:
        res = http.post("/v1/completions", json={"prompt": "Once upon a time", field: 0, "temperature": 0}).json()
    assert res["choices"][0]["text"] == "" and res["usage"]["completion_tokens"] == 0
    assert res["choices"][0]["finish_reason"] == "length"

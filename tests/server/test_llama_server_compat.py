"""llama-server's own request and response shapes (issue 22), each as llama.cpp's server tests use them:
/completion's completion_probabilities, several prompts, response_fields, text keys in logit_bias, the
multimodal prompt object, aliases and tags, and the -np / -kvu rule for a slot's context."""

from __future__ import annotations

import json

import httpx
import pytest

from llamactx.cli.commands import build_parser
from llamactx.cli.serve import config_from_args
from tests.server.conftest import running_server

PROMPT = "I believe the meaning of life is"


def test_n_probs_gives_completion_probabilities(server):
    with server.client() as http:
        body = http.post("/completion", json={"prompt": PROMPT, "n_probs": 3, "temperature": 0,
                                              "n_predict": 4, "return_tokens": True}).json()
        probs = body["completion_probabilities"]
        assert len(probs) == 4 and [p["id"] for p in probs] == body["tokens"]
        for p in probs:
            assert p["logprob"] <= 0 and bytes(p["bytes"]).decode() == p["token"] and len(p["top_logprobs"]) == 3
            assert p["top_logprobs"][0]["id"] == p["id"]  # greedy: the sampled token is the most likely
        streamed = [c for c in _stream(http, {"prompt": PROMPT, "n_probs": 3, "temperature": 0, "n_predict": 4})
                    if not c["stop"]]
        assert [c["completion_probabilities"][0]["id"] for c in streamed] == body["tokens"]
        post = http.post("/completion", json={"prompt": PROMPT, "n_probs": 10, "n_predict": 4, "temperature": 1.0,
                                               "top_k": 5, "seed": 1, "post_sampling_probs": True}).json()
        for p in post["completion_probabilities"]:  # over the 5 candidates top-k left, renormalised
            assert 0 < p["prob"] <= 1 and 1 <= len(p["top_probs"]) <= 5
            assert abs(sum(t["prob"] for t in p["top_probs"]) - 1) < 1e-5
            assert p["prob"] in [t["prob"] for t in p["top_probs"]]
        res = http.post("/v1/completions", json={"prompt": PROMPT, "logprobs": 2, "post_sampling_probs": True})
        assert res.status_code == 400 and "post_sampling_probs" in res.text


def _stream(http, body):
    with http.stream("POST", "/completion", json={**body, "stream": True, "return_tokens": True}) as res:
        return [json.loads(line[6:]) for line in res.iter_lines() if line.startswith("data: {")]


def test_several_prompts_give_a_list_and_fields_can_be_picked(server):
    with server.client() as http:
        tokens = http.post("/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
        body = http.post("/completion", json={"prompt": [tokens, PROMPT, {"prompt_string": PROMPT}],
                                              "temperature": 0, "n_predict": 6}).json()
        assert isinstance(body, list) and len({r["content"] for r in body}) == 1 and len(body) == 3
        one = http.post("/completion", json={"prompt": PROMPT, "temperature": 0, "n_predict": 6,
                                             "response_fields": ["content", "generation_settings/n_predict"]}).json()
        assert one == {"content": body[0]["content"], "generation_settings/n_predict": 6}
        res = http.post("/completion", json={"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}})
        assert res.status_code == 400 and "multimodal" in res.text


def test_logit_bias_text_keys_bias_their_tokens(server):
    with server.client() as http:
        base = {"prompt": "What is the best book", "n_predict": 24, "temperature": 0}
        plain = http.post("/completion", json=base).json()["content"]
        words = sorted({w for w in plain.split() if w.isalpha()})[:6]
        assert words, plain
        for bias in ([[f" {w}", -100] for w in words], {f" {w}": -100 for w in words}):
            out = http.post("/completion", json={**base, "logit_bias": bias}).json()["content"]
            assert out != plain and not any(f" {w} " in f" {out} " for w in words), out


def test_aliases_tags_and_a_slot_context_of_n_ctx_over_np():
    """-a with several names, --tags, and -np 2 -c 512 without -kvu: each slot's context is 256 (llama-server)."""
    with running_server(model="smollm2", alias="tinyllama-2,fim,code", tags=["chat", "small"], n_slots=2,
                        n_ctx=512, kv_unified=False) as srv:
        model = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"][0]
        assert model["id"] == "code" and set(model["aliases"]) == {"tinyllama-2", "fim", "code"}
        assert model["tags"] == ["chat", "small"]
        props = httpx.get(srv.url + "/props", timeout=30).json()
        assert props["default_generation_settings"]["n_ctx"] == 256 and props["total_slots"] == 2
        assert [s["n_ctx"] for s in httpx.get(srv.url + "/slots", timeout=30).json()] == [256, 256]
        res = httpx.post(srv.url + "/completion", json={"prompt": "word " * 300}, timeout=60)
        assert res.status_code == 400 and res.json()["error"]["n_ctx"] == 256


@pytest.mark.parametrize(("argv", "n_slots", "unified"), [
    ([], 4, True),  # llama-server's -np auto: 4 slots sharing -c
    (["-np", "2"], 2, False),  # an explicit -np: each slot gets -c / 2
    (["-np", "2", "-kvu"], 2, True),
    (["--no-kv-unified"], 4, False),
])
def test_np_and_kvu_follow_llama_server(argv, n_slots, unified):
    cfg = config_from_args(build_parser().parse_args(["serve", *argv]))
    assert (cfg.runtime.n_slots, cfg.runtime.kv_unified) == (n_slots, unified)


@pytest.mark.parametrize(("argv", "origins"), [
    ([], ["*"]),  # llama-server's default
    (["--api-key", "k"], ["*"]),
    (["--tools", "all"], ["localhost"]),  # tools can run: localhost
    (["--tools", "all", "--cors-origins", "*"], ["*"]),
    (["--cors-origins", "http://a.example,localhost"], ["http://a.example", "localhost"]),
])
def test_serve_cors_default_is_llama_servers(argv, origins):
    assert config_from_args(build_parser().parse_args(["serve", *argv])).cors_origins == origins


@pytest.mark.parametrize(("origin", "reflected"), [
    ("http://localhost:3000", True), ("http://127.0.0.1", True), ("http://[::1]:8080", True),
    ("http://localhost.evil.com", False), ("http://evil.com", False),
])
def test_cors_defaults_to_localhost_origins(server, origin, reflected):
    """llama-server's preflight answer (200, its methods and headers); with ServerConfig's default (the Python
    API's; `serve` defaults to llama-server's '*') only localhost origins are reflected."""
    with server.client() as http:
        res = http.options("/v1/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                        "Access-Control-Request-Headers": "Authorization"})
        assert res.status_code == 200 and res.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert res.headers.get("access-control-allow-origin") == (origin if reflected else None)
        assert res.headers.get("access-control-allow-credentials") == ("true" if reflected else None)
        get = http.get("/health", headers={"Origin": origin})
        assert get.headers.get("access-control-allow-origin") == (origin if reflected else None)


def test_a_final_assistant_message_is_continued(server):
    convo = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "The fruit is"}]
    with server.client() as http:
        body = http.post("/v1/chat/completions", json={"messages": convo, "max_tokens": 3, "temperature": 0,
                                                       "verbose": True}).json()
        prompt = body["__verbose"]["prompt"]
        head = http.post("/apply-template", json={"messages": convo[:1]}).json()["prompt"]
        assert prompt == head + "The fruit is"  # not closed: the model goes on from "is"
        both = http.post("/v1/chat/completions", json={"messages": convo, "add_generation_prompt": True,
                                                       "continue_final_message": True})
        assert both.status_code == 400 and "continue_final_message" in both.text
        twice = http.post("/v1/chat/completions", json={"messages": [*convo, {"role": "assistant", "content": "x"}]})
        assert twice.status_code == 400 and "two assistant messages" in twice.text
        assert "__verbose" not in http.post("/v1/chat/completions", json={"messages": convo[:1],
                                                                           "max_tokens": 1}).json()
        n = http.post("/chat/completions/input_tokens", json={"messages": convo[:1]}).json()["input_tokens"]
        assert n == len(http.post("/tokenize", json={"content": head, "add_special": True}).json()["tokens"])


def test_an_embedding_input_may_be_content_parts(server):
    with server.client() as http:
        data = http.post("/v1/embeddings", json={"input": [
            "hello world", {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]}
        ).json()["data"]
        assert data[0]["embedding"] == data[1]["embedding"]


def test_return_progress_reports_the_prompt_before_the_tokens(server):
    with server.client() as http:
        for path, body in (("/completion", {"prompt": "the quick brown fox " * 20, "n_predict": 3}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "test " * 30}],
                                                     "max_tokens": 3})):
            with http.stream("POST", path, json={**body, "stream": True, "return_progress": True,
                                                 "cache_prompt": False}) as res:
                events = [json.loads(line[6:]) for line in res.iter_lines() if line.startswith("data: {")]
            at = [i for i, e in enumerate(events) if "prompt_progress" in e]
            text = [i for i, e in enumerate(events) if e.get("content") or any(
                (c.get("delta") or {}).get("content") for c in e.get("choices", []))]
            assert len(at) == 2 and at[-1] < text[0]  # both reports come before the first token
            first, last = (events[i] for i in at)
            assert first["prompt_progress"]["processed"] == first["prompt_progress"]["cache"] == 0
            assert last["prompt_progress"]["processed"] == last["prompt_progress"]["total"] > 0
            assert first["timings"]["prompt_n"] == 0 and last["timings"]["prompt_ms"] > 0


def test_vertex_ai_predict_runs_each_instance_through_its_route():
    with running_server(model="smollm2", n_slots=2, n_ctx=1024, gcp_predict_route="/predict") as srv:
        chat = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4, "temperature": 0}
        body = httpx.post(srv.url + "/predict", json={"instances": [
            {"@requestFormat": "chatCompletions", **chat}, {"@requestFormat": "/tokenize", "content": "hi"},
            {"@requestFormat": "warpDrive"}, {"no": "format"}]}, timeout=120).json()["predictions"]
        direct = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=120).json()
        assert body[0]["choices"][0]["message"] == direct["choices"][0]["message"]
        assert body[1]["tokens"] and "warpDrive" in body[2]["error"]["message"] and "@requestFormat" in \
            body[3]["error"]["message"]
        res = httpx.post(srv.url + "/predict", json={"instances": [{}] * 129}, timeout=30)
        assert res.status_code == 400 and "128" in res.text


def test_return_tokens_n_discard_and_t_max_predict_ms(server):
    with server.client() as http:
        base = {"prompt": PROMPT, "n_predict": 4, "temperature": 0}
        assert http.post("/completion", json=base).json()["tokens"] == []  # llama-server: only when asked
        assert len(http.post("/completion", json={**base, "return_tokens": True}).json()["tokens"]) == 4
        # past its time, a generation stops at the first newline
        body = {"prompt": "List three fruits, one per line:\n", "n_predict": 64, "temperature": 0,
                "ignore_eos": True}
        full = http.post("/completion", json=body).json()
        cut = http.post("/completion", json={**body, "t_max_predict_ms": 1}).json()
        assert "\n" in full["content"] and cut["stop_type"] == "limit"
        assert cut["content"].count("\n") <= 1 < full["content"].count("\n") or len(cut["content"]) < \
            len(full["content"])


def test_n_discard_sets_how_much_a_context_shift_drops():
    from llamactx.engine.sequence import Sequence

    seq = Sequence(list(range(100)), sampler=None)
    seq.n_past = 100
    assert seq.shift(4, 10) == (4, 10) and len(seq.tokens) == 90 and seq.n_past == 90
    assert seq.shift(4) == (4, 43)  # half of what follows n_keep


def test_the_command_r_builtin_template():
    from llamactx.chat_template import ChatTemplate

    prompt = ChatTemplate("command-r").render([{"role": "system", "content": "You are a test."},
                                               {"role": "user", "content": " Hi there "}], True)
    assert prompt == ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")  # llama-chat.cpp's, as llama-server's tests want

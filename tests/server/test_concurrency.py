"""Many users at once through HTTP: concurrent requests equal each alone, the slots bound the running requests,
a shared system prompt is decoded once, a client that drops its stream frees its slot and disturbs nobody, and a
thousand requests leave memory and slots where they started."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import httpx
import psutil

from tests.server.conftest import running_server

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "1, 2, 3, 4, 5,", "The three primary colors are", "To make a cup of tea, first",
           "Python is a programming language that", "The largest planet in the solar system is"]


def complete(url: str, prompt: str, **kw) -> dict:
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, **kw}
    res = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert res.status_code == 200, res.text
    return res.json()


def test_eight_concurrent_requests_equal_each_alone(server):
    for kw in ({"temperature": 0}, {"temperature": 0.8, "seed": 42}):
        alone = [complete(server.url, p, **kw)["choices"][0]["text"] for p in PROMPTS]
        with cf.ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda p, kw=kw: complete(server.url, p, **kw), PROMPTS))
        assert [r["choices"][0]["text"] for r in together] == alone


def test_busy_slots_never_exceed_the_slots_and_everyone_is_served():
    with running_server(model="smollm2", n_slots=2, n_ctx=1024, metrics=True) as srv:
        seen = []
        with cf.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(complete, srv.url, p, max_tokens=16) for p in PROMPTS[:6]]
            while not all(f.done() for f in futures):
                seen.append(sum(s["is_processing"] for s in httpx.get(srv.url + "/slots", timeout=30).json()))
                time.sleep(0.05)
            results = [f.result() for f in futures]
        assert max(seen) <= 2 and all(r["usage"]["completion_tokens"] == 16 for r in results)


def test_a_shared_system_prompt_is_decoded_once():
    system = "You are a helpful assistant who answers questions about arithmetic precisely. " * 26
    with running_server(model="smollm2", n_slots=8, n_ctx=8192, metrics=True) as srv:
        vocab = srv.state.model.vocab
        n_system = len(vocab.tokenize(system))
        with cf.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: complete(srv.url, system + f"Question {i}: what is {i} + {i}?",
                                                       max_tokens=4), range(8)))
        metrics = _metrics(srv.url)
        prompt_total = sum(r["usage"]["prompt_tokens"] for r in results)
        cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results)
        assert n_system > 300
        assert cached >= 7 * (n_system - 2)  # seven of the eight found the system prompt in memory
        assert metrics["llamacpp:prompt_tokens_total"] <= prompt_total - 7 * (n_system - 2)
        tails = prompt_total - 8 * n_system
        assert metrics["llamacpp:kv_cache_tokens"] <= n_system + tails + 8 * 4 + 8  # one copy plus the tails


def test_a_dropped_stream_frees_its_slot_and_leaves_the_others_unchanged(server):
    prompts = PROMPTS[:3]
    alone = [complete(server.url, p, max_tokens=40)["choices"][0]["text"] for p in prompts[1:]]
    with cf.ThreadPoolExecutor(3) as pool:
        others = [pool.submit(complete, server.url, p, max_tokens=40) for p in prompts[1:]]
        body = {"prompt": prompts[0], "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as res:
            n = 0
            for line in res.iter_lines():
                n += line.startswith("data: ")
                if n == 2:
                    break  # the client goes away mid-stream
        t_dropped = time.monotonic()
        deadline = t_dropped + 60
        while any(s["is_processing"] and s["next_token"][0]["n_remain"] > 300 for s in _slots(server.url)):
            assert time.monotonic() < deadline, "the dropped request still holds its slot"
            time.sleep(0.02)
        assert [f.result()["choices"][0]["text"] for f in others] == alone


def test_a_thousand_requests_leave_memory_and_slots_as_they_were(server):
    proc = psutil.Process()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for i in range(50):  # warm up every path first
            http.post("/v1/completions", json={"prompt": f"Warm {i}", "max_tokens": 2, "temperature": 0})
        rss0 = proc.memory_info().rss
        for i in range(1000):
            res = http.post("/v1/completions", json={"prompt": f"Request {i}:", "max_tokens": 2, "temperature": 0.5,
                                                     "seed": i})
            assert res.status_code == 200
        rss1 = proc.memory_info().rss
        assert not any(s["is_processing"] for s in http.get("/slots").json())
    assert rss1 <= rss0 * 1.10, (rss0, rss1)


def _slots(url: str) -> list[dict]:
    return httpx.get(url + "/slots", timeout=30).json()


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.split(" ", 1)
            out[name] = float(value)
    return out


def test_the_queue_bound_answers_503_and_keeps_the_others():
    with running_server(model="smollm2", n_slots=1, n_ctx=512, max_queue=1) as srv:
        with cf.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(httpx.post, srv.url + "/v1/completions",
                                   json={"prompt": p, "max_tokens": 32, "temperature": 0}, timeout=120)
                       for p in PROMPTS[:6]]
            codes = [f.result().status_code for f in futures]
        assert codes.count(200) >= 2 and set(codes) <= {200, 503}
        refused = next(f.result() for f in futures if f.result().status_code == 503)
        assert refused.json()["error"]["type"] == "unavailable_error" and "Retry-After" in refused.headers
        assert json.loads(httpx.get(srv.url + "/health").text)["status"] == "ok"

"""`llamactx serve --replicas 2` on a local Ray with SmolLM2: the single-process server's greedy outputs through the
Ray deployment, prefix-affinity routing of multi-turn conversations, /health and /metrics over both replicas, and
a replica killed mid-stream (the last test: it costs one stream, and Ray starts a replacement)."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.cluster.conftest import needs_ray, running_cluster, wait_until
from tests.server.conftest import running_server

pytestmark = needs_ray

FLAGS = ("-m", "smollm2", "--replicas", "2", "-t", "1", "-np", "4", "-c", "4096", "--metrics")
SYSTEM = ("You are the support assistant of a small bookshop. Answer in one short sentence. The shop opens at nine "
          "and closes at six, every day but Sunday, when it opens at noon. Orders ship within two days; returns are "
          "free for thirty days with the receipt, and for store credit without it. Gift cards never expire and can "
          "be used online. The cafe upstairs serves tea, coffee and cake until five. Staff can order any book in "
          "print within a week, and second-hand copies within a month. Signed copies of local authors are on the "
          "shelf by the door. The reading group meets on the first Tuesday of every month at seven; this month it "
          "reads a novel about a lighthouse keeper. Children's story time is every Saturday at ten. The shop buys "
          "used books in good condition on weekday mornings. Members get ten percent off every purchase and early "
          "invitations to author events. Parking is free behind the building after four. ")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two replicas sharing a disk session tier (--session-dir): what one loses, another finds."""
    sessions = tmp_path_factory.mktemp("sessions")
    with running_cluster(*FLAGS, "--session-dir", str(sessions), "--session-disk", "256") as running:
        yield running


def metric_totals(client: httpx.Client) -> dict[str, float]:
    """The cluster's unlabelled series of GET /metrics, by name (without the llamacpp: prefix)."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("llamacpp:") and "{" not in line:
            name, value = line.split()
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def chat(client: httpx.Client, messages: list[dict], **extra) -> tuple[str, str, int, int]:
    """(reply, replica id, prompt tokens, of which cached) of a greedy chat completion."""
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return (r.json()["choices"][0]["message"]["content"], r.headers["x-llamactx-replica"], usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"])


def sse_events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


# -- the same bytes as the single-process server --------------------------------------------------------------


EQUALITY_REQUESTS = [
    ("/completion", {"prompt": "The capital of France is", "n_predict": 24, "temperature": 0, "return_tokens": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24,
                              "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 24,
                              "temperature": 0, "stream": True}),
    ("/v1/completions", {"prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0, "stream": True}),
]


def _generated(path: str, body: dict, r: httpx.Response):
    """What a response generated: the text (and token ids) of a JSON answer, the delta texts of a stream."""
    assert r.status_code == 200, r.text
    if body.get("stream"):
        events = [json.loads(e) for e in sse_events(r.text) if e != "[DONE]"]
        return [c.get("delta", {}).get("content") or c.get("text") for e in events for c in e["choices"]]
    data = r.json()
    if path == "/completion":
        return data["content"], data["tokens"], data["stop_type"]
    choice = data["choices"][0]
    return choice.get("message", {}).get("content") or choice.get("text"), choice["finish_reason"]


def test_greedy_outputs_equal_the_single_process_server(cluster):
    with running_server(model="smollm2", n_slots=4, n_ctx=4096, n_threads=1) as single:
        with single.client() as c:
            expected = [_generated(p, b, c.post(p, json=b)) for p, b in EQUALITY_REQUESTS]
    with cluster.client() as c:
        got = [_generated(p, b, c.post(p, json=b)) for p, b in EQUALITY_REQUESTS]
    assert got == expected
    assert all(e for e in expected)


# -- routing by prefix affinity ---------------------------------------------------------------------------------


def _conversation(cluster, i: int, n_turns: int) -> list[tuple[str, int, int]]:
    """Conversation i, each turn resending the whole history: (replica, prompt tokens, cached) of each turn."""
    messages, turns = [{"role": "system", "content": SYSTEM}], []
    with cluster.client() as c:
        for t in range(n_turns):
            messages.append({"role": "user", "content": f"Customer {i}, question {t}: what about book number {i}?"})
            reply, *turn = chat(c, messages)
            messages.append({"role": "assistant", "content": reply})
            turns.append(tuple(turn))
    return turns


def test_prefix_affinity_keeps_conversations_on_their_replica(cluster):
    """8 conversations x 3 turns, 4 at a time (one replica's -np: never saturated): every turn of a conversation
    goes to the replica that holds its history, so all of a later turn's prompt but its new message is cached;
    /metrics counts the same tokens."""
    with cluster.client() as c:
        before = metric_totals(c)
        with ThreadPoolExecutor(4) as pool:
            conversations = list(pool.map(lambda i: _conversation(cluster, i, 3), range(8)))
        after = metric_totals(c)
    routes = [[replica for replica, _, _ in turns] for turns in conversations]
    assert all(len(set(r)) == 1 for r in routes), routes
    per_replica = [sum(r[0] == rid for r in routes) for rid in {r[0] for r in routes}]
    # new conversations go to the replica holding the fewest, so both replicas get some (test_conversations.py
    # checks the even split of conversations sent one at a time)
    assert len(per_replica) == 2, routes
    later = [(n, cached) for turns in conversations for _, n, cached in turns[1:]]
    share = sum(cached for _, cached in later) / sum(n for n, _ in later)
    assert share >= 0.9, later
    turns = [t for ts in conversations for t in ts]
    cached = after["prompt_tokens_cached_total"] - before["prompt_tokens_cached_total"]
    decoded = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    assert (cached, cached + decoded) == (sum(c for _, _, c in turns), sum(n for _, n, _ in turns))


# -- /health and /metrics cover every replica -----------------------------------------------------------------


def test_health_and_metrics_cover_every_replica(cluster):
    health = cluster.health()
    assert health["status"] == "ok"
    assert len(health["replicas"]) == 2 and {r["status"] for r in health["replicas"]} == {"ok"}
    assert len({r["pid"] for r in health["replicas"]}) == 2
    with cluster.client() as c:
        text = c.get("/metrics").text
    ids = {r["replica"] for r in health["replicas"]}
    for name in ("prompt_tokens_total", "tokens_predicted_total", "requests_processing"):
        per = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(f"llamacpp:{name}{{replica=")}
        total = next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"llamacpp:{name} "))
        assert set(per) == ids and total == sum(per.values()), (name, per, total)


def test_a_client_that_leaves_mid_stream_frees_its_slot(cluster):
    """The proxy cancels the ingress, the ingress the replica's generator, and the replica's app sees the
    disconnect: the engine stops generating (2000 tokens would take a minute)."""
    body = {"prompt": "Once upon a time", "n_predict": 2000, "ignore_eos": True, "temperature": 0, "stream": True}
    with cluster.client() as c:
        with c.stream("POST", "/completion", json=body) as stream:
            lines = stream.iter_lines()
            assert [next(e for e in lines if e.startswith("data: ")) for _ in range(2)]
            assert metric_totals(c)["requests_processing"] == 1
        wait_until(lambda: metric_totals(c)["requests_processing"] == 0, 15, "the replica drops the stream")


# -- a replica killed mid-stream ------------------------------------------------------------------------------


def test_a_killed_replica_costs_one_stream(cluster):
    """Kill the replica serving a stream: that stream ends with an SSE error event and a clean end of its
    response; the requests it held that had not answered yet, and every new one, get their 200 from the other
    replica; no other 5xx. Ray starts a replacement, and a conversation the dead replica had stored in the shared
    disk tier resumes from there, its prompt not decoded again."""
    pids = {r["replica"]: r["pid"] for r in cluster.health()["replicas"]}
    with cluster.client() as c, ThreadPoolExecutor(8) as pool:
        tokens = lambda text: c.post("/tokenize", json={"content": text}).json()["tokens"]  # noqa: E731
        shop = tokens(SYSTEM)
        x = shop + tokens(" A question from customer X about the opening hours of the shop on the first Tuesday of "
                          "next month, when the reading group meets.")
        y = x + tokens(" Customer Y asks where the cafe is.")

        def complete(prompt: list[int], **extra) -> httpx.Response:  # token ids: one prefix key per 16 tokens
            return c.post("/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0, **extra})

        # conversation X's first turn; Y continues X's whole prompt but not its answer (affinity: the same replica)
        # and takes X's slot, which stores X's state in the disk tier; the stream continues Y, so it goes there too
        first = complete(x, return_tokens=True)
        victim = first.headers["x-llamactx-replica"]
        assert complete(y).headers["x-llamactx-replica"] == victim
        story = y + tokens(" Tell me a long story about the shop.")
        stream_body = {"prompt": story, "n_predict": 400, "ignore_eos": True, "temperature": 0, "stream": True}
        with c.stream("POST", "/completion", json=stream_body) as stream:
            assert stream.headers["x-llamactx-replica"] == victim
            events = stream.iter_lines()
            started = [next(e for e in events if e.startswith("data: ")) for _ in range(3)]
            # requests the victim takes (the same prefix: affinity) and holds, unanswered, when it dies
            chapter = story + tokens(" Chapter one.")
            held = [pool.submit(complete, chapter, n_predict=64, ignore_eos=True) for _ in range(3)]
            time.sleep(1.0)
            os.kill(pids[victim], signal.SIGKILL)
            rest = [line for line in events if line.startswith("data: ")]  # ends: no exception, no hang
        new = [pool.submit(complete, tokens(f"Fact number {k}:")) for k in range(4)]
        answers = [f.result(timeout=120) for f in held + new]
        assert len(started) == 3 and json.loads(rest[-1].removeprefix("data: "))["error"]["code"] == 503, rest[-3:]
        assert all(r.status_code == 200 for r in answers), [(r.status_code, r.text[:200]) for r in answers]
        assert all(r.json()["content"] for r in answers)
        survivor = set(pids) - {victim}
        assert {r.headers["x-llamactx-replica"] for r in answers} == survivor  # the held ones: sent again, there
        replaced = wait_until(lambda: (h := cluster.health())["status"] == "ok" and len(h["replicas"]) == 2
                              and victim not in {r["replica"] for r in h["replicas"]} and h, 120,
                              "Ray starts a replica in place of the killed one")
        assert {r["status"] for r in replaced["replicas"]} == {"ok"}
        # X's second turn: no live replica holds X's history (the victim's slots died with it); the disk does
        history = x + first.json()["tokens"]
        second = complete(history + tokens(" And on Sunday?"))
    assert second.status_code == 200 and second.headers["x-llamactx-replica"] != victim
    # the whole history but at most its last token (the last one sampled may not have been decoded): only the disk
    # tier has it, any live slot gives at most the shop's prompt
    assert second.json()["timings"]["cache_n"] >= len(history) - 1 > len(shop) + 16, second.json()["timings"]

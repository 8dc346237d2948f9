"""Prefix affinity without Ray: the chained block keys of a rendered prompt (and of the tokens a replica holds), the
table the router ranks replicas with and reconciles with the replicas' reports (cluster/affinity.py), and one
request run by an ASGI app on a replica (cluster/forward.py)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from llamactx.cluster.affinity import GRACE_S, SPREAD_RANKS, AffinityTable, history_bytes, prefix_keys
from llamactx.cluster.forward import ForwardedRequest, relay


def test_prefix_keys_are_chained_hashes_of_whole_blocks():
    a = bytes(range(200))
    keys = prefix_keys(a, block_bytes=64)
    assert len(keys) == 3  # the 8 bytes past the third block make no key
    assert prefix_keys(a[:128] + b"x" * 72, block_bytes=64)[:2] == keys[:2]  # equal first blocks, equal keys
    assert prefix_keys(b"y" + a[1:], block_bytes=64)[2] != keys[2]  # a change in block 0 changes every later key
    assert prefix_keys(a[64:128] * 2, block_bytes=64)[1] != prefix_keys(a[64:128] * 2, block_bytes=64)[0]
    assert len(prefix_keys(b"z" * 10_000, block_bytes=64, max_blocks=5)) == 5
    assert prefix_keys(a, block_bytes=64) == keys  # the same in every process (not Python's salted hash)


SYSTEM = b"s" * 128  # a system prompt every conversation starts with: two blocks of 64 bytes
T0 = 1000.0  # when the table's prompts were sent (time.time() in the router)


def keys(data: bytes) -> tuple[int, ...]:
    return prefix_keys(data, 64)


def test_a_conversation_sticks_and_new_ones_spread_with_nothing_in_flight():
    table = AffinityTable(seed=1)
    conv1, conv2 = SYSTEM + b"a" * 128, SYSTEM + b"b" * 128
    table.record(keys(conv1), "r1", T0)
    # conversation 2 shares only the system prompt (not a whole prompt r1 was sent): a new history, to the replica
    # holding the fewest, one rank each (load is 0 everywhere when requests come one at a time)
    assert table.rank(keys(conv2), ["r1", "r2", "r3"])[0] in (["r2"], ["r3"])
    assert table.rank(keys(conv2), ["r1", "r2", "r3"])[-1] == ["r1"]
    table.record(keys(conv2), "r2", T0)
    # the next turn of conversation 1 extends the whole prompt r1 was sent: r1 first, the others to spill over to
    turn2 = conv1 + b"c" * 64
    assert table.rank(keys(turn2), ["r1", "r2", "r3"]) == [["r1"], ["r3"], ["r2"]]
    table.record(keys(turn2), "r1", T0)
    assert (table.n_histories("r1"), table.n_histories("r2"), table.n_histories("r3")) == (1, 1, 0)
    assert table.rank(keys(turn2), ["r2", "r1"]) == [["r1"], ["r2"]]  # the same prompt again sticks too
    # a prompt that leaves conversation 1 inside a block it was sent (an edited turn) is a new history
    assert table.rank(keys(conv1[:100] + b"e" * 156), ["r1", "r2", "r3"])[0] == ["r3"]
    # nothing in common: spread; a holder that is no longer a candidate (dead) does not count
    assert table.rank(keys(b"q" * 256), ["r3", "r1"]) == [["r3"], ["r1"]]
    assert table.rank(keys(turn2), ["r2", "r3"]) in ([["r2"], ["r3"]], [["r3"], ["r2"]])
    assert table.rank((), ["r1"]) == [["r1"]]


def test_eight_sequential_conversations_spread_evenly():
    """The issue's case: eight conversations sharing a system prompt, three turns each, one request at a time:
    each replica gets four, and every later turn goes back to its conversation's replica."""
    table = AffinityTable(seed=2)
    where: dict[int, str] = {}
    for turn in range(3):
        for conv in range(8):
            prompt = SYSTEM + bytes([65 + conv]) * 64 * (turn + 1)
            first = table.rank(keys(prompt), ["r1", "r2"])[0]
            assert len(first) == 1
            if turn:
                assert first == [where[conv]]
            where[conv] = first[0]
            table.record(keys(prompt), first[0], T0)
    assert sorted(where.values()) == ["r1"] * 4 + ["r2"] * 4
    assert table.n_histories("r1") == table.n_histories("r2") == 4


def test_many_replicas_keep_the_ranks_few():
    table = AffinityTable(seed=3)
    ranks = table.rank(keys(b"x" * 128), [f"r{i}" for i in range(10)])
    assert [len(r) for r in ranks] == [1] * SPREAD_RANKS + [10 - SPREAD_RANKS]
    assert sorted(r for rank in ranks for r in rank) == sorted(f"r{i}" for i in range(10))


def test_a_report_drops_what_the_replica_no_longer_holds():
    table = AffinityTable(seed=4)
    conv1, conv2 = SYSTEM + b"a" * 128, SYSTEM + b"b" * 128
    table.record(keys(conv1), "r1", T0)
    table.record(keys(conv2), "r1", T0 + 100)
    # r1 reports (well after both were sent) that it holds conversation 2 only: conversation 1's own keys go, the
    # shared system prompt stays (conversation 2 holds it)
    assert table.reconcile("r1", set(keys(conv2)), T0 + 100 + GRACE_S + 1) == 2
    assert table.n_histories("r1") == 1
    assert table.match(keys(conv1 + b"c" * 64), ["r1", "r2"]) == (2, {"r1"})
    # its next turn is a new history now: the replica holding the fewest first, not r1
    assert table.rank(keys(conv1 + b"c" * 64), ["r1", "r2"])[0] == ["r2"]
    # a report from before a prompt was sent (or within GRACE_S of it) drops nothing of that prompt
    table.record(keys(conv1), "r1", T0 + 200)
    assert table.reconcile("r1", set(keys(conv2)), T0 + 200 + GRACE_S - 1) == 0
    assert table.rank(keys(conv1 + b"c" * 64), ["r1", "r2"])[0] == ["r1"]
    # another replica's report never touches r1's keys
    assert table.reconcile("r2", set(), T0 + 1000) == 0 and table.n_histories("r1") == 2


def test_forget_and_the_bound_on_keys():
    table = AffinityTable(max_keys=4)
    table.record(keys(b"a" * 256), "r1", T0)
    table.record(keys(b"a" * 128), "r2", T0)
    assert table.match(keys(b"a" * 256), ["r1", "r2"]) == (4, {"r1"})
    table.forget("r1")
    assert table.match(keys(b"a" * 256), ["r1", "r2"]) == (2, {"r2"})
    assert table.n_histories("r1") == 0 and table.n_histories("r2") == 1
    table.record(keys(b"b" * 256), "r1", T0)  # 4 new keys push out the least recently used
    assert len(table) == 4 and table.match(keys(b"a" * 256), ["r2"]) == (0, set())
    assert table.n_histories("r2") == 0  # its history's keys are gone, and the history with them
    with pytest.raises(ValueError, match="max_keys = 0"):
        AffinityTable(max_keys=0)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_a_replicas_history_has_the_keys_of_the_prompt_it_came_from(model):
    """history_bytes(the tokens the server decodes) gives back the rendered prompt's bytes, a BOS the tokenizer
    added left out, and the answer's tokens extend them as the next turn's rendered prompt does: a replica
    reports the keys the ingress routes by (cluster/replica.py)."""
    from llamactx.runtime import Runtime, RuntimeParams

    rt = Runtime(RuntimeParams(model=model, vocab_only=True))
    vocab = rt.model.vocab
    messages = [{"role": "system", "content": "You are a travel agent. " * 8},
                {"role": "user", "content": "How do I get to Lisbon, and what does the hotel cost?"}]
    prompt = rt.template.render(messages, True)
    tokens = vocab.tokenize(prompt, add_special=True, parse_special=True)  # server/prompts.prompt_tokens
    assert history_bytes(vocab, tokens) == prompt.encode()
    answer = "Take the train: it is 120 euros."
    with_answer = tokens + vocab.tokenize(answer, add_special=False, parse_special=False)
    next_turn = rt.template.render([*messages, {"role": "assistant", "content": answer},
                                    {"role": "user", "content": "Do I need a visa?"}], True)
    assert next_turn.encode().startswith(history_bytes(vocab, with_answer))
    assert keys(next_turn.encode())[: len(keys(prompt.encode()))] == keys(prompt.encode())


# -- a request carried to a replica's app ----------------------------------------------------------------------


def _app(events: list[str]) -> Starlette:
    async def echo(request):
        return JSONResponse({"path": request.url.path, "query": request.url.query, "body": (await request.body())
                             .decode(), "auth": request.headers.get("authorization")}, status_code=201)

    async def ticks(request):
        async def gen():
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n".encode()
                    await asyncio.sleep(0.01)
                events.append("finished")
            except asyncio.CancelledError:
                events.append("cancelled")
                raise

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def boom(request):
        raise RuntimeError("boom")

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/ticks", ticks),
                             Route("/boom", boom)])


def _request(method: str, path: str, body: bytes = b"", query: bytes = b"") -> ForwardedRequest:
    scope = {"method": method, "path": path, "query_string": query, "client": ("127.0.0.1", 5),
             "headers": [(b"authorization", b"Bearer k"), (b"content-length", str(len(body)).encode())]}
    return ForwardedRequest.of(scope, body, (1, 2))


def test_relay_runs_the_app_and_returns_its_messages():
    async def run():
        return [m async for m in relay(_app([]), _request("POST", "/echo", b"hello", b"a=1"), [(b"x-r", b"7")])]

    (kind, status, headers), (body_kind, body, more) = asyncio.run(run())
    assert (kind, status, body_kind, more) == ("start", 201, "body", False)
    assert (b"x-r", b"7") in headers and (b"content-type", b"application/json") in headers
    assert body == b'{"path":"/echo","query":"a=1","body":"hello","auth":"Bearer k"}'


def test_a_consumer_that_stops_disconnects_the_app():
    events: list[str] = []

    async def run():
        stream = relay(_app(events), _request("GET", "/ticks"))
        got = [await stream.__anext__() for _ in range(4)]
        await stream.aclose()  # what Ray's cancellation of the replica's generator does
        return got

    got = asyncio.run(asyncio.wait_for(run(), 10))
    assert got[0][:2] == ("start", 200) and [m[1] for m in got[1:]] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert events == ["cancelled"]


def test_an_app_error_reaches_the_caller():
    async def run(app, path):
        return [m async for m in relay(app, _request("GET", path))]

    (_, status, _), _ = asyncio.run(run(_app([]), "/boom"))  # Starlette's own 500, as under uvicorn
    assert status == 500

    async def no_answer(scope, receive, send):
        raise RuntimeError("boom before any answer")

    with pytest.raises(RuntimeError, match="boom before any answer"):
        asyncio.run(run(no_answer, "/"))

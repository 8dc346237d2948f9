"""Prefix affinity without Ray: the chained block keys of a rendered prompt and the table the router ranks replicas
with (cluster/affinity.py), and one request run by an ASGI app on a replica (cluster/forward.py)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from llamactx.cluster.affinity import AffinityTable, prefix_keys
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


def test_a_conversation_sticks_and_a_shared_prefix_goes_by_load():
    table = AffinityTable()
    system = b"s" * 128
    conv1, conv2 = system + b"a" * 128, system + b"b" * 128
    table.record(prefix_keys(conv1, 64), "r1")
    # conversation 2 shares only the system prompt, which one prompt continued so far: r1 first
    assert table.rank(prefix_keys(conv2, 64), ["r1", "r2", "r3"]) == [["r1"], ["r2", "r3"]]
    table.record(prefix_keys(conv2, 64), "r2")
    # a later turn of conversation 1: r1 first, the others as the spill-over rank
    assert table.rank(prefix_keys(conv1 + b"c" * 64, 64), ["r1", "r2", "r3"]) == [["r1"], ["r2", "r3"]]
    # a new conversation: the system prompt has branched (two conversations went on from it): one rank, holders
    # first, Ray's least loaded takes it (replicated by load, not piled onto r1)
    assert table.rank(prefix_keys(system + b"d" * 128, 64), ["r3", "r2", "r1"]) == [["r1", "r2", "r3"]]
    # the same prompt sent again is no branch
    table.record(prefix_keys(conv1 + b"c" * 64, 64), "r1")
    table.record(prefix_keys(conv1 + b"c" * 64, 64), "r1")
    assert table.rank(prefix_keys(conv1 + b"c" * 128, 64), ["r2", "r1"]) == [["r1"], ["r2"]]
    # nothing in common: every candidate in one rank
    assert table.rank(prefix_keys(b"q" * 256, 64), ["r2", "r1"]) == [["r2", "r1"]]
    assert table.rank((), ["r1"]) == [["r1"]]
    # a holder that is no longer a candidate (dead) does not count: the longest prefix a candidate holds decides
    assert table.rank(prefix_keys(conv1, 64), ["r2", "r3"]) == [["r2", "r3"]]


def test_forget_and_the_bound_on_keys():
    table = AffinityTable(max_keys=4)
    table.record(prefix_keys(b"a" * 256, 64), "r1")
    table.record(prefix_keys(b"a" * 128, 64), "r2")
    assert table.match(prefix_keys(b"a" * 256, 64), ["r1", "r2"]) == (4, {"r1"})
    table.forget("r1")
    assert table.match(prefix_keys(b"a" * 256, 64), ["r1", "r2"]) == (2, {"r2"})
    table.record(prefix_keys(b"b" * 256, 64), "r1")  # 4 new keys push out the least recently used
    assert len(table) == 4 and table.match(prefix_keys(b"a" * 256, 64), ["r2"]) == (0, set())
    with pytest.raises(ValueError, match="max_keys = 0"):
        AffinityTable(max_keys=0)


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

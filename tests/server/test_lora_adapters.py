"""The server's LoRA adapters: --lora / --lora-scaled loaded at start, GET / POST /lora-adapters (llama-server's
global scales), a request's own "lora" field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamactx.llm import LLM
from tests.conftest import VARIANT_DIR
from tests.server.conftest import running_server

DATA = Path(__file__).parents[1] / "data" / "lora"
GREEDY = json.loads((DATA / VARIANT_DIR / "reference.json").read_text())["greedy"]


@pytest.fixture(scope="module")
def server():
    with running_server(model="smollm2", n_slots=2, n_ctx=1024,
                        lora=[(str(DATA / GREEDY["adapter"]), GREEDY["scale"]),
                              (str(DATA / "smollm2-lora-b.gguf"), 0.0)]) as running:
        yield running


def _complete(client, **extra) -> str:
    r = client.post("/v1/completions", json={"prompt": GREEDY["prompt"], "max_tokens": GREEDY["max_tokens"],
                                             "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_lora_adapters_get_post_and_completions(server, smollm):
    with server.client() as c:
        listed = c.get("/lora-adapters").json()
        assert [(e["id"], Path(e["path"]).name, e["scale"]) for e in listed] == [
            (0, GREEDY["adapter"], GREEDY["scale"]), (1, "smollm2-lora-b.gguf", 0.0)]
        assert _complete(c) == GREEDY["text"]  # llama-cpp-python's text with the same adapter and scale
        assert _complete(c, lora=[{"id": 0, "scale": GREEDY["scale"]}]) == GREEDY["text"]  # the scales in effect
        assert c.post("/lora-adapters", json=[{"id": 0, "scale": 0}]).json() == {"success": True}
        assert [e["scale"] for e in c.get("/lora-adapters").json()] == [0.0, 0.0]
        base = LLM(smollm, n_ctx=256).complete(GREEDY["prompt"], max_tokens=GREEDY["max_tokens"], temperature=0)
        assert _complete(c) == base.text != GREEDY["text"]  # the cached prompt was not reused with old adapters
        assert c.post("/lora-adapters", json=[{"id": 0, "scale": GREEDY["scale"]}]).status_code == 200
        assert _complete(c) == GREEDY["text"]


@pytest.mark.parametrize("body, message", [
    ({"id": 0, "scale": 1}, "must be an array"),
    ([{"id": 2, "scale": 1}], "body[0].id = 2 is not an adapter id in [0, 2)"),
    ([{"id": 0, "scale": "big"}], "body[0].scale = 'big' is not a finite number"),
    ([{"scale": 1}], "body[0].id = None"),
])
def test_bad_lora_requests_are_400_and_change_nothing(server, body, message):
    with server.client() as c:
        before = c.get("/lora-adapters").json()
        r = c.post("/lora-adapters", json=body)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
        assert c.get("/lora-adapters").json() == before


def test_per_request_scales_other_than_the_global_ones_are_refused(server):
    with server.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                                 "lora": [{"id": 1, "scale": 0.5}]})
        assert r.status_code == 400 and "POST /lora-adapters" in r.json()["error"]["message"]

"""POST /v1/rerank of `llamactx serve -m tiny-bert-rerank.gguf --reranking -fa off` over plain HTTP: a BERT
reranker's classifier head (cls, tanh, cls.output) scores each (query, document) pair as llama.cpp does, bit for bit
as float32 (tests/data/tiny/rerank.json: llama-cpp-python's score of each pair alone), in llama-server's order
(sorted by score, highest first, cut to top_n), with its usage; and equal to llama-server's own response where the
reference has one ("server": `llama-server --reranking -fa off -np 1`, make_tiny_rerank_reference.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from tests.conftest import VARIANT
from tests.models.tiny import TINY, TINY_REF
from tests.server.conftest import Running, running_server

N_DOCS = 3


@pytest.fixture(scope="module")
def ref() -> dict:
    path = TINY_REF / "rerank.json"
    if not path.exists():  # made by make_tiny_rerank_reference.py for each build of llama.cpp
        pytest.skip(f"no llama.cpp reference {path} for the {VARIANT} arithmetic")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def reranker(ref) -> Iterator[Running]:
    with running_server(model=str(TINY / "tiny-bert-rerank.gguf"), alias="tiny-bert-rerank", n_slots=1, n_ctx=512,
                        reranking=True, flash_attn="disabled") as running:
        yield running


def _bits(score: float) -> bytes:
    return np.float32(score).tobytes()


def _expected(ref) -> list[tuple[int, bytes]]:
    """(index, score bits) of the first N_DOCS pairs, highest score first (format_response_rerank's sort)."""
    scores = [float.fromhex(ref["rerank"]["alone"][i][0]) for i in range(N_DOCS)]
    return [(i, _bits(scores[i])) for i in sorted(range(N_DOCS), key=lambda i: -scores[i])]


def _rerank(reranker, ref, **fields) -> dict:
    with reranker.client() as http:
        res = http.post("/v1/rerank", json={"query": ref["query"], "documents": ref["documents"][:N_DOCS], **fields})
    assert res.status_code == 200, res.text
    return res.json()


def test_scores_and_order_are_llama_cpps(reranker, ref):
    body = _rerank(reranker, ref)
    assert [(r["index"], _bits(r["relevance_score"])) for r in body["results"]] == _expected(ref)
    n_tokens = sum(len(t) for t in ref["tokens"][:N_DOCS])
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens} and body["object"] == "list"


def test_the_response_is_llama_servers(reranker, ref):
    if "server" not in ref:  # llama-server is built for the native target only
        pytest.skip(f"no llama-server response in {TINY_REF / 'rerank.json'} for the {VARIANT} arithmetic")
    expected = ref["server"]["response"]
    body = _rerank(reranker, ref)
    assert [(r["index"], _bits(r["relevance_score"])) for r in body["results"]] == \
        [(r["index"], _bits(r["relevance_score"])) for r in expected["results"]]
    assert body["usage"] == expected["usage"] and body["object"] == expected["object"]


def test_top_n_keeps_the_highest_scores(reranker, ref):
    got = _rerank(reranker, ref, top_n=2)["results"]
    assert [(r["index"], _bits(r["relevance_score"])) for r in got] == _expected(ref)[:2]

"""POST /rerank with --reranking, from a client's view: llama.cpp's rank pooling for a model without a classifier
head (the score is element 0 of the last token's final hidden state), llama-server's two response shapes, top_n,
and a 400 naming the field for a malformed body."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from llamactx.batch import Batch
from llamactx.context import Context
from llamactx.cparams import ContextParams
from tests.server.conftest import Running, running_server

QUERY = "What is the capital city of France?"
DOCUMENTS = [
    "Bananas are yellow fruit that grow in bunches on tropical plants.",
    "Paris is the capital city of France.",
    "The stock market closed lower on Tuesday after a volatile session.",
]


@pytest.fixture(scope="module")
def reranker() -> Iterator[Running]:
    with running_server(model="smollm2", alias="smollm2", n_slots=1, n_ctx=1024, reranking=True) as running:
        yield running


def _pair_tokens(vocab, query: str, doc: str) -> list[int]:
    """llama-server's format_prompt_rerank for a model without a rerank template: [BOS] q [EOS] [SEP] d [EOS],
    each special token only where the vocabulary asks for it."""
    eos = vocab.eos if vocab.eos >= 0 else vocab.sep
    out = [vocab.bos] if vocab.add_bos else []
    out += vocab.tokenize(query, add_special=False) + ([eos] if vocab.add_eos else [])
    out += [vocab.sep] if vocab.add_sep else []
    return out + vocab.tokenize(doc, add_special=False) + ([eos] if vocab.add_eos else [])


def test_scores_are_element_0_of_the_last_token_hidden_state(reranker):
    with reranker.client() as http:
        res = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert res.status_code == 200, res.text
    body = res.json()
    state = reranker.state
    model, n_ctx = state.model, state.reranker.n_ctx
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=n_ctx, embeddings=True, pooling_type="last"))
    expected, n_tokens = {}, 0
    for i, doc in enumerate(DOCUMENTS):
        tokens = _pair_tokens(model.vocab, QUERY, doc)
        n_tokens += len(tokens)
        ctx.memory.clear(data=False)
        batch = Batch(len(tokens))
        for p, t in enumerate(tokens):
            batch.add(t, p, (0,), True)
        ctx.decode(batch)
        expected[i] = float(ctx.get_embeddings_seq(0)[0])  # not normalised
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert sorted(got) == [0, 1, 2]
    assert np.allclose([got[i] for i in range(3)], [expected[i] for i in range(3)], rtol=1e-5, atol=1e-6), \
        (got, expected)
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert body["results"][0]["index"] == 1  # the relevant document first
    assert body["model"] == "smollm2" and body["object"] == "list"
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}


def test_every_route_top_n_and_the_tei_shape(reranker):
    with reranker.client() as http:
        jina = http.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()
        full = http.post("/reranking", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 99}).json()
        tei = http.post("/v1/reranking", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True}).json()
        none = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 0}).json()
    assert len(jina["results"]) == 2 and len(full["results"]) == 3 and none["results"] == []
    assert jina["results"] == full["results"][:2]
    assert isinstance(tei, list) and len(tei) == 3
    assert [(r["index"], r["score"]) for r in tei] == [(r["index"], r["relevance_score"]) for r in full["results"]]
    assert all(r["text"] == DOCUMENTS[r["index"]] for r in tei)


@pytest.mark.parametrize(("body", "text"), [
    ({"documents": DOCUMENTS}, '"query" must be provided'),
    ({"query": 5, "documents": DOCUMENTS}, '"query" must be a string'),
    ({"query": QUERY, "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": QUERY}, '"documents" must be a non-empty string array'),
    ({"query": QUERY, "documents": ["ok", 2]}, "documents[1] is int"),
    ({"query": QUERY, "documents": "one"}, '"documents" must be a non-empty string array'),
    ({"query": QUERY, "documents": DOCUMENTS, "top_n": -1}, '"top_n" = -1 must be an integer >= 0'),
    ({"query": QUERY, "documents": DOCUMENTS, "top_n": "2"}, '"top_n"'),
    ({"query": QUERY, "documents": ["x " * 5000]}, "documents[0]"),
])
def test_bad_bodies_name_the_field(reranker, body, text):
    with reranker.client() as http:
        res = http.post("/v1/rerank", json=body)
        assert res.status_code == 400, res.text
        err = res.json()["error"]
        assert err["type"] == "invalid_request_error" and text in err["message"], err
        assert http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).status_code == 200


def test_without_the_flag_rerank_is_not_supported(server):
    with server.client() as http:
        res = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert res.status_code == 501
    assert res.json()["error"]["type"] == "not_supported_error" and "--reranking" in res.json()["error"]["message"]

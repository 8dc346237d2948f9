"""/v1/embeddings of an embedding model (the tiny BERT, tests/data/tiny/tiny-bert.gguf) through the official
`openai` client: the model's own pooling (mean) and llama.cpp's vector, normalised as llama-server does
(common_embd_normalize of llama.cpp's pooled embedding, tests/data/tiny/bert.npz); completions refused with the
reason."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import openai
import pytest

from llamactx.embedding import embd_normalize
from tests.conftest import reference_path
from tests.models.tiny import TINY
from tests.server.conftest import Running, running_server


@pytest.fixture(scope="module")
def bert_server() -> Iterator[Running]:
    with running_server(model=str(TINY / "tiny-bert.gguf"), alias="tiny-bert", n_slots=1, n_ctx=512) as running:
        yield running


@pytest.fixture(scope="module")
def client(bert_server):
    return openai.OpenAI(base_url=bert_server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_embeddings_are_llama_cpps_vectors(client):
    ref = json.loads(reference_path(TINY, "bert.json").read_text())
    with np.load(reference_path(TINY, "bert.npz")) as npz:
        # the server's default flash attention is llama.cpp's -fa auto: on for a CPU
        expected = [embd_normalize(npz[f"fa_mean_{i}"]) for i in (0, 2)]
    out = client.embeddings.create(model="tiny-bert", input=[ref["texts"][0], ref["texts"][2]])
    got = [np.array(d.embedding, np.float32) for d in out.data]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)
    assert out.usage.prompt_tokens == len(ref["tokens"][0]) + len(ref["tokens"][2])


def test_completions_are_refused_naming_the_reason(client):
    with pytest.raises(openai.BadRequestError, match="encoder"):
        client.completions.create(model="tiny-bert", prompt="the quick brown fox", max_tokens=4)

"""Every llama-server sampler a request names is honoured (issue 22): a seeded request with DRY, XTC, top-n-sigma,
dynamic temperature or a sampler order gives the text `llamactx.sampling` gives for the same chain (the LLM API
over the same model), and not the text of the plain chain."""

from __future__ import annotations

import pytest

from llamactx.llm import LLM

PROMPT = "Write a list of animals: cat, dog, cat, dog, cat,"
BASE = {"temperature": 1.0, "seed": 42, "max_tokens": 24}
CASES = {
    "dry": {"dry_multiplier": 2.0, "dry_allowed_length": 1},
    "xtc": {"xtc_probability": 1.0, "xtc_threshold": 0.02},
    "top_n_sigma": {"top_n_sigma": 0.5},
    "dynatemp": {"dynatemp_range": 0.9, "dynatemp_exponent": 0.5},
    "samplers-names": {"samplers": ["top_k", "temperature"], "top_k": 3},
    "samplers-chars": {"samplers": "kt", "top_k": 3},
}


@pytest.fixture(scope="module")
def llm(server):
    return LLM(server.state.model, n_ctx=server.state.engine.n_ctx_slot)


def served(server, **fields) -> str:
    with server.client() as http:
        res = http.post("/v1/completions", json={"prompt": PROMPT, **BASE, **fields})
        assert res.status_code == 200, res.text
        return res.json()["choices"][0]["text"]


@pytest.mark.parametrize("name", list(CASES))
def test_a_sampler_in_a_request_is_the_same_chain_as_llamactx_sampling(server, llm, name):
    fields = CASES[name]
    direct = llm.complete(PROMPT, max_tokens=BASE["max_tokens"], temperature=1.0, seed=42, **fields).text
    assert served(server, **fields) == direct
    assert direct != llm.complete(PROMPT, max_tokens=BASE["max_tokens"], temperature=1.0, seed=42).text


@pytest.mark.parametrize(("fields", "text"), [
    ({"xtc_probability": 2.0}, "xtc_probability"),
    ({"dry_multiplier": -1.0}, "dry_multiplier"),
    ({"samplers": ["top_k", "warp_drive"]}, "samplers[1]"),
    ({"samplers": "kQ"}, "samplers[1]"),
    ({"dynatemp_range": -0.5}, "dynatemp_range"),
])
def test_bad_sampler_fields_are_a_400_naming_them(server, fields, text):
    with server.client() as http:
        res = http.post("/v1/completions", json={"prompt": PROMPT, **BASE, **fields})
        assert res.status_code == 400 and text in res.json()["error"]["message"], res.text

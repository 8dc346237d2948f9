"""POST /infill: llama-server's repo-level FIM prompt (format_prompt_infill), and a clear 400 for a model without
FIM tokens (SmolLM2 and Gemma 3 have none)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from llamactx.api.infill import format_infill
from llamactx.api.protocol import ProtocolError


@dataclass
class CharVocab:
    """One token per character (ids = code points + 100); FIM tokens 1..5, BOS 0."""

    fim_pre: int = 1
    fim_suf: int = 2
    fim_mid: int = 3
    fim_rep: int = 4
    fim_sep: int = 5
    bos: int = 0
    add_bos: bool = False
    n_tokens: int = 1000

    def tokenize(self, text, add_special=False, parse_special=False):
        return [ord(c) + 100 for c in text]


def t(text: str) -> list[int]:
    return [ord(c) + 100 for c in text]


def test_the_fim_pattern_and_its_budget():
    v = CharVocab()
    got = format_infill(v, "abcdefgh", "uvwxyz", [{"filename": "f.py", "text": "XY"}], n_batch=16, n_predict=0,
                        n_ctx=1000, prompt_tokens=t("p"))
    extra = [4, *t("myproject\n"), 5, *t("f.py\n"), *t("XY"), 5, *t("filename\n")]
    # prefix: its last 3 * 16 / 4 = 12 (all 8); suffix: its first 16 / 4 - (2 + 1 prompt token) = 1
    assert got == [*extra, 1, *t("abcdefgh"), *t("p"), 2, *t("u"), 3]
    short = format_infill(v, "abcdefgh", "uvwxyz", [], n_batch=8, n_predict=0, n_ctx=8, prompt_tokens=[])
    assert short == [1, *t("cdefgh"), 2, 3]  # 6 of the prefix's end, 8 / 4 - 2 = 0 of the suffix, no room for extra
    v.add_bos, v.fim_sep = True, -1
    got = format_infill(v, "ab", [ord("z") + 100, "y"], [{"text": "Q"}], n_batch=64, n_predict=4, n_ctx=200,
                        prompt_tokens=[])
    assert got == [4, *t("myproject\n"), *t("\n\n--- snippet ---\n\n"), *t("Q"), 0, 1, *t("ab"), 2, *t("zy"), 3]
    with pytest.raises(ProtocolError, match="outside the vocab"):
        format_infill(v, [5000], "", [], 64, 4, 200, [])


def test_a_model_without_fim_tokens_gets_a_400(server):
    with server.client() as http:
        res = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": "):\n    pass"})
        err = res.json()["error"]
        assert res.status_code == 400 and "Infill is not supported by this model" in err["message"]
        assert "prefix" in err["message"] and err["type"] == "not_supported_error"

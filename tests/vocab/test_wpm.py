"""WordPiece (llamactx.vocab.wpm, llama-vocab.cpp's llm_tokenizer_wpm) against llama.cpp's tokens for the tiny
BERT vocabulary (tests/data/tiny/bert.json, llama-cpp-python's `tokenize`): accents, punctuation, unknown
words, CJK, whitespace runs; [CLS] ... [SEP] with add_special; special-token parsing."""

from __future__ import annotations

import json

import pytest

from llamactx import Model
from llamactx.vocab.wpm import preprocess
from tests.models.tiny import TINY, TINY_REF


@pytest.fixture(scope="module")
def vocab():
    return Model.load(TINY / "tiny-bert.gguf", vocab_only=True).vocab


@pytest.fixture(scope="module")
def ref() -> dict:
    return json.loads((TINY_REF / "bert.json").read_text())


def test_tokens_are_llama_cpps(vocab, ref):
    for text, with_special, plain in zip(ref["texts"], ref["tokens"], ref["tokens_plain"], strict=True):
        assert vocab.tokenize(text, add_special=True) == with_special, text
        assert vocab.tokenize(text, add_special=False) == plain, text


def test_special_tokens_are_parsed_and_cls_sep_added(vocab, ref):
    tokens = vocab.tokenize("[CLS] hello [SEP] [MASK] world", add_special=True, parse_special=True)
    assert tokens == ref["tokens_special"]
    assert (tokens[0], tokens[-1]) == (vocab.bos, vocab.sep)
    assert vocab.token_get_text(vocab.bos) == "[CLS]" and vocab.token_get_text(vocab.sep) == "[SEP]"


def test_unknown_word_is_one_unk_and_continuations_follow_a_word_start(vocab):
    unk = vocab.unk
    assert vocab.token_get_text(unk) == "[UNK]"
    assert vocab.tokenize("日本", add_special=False) == [unk, unk]  # each CJK ideograph is a word
    ids = vocab.tokenize("the", add_special=False)
    assert [vocab.token_get_text(i) for i in ids] == ["\u2581the"]
    pieces = [vocab.token_get_text(i) for i in vocab.tokenize("thes", add_special=False)]
    assert pieces[0].startswith("\u2581") and not any(p.startswith("\u2581") for p in pieces[1:])


def test_preprocess_normalizes_like_bert():
    assert preprocess("Café, NAÏVE!", True, True) == ["cafe", ",", "naive", "!"]
    assert preprocess("Café", False, False) == ["Café"]
    assert preprocess("a\u200bb\x00c\ufffd d", True, True) == ["abc", "d"]  # Cf / NUL / U+FFFD vanish
    assert preprocess("中文x", True, True) == ["中", "文", "x"]
    assert preprocess("  \t\n ", True, True) == []


def test_detokenize_puts_the_spaces_back(vocab):
    tokens = vocab.tokenize("the quick fox.", add_special=True)
    assert vocab.detokenize(tokens, remove_special=True).strip() == "the quick fox."

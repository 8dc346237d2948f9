"""LLAMA_VOCAB_TYPE_TEST (`tokenizer.ggml.model` = "test"): the dummy tokenizer of llama.cpp's own tests
(test-llama-archs builds models with it). Each raw-text fragment's UTF-8 bytes, in chunks of five, hash to one token
(hash = hash * 31 + byte, in uint64, modulo the vocabulary size); a token's piece is its id in hex.
"""

from __future__ import annotations

_CHUNK = 5
_U64 = (1 << 64) - 1


class DummyTokenizer:
    """llama_vocab::impl::tokenize's LLAMA_VOCAB_TYPE_TEST case."""

    def __init__(self, n_tokens: int) -> None:
        self._n_tokens = n_tokens

    def tokenize(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        out = []
        for pos in range(0, len(data), _CHUNK):
            h = 0
            for b in data[pos : pos + _CHUNK]:
                h = (h * 31 + b) & _U64
            out.append(h % self._n_tokens)
        return out


def dummy_piece(token: int) -> bytes:
    """token_to_piece for LLAMA_VOCAB_TYPE_TEST: format("%x", token)."""
    return f"{token:x}".encode()

"""RWKV's "world" tokenizer (`tokenizer.ggml.model` = "rwkv"): llama-vocab.cpp's llm_tokenizer_rwkv and
llm_tokenizer_rwkv_session.

Token texts are Python byte reprs without the b'' ("\\xff", "\\n", "\\\\"), as convert_hf_to_gguf writes them;
`unescape_rwkv_token` turns one back into its bytes (llama_unescape_rwkv_token, which also gives a token's piece).
Tokenizing is greedy: at each byte the longest token that the text continues with, in UTF-8 bytes; a byte no
token starts with is UNK.
"""

from __future__ import annotations

from collections.abc import Sequence

from llamactx.vocab.special import VocabError
from llamactx.vocab.tokenizers import Memo

_ESCAPES = {ord("t"): 0x09, ord("n"): 0x0A, ord("r"): 0x0D}


def unescape_rwkv_token(text: str) -> bytes:
    """llama_unescape_rwkv_token: '\\t' '\\n' '\\r', '\\xHH' (lower-case hex digits), '\\c' for any other c."""
    out = bytearray()
    data = text.encode("utf-8", "surrogateescape")
    escaping, hex_left, acc = False, 0, 0
    for c in data:
        if hex_left:
            acc = ((acc << 4) + (c - ord("a") + 10 if c >= ord("a") else c - ord("0"))) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            if c == ord("x"):
                hex_left = 2
            else:
                out.append(_ESCAPES.get(c, c))
            escaping = False
        elif c == ord("\\"):
            escaping = True
        else:
            out.append(c)
    return bytes(out)


class RwkvTokenizer:
    """llm_tokenizer_rwkv_session: greedy longest-match over the unescaped token bytes."""

    def __init__(self, texts: Sequence[str], unk: int) -> None:
        self._ids: dict[bytes, int] = {}
        self._prefixes: set[bytes] = set()  # the token trie's nodes
        for i, text in enumerate(texts):
            data = unescape_rwkv_token(text)
            self._ids[data] = i  # naive_trie::insert: a later token of the same bytes wins
            self._prefixes.update(data[:k] for k in range(1, len(data) + 1))
        self._unk = unk
        self._cache = Memo()

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (special tokens already split out)."""
        ids = self._cache.get(text)
        if ids is None:
            ids = self._greedy(text.encode("utf-8"))
            self._cache.put(text, ids)
        return list(ids)

    def _greedy(self, data: bytes) -> list[int]:
        out: list[int] = []
        pos, n = 0, len(data)
        while pos < n:
            if data[pos : pos + 1] not in self._prefixes:  # no token starts with this byte: UNK
                if self._unk < 0:
                    raise VocabError(f"RWKV vocab: no token starts with byte {data[pos]:#04x} and there is no UNK")
                out.append(self._unk)
                pos += 1
                continue
            end, best = pos + 1, 0
            while end <= n and data[pos:end] in self._prefixes:
                if data[pos:end] in self._ids:
                    best = end
                end += 1
            if best == 0:  # llama.cpp would restart from the text's beginning, forever
                raise VocabError(f"RWKV vocab: no token covers the bytes at offset {pos} ({data[pos:end][:16]!r})")
            out.append(self._ids[data[pos:best]])
            pos = best
        return out

"""PLaMo-2's tokenizer (`tokenizer.ggml.model` = "plamo2"): llama-vocab.cpp's llm_tokenizer_plamo2.

llama.cpp encodes with a dynamic program from the end of the text to its start over code points: at each
position every token (byte tokens aside) that the text continues with is a candidate scoring round(score * 1e4)
as an int32, and one code point as UNKNOWN scores -10^7 and goes out as its UTF-8 byte tokens ('<0xXX>'); the
lowest sum of negated scores wins, the longest candidate on a tie (the table lists a suffix's prefixes longest
first, the unknown row last, and only a strictly better sum replaces). llama.cpp finds the candidates through a
suffix table of the tokens; here a dict of token texts gives the same candidates. A leading U+FEFF is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from llamactx.vocab.special import ATTR_BYTE, VocabError
from llamactx.vocab.tokenizers import Memo

_UNKNOWN_SCORE = -10_000_000
_INF = 1 << 60


def _score_int(score: float) -> int | None:
    """static_cast<int32_t>(std::round(score * 1e4)); None for a score that is not finite (INVALID_SCORE)."""
    if not math.isfinite(score):
        return None
    x = score * 1e4
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def byte_tokens(texts: Sequence[str], attrs: Sequence[int]) -> list[int]:
    """The id of '<0xXX>' for each byte value (llm_tokenizer_plamo2::build); VocabError naming the first missing
    byte (llama.cpp refuses such a vocabulary at load)."""
    ids = [0] * 256
    for i, (text, attr) in enumerate(zip(texts, attrs, strict=True)):
        if attr & ATTR_BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                ids[int(text[3:5], 16)] = i
            except ValueError:
                continue
    for b, tid in enumerate(ids):
        if tid == 0:  # llama.cpp's test: a byte token at id 0 counts as missing too
            raise VocabError(f"PLaMo-2 vocab: byte token '<0x{b:02X}>' is not set")
    return ids


class Plamo2Tokenizer:
    """llm_tokenizer_plamo2_session over a vocabulary: `tokenize(fragment)` -> token ids."""

    def __init__(self, texts: Sequence[str], scores: Sequence[float], attrs: Sequence[int]) -> None:
        self._bytes = byte_tokens(texts, attrs)
        self._tokens: dict[str, tuple[int, int]] = {}  # text -> (id, int score), candidates only
        for i, (text, attr) in enumerate(zip(texts, attrs, strict=True)):
            score = _score_int(scores[i])
            if not attr & ATTR_BYTE and score is not None:
                self._tokens[text] = (i, score)
        self._max_len = max(map(len, self._tokens), default=0)
        self._cache = Memo()

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (special tokens already split out)."""
        ids = self._cache.get(text)
        if ids is None:
            ids = self._encode(text)
            self._cache.put(text, ids)
        return list(ids)

    def _encode(self, text: str) -> list[int]:
        if text.startswith("\ufeff"):
            text = text[1:]
        n = len(text)
        best = [_INF] * (n + 1)  # best[i]: the lowest sum of negated scores for text[i:]
        best[n] = 0
        step: list[tuple[int, int]] = [(1, -1)] * (n + 1)  # (length, token id; -1: byte fallback)
        tokens = self._tokens
        for i in range(n - 1, -1, -1):
            for k in range(min(self._max_len, n - i), 0, -1):
                hit = tokens.get(text[i : i + k])
                if hit is not None and best[i + k] - hit[1] < best[i]:
                    best[i], step[i] = best[i + k] - hit[1], (k, hit[0])
            if best[i + 1] - _UNKNOWN_SCORE < best[i]:
                best[i], step[i] = best[i + 1] - _UNKNOWN_SCORE, (1, -1)
        out: list[int] = []
        pos = 0
        while pos < n:
            k, tid = step[pos]
            if tid >= 0:
                out.append(tid)
            else:
                out += [self._bytes[b] for b in text[pos].encode("utf-8", "surrogatepass")]
            pos += k
        return out

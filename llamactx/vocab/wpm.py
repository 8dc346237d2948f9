"""WordPiece (WPM), the tokenizer of BERT vocabularies (`tokenizer.ggml.model` = "bert"): llama-vocab.cpp's
llm_tokenizer_wpm_session.

`preprocess` is BertNormalizer + BertPreTokenizer as llama.cpp does them: NFD and accent marks (Mn) dropped when
stripping accents, lower case (one code point for one, as llama.cpp's table), whitespace splits words, control
characters, NUL and U+FFFD vanish, and each punctuation mark, ASCII symbol and CJK ideograph is a word of its
own. Each word then gets the "▁" prefix (a converted BERT file stores word starts as "▁w" and continuations
without their "##") and is cut greedily into the longest vocabulary pieces from left to right, in UTF-8 bytes
as llama.cpp does; a word with a piece that matches nothing is one [UNK]. Unicode properties come from Python's
unicodedata (llama.cpp has its own tables of a close Unicode version).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from llamactx.vocab.tokenizers import SPM_SPACE, Memo

# unicode.cpp's whitespace set (unicode_cpt_flags: is_whitespace)
WHITESPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
     0x205F, 0x3000]
)
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # is_chinese_char (0x2B920 as HF's code)


def is_chinese_char(cpt: int) -> bool:
    return any(lo <= cpt <= hi for lo, hi in _CJK)


def unicode_tolower(ch: str) -> str:
    """unicode_tolower: the simple (one code point) lower case mapping."""
    low = ch.lower()
    return low if len(low) == 1 else low[0]


def preprocess(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """llm_tokenizer_wpm_session::preprocess: the words of `text`, normalized."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    words = [""]
    for ch in text:
        cpt = ord(ch)
        if cpt in WHITESPACE:
            if words[-1]:
                words.append("")
            continue
        cat = unicodedata.category(ch)
        if cpt == 0 or cpt == 0xFFFD or cat[0] == "C":  # is_control: categories Cc Cf Cs Co Cn
            continue
        if strip_accents and cat == "Mn":  # is_accent_mark
            continue
        s = unicode_tolower(ch) if lowercase else ch
        if cat[0] == "P" or (cpt < 0x7F and cat[0] == "S") or is_chinese_char(cpt):
            if words[-1]:
                words.append("")
            words[-1] = s  # a word of one character
            words.append("")
        else:
            words[-1] += s
    if not words[-1]:
        words.pop()
    return words


class WpmTokenizer:
    """llm_tokenizer_wpm_session over a vocabulary (token text -> id); `max_token_len`: the longest token text in
    UTF-8 bytes (llama_vocab::max_token_len)."""

    def __init__(self, token_to_id: Mapping[str, int], unk: int, lowercase: bool, strip_accents: bool) -> None:
        self._ids = {t.encode("utf-8", "surrogateescape"): i for t, i in token_to_id.items()}
        self._max_len = max((len(t) for t in self._ids), default=0)
        self._unk = unk
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self._cache = Memo()

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (special tokens already split out)."""
        out: list[int] = []
        for word in preprocess(text, self.lowercase, self.strip_accents):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._word(word)
                self._cache.put(word, ids)
            out += ids
        return out

    def _word(self, word: str) -> list[int]:
        """Greedy longest match over the bytes of "▁" + word; [UNK] for the whole word when a position matches
        nothing."""
        b = (SPM_SPACE + word).encode("utf-8")
        n, i, ids = len(b), 0, []
        while i < n:
            for j in range(min(n, i + self._max_len + 1), i, -1):
                tid = self._ids.get(b[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                return [self._unk]
        return ids

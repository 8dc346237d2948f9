"""UGM, the unigram tokenizer of T5-style vocabularies (`tokenizer.ggml.model` = "t5"): llama-vocab.cpp's
llm_tokenizer_ugm and llm_tokenizer_ugm_session.

The text is normalized first (`normalize`): at each position a prefix of a USER_DEFINED token's text is kept as
it is, else the longest prefix that SentencePiece's precompiled charsmap (an XOR-compressed double array, XCDA)
maps is replaced, else the code point is kept; spaces become '▁' and are prepended, merged or appended as
add_space_prefix / remove_extra_whitespaces say. Then a Viterbi pass over the normalized bytes picks the
tokenization of highest total score (scores are float32 log probabilities summed as doubles, USER_DEFINED tokens
scoring 0, a code point that no token covers costing the lowest normal score minus 10 as UNK); consecutive UNKs
merge into one. Everything runs on UTF-8 bytes, as llama.cpp does, so ties break the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llamactx.vocab.special import ATTR_NORMAL, ATTR_UNUSED, ATTR_USER_DEFINED, VocabError
from llamactx.vocab.tokenizers import SPM_SPACE, Memo

_SPACE = SPM_SPACE.encode("utf-8")
_UNK_PENALTY = np.float32(10.0)  # llm_tokenizer_ugm::unknown_token_score_penalty


def _utf8_len(lead: int) -> int:
    """unicode_len_utf8: the code point's length in bytes from its first byte."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[lead >> 4]


class Charsmap:
    """The precompiled charsmap: 4 bytes of XCDA size, the XCDA's uint32 entries, then NUL-terminated
    replacement strings (llm_tokenizer_ugm's constructor; xcda_array_view). Its header is checked when built, as
    llama_vocab::impl::load checks it: VocabError naming the key."""

    def __init__(self, blob: np.ndarray | None) -> None:
        self.xcda: list[int] = []
        self.replacements = b""
        if blob is None or len(blob) == 0:
            return
        data = np.asarray(blob).astype(np.uint8).tobytes()
        if len(data) < 4:
            raise VocabError("'tokenizer.ggml.precompiled_charsmap' is too small for its XCDA size header")
        size = int.from_bytes(data[:4], "little")
        if size + 4 >= len(data):
            raise VocabError(f"'tokenizer.ggml.precompiled_charsmap': XCDA size {size} exceeds the "
                             f"{len(data)}-byte blob")
        self.xcda = np.frombuffer(data[4 : 4 + size - size % 4], dtype="<u4").tolist()
        self.replacements = data[4 + size :]

    def _node(self, index: int) -> int:
        if index >= len(self.xcda):
            raise VocabError(f"precompiled charsmap: XCDA index {index} is outside its {len(self.xcda)} entries")
        return self.xcda[index]

    def _base(self, index: int) -> int:
        node = self._node(index)
        return (node >> 10) << ((node & (1 << 9)) >> 6)

    def longest_prefix(self, data: bytes, start: int) -> tuple[int, bytes]:
        """(length of the longest prefix of data[start:] the charsmap replaces, its replacement); (0, b"")
        for none."""
        if not self.xcda:
            return 0, b""
        best_len, best_offset = 0, 0
        index = self._base(0)
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break
            index ^= c
            node = self._node(index)
            if node & ((1 << 31) | 0xFF) != c:  # LCHECK: not a child of the previous node
                break
            is_leaf = (node >> 8) & 1
            index ^= self._base(index)
            if is_leaf:
                best_len = pos - start + 1
                best_offset = self._node(index) & ((1 << 31) - 1)
        if best_len == 0:
            return 0, b""
        if best_offset >= len(self.replacements):
            raise VocabError("precompiled charsmap: a replacement offset is outside the blob")
        end = self.replacements.find(b"\0", best_offset)
        if end < 0:
            raise VocabError("precompiled charsmap: an unterminated replacement string")
        return best_len, self.replacements[best_offset:end]


class UgmTokenizer:
    """llm_tokenizer_ugm_session over a vocabulary: `tokenize(fragment)` -> token ids."""

    def __init__(
        self,
        texts: Sequence[str],
        scores: Sequence[float],
        attrs: Sequence[int],
        unk: int,
        charsmap: Charsmap,
        add_space_prefix: bool,
        remove_extra_whitespaces: bool,
    ) -> None:
        self._charsmap = charsmap
        self._unk = unk
        self._add_space_prefix, self._merge_spaces = add_space_prefix, remove_extra_whitespaces
        self._ids: dict[bytes, int] = {}
        self._score: dict[int, float] = {}
        user_prefixes: set[bytes] = set()
        min_score = np.float32(np.inf)
        for i, (text, attr) in enumerate(zip(texts, attrs, strict=True)):
            data = text.encode("utf-8", "surrogateescape")
            if attr & ATTR_NORMAL:
                min_score = min(min_score, np.float32(scores[i]))
            if attr & (ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED):
                self._ids[data] = i  # naive_trie::insert: a later token of the same text wins
                self._score[i] = 0.0 if attr & ATTR_USER_DEFINED else float(scores[i])
            if attr & ATTR_USER_DEFINED:
                user_prefixes.update(data[:k] for k in range(1, len(data) + 1))
        self._user_prefixes = frozenset(user_prefixes)
        self._unk_score = float(np.float32(min_score - _UNK_PENALTY))  # float arithmetic, as llama.cpp
        self._max_len = max(map(len, self._ids), default=0)
        self._cache = Memo()

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (special tokens already split out)."""
        ids = self._cache.get(text)
        if ids is None:
            ids = self._viterbi(self.normalize(text.encode("utf-8")))
            self._cache.put(text, ids)
        return list(ids)

    def normalize(self, data: bytes) -> bytes:
        """llm_tokenizer_ugm_session::normalize (treat_whitespace_as_suffix is never set: no GGUF key)."""
        out = bytearray()
        prepended = in_word = False
        pos = 0
        while pos < len(data):
            piece, consumed = self._normalize_prefix(data, pos)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self._add_space_prefix and not prepended) or self._merge_spaces:
                            out += _SPACE
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not self._merge_spaces:
                        out += _SPACE
            pos += consumed
        return bytes(out)

    def _normalize_prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        # naive_trie::get_longest_prefix walks the user-defined tokens' trie as far as the input follows it,
        # whether or not a token ends there
        k = 0
        while pos + k < len(data) and data[pos : pos + k + 1] in self._user_prefixes:
            k += 1
        if k:
            return data[pos : pos + k], k
        n, replacement = self._charsmap.longest_prefix(data, pos)
        if n:
            return replacement, n
        n = min(_utf8_len(data[pos]), len(data) - pos)
        return data[pos : pos + n], n

    def _viterbi(self, data: bytes) -> list[int]:
        n = len(data)
        if n == 0:
            return []
        # best[i] = (score_sum, token, start) of the best tokenization of data[:i]
        best: list[tuple[float, int, int]] = [(-np.inf, self._unk, 0)] * (n + 1)
        best[0] = (0.0, self._unk, 0)
        ids, score = self._ids, self._score
        start = 0
        while start < n:
            n_cp = min(_utf8_len(data[start]), n - start)
            base = best[start][0]
            single = False
            for end in range(start + 1, min(n, start + self._max_len) + 1):
                tid = ids.get(data[start:end])
                if tid is None:
                    continue
                single = single or end - start == n_cp
                challenger = base + score[tid]
                if challenger > best[end][0]:
                    best[end] = (challenger, tid, start)
            if not single:
                end = start + n_cp
                challenger = base + self._unk_score
                if challenger > best[end][0]:
                    best[end] = (challenger, self._unk, start)
            start += n_cp
        out: list[int] = []
        pos, prev_unk = n, False
        while True:
            _, tid, prev = best[pos]
            is_unk = tid == self._unk
            if not (prev_unk and is_unk):
                out.append(tid)
            if prev == 0:
                break
            prev_unk, pos = is_unk, prev
        return out[::-1]

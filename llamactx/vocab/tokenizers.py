"""The two tokenizer models behind `Vocab.tokenize`: SPM (llama-vocab.cpp's llm_tokenizer_spm_session) and
byte-level BPE (llm_tokenizer_bpe_session).

Both see one raw-text fragment at a time (special tokens were already split out) and return token ids. Both
cache the ids of the pieces they have seen, which is what makes them fast on real text; the caches are memos
of pure functions, bounded in entries and in bytes, and keep no piece longer than MEMO_MAX_KEY characters (a
client's huge word is tokenized, never kept).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Mapping, Sequence
from typing import Any

from llamactx.vocab.pretok import PreTokenizer
from llamactx.vocab.special import VocabError

MEMO_MAX_ENTRIES = 1 << 17
MEMO_MAX_BYTES = 32 << 20  # keys' characters + 8 bytes per id, about what the entries hold beyond their overhead
MEMO_MAX_KEY = 256
SPM_SPACE = "\u2581"  # '▁', llama_escape_whitespace
_SPM_LONG_SEGMENT = 64


class Memo:
    """piece -> token ids, forgotten whole when it would pass MEMO_MAX_ENTRIES entries or MEMO_MAX_BYTES; pieces
    longer than MEMO_MAX_KEY characters are not kept."""

    def __init__(self) -> None:
        self._ids: dict[str, list[int]] = {}
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, key: str) -> list[int] | None:
        return self._ids.get(key)

    def put(self, key: str, ids: list[int]) -> None:
        if len(key) > MEMO_MAX_KEY or key in self._ids:
            return
        size = len(key) + 8 * len(ids)
        if len(self._ids) >= MEMO_MAX_ENTRIES or self.nbytes + size > MEMO_MAX_BYTES:
            self._ids.clear()
            self.nbytes = 0
        self._ids[key] = ids
        self.nbytes += size


class SpmTokenizer:
    """llm_tokenizer_spm_session: highest-score bigram merges over the UTF-8 characters of a fragment.

    llama.cpp merges over the whole fragment at once; we cut it into segments first and merge each one alone,
    caching the result per segment. That is exact: a merged symbol is always a vocab token, so a cut between
    two characters whose pair occurs in no token can never be crossed by a merge, and the merges on either
    side never compete (the heap order restricted to one segment is unchanged: score, then leftmost). We cut
    before each run of '▁' (unless some token holds that character followed by '▁') and, inside long segments
    (CJK, code), at every other pair that no token contains.
    """

    def __init__(self, token_to_id: Mapping[str, int], texts: Sequence[str], scores: Sequence[float]) -> None:
        self._token_to_id = token_to_id
        self._scores = scores
        self._texts = texts
        self._cache = Memo()
        self._pairs: frozenset[str] | None = None
        self._byte_ids: list[int | None] | None = None
        before_space = "".join(sorted(_chars_before_space(texts)))
        glue = f"|(?<=[{re.escape(before_space)}]){SPM_SPACE}+" if before_space else ""
        self._segment_re = re.compile(f"{SPM_SPACE}*(?:[^{SPM_SPACE}]{glue})+|{SPM_SPACE}+")

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one escaped fragment (spaces already replaced by '▁')."""
        out: list[int] = []
        cache = self._cache
        for seg in self._segment_re.findall(text):
            ids = cache.get(seg)
            if ids is None:
                ids = self._tokenize_segment(seg)
                cache.put(seg, ids)
            out += ids
        return out

    def _tokenize_segment(self, seg: str) -> list[int]:
        if len(seg) <= _SPM_LONG_SEGMENT:
            return self._merge(seg)
        if self._pairs is None:
            pairs: set[str] = set()
            for t in self._texts:
                pairs.update(map(str.__add__, t, t[1:]))  # every adjacent character pair in a token
            self._pairs = frozenset(pairs)
        pairs = self._pairs
        cuts = [i for i in range(1, len(seg)) if seg[i - 1 : i + 1] not in pairs]
        out: list[int] = []
        for a, b in zip([0, *cuts], [*cuts, len(seg)], strict=True):
            out += self._merge(seg[a:b])
        return out

    def _merge(self, text: str) -> list[int]:
        # llm_tokenizer_spm_session::tokenize: symbols are characters; the bigram whose concatenation is the
        # highest-scoring token merges first, ties to the leftmost; a queued bigram is stale once either side
        # changed length (the size check of llama.cpp).
        syms = list(text)
        n = len(syms)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        get, scores = self._token_to_id.get, self._scores
        heap = []
        for i in range(n - 1):
            tid = get(syms[i] + syms[i + 1])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            a, b = syms[left], syms[right]
            if not a or not b or len(a) + len(b) != size:
                continue
            syms[left], syms[right] = a + b, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            for lo, hi in ((prv[left], left), (left, nxt[left])):
                if lo >= 0 and hi >= 0:
                    merged = syms[lo] + syms[hi]
                    tid = get(merged)
                    if tid is not None:
                        heapq.heappush(heap, (-scores[tid], lo, hi, len(merged)))
        out: list[int] = []
        for sym in syms:
            if sym:
                tid = get(sym)
                out += [tid] if tid is not None else self._bytes(sym)
        return out

    def _bytes(self, sym: str) -> list[int]:
        # resegment: a symbol that is no token goes out as byte tokens (llama_vocab::byte_to_token: '<0xXX>',
        # else the one-byte text itself; llama.cpp throws when neither exists)
        if self._byte_ids is None:
            get = self._token_to_id.get
            self._byte_ids = [get(f"<0x{b:02X}>", get(chr(b)) if b < 0x80 else None) for b in range(256)]
        out = []
        for b in sym.encode("utf-8"):
            tid = self._byte_ids[b]
            if tid is None:
                raise VocabError(f"SPM vocab has no byte token '<0x{b:02X}>' for character {sym!r}")
            out.append(tid)
        return out


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _chars_before_space(texts: Sequence[str]) -> set[str]:
    # characters that some token holds right before a '▁' (e.g. Gemma's '>▁</'): no cut between them
    out = set()
    for t in texts:
        j = t.find(SPM_SPACE, 1)
        while j > 0:
            if t[j - 1] != SPM_SPACE:
                out.add(t[j - 1])
            j = t.find(SPM_SPACE, j + 1)
    return out


class BpeTokenizer:
    """llm_tokenizer_bpe_session for byte-level BPE: llama.cpp's pre-tokenizer split, then per word the GPT-2
    byte-to-unicode mapping and rank-ordered merges.

    The merges run in HF `tokenizers` (Rust): its BPE merges the lowest-rank pair first, ties to the leftmost,
    exactly as llm_bigram_bpe's queue does, and `ignore_merges` is the same shortcut as llama.cpp's. Words are
    cached here, so HF sees each distinct word once. Merges whose parts or result are not in the vocab are
    left out (HF rejects them; llama.cpp would merge and then drop the unknown symbol's bytes).

    `byte_encode` False is SPM-style BPE (gemma4): the words stay raw UTF-8 and a symbol that is no token goes
    out as '<0xXX>' byte tokens (HF's byte_fallback). `newline_words`: a word of newlines only that is a token
    is that token, unmerged (llama.cpp's gemma4 fix, llm_tokenizer_bpe_session::tokenize).
    """

    def __init__(
        self,
        token_to_id: Mapping[str, int],
        merges: Sequence[str],
        ignore_merges: bool,
        pre: PreTokenizer,
        byte_encode: bool = True,
        newline_words: bool = False,
    ) -> None:
        self.pre = pre
        self._token_to_id = token_to_id
        self._merges = merges
        self._ignore_merges = ignore_merges
        self._byte_encode = byte_encode
        self._newline_words = newline_words
        self._hf: Any = None  # tokenizers.Tokenizer, built on the first unseen word
        self._cache = Memo()

    def _build(self) -> Any:
        from tokenizers import Tokenizer, models, pre_tokenizers

        # tokens that are not valid UTF-8 (kept as surrogates) can never come out of byte-level merges, and HF's
        # vocab cannot hold them
        vocab = {t: i for t, i in self._token_to_id.items() if _is_utf8(t)}
        pairs, seen = [], set()
        for m in self._merges:
            pos = m.find(" ", 1)  # llama_vocab::impl::load: split at the first space after position 0
            if pos < 0:
                continue
            pair = (m[:pos], m[pos + 1 :])
            if pair not in seen and pair[0] in vocab and pair[1] in vocab and pair[0] + pair[1] in vocab:
                seen.add(pair)  # bpe_ranks.emplace keeps the first rank of a repeated merge
                pairs.append(pair)
        if not self._byte_encode:
            return Tokenizer(models.BPE(vocab, pairs, ignore_merges=self._ignore_merges, byte_fallback=True))
        hf = Tokenizer(models.BPE(vocab, pairs, ignore_merges=self._ignore_merges))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return hf

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment."""
        words = self.pre.split(text)
        cache = self._cache
        distinct = set(words)
        found = {w: ids for w in distinct if (ids := cache.get(w)) is not None}
        if self._newline_words:
            found.update((w, [self._token_to_id[w]]) for w in distinct if w in self._token_to_id and not w.strip("\n"))
        missing = [w for w in distinct if w not in found]
        if missing:
            for w, ids in zip(missing, self._encode(missing), strict=True):
                found[w] = ids
                cache.put(w, ids)
        out: list[int] = []
        for w in words:
            out += found[w]
        return out

    def _encode(self, words: list[str]) -> list[list[int]]:
        if self._hf is None:
            self._hf = self._build()
        enc = self._hf.encode(words, is_pretokenized=True, add_special_tokens=False)
        groups: list[list[int]] = [[] for _ in words]
        for tid, wid in zip(enc.ids, enc.word_ids, strict=True):
            groups[wid].append(tid)
        return groups

"""The BPE sessions that cut the text before the BPE tokenizer sees it (src/llama-vocab.cpp):
llm_tokenizer_whitespace_session (`tokenizer.ggml.model` = "whitespace", jina-embeddings-v2-base-zh) and
llm_tokenizer_hybriddna_session ("hybriddna": text with <dna>...</dna> spans of DNA k-mers).
"""

from __future__ import annotations

from collections.abc import Mapping

from llamactx.vocab.tokenizers import BpeTokenizer
from llamactx.vocab.wpm import WHITESPACE, unicode_tolower

DNA_KMER_MARKER = "\ue000"  # the suffix that keeps a k-mer's id apart from a BPE token of the same letters
_DNA_OPEN, _DNA_CLOSE, _DNA_OOV, _DNA_K = "<dna>", "</dna>", "<oov>", 6


class WhitespaceBpe:
    """llm_tokenizer_whitespace_session: whitespace (unicode_cpt_flags) separates segments and is dropped; each
    segment, lower-cased per code point when the normalizer says so, goes to the BPE session alone."""

    def __init__(self, bpe: BpeTokenizer, lowercase: bool) -> None:
        self._bpe, self._lowercase = bpe, lowercase

    def tokenize(self, text: str) -> list[int]:
        out: list[int] = []
        segment: list[str] = []
        for ch in text + " ":
            if ord(ch) in WHITESPACE:
                if segment:
                    out += self._bpe.tokenize("".join(segment))
                    segment = []
            else:
                segment.append(unicode_tolower(ch) if self._lowercase else ch)
        return out


class HybridDnaBpe:
    """llm_tokenizer_hybriddna_session: outside <dna>...</dna> plain BPE; inside, the upper-cased bytes in k-mers of
    six (the last one padded with 'A'), each the token '<k-mer>' + DNA_KMER_MARKER or '<oov>'. Without the three
    tags in the vocab, plain BPE throughout."""

    def __init__(self, bpe: BpeTokenizer, token_to_id: Mapping[str, int]) -> None:
        self._bpe, self._token_to_id = bpe, token_to_id
        self._tags = [token_to_id.get(t) for t in (_DNA_OPEN, _DNA_CLOSE, _DNA_OOV)]

    def tokenize(self, text: str) -> list[int]:
        begin, end_id, oov = self._tags
        if begin is None or end_id is None or oov is None:
            return self._bpe.tokenize(text)
        out: list[int] = []
        pos = 0
        while pos < len(text):
            start = text.find(_DNA_OPEN, pos)
            if start < 0:
                out += self._bpe.tokenize(text[pos:])
                break
            if start > pos:
                out += self._bpe.tokenize(text[pos:start])
            out.append(begin)
            content = start + len(_DNA_OPEN)
            end = text.find(_DNA_CLOSE, content)
            out += self._kmers(text[content : len(text) if end < 0 else end], oov)
            if end < 0:
                break
            out.append(end_id)
            pos = end + len(_DNA_CLOSE)
        return out

    def _kmers(self, raw: str, oov: int) -> list[int]:
        # emit_dna_kmers works on the UTF-8 bytes: only a-z are upper-cased
        seq = bytes(c - 32 if 0x61 <= c <= 0x7A else c for c in raw.encode("utf-8"))
        out = []
        for i in range(0, len(seq), _DNA_K):
            kmer = seq[i : i + _DNA_K].ljust(_DNA_K, b"A")
            text = kmer.decode("utf-8", "surrogateescape") + DNA_KMER_MARKER
            out.append(self._token_to_id.get(text, oov))
        return out

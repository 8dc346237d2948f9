"""Special tokens: ids, attributes, the end-of-generation set, and splitting them out of text.

`SpecialTokens.detect` follows the special-token part of llama_vocab::impl::load (src/llama-vocab.cpp):
default ids per tokenizer model, GGUF keys, detection by token text, the 'unused' marking, the EOG set and its
fix-ups, the per-model LSTRIP/RSTRIP attributes, and cache_special_tokens. `partition` is
tokenizer_st_partition.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from llamactx.errors import LlamactxError

TOKEN_NULL = -1  # LLAMA_TOKEN_NULL

# llama_token_attr (include/llama.h)
ATTR_UNDEFINED, ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL = 0, 1 << 0, 1 << 1, 1 << 2
ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_BYTE = 1 << 3, 1 << 4, 1 << 5
ATTR_LSTRIP, ATTR_RSTRIP = 1 << 7, 1 << 8
# llama_token_type -> attr: UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE],
    dtype=np.int64,
)

_KEY = "tokenizer.ggml."
# field=GGUF key, in llama_vocab::impl::load order (the deprecated prefix/suffix/middle keys come last)
_ID_KEYS = [
    tuple(pair.split("="))
    for pair in (
        "bos=bos_token_id eos=eos_token_id eot=eot_token_id eom=eom_token_id unk=unknown_token_id "
        "sep=seperator_token_id pad=padding_token_id mask=mask_token_id fim_pre=fim_pre_token_id "
        "fim_suf=fim_suf_token_id fim_mid=fim_mid_token_id fim_pad=fim_pad_token_id fim_rep=fim_rep_token_id "
        "fim_sep=fim_sep_token_id fim_pre=prefix_token_id fim_suf=suffix_token_id fim_mid=middle_token_id"
    ).split()
]
# token texts that identify a special token the GGUF does not name (llama_vocab::impl::load)
_BY_TEXT = {
    "eot": (
        "<|eot_id|> <|im_end|> <|end|> <end_of_turn> <|endoftext|> <|end_of_text|> <EOT> _<EOT> [EOT] "
        "<｜end▁of▁sentence｜> <end_of_utterance>"
    ).split(),
    "eom": ["<|eom_id|>"],
    "fim_pre": (
        "<|fim_prefix|> <fim-prefix> <fim_prefix> <｜fim▁begin｜> <PRE> ▁<PRE> <|code_prefix|> <|prefix|>"
    ).split(),
    "fim_suf": (
        "<|fim_suffix|> <fim-suffix> <fim_suffix> <｜fim▁hole｜> <SUF> ▁<SUF> <|code_suffix|> <|suffix|>"
    ).split(),
    "fim_mid": (
        "<|fim_middle|> <fim-middle> <fim_middle> <｜fim▁end｜> <MID> ▁<MID> <|code_middle|> <|middle|>"
    ).split(),
    "fim_pad": "<|fim_pad|> <fim-pad> <fim_pad> <PAD> [PAD]".split(),
    "fim_rep": "<|fim_repo|> <|repo_name|> <fim-repo> <REPO> <reponame>".split(),
    "fim_sep": ["<|file_sep|>"],
}
_EOG_TEXTS = frozenset(
    (
        "<|eot_id|> <|im_end|> <|end|> <|return|> <|call|> <|flush|> <|calls|> <end_of_turn> <|endoftext|> "
        "</s> <|eom_id|> <EOT> _<EOT> [EOT] [EOS] <|end_of_text|> <end_of_utterance> <eos> <turn|> "
        "<|tool_response> <｜end▁of▁sentence｜> [e~["
    ).split()
)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: USER_DEFINED
_SPACES = " \t\n\x0b\x0c\r"  # C isspace()

log = logging.getLogger("llamactx.vocab")


class VocabError(LlamactxError, ValueError):
    """Vocab metadata that cannot be used, or input the vocab cannot take (a token id outside it, text with no
    UTF-8 form); the message names the key or the value. (Defined here, the vocab package's lowest module; the
    public name is llamactx.vocab.VocabError.)"""


def attrs_from_types(types: np.ndarray | None, n: int) -> list[int]:
    """Token attributes from tokenizer.ggml.token_type (all NORMAL without it); unknown types -> UNDEFINED."""
    if types is None:
        return [ATTR_NORMAL] * n
    t = np.asarray(types[:n], dtype=np.int64)
    ok = (t >= 0) & (t < len(_TYPE_TO_ATTR))
    return np.where(ok, _TYPE_TO_ATTR[np.where(ok, t, 0)], ATTR_UNDEFINED).tolist()


@dataclass(slots=True)
class SpecialTokens:
    """Special token ids (TOKEN_NULL when absent), the EOG set and cache_special_tokens."""

    bos: int = TOKEN_NULL
    eos: int = TOKEN_NULL
    eot: int = TOKEN_NULL
    eom: int = TOKEN_NULL
    unk: int = TOKEN_NULL
    sep: int = TOKEN_NULL
    pad: int = TOKEN_NULL
    mask: int = TOKEN_NULL
    fim_pre: int = TOKEN_NULL
    fim_suf: int = TOKEN_NULL
    fim_mid: int = TOKEN_NULL
    fim_pad: int = TOKEN_NULL
    fim_rep: int = TOKEN_NULL
    fim_sep: int = TOKEN_NULL
    eog: tuple[int, ...] = ()
    cache: tuple[int, ...] = ()

    @classmethod
    def detect(
        cls,
        meta: Mapping[str, object],
        texts: Sequence[str],
        token_to_id: Mapping[str, int],
        attrs: list[int],
        model_type: str,
        pre_type: str,
    ) -> SpecialTokens:
        """Special ids as llama_vocab::impl::load finds them. Updates `attrs` in place as llama.cpp does
        (CONTROL for detected specials, UNUSED for 'unused' control tokens, the gpt-oss and EOG fix-ups)."""
        n = len(texts)
        sp = cls(bos=1, eos=2, unk=0) if model_type == "llama" else cls(bos=11, eos=11)
        if model_type == "bert":  # WPM's defaults: [CLS] 101 as BOS, [UNK] 100, [SEP] 102, [PAD] 0, [MASK] 103
            sp = cls(bos=101, unk=100, sep=102, pad=0, mask=103)
        elif model_type in ("gemma4", "rwkv", "test"):  # read from the GGUF only
            sp = cls()
        elif model_type == "t5":  # UGM: '</s>' 1, '<unk>' 2, '<pad>' 0
            sp = cls(eos=1, unk=2, pad=0)
        elif model_type == "plamo2":  # <|plamo:unk|> 0, <|plamo:bos|> 1, <|plamo:eos|> 2, <|plamo:pad|> 3
            sp = cls(bos=1, eos=2, unk=0, pad=3)
        if pre_type == "chatglm4":
            sp.bos = TOKEN_NULL
        for field, key in _ID_KEYS:
            if getattr(sp, field) >= n:
                setattr(sp, field, TOKEN_NULL)  # a default outside the vocab is disabled
            _set_id(sp, field, _KEY + key, meta.get(_KEY + key), n)
        for field, candidates in _BY_TEXT.items():
            # llama.cpp takes the first hit while walking its unordered_map (libstdc++ hash order,
            # unspecified); we take the lowest id, which agrees for the models in tests/data (SmolLM2's EOT is
            # '<|endoftext|>' (0), not '<|im_end|>' (2))
            hits = [token_to_id[t] for t in candidates if t in token_to_id]
            if getattr(sp, field) == TOKEN_NULL and hits:
                setattr(sp, field, min(hits))
                attrs[min(hits)] |= ATTR_CONTROL
        for i in np.flatnonzero(np.asarray(attrs) & ATTR_CONTROL).tolist():
            if "unused" in texts[i]:
                attrs[i] |= ATTR_UNUSED
        sp.eog = tuple(sorted(_eog_ids(sp, texts, attrs, token_to_id)))
        sp.cache = tuple(_cache_special_tokens(texts, attrs))
        _model_attrs(meta, texts, attrs, token_to_id, sp.cache)
        return sp


def _set_id(sp: SpecialTokens, field: str, key: str, value: object, n: int) -> None:
    """Take a special token id from the GGUF key; one outside the vocab keeps the default, with llama.cpp's warning."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise VocabError(f"'{key}' = {value!r} is not an integer token id")
    if not 0 <= value < n:
        log.warning("bad special token: '%s' = %d is outside [0, %d), using default id %d", key, value, n,
                    getattr(sp, field))
        return
    setattr(sp, field, int(value))


def _eog_ids(
    sp: SpecialTokens, texts: Sequence[str], attrs: list[int], token_to_id: Mapping[str, int]
) -> set[int]:
    eog = {i for i in (sp.fim_pad, sp.fim_rep, sp.fim_sep) if i != TOKEN_NULL}
    for text in _EOG_TEXTS:
        if text in token_to_id:
            eog.add(token_to_id[text])
            attrs[token_to_id[text]] |= ATTR_CONTROL
    for text in _ALWAYS_RENDERED:
        if text in token_to_id:
            attrs[token_to_id[text]] = ATTR_USER_DEFINED
    eog |= {i for i in (sp.eos, sp.eot, sp.eom) if i != TOKEN_NULL}
    by_text = {texts[i]: i for i in eog}
    has_call = "<|call|>" in by_text or "<|calls|>" in by_text
    if "<|end|>" in by_text and has_call and ("<|return|>" in by_text or "<|flush|>" in by_text):
        # o200k_harmony / solar-open: '<|end|>' is not end-of-generation there
        eog.discard(by_text["<|end|>"])
        attrs[by_text["<|end|>"]] = ATTR_USER_DEFINED
    if "</s>" in by_text and ("<|tool_response>" in by_text or "<|plamo:eos|>" in by_text):
        eog.discard(by_text["</s>"])  # gemma4 / plamo: '</s>' is a normal token
        attrs[by_text["</s>"]] = ATTR_NORMAL
    return eog


def _cache_special_tokens(texts: Sequence[str], attrs: list[int]) -> list[int]:
    # CONTROL, USER_DEFINED and UNKNOWN tokens, longest text (in bytes) first. llama.cpp's std::sort leaves
    # the order of equal lengths unspecified; we keep them by id.
    ids = np.flatnonzero(np.asarray(attrs) & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)).tolist()
    return sorted(ids, key=lambda i: -len(texts[i].encode("utf-8", "surrogateescape")))


def _model_attrs(
    meta: Mapping[str, object],
    texts: Sequence[str],
    attrs: list[int],
    token_to_id: Mapping[str, int],
    cache: Sequence[int],
) -> None:
    # llama_vocab::impl::load, "set attributes by model/tokenizer/architecture name"
    name = str(meta.get("general.name", "")).lower()
    pre = str(meta.get(_KEY + "pre", ""))
    arch = str(meta.get("general.architecture", ""))

    def set_attr(text: str, attr: int, on: bool) -> None:
        if text in token_to_id:
            i = token_to_id[text]
            attrs[i] = attrs[i] | attr if on else attrs[i] & ~attr

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", ATTR_LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for i in cache:
            attrs[i] |= ATTR_RSTRIP
        set_attr("</s>", ATTR_RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, ATTR_RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", ATTR_LSTRIP, True)


class _SpecialMatcher:
    """Finds which special tokens occur in a text at all: one trie-shaped regex gives the longest special at a
    position; every shorter special matching there is a prefix of it. Positions inside a match are probed too,
    since specials may overlap."""

    def __init__(self, specials: Sequence[str]) -> None:
        trie: dict = {}
        for s in specials:
            node = trie
            for ch in s:
                node = node.setdefault(ch, {})
            node[""] = True
        self.regex = re.compile(_trie_pattern(trie), re.DOTALL)
        present = set(specials)
        self.prefixes = {s: [s[:k] for k in range(1, len(s) + 1) if s[:k] in present] for s in specials}

    def occurring(self, text: str) -> set[str]:
        found: set[str] = set()
        match = self.regex.match
        for m in self.regex.finditer(text):
            found.update(self.prefixes[m.group()])
            for p in range(m.start() + 1, m.end()):
                inner = match(text, p)
                if inner:
                    found.update(self.prefixes[inner.group()])
        return found


def _trie_pattern(node: dict) -> str:
    branches = [re.escape(ch) + _trie_pattern(child) for ch, child in sorted(node.items()) if ch]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    return f"(?:{body})?" if "" in node else body


def partition(
    text: str,
    cache: Sequence[int],
    texts: Sequence[str],
    attrs: Sequence[int],
    parse_special: bool,
    matchers: dict[bool, _SpecialMatcher | None],
) -> list[int | str]:
    """tokenizer_st_partition: `text` as raw-text pieces (str) and special token ids (int). Each special,
    longest first, is cut out of every raw piece; CONTROL and UNKNOWN specials only when `parse_special`.
    `matchers` caches the compiled matcher per `parse_special`."""
    if not text:
        return []
    if parse_special not in matchers:
        allowed = [texts[i] for i in cache if parse_special or not attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)]
        matchers[parse_special] = _SpecialMatcher(allowed) if allowed else None
    matcher = matchers[parse_special]
    found = matcher.occurring(text) if matcher else set()
    frags: list[int | tuple[int, int]] = [(0, len(text))]
    for tid in cache:
        if texts[tid] in found and (parse_special or not attrs[tid] & (ATTR_CONTROL | ATTR_UNKNOWN)):
            frags = _cut(text, frags, tid, texts[tid], attrs[tid])
    return [f if isinstance(f, int) else text[f[0] : f[1]] for f in frags]


def _cut(
    text: str, frags: list[int | tuple[int, int]], tid: int, needle: str, attr: int
) -> list[int | tuple[int, int]]:
    out: list[int | tuple[int, int]] = []
    for frag in frags:
        if isinstance(frag, int):
            out.append(frag)
            continue
        start, end = frag
        while True:
            m = text.find(needle, start, end)
            if m < 0:
                out.append((start, end))
                break
            left = m
            if attr & ATTR_LSTRIP:
                while left > start and text[left - 1] in _SPACES:
                    left -= 1
            if left > start:
                out.append((start, left))
            out.append(tid)
            start = m + len(needle)
            if attr & ATTR_RSTRIP:
                while start < end and text[start] in _SPACES:
                    start += 1
            if start >= end:
                break
    return out

"""Vocab: tokenize / detokenize / token_to_piece, as llama.cpp's src/llama-vocab.cpp (llama_vocab::impl).

Loading (`Vocab.from_gguf_meta`) follows llama_vocab::impl::load: tokenizer model and pre-tokenizer type,
token attributes from token types, special token ids (defaults, GGUF keys, then detection by text), the
end-of-generation set and the special-token cache. Tokenizing follows llama_vocab::impl::tokenize: special
tokens are split out of the text first (tokenizer_st_partition, in special.py), then each raw fragment
goes to the SPM, BPE or WPM tokenizer (tokenizers.py, wpm.py). Supported tokenizer models: 'llama' (SPM),
'gpt2' (byte-level BPE, every pre-tokenizer of pre_types.py), 'gemma4' (SPM-style BPE on raw UTF-8), 'whitespace'
and 'hybriddna' (BPE behind bpe_sessions.py's cuts), 'bert' (WPM), 't5' (UGM, ugm.py), 'rwkv' (rwkv.py) and
'plamo2' (plamo2.py), and llama.cpp's dummy 'test' (dummy.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from llamactx.vocab.bpe_sessions import DNA_KMER_MARKER, HybridDnaBpe, WhitespaceBpe
from llamactx.vocab.detokenize import clean_spaces, decode_byte_level
from llamactx.vocab.dummy import DummyTokenizer, dummy_piece
from llamactx.vocab.plamo2 import Plamo2Tokenizer, byte_tokens
from llamactx.vocab.pre_types import PRE_TYPES, REGEX_EXPRS, PreType
from llamactx.vocab.pretok import PreTokenizer
from llamactx.vocab.rwkv import RwkvTokenizer, unescape_rwkv_token
from llamactx.vocab.special import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    TOKEN_NULL,
    SpecialTokens,
    VocabError,
    attrs_from_types,
    partition,
)
from llamactx.vocab.tokenizers import SPM_SPACE, BpeTokenizer, SpmTokenizer
from llamactx.vocab.ugm import Charsmap, UgmTokenizer
from llamactx.vocab.wpm import WpmTokenizer

__all__ = ["TOKEN_NULL", "Vocab", "VocabError"]

# one tokenizer session per llama_vocab_type
Session = (SpmTokenizer | BpeTokenizer | WhitespaceBpe | HybridDnaBpe | WpmTokenizer | UgmTokenizer | RwkvTokenizer
           | Plamo2Tokenizer | DummyTokenizer)


_KEY = "tokenizer.ggml."
_HEX = frozenset("0123456789abcdefABCDEF")  # std::isxdigit
_NOT_WORD = re.compile(r"\W+")
# tokenizer.ggml.model -> llama_vocab_type (llama_vocab::impl::load)
VOCAB_TYPES = {
    "llama": "spm", "gpt2": "bpe", "gemma4": "bpe", "whitespace": "bpe", "hybriddna": "bpe", "bert": "wpm", "t5": "ugm",
    "rwkv": "rwkv", "plamo2": "plamo2", "test": "test",
}


class Vocab:
    """A model's vocabulary and tokenizer. Build with `Vocab.from_gguf_meta(meta)`.

    Token ids outside [0, n_tokens) raise ValueError wherever a token id is taken.
    """

    def __init__(
        self,
        model_type: str,
        pre_type: str,
        texts: list[str],
        token_to_id: dict[str, int],
        scores: list[float],
        attrs: list[int],
        special: SpecialTokens,
        flags: Mapping[str, bool],
        merges: Sequence[str],
        pre: PreType,
    ) -> None:
        self.model_type, self.pre_type = model_type, pre_type
        self.vocab_type = VOCAB_TYPES[model_type]  # spm, bpe, wpm, ugm, rwkv or plamo2 (llama_vocab_type)
        self.n_tokens = len(texts)
        self._texts, self._token_to_id, self._scores, self._attrs = texts, token_to_id, scores, attrs
        self.bos, self.eos, self.eot, self.eom = special.bos, special.eos, special.eot, special.eom
        self.unk, self.sep, self.pad, self.mask = special.unk, special.sep, special.pad, special.mask
        self.fim_pre, self.fim_suf, self.fim_mid = special.fim_pre, special.fim_suf, special.fim_mid
        self.fim_pad, self.fim_rep, self.fim_sep = special.fim_pad, special.fim_rep, special.fim_sep
        self.eog_ids = frozenset(special.eog)
        self.special_cache = special.cache  # cache_special_tokens: text length (bytes) descending
        self.add_bos, self.add_eos = flags["add_bos"], flags["add_eos"]
        self.add_sep = flags.get("add_sep", False)  # llama_vocab_get_add_sep: SEP between a rerank query and doc
        self.add_space_prefix, self.clean_spaces = flags["add_space_prefix"], flags["clean_spaces"]
        self.ignore_merges = flags["ignore_merges"]
        self.lowercase, self.strip_accents = flags.get("lowercase", False), flags.get("strip_accents", False)
        self.remove_extra_whitespaces = flags.get("remove_extra_whitespaces", False)
        self._charsmap = flags.get("charsmap")  # UGM's precompiled_charsmap
        self.escape_whitespaces = pre.escape_whitespaces  # SPM-style BPE: ' ' is '▁' in the token texts
        self._merges, self._pre = merges, pre
        self._model: Session | None = None
        self._pieces: list[bytes | None] = [None] * self.n_tokens
        self._matchers: dict = {}  # partition's special-token matcher per parse_special
        self._nl: int | None = None
        self._max_token_len: int | None = None

    # ---- loading -------------------------------------------------------------------------------------------

    @classmethod
    def from_gguf_meta(cls, meta: Mapping[str, object]) -> Vocab:
        """Build from GGUF metadata (every key/value, arrays as numpy arrays or lists of str).

        Raises ValueError naming the key for missing or malformed tokenizer metadata and for unsupported
        tokenizer models (see VOCAB_TYPES) or pre-tokenizer types.
        """
        model_type = meta.get(_KEY + "model")
        if not isinstance(model_type, str):
            raise VocabError(f"'{_KEY}model' is missing or not a string: {model_type!r}")
        if model_type not in VOCAB_TYPES:
            raise VocabError(f"'{_KEY}model' = {model_type!r} is not supported (supported: "
                             f"{', '.join(map(repr, VOCAB_TYPES))})")
        texts = _string_list(meta, _KEY + "tokens")
        n = len(texts)
        for i, t in enumerate(texts):
            if not t:
                texts[i] = f"[EMPTY_{i}]"  # llama_vocab::impl::load renames empty tokens
        token_to_id = dict(zip(texts, range(n), strict=True))
        if len(token_to_id) != n:
            dup = next(t for i, t in enumerate(texts) if token_to_id[t] != i)
            raise VocabError(
                f"'{_KEY}tokens' holds {dup!r} twice (ids {texts.index(dup)} and {token_to_id[dup]})"
            )
        if model_type == "hybriddna" and "<oov>" in token_to_id:  # the k-mers after '<oov>' detokenize bare
            for i in range(token_to_id["<oov>"] + 1, n):
                if len(texts[i]) > 1 and texts[i].endswith(DNA_KMER_MARKER):
                    texts[i] = texts[i][:-1]
        scores = _numeric(meta, _KEY + "scores", n, (np.floating, np.integer))
        types = _numeric(meta, _KEY + "token_type", n, (np.integer,))
        flags = {
            "add_space_prefix": True,
            "clean_spaces": False,
            "add_bos": True,
            "add_eos": False,
            "ignore_merges": False,
        }
        merges: Sequence[str] = ()
        pre = PRE_TYPES["default"]
        if VOCAB_TYPES[model_type] == "bpe":
            # the gemma4 tokenizer model is BPE with the gemma4 pre-tokenizer, whatever tokenizer.ggml.pre says
            name = "gemma4" if model_type == "gemma4" else (meta.get(_KEY + "pre", "") or "default")
            if name not in PRE_TYPES:
                raise VocabError(f"'{_KEY}pre' = {name!r} is not a supported pre-tokenizer type")
            pre = PRE_TYPES[name]
            # Kimi-K2's vocabulary may come without merges (llama_vocab::impl::load skips them)
            if not (name == "kimi-k2" and model_type == "gpt2" and _KEY + "merges" not in meta):
                merges = _merges(meta, _KEY + "merges")
            flags.update(add_space_prefix=False, clean_spaces=pre.clean_spaces, ignore_merges=pre.ignore_merges,
                         add_bos=pre.add_bos)
        if model_type == "bert":  # WPM (llama_vocab::impl::load): no space prefix, clean_spaces, [SEP] appended
            flags.update(add_space_prefix=False, clean_spaces=True)
        # BertNormalizer's options (WPM, the whitespace session): lower case (default true but for the whitespace
        # pre-tokenizer), strip accents (default: as lowercase)
        flags["lowercase"] = _bool(meta, _KEY + "normalizer.lowercase", pre.name != "whitespace")
        flags["strip_accents"] = _bool(meta, _KEY + "normalizer.strip_accents", flags["lowercase"])
        if model_type == "t5":  # UGM: no BOS, EOS appended, no space prefix unless the file asks
            flags.update(add_space_prefix=False, add_bos=False, add_eos=True)
        if model_type in ("rwkv", "plamo2", "test"):
            flags.update(add_space_prefix=False, add_bos=False)
        flags["add_space_prefix"] = _bool(meta, _KEY + "add_space_prefix", flags["add_space_prefix"])
        flags["remove_extra_whitespaces"] = _bool(meta, _KEY + "remove_extra_whitespaces", False)
        charsmap = meta.get(_KEY + "precompiled_charsmap")
        if charsmap is not None and not (isinstance(charsmap, np.ndarray) and charsmap.dtype in (np.uint8, np.int8)):
            raise VocabError(f"'{_KEY}precompiled_charsmap' is not an array of 8-bit integers")
        flags["charsmap"] = Charsmap(charsmap if model_type == "t5" else None)
        attrs = attrs_from_types(types, n)
        special = SpecialTokens.detect(meta, texts, token_to_id, attrs, model_type, pre.name)
        if model_type == "plamo2":
            byte_tokens(texts, attrs)  # llm_tokenizer_plamo2::build refuses a vocabulary without all 256
        # Gemma 4 adds BOS whatever its file says (llama.cpp's workaround, PR 21500)
        flags["add_bos"] = _bool(meta, _KEY + "add_bos_token", flags["add_bos"]) or pre.name == "gemma4"
        flags["add_eos"] = _bool(meta, _KEY + "add_eos_token", flags["add_eos"])
        # false for SPM and BPE vocabularies unless the file says otherwise (llama-vocab.cpp sets it for WPM and
        # the jina / roberta BPE pre-tokenizers)
        flags["add_sep"] = _bool(meta, _KEY + "add_sep_token", model_type == "bert" or pre.add_sep)
        score_list = [0.0] * n if scores is None else np.asarray(scores[:n], dtype=np.float64).tolist()
        return cls(model_type, pre.name, texts, token_to_id, score_list, attrs, special, flags, merges, pre)

    def _tokenizer(self) -> Session:
        # built on first use: BPE merges and SPM segment tables cost a little, detokenizing needs neither
        if self._model is None:
            if self.vocab_type == "wpm":
                self._model = WpmTokenizer(self._token_to_id, self.unk, self.lowercase, self.strip_accents)
            elif self.vocab_type == "spm":
                self._model = SpmTokenizer(self._token_to_id, self._texts, self._scores)
            elif self.vocab_type == "rwkv":
                self._model = RwkvTokenizer(self._texts, self.unk)
            elif self.vocab_type == "plamo2":
                self._model = Plamo2Tokenizer(self._texts, self._scores, self._attrs)
            elif self.vocab_type == "test":
                self._model = DummyTokenizer(self.n_tokens)
            elif self.vocab_type == "ugm":
                self._model = UgmTokenizer(self._texts, self._scores, self._attrs, self.unk, self._charsmap,
                                           self.add_space_prefix, self.remove_extra_whitespaces)
            else:
                splitter = PreTokenizer(REGEX_EXPRS[self._pre.family])
                bpe = BpeTokenizer(self._token_to_id, self._merges, self.ignore_merges, splitter,
                                   byte_encode=self._pre.byte_encode, newline_words=self._pre.name == "gemma4")
                if self.model_type == "whitespace":
                    self._model = WhitespaceBpe(bpe, self.lowercase)
                elif self.model_type == "hybriddna":
                    self._model = HybridDnaBpe(bpe, self._token_to_id)
                else:
                    self._model = bpe
        return self._model

    # ---- tokens --------------------------------------------------------------------------------------------

    def _check(self, token: int) -> int:
        token = int(token)
        if not 0 <= token < self.n_tokens:
            raise VocabError(f"token id {token} is out of range [0, n_tokens={self.n_tokens})")
        return token

    def token_get_text(self, token: int) -> str:
        """The token's text as stored in the vocab (llama_vocab_get_text)."""
        return self._texts[self._check(token)]

    def token_get_score(self, token: int) -> float:
        """The token's score (0.0 for vocabs without scores)."""
        return self._scores[self._check(token)]

    def token_get_attr(self, token: int) -> int:
        """llama_token_attr bit flags (LLAMA_TOKEN_ATTR_*), as llama_vocab::impl::load derives them."""
        return self._attrs[self._check(token)]

    def is_eog(self, token: int) -> bool:
        """Whether the token ends generation (llama_vocab_is_eog); LLAMA_TOKEN_NULL (-1) is not."""
        return token != TOKEN_NULL and self._check(token) in self.eog_ids

    def is_control(self, token: int) -> bool:
        """Whether the token has the CONTROL attribute."""
        return bool(self._attrs[self._check(token)] & ATTR_CONTROL)

    @property
    def nl(self) -> int:
        """The newline token (llama_vocab_nl): SPM '<0x0A>', BPE the first token of "\\n"."""
        if self._nl is None:
            if self.vocab_type == "spm":
                self._nl = self._token_to_id.get("<0x0A>", self._token_to_id.get("\n", self.pad))
            elif self.vocab_type == "wpm":
                self._nl = self.pad
            else:
                ids = self._tokenizer().tokenize("\n")
                self._nl = ids[0] if ids else self.pad
        return self._nl

    # ---- tokenize ------------------------------------------------------------------------------------------

    def min_tokens(self, text: str) -> int:
        """A lower bound on len(tokenize(text)) from the text's length alone, to refuse an over-long prompt before
        tokenizing it. Tokens partition the text, and no token covers more characters of it than its own text
        has UTF-8 bytes (SPM's '▁' and BPE's byte-to-unicode mapping only lengthen a piece), so there are at
        least len(text) / (the longest token text, in bytes) tokens. The tokenizers that drop or merge characters
        (WPM, UGM, the whitespace session: whitespace, controls, accents) keep every letter, digit and '_', so
        for them only those count; the dummy 'test' tokenizer covers five bytes a token."""
        if self._max_token_len is None:
            longest = max(len(t.encode("utf-8", "surrogatepass")) for t in self._texts)
            self._max_token_len = max(longest, 5) if self.vocab_type == "test" else longest
        n = len(text)
        if self.vocab_type in ("wpm", "ugm") or self.model_type == "whitespace":
            n = len(_NOT_WORD.sub("", text))  # the \w characters (str.isalnum or '_')
        return -(-n // self._max_token_len)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text` (llama_tokenize). `add_special` adds BOS/EOS as the model asks
        (add_bos/add_eos); `parse_special` lets CONTROL and UNKNOWN token texts in `text` become those tokens
        (USER_DEFINED ones always do). Raises ValueError for text holding lone surrogates (no UTF-8 form)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise VocabError(
                f"text holds a lone surrogate {text[e.start]!r} at index {e.start}; it has no UTF-8 form"
            ) from None
        fragments = partition(
            text, self.special_cache, self._texts, self._attrs, parse_special, self._matchers
        )
        model = self._tokenizer()
        out: list[int] = []
        if isinstance(model, WpmTokenizer):  # llama_vocab::impl::tokenize, WPM: [CLS] ... [SEP] when add_special
            return self._tokenize_wpm(model, fragments, add_special)
        if isinstance(model, (RwkvTokenizer, Plamo2Tokenizer, DummyTokenizer)):  # these never add BOS / EOS
            add_special = False
        if add_special and self.add_bos:
            if self.bos == TOKEN_NULL:
                raise VocabError("the model asks for BOS (add_bos_token) but has no BOS token")
            out.append(self.bos)
        if isinstance(model, SpmTokenizer):
            is_prev_special = True  # SPM: prefix with a space at the start and after each special token
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    is_prev_special = True
                    continue
                prefix = " " if self.add_space_prefix and is_prev_special else ""
                out += model.tokenize((prefix + frag).replace(" ", SPM_SPACE))
                is_prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:  # llama_escape_whitespace for SPM-style BPE (gemma4)
                    out += model.tokenize(frag.replace(" ", SPM_SPACE) if self.escape_whitespaces else frag)
        if add_special and self.add_eos:
            if self.eos == TOKEN_NULL:
                raise VocabError("the model asks for EOS (add_eos_token) but has no EOS token")
            out.append(self.eos)
        return out

    def _tokenize_wpm(self, model: WpmTokenizer, fragments: list, add_special: bool) -> list[int]:
        """WPM: BOS ([CLS]) and SEP around the fragments with add_special, whatever add_bos / add_eos say."""
        if add_special and (self.bos == TOKEN_NULL or self.sep == TOKEN_NULL):
            raise VocabError("a WPM (bert) vocabulary needs BOS ([CLS]) and SEP tokens to add special tokens")
        out = [self.bos] if add_special else []
        for frag in fragments:
            out += [frag] if isinstance(frag, int) else model.tokenize(frag)
        return out + [self.sep] if add_special else out

    # ---- detokenize ----------------------------------------------------------------------------------------

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The bytes one token stands for (llama_token_to_piece with lstrip 0). CONTROL and UNKNOWN tokens
        give b"" unless `special`; a piece may be part of a UTF-8 character."""
        token = self._check(token)
        if not special and self._attrs[token] & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        piece = self._pieces[token]
        if piece is None:
            piece = self._pieces[token] = self._piece(token)
        return piece

    def _piece(self, token: int) -> bytes:
        # llama_vocab::impl::token_to_piece with special = true (what cache_token_to_piece holds)
        attr, text = self._attrs[token], self._texts[token]
        if self.vocab_type == "rwkv":  # every token, whatever its attributes
            return unescape_rwkv_token(text)
        if self.vocab_type == "test":
            return dummy_piece(token)
        if self.vocab_type == "plamo2":  # '<0xXX>' byte tokens as their byte, every other token as its text
            hex_ok = len(text) == 6 and text[:3] == "<0x" and text[5] == ">" and all(c in _HEX for c in text[3:5])
            if attr & ATTR_BYTE and hex_ok:
                return bytes([int(text[3:5], 16)])
            return text.encode("utf-8", "surrogateescape")
        # token texts are the file's bytes: undecodable ones were kept as surrogates, and go back out as those bytes
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & ATTR_NORMAL:
            if self.vocab_type != "bpe" or self.escape_whitespaces:  # SPM, WPM, SPM-style BPE: '▁' back to ' '
                return text.replace(SPM_SPACE, " ").encode("utf-8", "surrogateescape")
            return decode_byte_level(text)
        if attr & ATTR_BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b"\x00"  # strtol of a malformed '<0xXX>' gives 0
        return b""

    def detokenize(
        self, tokens: Iterable[int], remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        """Text of a token sequence (llama_detokenize): pieces joined as bytes, then decoded with invalid
        UTF-8 as U+FFFD. `remove_special` drops a leading BOS / trailing EOS the model adds; `unparse_special`
        renders CONTROL/UNKNOWN tokens as their text. Applies the model's leading-space and clean-up rules."""
        toks = [self._check(t) for t in tokens]
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and toks and toks[0] == self.bos:
            remove_space = False
            toks = toks[1:]
        if remove_special and self.add_eos and toks and toks[-1] == self.eos:
            toks = toks[:-1]
        pieces = [self.token_to_piece(t, unparse_special) for t in toks]
        if remove_space and pieces and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]
        data = b"".join(pieces)
        if self.clean_spaces:
            data = clean_spaces(data)
        return data.decode("utf-8", errors="replace")


def _string_list(meta: Mapping[str, object], key: str) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, (list, tuple)) or not set(map(type, value)) <= {str}:
        raise VocabError(f"'{key}' is missing or not an array of strings (got {type(value).__name__})")
    return list(value)


def _numeric(meta: Mapping[str, object], key: str, n: int, kinds: tuple[type, ...]) -> np.ndarray | None:
    value = meta.get(key)
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.ndim != 1 or not any(np.issubdtype(arr.dtype, k) for k in kinds):
        raise VocabError(f"'{key}' is not a 1-D numeric array of the expected kind (dtype {arr.dtype})")
    if len(arr) != n:  # llama.cpp reads n entries; more means the arrays do not describe the same tokens
        raise VocabError(f"'{key}' has {len(arr)} entries for the {n} tokens of '{_KEY}tokens'")
    return arr


def _merges(meta: Mapping[str, object], key: str) -> list[str]:
    """BPE merges: each "left right", split at the first space after the first character (llama_vocab::impl::load,
    which would silently store an empty pair for anything else)."""
    merges = _string_list(meta, key)
    for i, m in enumerate(merges):
        pos = m.find(" ", 1)
        if pos < 0 or pos == len(m) - 1:
            raise VocabError(f"'{key}'[{i}] = {m[:64]!r} is not two parts separated by a space")
    return merges


def _bool(meta: Mapping[str, object], key: str, default: bool) -> bool:
    value = meta.get(key, default)
    if not isinstance(value, (bool, np.bool_)):
        raise VocabError(f"'{key}' = {value!r} is not a bool")
    return bool(value)

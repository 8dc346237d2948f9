"""Constrained output: a grammar sampler backed by llguidance (common/llguidance.cpp, llama.cpp's
LLAMA_LLGUIDANCE build).

`GrammarSampler` masks the logits of every token the grammar cannot take next, so each completion parses.
Grammars come as GBNF (llama.cpp's grammar format, converted by llguidance's own gbnf_to_lark), Lark
(llguidance's native format) or a JSON schema (compiled by llguidance). The engine works on token bytes: the
tokenizer it needs is built from a `Vocab` once (`engine_tokenizer`) and shared by every grammar on that vocab.

Why llguidance and not xgrammar: llama.cpp itself ships llguidance as its alternative grammar engine
(common/llguidance.cpp), so the token-bytes convention below is upstream's; it reads llama.cpp's GBNF as well as
Lark and JSON schema; its wheel is one self-contained Rust extension (xgrammar brings torch and transformers);
and it computes each mask lazily from a token trie, with no per-grammar pass over the whole vocabulary, so a
new grammar costs milliseconds and a mask typically well under a millisecond, on the 49k and the 262k vocabulary.

Errors: a malformed grammar or schema raises `GrammarError` (a ValueError) carrying the engine's message. A
grammar that reaches a dead end mid-generation (the engine reports an error or allows no token) raises
`GrammarDeadEnd` (a RuntimeError) from `apply` / `accept`; that ends the one generation. A rejected token
changes nothing; after an engine error, `reset` starts the grammar over.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any, Literal

import llguidance
import llguidance.gbnf_to_lark
import numpy as np

from llamactx.errors import LlamactxError
from llamactx.sampling.token_data import TokenDataArray
from llamactx.vocab import Vocab

__all__ = ["GrammarDeadEnd", "GrammarError", "GrammarSampler", "engine_tokenizer"]

GrammarKind = Literal["gbnf", "lark", "json_schema"]

# The engine prints warnings to stderr at log level 1; we report errors through exceptions instead.
_LOG_LEVEL = 0
# Non-verbose errors: the message names the failure without dumping parser state and the whole grammar.
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class GrammarError(LlamactxError, ValueError):
    """A grammar or JSON schema the engine cannot compile; the message includes the engine's."""


class GrammarDeadEnd(LlamactxError, RuntimeError):
    """The grammar cannot continue: the engine is in an error state, allows no token, or was given a token it
    does not allow."""


# ---- the engine's tokenizer, one per vocab -------------------------------------------------------------------

_tokenizers: weakref.WeakKeyDictionary[Vocab, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


class _VocabTokens:
    """What llguidance.TokenizerWrapper reads: token bytes, EOS/BOS ids and a tokenize callable.

    Holds the vocab weakly: the engine tokenizer keeps this object alive and is itself a value of the
    vocab-keyed cache, so a strong reference would keep every vocab alive forever.
    """

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = weakref.ref(vocab)
        self.tokens = [_token_bytes(vocab, t) for t in range(vocab.n_tokens)]
        self.special_token_ids = [t for t, b in enumerate(self.tokens) if b[:1] == b"\xff"]
        self.eos_token_id = vocab.eot if vocab.eot >= 0 else vocab.eos
        self.bos_token_id = vocab.bos if vocab.bos >= 0 else None

    def __call__(self, text: str) -> list[int]:
        # llama_sampler_llg_tokenize_fn: no BOS/EOS, special token texts parsed. Taking only str makes
        # TokenizerWrapper pass str (it probes with bytes and falls back on the TypeError).
        vocab = self._vocab()
        if vocab is None:
            raise RuntimeError("the vocab of this grammar tokenizer has been freed")
        return vocab.tokenize(text, add_special=False, parse_special=True)


def _token_bytes(vocab: Vocab, token: int) -> bytes:
    # llama_sampler_llg_new_tokenizer: the piece as text; a token with no text piece (CONTROL, UNKNOWN) is a
    # special token, given to the engine as 0xFF + its text so that no grammar literal can spell it.
    piece = vocab.token_to_piece(token)
    if piece:
        return piece
    special = vocab.token_to_piece(token, special=True)
    return b"\xff" + special if special else b""


def engine_tokenizer(vocab: Vocab) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for `vocab`: token bytes, the end-of-generation tokens and llguidance's slices
    for fast masks. Built on first use (a cost that grows with the vocabulary) and cached for as long as
    `vocab` lives; safe to call from several threads.
    """
    with _tokenizers_lock:
        tok = _tokenizers.get(vocab)
        if tok is None:
            src = _VocabTokens(vocab)
            eog = sorted({src.eos_token_id, *vocab.eog_ids} - {-1})
            tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(src), n_vocab=vocab.n_tokens, eos_token=eog)
            _tokenizers[vocab] = tok
        return tok


# ---- grammar text -> llguidance grammar ----------------------------------------------------------------------


def _compile(kind: GrammarKind, source: str | dict[str, Any]) -> str:
    """The llguidance grammar (its JSON form) for `source`; GrammarError when the text cannot be read."""
    if kind == "json_schema":
        try:
            text = source if isinstance(source, str) else json.dumps(source)
            return llguidance.LLMatcher.grammar_from_json_schema(text)
        except (TypeError, ValueError) as e:
            raise GrammarError(f"{kind} grammar: {e}") from None
    if not isinstance(source, str):
        raise TypeError(f"{kind} grammar: expected str, got {type(source).__name__}")
    if kind == "gbnf":
        try:
            source = llguidance.gbnf_to_lark.gbnf_to_lark(source)
        except Exception as e:  # the converter raises bare Exception for unknown rules and a missing root
            raise GrammarError(f"{kind} grammar: {e}") from None
    return llguidance.LLMatcher.grammar_from_lark(source)


class GrammarSampler:
    """The grammar step of a sampler chain (llama_sampler_init_llg): `apply` sets the logits of tokens the
    grammar cannot take next to -inf, `accept` advances the grammar by one token.

    Build with `from_gbnf`, `from_lark` or `from_json_schema`. Hand it to `SamplerChain(..., grammar=g)`; the
    chain applies it the way common_sampler_sample does. `tokens` are the tokens accepted since the last reset.
    Not thread-safe: one per sequence (`clone`).
    """

    __slots__ = ("vocab", "kind", "grammar", "tokens", "_tokenizer", "_matcher", "_allowed", "_mask")

    def __init__(self, vocab: Vocab, kind: GrammarKind, grammar: str) -> None:
        """A sampler for `grammar`, already in llguidance's form; prefer the from_* constructors. Raises
        GrammarError with the engine's message when the grammar does not compile."""
        self.vocab, self.kind, self.grammar = vocab, kind, grammar
        self.tokens: list[int] = []  # accepted since the last reset
        self._tokenizer = engine_tokenizer(vocab)
        self._matcher = self._new_matcher()
        if self._matcher.is_error():
            raise GrammarError(f"{kind} grammar: {self._matcher.get_error()}")
        self._mask = np.zeros((vocab.n_tokens + 31) // 32, dtype=np.int32)  # (n_words,) one bit per token
        self._allowed: np.ndarray | None = None  # (n_tokens,) bool, the mask of the current state

    def _new_matcher(self) -> llguidance.LLMatcher:
        return llguidance.LLMatcher(self._tokenizer, self.grammar, log_level=_LOG_LEVEL, limits=_LIMITS)

    @classmethod
    def from_gbnf(cls, vocab: Vocab, text: str) -> GrammarSampler:
        """From a GBNF grammar (llama.cpp's grammars/README.md) with a `root` rule. Text starting with
        `%llguidance` is Lark, as common_sampler_init decides. Raises TypeError for non-str `text` and
        GrammarError with the converter's or the engine's message."""
        is_lark = isinstance(text, str) and text.lstrip().startswith("%llguidance")
        kind: GrammarKind = "lark" if is_lark else "gbnf"
        return cls(vocab, kind, _compile(kind, text))

    @classmethod
    def build(cls, vocab: Vocab, grammar: str | None = None,
              json_schema: dict[str, Any] | str | None = None) -> GrammarSampler | None:
        """The one way every front end makes its constraint: a GBNF (or %llguidance Lark) `grammar`, or a JSON
        `json_schema` (a dict or its text), or None when neither is given. GrammarError for both, or for either
        one that does not compile."""
        if grammar is not None and json_schema is not None:
            raise GrammarError("give either grammar or json_schema, not both")
        if grammar is not None:
            return cls.from_gbnf(vocab, grammar)
        if isinstance(json_schema, str):
            try:
                json_schema = json.loads(json_schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"json_schema: not valid JSON: {e}") from None
        return None if json_schema is None else cls.from_json_schema(vocab, json_schema)

    @classmethod
    def from_lark(cls, vocab: Vocab, text: str) -> GrammarSampler:
        """From a grammar in llguidance's Lark dialect (start rule `start`). Raises GrammarError."""
        return cls(vocab, "lark", _compile("lark", text))

    @classmethod
    def from_json_schema(cls, vocab: Vocab, schema: dict[str, Any] | str) -> GrammarSampler:
        """Output that is one JSON value valid under `schema` (a dict or its JSON text). llguidance's defaults
        apply (flexible whitespace, "," and ":" separators); the schema's "x-guidance" object overrides them.
        Raises GrammarError for text that is not JSON, an invalid or unsatisfiable schema, or a keyword the
        engine does not implement."""
        return cls(vocab, "json_schema", _compile("json_schema", schema))

    # ---- state ---------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "grammar"

    def __repr__(self) -> str:
        return f"GrammarSampler({self.kind}, accepting={self.is_accepting}, done={self.is_done})"

    @property
    def is_accepting(self) -> bool:
        """Whether the text so far is a complete parse (ending generation now would be valid)."""
        return self._matcher.is_accepting()

    @property
    def is_done(self) -> bool:
        """Whether the grammar takes no more text: only an end-of-generation token may follow (or one was
        accepted)."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    def allowed(self) -> np.ndarray:
        """The tokens the grammar allows next, a read-only bool array (n_tokens,). Computed once per state.
        Raises GrammarDeadEnd when the engine is in an error state or allows no token at all."""
        if self._allowed is None:
            self._check_alive()
            self._matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
            self._check_alive()
            bits = np.unpackbits(self._mask.view(np.uint8), count=self.vocab.n_tokens, bitorder="little")
            allowed = bits.view(np.bool_)  # (n_tokens,)
            if not allowed.any():
                raise self._dead_end("no token can continue the text")
            allowed.flags.writeable = False
            self._allowed = allowed
        return self._allowed

    def _check_alive(self) -> None:
        if self._matcher.is_error():
            raise self._dead_end(self._matcher.get_error())

    def _dead_end(self, reason: str) -> GrammarDeadEnd:
        reason = reason.replace("<non-verbose/>", "").strip()
        text = b"".join(self.vocab.token_to_piece(t, special=True) for t in self.tokens[-16:])
        return GrammarDeadEnd(
            f"{self.kind} grammar: dead end after {len(self.tokens)} accepted tokens (ending {text!r}): {reason}"
        )

    def can_accept(self, token: int) -> bool:
        """Whether `token` is allowed next (the predicate of `accept`)."""
        token = int(token)
        return 0 <= token < self.vocab.n_tokens and bool(self.allowed()[token])

    # ---- Sampler protocol ----------------------------------------------------------------------------------

    def apply(self, cur: TokenDataArray) -> None:
        """Set the logit of every candidate the grammar does not allow to -inf (llama_sampler_llg_apply).
        Candidate ids past the vocabulary are never allowed. Raises GrammarDeadEnd (see `allowed`)."""
        allowed = self.allowed()
        n = allowed.shape[0]
        ids = cur.ids  # (n_cur,)
        if ids.shape[0] and int(ids.max()) >= n:
            ok = np.zeros(ids.shape[0], dtype=np.bool_)  # (n_cur,)
            inside = ids < n
            ok[inside] = allowed[ids[inside]]
        else:
            ok = allowed[ids]  # (n_cur,)
        cur.logits[~ok] = -np.inf

    def accept(self, token: int) -> None:
        """Advance the grammar by `token`. Raises GrammarDeadEnd, with the sampler unchanged, when the grammar
        does not allow `token` here (the chain never picks one; a caller forcing tokens might)."""
        token = int(token)
        if not self.can_accept(token):
            piece = self.vocab.token_to_piece(token, special=True) if 0 <= token < self.vocab.n_tokens else b""
            raise self._dead_end(f"token {token} ({piece!r}) is not allowed here")
        if not self._matcher.consume_token(token):
            raise self._dead_end(self._matcher.get_error())
        self.tokens.append(token)
        self._allowed = None

    def reset(self) -> None:
        """Back to the start of the grammar (llama_sampler_llg_reset)."""
        if not self._matcher.reset():  # an engine in an error state cannot reset: start a fresh one
            self._matcher = self._new_matcher()
        self.tokens.clear()
        self._allowed = None

    def clone(self) -> GrammarSampler:
        """An independent copy in the same state (llama_sampler_llg_clone); the tokenizer is shared."""
        out = GrammarSampler.__new__(GrammarSampler)
        out.vocab, out.kind, out.grammar, out._tokenizer = self.vocab, self.kind, self.grammar, self._tokenizer
        out.tokens = list(self.tokens)
        out._matcher = self._matcher.deep_copy()
        out._mask = np.zeros_like(self._mask)
        out._allowed = self._allowed  # read-only, so sharing it is safe
        return out

"""Speculative decoding's drafting side: which drafters run, with what parameters, and which of them drafted for a
slot (llama.cpp's common/speculative.cpp `common_speculative`: init, begin, draft, accept; the parameters of
common/common.h `common_params_speculative`).

Decoding one token per step reads every weight once per token; with a draft of k tokens after the one sampled
last, one decode of k + 1 tokens checks them all. The engine puts each speculating sequence's sampled token and
its draft in the same batch as everything else, asks for logits at every position, samples the target there and
keeps the longest prefix of the draft the sampler agreed with, plus the sampler's own token after it
(`common_sampler_sample_and_accept_n`); the rejected positions are removed from memory (`seq_rm`). The sampler
runs exactly as often, over exactly the tokens, it would without the draft, and on the same logits bit for bit, so
greedy and seeded outputs are token for token the same; only the number of decodes drops. Where the weights'
kernels are row invariant (F32 / F16 and the 32-block quant types such as SmolLM2's Q4_1: docs/numerics.md) that
holds for drafts of any length. Q4_K and Q6_K weights (Gemma 3's Q4_K_M) follow llama.cpp's kernel choice by
ubatch size (Q4_K: gemm for rows in fours, gemv for the last n % 4; Q6_K: tiled from 8 rows), so the engine caps
their drafts at two tokens: a lone stream's ubatch then has at most three rows, each computed as a row alone. With
several streams in one step a row's neighbours already decide its arithmetic, with or without drafts, as in
llama.cpp's continuous batching.

Drafts come from the sequence's own history (the n-gram drafters of ngram.py); draft models (`draft-*` types) are
not supported. As in llama.cpp, a draft's length is its drafter's (ngram-simple / ngram-map-k: size_m, ngram-mod:
its n_max), cut to what the slot has room for; --spec-draft-n-max / -n-min / -p-min belong to draft models and are
only validated and kept here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llamactx.engine.ngram import NgramMapK, NgramMod, NgramSimple
from llamactx.errors import LlamactxError

# the implemented types, in llama.cpp's order of preference (common_speculative_init)
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")
# llama.cpp's other types: why llamactx refuses each
UNSUPPORTED_TYPES = {
    **{t: "needs a draft model, which llamactx does not support"
       for t in ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")},
    "ngram-map-k4v": "is not implemented (use ngram-map-k)",
    "ngram-cache": "is not implemented (use ngram-simple, ngram-map-k or ngram-mod)",
}


class SpecParamsError(LlamactxError, ValueError):
    """A speculative-decoding parameter outside its allowed values; names the field, the value and the limit."""


@dataclass(frozen=True, slots=True)
class NgramParams:
    """common_params_speculative_ngram_map: the key n-gram looked up, the m-gram drafted after it."""

    size_n: int = 12  # length of the key n-gram (the last tokens, ending with the sampled one)
    size_m: int = 48  # length of the drafted m-gram
    min_hits: int = 1  # key hits before a draft (llama.cpp's ngram-map-k4v; ngram-simple / -map-k ignore it)


@dataclass(frozen=True, slots=True)
class SpecParams:
    """Speculative decoding for an Engine (llama-server's --spec-* flags). `types` empty or ("none",): off.
    Several types are tried in llama.cpp's order of preference (SPEC_TYPES), the first non-empty draft wins.
    Raises SpecParamsError for a value llama.cpp refuses or an unknown / unsupported type."""

    types: tuple[str, ...] = ()
    n_max: int = 3  # --spec-draft-n-max (draft models)
    n_min: int = 0  # --spec-draft-n-min (draft models)
    p_min: float = 0.0  # --spec-draft-p-min (draft models)
    ngram_simple: NgramParams = field(default_factory=NgramParams)
    ngram_map_k: NgramParams = field(default_factory=NgramParams)
    ngram_mod_n_match: int = 24  # --spec-ngram-mod-n-match: the n-gram hashed
    ngram_mod_n_min: int = 48  # --spec-ngram-mod-n-min: a shorter draft is dropped
    ngram_mod_n_max: int = 64  # --spec-ngram-mod-n-max

    def __post_init__(self) -> None:
        if isinstance(self.types, str):
            raise SpecParamsError(f"types = {self.types!r}: expected a tuple of names, e.g. ('ngram-simple',)")
        for t in self.types:
            if t in UNSUPPORTED_TYPES:
                raise SpecParamsError(f"speculative type {t!r} {UNSUPPORTED_TYPES[t]}")
            if t not in SPEC_TYPES and t != "none":
                raise SpecParamsError(f"unknown speculative type {t!r} (one of none, {', '.join(SPEC_TYPES)})")
        _check_int("n_max", self.n_max, 0, None)
        _check_int("n_min", self.n_min, 0, None)
        if isinstance(self.p_min, bool) or not isinstance(self.p_min, (int, float)) or not 0.0 <= self.p_min <= 1.0:
            raise SpecParamsError(f"p_min = {self.p_min!r} is outside [0, 1]")
        for name in ("ngram_simple", "ngram_map_k"):
            p = getattr(self, name)
            if not isinstance(p, NgramParams):
                raise SpecParamsError(f"{name}: expected NgramParams, got {type(p).__name__}")
            _check_int(f"{name}.size_n", p.size_n, 1, 1024)
            _check_int(f"{name}.size_m", p.size_m, 1, 1024)
            _check_int(f"{name}.min_hits", p.min_hits, 1, None)
        _check_int("ngram_mod_n_match", self.ngram_mod_n_match, 1, 1024)
        _check_int("ngram_mod_n_min", self.ngram_mod_n_min, 0, 1024)
        _check_int("ngram_mod_n_max", self.ngram_mod_n_max, 0, 1024)

    @property
    def enabled(self) -> bool:
        return bool(self.types) and "none" not in self.types  # "none" anywhere switches it off, as in llama.cpp


def _check_int(name: str, value, lo: int, hi: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        limit = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise SpecParamsError(f"{name} = {value!r} is outside {limit}")


class Speculator:
    """The drafters of one engine and, per slot, which request they began and which drafter made the draft being
    verified (common_speculative). Not thread-safe: the engine's thread owns it."""

    def __init__(self, params: SpecParams):
        if not params.enabled:
            raise SpecParamsError("speculative decoding is off (no type): nothing to draft with")
        self.params = params
        self.drafters = [self._make(t) for t in SPEC_TYPES if t in params.types]
        self._begun: dict[int, int] = {}  # seq_id -> the request (Sequence.id) the drafters began
        self._last: dict[int, object] = {}  # seq_id -> the drafter of its last draft

    def _make(self, name: str):
        p = self.params
        if name == "ngram-simple":
            return NgramSimple(p.ngram_simple.size_n, p.ngram_simple.size_m)
        if name == "ngram-map-k":
            return NgramMapK(p.ngram_map_k.size_n, p.ngram_map_k.size_m)
        return NgramMod(p.ngram_mod_n_match, p.ngram_mod_n_min, p.ngram_mod_n_max)

    def draft(self, seq_id: int, request_id: int, tokens: list[int], n_max: int) -> list[int]:
        """Up to `n_max` tokens expected after `tokens` (what slot `seq_id` holds, ending with the token sampled
        last) from the first drafter that has some (common_speculative_draft); [] when none has. A request new to
        the slot first begins the drafters on its prompt (common_speculative_begin)."""
        prompt, sampled = tokens[:-1], tokens[-1]
        if self._begun.get(seq_id) != request_id:
            self._begun[seq_id] = request_id
            self._last.pop(seq_id, None)
            for d in self.drafters:
                d.begin(seq_id, prompt)
        if n_max <= 0:
            return []
        for d in self.drafters:
            out = d.draft(seq_id, prompt, sampled)
            if out:
                self._last[seq_id] = d
                return out[:n_max]
        return []

    def accept(self, seq_id: int, n_accepted: int) -> None:
        """`n_accepted` tokens of slot `seq_id`'s last draft were accepted (common_speculative_accept)."""
        last = self._last.get(seq_id)
        if last is None:
            return
        for d in self.drafters:
            d.accept(seq_id, n_accepted, d is not last)

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

Drafts come from the sequence's own history (the n-gram drafters of ngram.py) or from a draft model with the
target's vocabulary (`draft-simple`, draft_model.py), tried in llama.cpp's order of preference: the n-gram types
first, the draft model when none of them has a draft. `ngram-backoff` is llamactx's own (ngram.py NgramBackoff:
ngram-simple's lookup with shorter keys where the longest finds nothing, and loops drafted through; it takes
ngram-simple's size_n / size_m). As in llama.cpp, a draft's length is its drafter's
(ngram-simple / ngram-map-k / ngram-backoff: size_m, ngram-mod: its n_max, draft-simple: --spec-draft-n-max, cut by
--spec-draft-p-min and dropped under --spec-draft-n-min), cut to what the slot has room for. A draft model given
without the draft-simple type is not used (llama-server 0c1e570 loads it and then speculates with the types asked
for only). The other draft-* types (EAGLE-3, MTP, DFlash) need models and contexts llamactx does not have.

How much of a draft to verify is decided per step by the draft budget (draft_budget.py: DecodeCost measures what
a decode row costs on this machine, DraftBudget verifies the draft length that pays, and follows the drafts it
does not verify); which tokens are verified never changes the output.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llamactx.engine.draft_budget import DecodeCost, DraftBudget
from llamactx.engine.draft_model import DraftSimple, vocab_mismatch
from llamactx.engine.ngram import NgramBackoff, NgramMapK, NgramMod, NgramSimple
from llamactx.errors import LlamactxError
from llamactx.model import Model

# the implemented types, in llama.cpp's order of preference (common_speculative_init); ngram-backoff, llamactx's
# own n-gram type, after llama.cpp's n-gram types
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-backoff", "draft-simple")
# llama.cpp's other types: why llamactx refuses each
UNSUPPORTED_TYPES = {
    **{t: "is not implemented (its draft model runs inside the target's graph; llamactx's draft models run as "
          "draft-simple)"
       for t in ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")},
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
    `draft_model` (--spec-draft-model / -md): a GGUF path or a loaded Model, for draft-simple; the engine loads a
    path. Raises SpecParamsError for a value llama.cpp refuses, an unknown / unsupported type, draft-simple without
    a draft model or a draft model path that is not a file."""

    types: tuple[str, ...] = ()
    draft_model: str | os.PathLike | Model | None = None  # --spec-draft-model / -md (draft-simple)
    n_max: int = 3  # --spec-draft-n-max (draft models)
    n_min: int = 0  # --spec-draft-n-min (draft models)
    p_min: float = 0.0  # --spec-draft-p-min (draft models)
    ngram_simple: NgramParams = field(default_factory=NgramParams)
    ngram_map_k: NgramParams = field(default_factory=NgramParams)
    ngram_mod_n_match: int = 24  # --spec-ngram-mod-n-match: the n-gram hashed
    ngram_mod_n_min: int = 48  # --spec-ngram-mod-n-min: a shorter draft is dropped
    ngram_mod_n_max: int = 64  # --spec-ngram-mod-n-max
    # the cost model's prior until decodes are measured: rows a decode holds for about the price of one
    # (DecodeCost; 0: verify every draft whole, as llama.cpp does)
    free_rows: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.types, str):
            raise SpecParamsError(f"types = {self.types!r}: expected a tuple of names, e.g. ('ngram-simple',)")
        for t in self.types:
            if t in UNSUPPORTED_TYPES:
                raise SpecParamsError(f"speculative type {t!r} {UNSUPPORTED_TYPES[t]}")
            if t not in SPEC_TYPES and t != "none":
                raise SpecParamsError(f"unknown speculative type {t!r} (one of none, {', '.join(SPEC_TYPES)})")
        self._check_draft_model()
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
        _check_int("free_rows", self.free_rows, 0, 1 << 16)

    def _check_draft_model(self) -> None:
        dm = self.draft_model
        if dm is not None and not isinstance(dm, (str, os.PathLike, Model)):
            raise SpecParamsError(f"draft_model: expected a GGUF path or a Model, got {type(dm).__name__}")
        if isinstance(dm, (str, os.PathLike)) and not Path(dm).is_file():
            raise SpecParamsError(f"draft_model = {str(dm)!r}: no such file")
        if "draft-simple" in self.types and dm is None and "none" not in self.types:
            raise SpecParamsError("speculative type 'draft-simple' needs a draft model (draft_model; "
                                  "--spec-draft-model / -md FNAME)")

    @property
    def enabled(self) -> bool:
        return bool(self.types) and "none" not in self.types  # "none" anywhere switches it off, as in llama.cpp


def _check_int(name: str, value, lo: int, hi: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        limit = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise SpecParamsError(f"{name} = {value!r} is outside {limit}")


class Speculator:
    """The drafters of one engine and, per slot, which request they began and which drafter made the draft being
    verified (common_speculative). draft-simple needs the `target` model (its vocabulary is checked against the
    draft's), the engine's `n_seq` slots and the draft context's `context_params` (n_ctx, n_batch, threads...).
    `cost`: the decode costs measured so far (a machine's, kept by a new Speculator of the same engine; None: none
    yet). Raises SpecParamsError for a draft model that cannot draft for `target`. Not thread-safe: the engine's
    thread owns it."""

    def __init__(self, params: SpecParams, target: Model | None = None, n_seq: int = 1,
                 context_params: Mapping[str, object] | None = None, cost: DecodeCost | None = None):
        if not params.enabled:
            raise SpecParamsError("speculative decoding is off (no type): nothing to draft with")
        self.params = params
        self.draft_model: DraftSimple | None = None
        self.drafters = [self._make(t, target, n_seq, context_params or {}) for t in SPEC_TYPES if t in params.types]
        self._begun: dict[int, int] = {}  # seq_id -> the request (Sequence.id) the drafters began
        self._last: dict[int, object] = {}  # seq_id -> the drafter of its last draft
        # seq_id -> (request, its n_tokens, drafter, draft): the drafts `prepare` made for this step
        self._prepared: dict[int, tuple[int, int, object, list[int]]] = {}
        self.budget = DraftBudget(params.free_rows, cost)

    def _make(self, name: str, target: Model | None, n_seq: int, context_params: Mapping[str, object]):
        p = self.params
        if name == "ngram-simple":
            return NgramSimple(p.ngram_simple.size_n, p.ngram_simple.size_m)
        if name == "ngram-map-k":
            return NgramMapK(p.ngram_map_k.size_n, p.ngram_map_k.size_m)
        if name == "ngram-mod":
            return NgramMod(p.ngram_mod_n_match, p.ngram_mod_n_min, p.ngram_mod_n_max)
        if name == "ngram-backoff":  # ngram-simple's key and draft lengths (--spec-ngram-simple-size-n / -m)
            return NgramBackoff(p.ngram_simple.size_n, p.ngram_simple.size_m)
        if target is None:
            raise SpecParamsError("draft-simple: the target model is needed to check the draft model's vocabulary")
        self.draft_model = DraftSimple(load_draft_model(p.draft_model, target), n_seq, p.n_max, p.n_min, p.p_min,
                                       target.hparams.n_vocab, context_params)
        if not self.draft_model.ctx.memory.partial_prefix:
            raise SpecParamsError(f"draft model {_name(p.draft_model)} ({self.draft_model.model.arch}): its memory "
                                  f"cannot remove rejected draft tokens (a recurrent state has no rollback)")
        return self.draft_model

    def prepare(self, requests: list[tuple[int, int, list[int], int]]) -> None:
        """Draft now, for every `(seq_id, request_id, tokens, n_max)` of this step, so that the draft model
        decodes all the sequences it drafts for together (llama.cpp's common_speculative_draft over every slot);
        `draft` then hands out these drafts. Only worth it with a draft model."""
        self._prepared.clear()
        pending: dict[int, tuple[list[int], int, int]] = {}
        keys = {}
        for seq_id, request_id, tokens, n_max in requests:
            self._begin(seq_id, request_id, tokens[:-1])
            keys[seq_id] = (request_id, len(tokens))
            if n_max <= 0:
                continue
            for d in self.drafters:
                if d is self.draft_model:
                    pending[seq_id] = (tokens[:-1], tokens[-1], n_max)
                    break
                out = d.draft(seq_id, tokens[:-1], tokens[-1])
                if out:
                    self._prepared[seq_id] = (*keys[seq_id], d, out[:n_max])
                    break
        if pending:
            for seq_id, out in self.draft_model.draft_many(pending).items():
                self._prepared[seq_id] = (*keys[seq_id], self.draft_model, out)
        for seq_id, key in keys.items():
            self._prepared.setdefault(seq_id, (*key, None, []))

    def draft(self, seq_id: int, request_id: int, tokens: list[int], n_max: int) -> list[int]:
        """Up to `n_max` tokens expected after `tokens` (what slot `seq_id` holds, ending with the token sampled
        last) from the first drafter that has some (common_speculative_draft); [] when none has. A request new to
        the slot first begins the drafters on its prompt (common_speculative_begin)."""
        prompt, sampled = tokens[:-1], tokens[-1]
        self._begin(seq_id, request_id, prompt)
        ready = self._prepared.pop(seq_id, None)
        if ready is not None and ready[:2] == (request_id, len(tokens)):
            if ready[2] is not None and n_max > 0:
                self._last[seq_id] = ready[2]
            return ready[3][:max(n_max, 0)]
        if n_max <= 0:
            return []
        for d in self.drafters:
            out = d.draft(seq_id, prompt, sampled, n_max) if d is self.draft_model else d.draft(seq_id, prompt, sampled)
            if out:
                self._last[seq_id] = d
                return out[:n_max]
        return []

    def _begin(self, seq_id: int, request_id: int, prompt: list[int]) -> None:
        if self._begun.get(seq_id) != request_id:
            self._begun[seq_id] = request_id
            self._last.pop(seq_id, None)
            self.budget.forget(seq_id)
            for d in self.drafters:
                d.begin(seq_id, prompt)

    def accept(self, seq_id: int, n_accepted: int, n_draft: int) -> None:
        """`n_accepted` of the `n_draft` tokens of slot `seq_id`'s last draft were accepted
        (common_speculative_accept)."""
        self.budget.record(seq_id, n_draft, n_accepted)
        last = self._last.get(seq_id)
        if last is None:
            return
        for d in self.drafters:
            d.accept(seq_id, n_accepted, d is not last)


def load_draft_model(draft_model: str | os.PathLike | Model | None, target: Model) -> Model:
    """The draft Model of SpecParams.draft_model (loaded from a path), checked against `target`: SpecParamsError
    for a missing one, one that cannot generate (an encoder) or a vocabulary that is not the target's
    (common_speculative_are_compatible), naming what differs."""
    if draft_model is None:
        raise SpecParamsError("speculative type 'draft-simple' needs a draft model (--spec-draft-model / -md)")
    model = draft_model if isinstance(draft_model, Model) else Model.load(draft_model)
    if model.is_embedding_only:
        raise SpecParamsError(f"draft model {_name(draft_model)} ({model.arch}) is an encoder: it has no logits "
                              f"to draft from")
    why = vocab_mismatch(target, model)
    if why is not None:
        raise SpecParamsError(f"draft model {_name(draft_model)}: its vocabulary does not match the target "
                              f"model's ({why})")
    return model


def _name(draft_model) -> str:
    return repr(str(draft_model.path if isinstance(draft_model, Model) else draft_model))

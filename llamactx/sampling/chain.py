"""Sampling: a chain of small samplers turning one row of logits into a token (src/llama-sampler.cpp sampler
chain, common/sampling.cpp common_sampler).

`SamplerChain` applies its samplers in order to a `TokenDataArray` of all candidates, reads the token the last
one selected, and lets every sampler `accept` it. `SamplerChain.default` builds llama-server's chain from
`SamplingParams` exactly as common_sampler_init does. An optional grammar sampler runs around the chain the
way common_sampler_sample runs it. This module is the public face of the sampling package: the samplers
themselves live in samplers.py, mirostat.py, penalties.py and dry.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol

import numpy as np

from llamactx.sampling.dry import DryBreakers, DrySampler, DryVocab
from llamactx.sampling.mirostat import MirostatSampler, MirostatV2Sampler
from llamactx.sampling.params import DEFAULT_SAMPLERS, SamplingParams
from llamactx.sampling.penalties import PenaltiesSampler
from llamactx.sampling.rng import LLAMA_DEFAULT_SEED, StdMt19937
from llamactx.sampling.samplers import (
    DistSampler,
    GreedySampler,
    LogitBiasSampler,
    MinPSampler,
    TempExtSampler,
    TempSampler,
    TopKSampler,
    TopNSigmaSampler,
    TopPSampler,
    TypicalSampler,
    XtcSampler,
)
from llamactx.sampling.token_data import Sampler, SamplingParamsError, TokenDataArray

__all__ = [
    "DEFAULT_SAMPLERS", "LLAMA_DEFAULT_SEED", "DistSampler", "DryBreakers", "DrySampler", "DryVocab",
    "GreedySampler", "LogitBiasSampler", "MinPSampler", "MirostatSampler", "MirostatV2Sampler",
    "PenaltiesSampler", "Sampler", "SamplerChain", "SamplingParams", "StdMt19937", "TempExtSampler",
    "TempSampler", "TokenDataArray", "TopKSampler", "TopNSigmaSampler", "TopPSampler", "TypicalSampler",
    "XtcSampler",
]  # fmt: skip

N_PREV = 64  # common_sampler keeps max(32, params.n_prev) previous tokens; n_prev defaults to 64


class LogitsSource(Protocol):
    """What `SamplerChain.sample` needs from a context (llama_get_logits_ith)."""

    def get_logits_ith(self, i: int) -> np.ndarray: ...


class SamplerChain:
    """An ordered list of samplers plus an optional grammar sampler (llama_sampler_chain + common_sampler).

    Not thread-safe: use one chain per sequence (clone() gives an independent copy). `cur` is the candidate
    array of the last `sample`, for reporting probabilities (common_sampler_get_candidates); `prev` the last
    accepted tokens.
    """

    __slots__ = ("samplers", "grammar", "cur", "prev")

    def __init__(self, samplers: Iterable[Sampler] = (), grammar: Sampler | None = None) -> None:
        self.samplers: list[Sampler] = list(samplers)
        self.grammar = grammar
        self.cur: TokenDataArray | None = None
        self.prev: deque[int] = deque(maxlen=N_PREV)
        for i, s in enumerate([*self.samplers, *([grammar] if grammar is not None else [])]):
            if not isinstance(s, Sampler):
                raise TypeError(f"samplers[{i}]: {type(s).__name__} does not implement the Sampler protocol")

    @property
    def name(self) -> str:
        return "chain"

    @property
    def names(self) -> list[str]:
        """The samplers' names in order, llama.cpp style ("?top-k" marks a sampler that its parameters switch
        off)."""
        return [s.name for s in self.samplers]

    def __repr__(self) -> str:
        grammar = f"{self.grammar.name} + " if self.grammar is not None else ""
        return f"SamplerChain({grammar}{' -> '.join(self.names)})"

    def add(self, sampler: Sampler) -> None:
        """Append a sampler (llama_sampler_chain_add)."""
        if not isinstance(sampler, Sampler):
            raise TypeError(f"sampler: {type(sampler).__name__} does not implement the Sampler protocol")
        self.samplers.append(sampler)

    def apply(self, cur: TokenDataArray) -> None:
        """Run every sampler over `cur`, in order (llama_sampler_chain_apply); the grammar is not applied
        here."""
        for s in self.samplers:
            s.apply(cur)

    def accept(self, token: int, is_generated: bool = True) -> None:
        """Tell every sampler which token was chosen (common_sampler_accept). The grammar only hears generated
        tokens: llama-server feeds the prompt through here with `is_generated=False`, so penalties and DRY see
        it while the grammar does not.
        """
        token = int(token)
        if self.grammar is not None and is_generated:
            self.grammar.accept(token)
        for s in self.samplers:
            s.accept(token)
        self.prev.append(token)

    def reset(self) -> None:
        """Back to the initial state; seeded samplers restart their streams (llama_sampler_reset)."""
        if self.grammar is not None:
            self.grammar.reset()
        for s in self.samplers:
            s.reset()
        self.prev.clear()
        self.cur = None

    def clone(self) -> SamplerChain:
        """An independent copy with all sampler state (common_sampler_clone)."""
        out = SamplerChain([s.clone() for s in self.samplers], self.grammar.clone() if self.grammar else None)
        out.prev.extend(self.prev)
        return out

    def get_seed(self) -> int:
        """The seed in use: that of the last seeded sampler, else LLAMA_DEFAULT_SEED
        (llama_sampler_get_seed)."""
        for s in reversed(self.samplers):
            if (
                isinstance(s, (DistSampler, MirostatSampler, MirostatV2Sampler))
                and s.seed_cur != LLAMA_DEFAULT_SEED
            ):
                return s.seed_cur
        return LLAMA_DEFAULT_SEED

    def last(self) -> int:
        """The last accepted token (common_sampler_last); IndexError when none was accepted yet."""
        if not self.prev:
            raise IndexError("last: no token has been accepted yet")
        return self.prev[-1]

    def sample(self, ctx: LogitsSource, idx: int = -1, grammar_first: bool = False) -> int:
        """Sample the next token from the logits of output `idx` of `ctx` and accept it (common_sampler_sample
        + common_sampler_accept).
        """
        return self.sample_logits(ctx.get_logits_ith(idx), grammar_first)

    def sample_logits(self, logits: np.ndarray, grammar_first: bool = False) -> int:
        """Sample from one row of logits (n_vocab,) and accept the token; the row itself is not modified.

        With a grammar, llama.cpp's rejection scheme: run the chain, check the chosen token against the
        grammar, and only if it is rejected start again from the logits with the grammar applied first.
        `grammar_first` applies it first straight away. Raises RuntimeError if the chain selects nothing (no
        dist/greedy/mirostat at its end).
        """
        with np.errstate(invalid="ignore"):  # all candidates at -inf make NaNs: refused just below
            token = self._select(logits, grammar_first)
        cur = self.cur
        if cur is not None and cur.logits[cur.selected] == -np.inf:
            raise RuntimeError("no token is possible: every candidate's logit is -inf (logit_bias bans, a grammar "
                               "that only allows banned tokens)")
        self.accept(token)
        return token

    def _select(self, logits: np.ndarray, grammar_first: bool) -> int:
        cur = TokenDataArray.from_logits(logits)
        self.cur = cur
        if self.grammar is None:
            self.apply(cur)
            return cur.selected_token
        if grammar_first:
            self.grammar.apply(cur)
        self.apply(cur)
        token = cur.selected_token
        if grammar_first or _allows(self.grammar, token):
            return token
        cur = TokenDataArray.from_logits(logits)
        self.cur = cur
        self.grammar.apply(cur)
        self.apply(cur)
        return cur.selected_token

    def candidates(self, do_sort: bool = True) -> TokenDataArray:
        """The candidates of the last `sample`, sorted by probability when `do_sort` with `selected` kept
        pointing at the chosen token (common_sampler_get_candidates). Raises RuntimeError before the first
        sample.
        """
        cur = self.cur
        if cur is None:
            raise RuntimeError("candidates: nothing has been sampled yet")
        if do_sort and not cur.sorted:
            token = cur.selected_token
            probs = cur.probs if cur.probs is not None else cur.softmax(False)
            cur.keep(np.argsort(-probs, kind="stable"))
            cur.selected = int(np.flatnonzero(cur.ids == token)[0])
            cur.sorted = True
        return cur

    @classmethod
    def default(
        cls,
        params: SamplingParams,
        n_vocab: int,
        vocab: DryVocab | None = None,
        *,
        n_ctx: int | None = None,
        n_ctx_train: int | None = None,
        grammar: Sampler | None = None,
        dry_breakers: DryBreakers | None = None,
    ) -> SamplerChain:
        """llama-server's chain for `params` (common_sampler_init in this llama.cpp tree).

        logit-bias (only when biases are given) -> the samplers of `params.samplers` (default: penalties ->
        dry -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> xtc -> temp-ext) -> dist(seed). Mirostat
        1/2 replaces everything after logit-bias with temp -> mirostat. temperature <= 0 is not a separate
        greedy chain: temp-ext keeps only the max logit and dist then picks it (draws are still made, as in
        llama.cpp).

        `penalty_last_n` / `dry_penalty_last_n` -1 become `n_ctx` (else `n_ctx_train`). DRY needs its breakers
        as tokens: `dry_breakers` if given (build once per model with DryBreakers.from_strings), else
        tokenised with `vocab`. Raises ValueError when a -1 cannot be resolved, when DRY is on with breaker
        strings but neither `vocab` nor `dry_breakers` is given, or for a logit-bias token outside [0,
        n_vocab).
        """
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
        chain: list[Sampler] = []
        if params.logit_bias:
            chain.append(LogitBiasSampler(n_vocab, params.logit_bias))
        if params.mirostat == 0:
            for name in params.samplers:
                chain.append(_build(name, params, n_vocab, vocab, n_ctx, n_ctx_train, dry_breakers))
            chain.append(DistSampler(params.seed))
        else:
            chain.append(TempSampler(params.temperature))
            if params.mirostat == 1:
                chain.append(
                    MirostatSampler(n_vocab, params.seed, params.mirostat_tau, params.mirostat_eta, 100)
                )
            else:
                chain.append(MirostatV2Sampler(params.seed, params.mirostat_tau, params.mirostat_eta))
        return cls(chain, grammar)


def _allows(grammar: Sampler, token: int) -> bool:
    """Whether `grammar` leaves `token` possible: apply it to that single candidate
    (common_sampler_sample)."""
    single = TokenDataArray(np.array([token], dtype=np.int32), np.ones(1, dtype=np.float32))
    grammar.apply(single)
    return bool(single.logits[0] != -np.inf)


def _context_size(field_name: str, n_ctx: int | None, n_ctx_train: int | None) -> int:
    size = n_ctx if n_ctx is not None else n_ctx_train
    if size is None:
        raise SamplingParamsError(
            f"{field_name}: -1 means the context size, but neither n_ctx nor n_ctx_train was given"
        )
    return size


def _build(
    name: str,
    p: SamplingParams,
    n_vocab: int,
    vocab: DryVocab | None,
    n_ctx: int | None,
    n_ctx_train: int | None,
    dry_breakers: DryBreakers | None,
) -> Sampler:
    """One sampler of common_sampler_init's switch over params.samplers."""
    if name == "penalties":
        last_n = p.penalty_last_n
        if last_n == -1:
            last_n = _context_size("penalty_last_n", n_ctx, n_ctx_train)
        return PenaltiesSampler(n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty)
    if name == "dry":
        return _build_dry(p, n_vocab, vocab, n_ctx, n_ctx_train, dry_breakers)
    if name == "top_n_sigma":
        return TopNSigmaSampler(p.top_n_sigma)
    if name == "top_k":
        return TopKSampler(p.top_k)
    if name == "typ_p":
        return TypicalSampler(p.typical_p, p.min_keep)
    if name == "top_p":
        return TopPSampler(p.top_p, p.min_keep)
    if name == "min_p":
        return MinPSampler(p.min_p, p.min_keep)
    if name == "xtc":
        return XtcSampler(p.xtc_probability, p.xtc_threshold, p.min_keep, p.seed)
    if name == "temperature":
        return TempExtSampler(p.temperature, p.dynatemp_range, p.dynatemp_exponent)
    raise SamplingParamsError(f"samplers: unknown sampler {name!r}")


def _build_dry(
    p: SamplingParams,
    n_vocab: int,
    vocab: DryVocab | None,
    n_ctx: int | None,
    n_ctx_train: int | None,
    dry_breakers: DryBreakers | None,
) -> DrySampler:
    enabled = p.dry_multiplier != 0.0 and p.dry_base >= 1.0 and p.dry_penalty_last_n != 0
    last_n = p.dry_penalty_last_n
    if enabled and last_n == -1:
        last_n = _context_size("dry_penalty_last_n", n_ctx, n_ctx_train)
    breakers = dry_breakers
    if breakers is None and enabled and any(p.dry_sequence_breakers):
        if vocab is None:
            raise SamplingParamsError(
                "dry_sequence_breakers: DRY is on (dry_multiplier > 0) and its breakers must be tokenised; "
                "pass vocab= or dry_breakers="
            )
        breakers = DryBreakers.from_strings(p.dry_sequence_breakers, vocab, n_vocab)
    return DrySampler(
        n_ctx_train or 0,
        p.dry_multiplier,
        p.dry_base,
        p.dry_allowed_length,
        max(last_n, 0),
        breakers or DryBreakers(),
    )

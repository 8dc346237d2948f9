"""Sampling parameters: llama-server's request fields (common/common.h common_params_sampling), validated.

Names are llama-server's JSON names (`temperature`, `repeat_penalty`, `typical_p`, ...) where they differ from
the C struct; defaults are common_params_sampling's, except `dry_penalty_last_n = -1` (the whole context),
which this project's API documents. Every field is checked in `__post_init__`; a bad value raises ValueError
naming the field, the value and the allowed range.

Decisions where llama.cpp is loose:
- `temperature < 0` is accepted and means greedy, like 0 (common.h: "<= 0.0 to sample greedily"; the temp
  sampler keeps only the max logit for t <= 0). It cannot be combined with `dynatemp_range > 0`, whose range
  would reach positive temperatures and make it non-greedy.
- `top_k` <= 0 is off; only -1 and 0 are accepted as "off".
- `penalty_last_n` / `dry_penalty_last_n` -1 mean "the context size", resolved by SamplerChain.default.
- `dry_base < 1` disables DRY, as the sampler does (llama-server would substitute the default 1.75).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from llamactx.sampling.rng import LLAMA_DEFAULT_SEED, check_seed
from llamactx.sampling.token_data import SamplingParamsError

INF = math.inf

# common_params_sampling::samplers, the order common_sampler_init builds the chain in.
DEFAULT_SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)

# common_sampler_types_from_names: canonical names, their kebab-case and no-dash forms, and a few aliases.
_CANONICAL = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "penalties")
SAMPLER_ALIASES = {
    **{n: n for n in _CANONICAL},
    **{n.replace("_", "-"): n for n in _CANONICAL},
    **{n.replace("_", ""): n for n in _CANONICAL},
    "nucleus": "top_p",
    "temp": "temperature",
    "typ": "typ_p",
}
# common_sampler_types_from_chars
SAMPLER_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
                 "t": "temperature", "x": "xtc", "e": "penalties"}  # fmt: skip
_NOT_IMPLEMENTED = {"infill", "adaptive_p", "adaptive-p", "adaptivep", "i", "a"}


def _number(name: str, value: float, lo: float = -INF, hi: float = INF, note: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingParamsError(f"{name}: expected a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise SamplingParamsError(f"{name}: {v} is not a finite number")
    if not lo <= v <= hi:
        raise SamplingParamsError(f"{name}: {v} is outside the allowed range [{lo}, {hi}]{note}")
    return v


def _integer(name: str, value: int, lo: int, hi: int = 2**31 - 1, note: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingParamsError(f"{name}: expected an int, got {value!r}")
    if not lo <= value <= hi:
        raise SamplingParamsError(f"{name}: {value} is outside the allowed range [{lo}, {hi}]{note}")
    return value


def _sampler_names(samplers: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Sampler order from names (with llama.cpp's aliases) or a string of sampler chars ("edskypmxt")."""
    if isinstance(samplers, str):
        names, table, what = list(samplers), SAMPLER_CHARS, "char"
    else:
        names, table, what = list(samplers), SAMPLER_ALIASES, "name"
    out = []
    for i, raw in enumerate(names):
        key = raw.lower() if isinstance(raw, str) else raw
        if key in _NOT_IMPLEMENTED:
            raise SamplingParamsError(f"samplers[{i}]: sampler {raw!r} is not implemented in llamactx")
        if key not in table:
            raise SamplingParamsError(
                f"samplers[{i}]: unknown sampler {what} {raw!r}; known: {sorted(set(table.values()))}"
            )
        out.append(table[key])
    return tuple(out)


def _logit_bias(value) -> tuple[tuple[int, float], ...]:
    pairs = value.items() if isinstance(value, Mapping) else value
    out = []
    for item in pairs:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise SamplingParamsError(f"logit_bias: expected (token, bias) pairs or a mapping, got item {item!r}")
        tok, bias = item
        if isinstance(bias, bool) and bias is False:  # llama-server: false bans the token
            bias = -INF
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise SamplingParamsError(f"logit_bias: token {tok!r} is not a token id (an int >= 0)")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias) or bias == INF:
            raise SamplingParamsError(f"logit_bias[{tok}]: bias {bias!r} must be a finite number or -inf (ban)")
        out.append((tok, float(bias)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling settings of one request (common_params_sampling with llama-server's field names).

    `seed` -1 or LLAMA_DEFAULT_SEED draws a random seed. `logit_bias` may be given as a mapping token -> bias
    or as (token, bias) pairs (bias False or -inf bans); it is stored as pairs. `samplers` is the chain order,
    as names (llama.cpp aliases accepted) or a string of sampler chars. Raises ValueError for any value
    outside its range.
    """

    seed: int = LLAMA_DEFAULT_SEED
    n_probs: int = 0
    min_keep: int = 0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    typical_p: float = 1.0
    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    top_n_sigma: float = -1.0
    logit_bias: tuple[tuple[int, float], ...] | Mapping[int, float] = ()
    samplers: tuple[str, ...] | str = DEFAULT_SAMPLERS

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put("seed", check_seed(self.seed))
        _integer("n_probs", self.n_probs, 0)
        _integer("min_keep", self.min_keep, 0)
        _integer("top_k", self.top_k, -1, note=" (-1 or 0 = off)")
        for name in ("top_p", "min_p", "typical_p", "xtc_probability", "xtc_threshold"):
            _number(name, getattr(self, name), 0.0, 1.0)
        _number("temperature", self.temperature, note=" (<= 0 = greedy)")
        _number("dynatemp_range", self.dynatemp_range, 0.0)
        _number("dynatemp_exponent", self.dynatemp_exponent, 0.0)
        if self.temperature < 0 and self.dynatemp_range > 0:
            raise SamplingParamsError(
                f"temperature: {self.temperature} < 0 means greedy and cannot be combined with "
                f"dynatemp_range {self.dynatemp_range} > 0"
            )
        self._check_penalties()
        _integer("mirostat", self.mirostat, 0, 2, note=" (0 = off, 1 = Mirostat, 2 = Mirostat 2.0)")
        _number("mirostat_tau", self.mirostat_tau, 0.0)
        _number("mirostat_eta", self.mirostat_eta, 0.0)
        _number("top_n_sigma", self.top_n_sigma, note=" (<= 0 = off)")
        put("logit_bias", _logit_bias(self.logit_bias))
        put("samplers", _sampler_names(self.samplers))

    def _check_penalties(self) -> None:
        _integer("penalty_last_n", self.penalty_last_n, -1, note=" (-1 = context size, 0 = off)")
        _number("repeat_penalty", self.repeat_penalty, 0.0)
        if self.repeat_penalty <= 0 or not math.isfinite(1.0 / self.repeat_penalty):
            raise SamplingParamsError(f"repeat_penalty: {self.repeat_penalty} must be greater than 0 (1.0 = off)")
        _number("frequency_penalty", self.frequency_penalty)
        _number("presence_penalty", self.presence_penalty)
        _number("dry_multiplier", self.dry_multiplier, 0.0, note=" (0 = off)")
        _number("dry_base", self.dry_base, 0.0, note=" (< 1 = off)")
        _integer("dry_allowed_length", self.dry_allowed_length, 0)
        _integer("dry_penalty_last_n", self.dry_penalty_last_n, -1, note=" (-1 = context size, 0 = off)")
        breakers = self.dry_sequence_breakers
        if isinstance(breakers, str) or not all(isinstance(b, str) for b in breakers):
            raise SamplingParamsError(f"dry_sequence_breakers: expected a list of strings, got {breakers!r}")
        object.__setattr__(self, "dry_sequence_breakers", tuple(breakers))

    @property
    def greedy(self) -> bool:
        """True when the chain picks the max logit (temperature <= 0, no dynamic range): llama-server's "0 =
        greedy"."""
        return self.temperature <= 0 and self.dynatemp_range <= 0

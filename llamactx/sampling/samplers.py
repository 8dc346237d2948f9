"""The built-in samplers of src/llama-sampler.cpp that look only at the current candidates.

Each class follows the llama.cpp sampler named in its docstring: same parameters, same "off" values (a sampler
whose parameters make it a no-op reports llama.cpp's empty-sampler name, e.g. "?top-k"), same sorting
behaviour and the same float32 arithmetic. Samplers with history live in penalties.py (repetition
penalties), dry.py (DRY) and mirostat.py. Float parameters are rounded to float32 on construction, as the C API stores
them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from llamactx.sampling.kernels import dist_pick, min_p_cut, top_p_cut
from llamactx.sampling.rng import LLAMA_DEFAULT_SEED, StdMt19937, check_seed, get_rng_seed
from llamactx.sampling.token_data import Sampler, SamplingParamsError, TokenDataArray, find_tokens, ordered_prefix

F32 = np.float32


def f32_param(name: str, value: float, allow_inf: bool = False) -> float:
    """A float parameter rounded to float32; ValueError naming `name` if it is not a number, NaN or
    infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SamplingParamsError(f"{name}: expected a number, got {value!r}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise SamplingParamsError(f"{name}: {v} is not a finite number")
    return float(F32(v))


def int_param(name: str, value: int, lo: int) -> int:
    """An int parameter >= `lo`; ValueError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SamplingParamsError(f"{name}: expected an int, got {value!r}")
    if value < lo:
        raise SamplingParamsError(f"{name}: {value} is below the minimum {lo}")
    return int(value)


class SamplerBase:
    """Defaults for the optional parts of the Sampler protocol: stateless accept/reset, clone by deep copy."""

    __slots__ = ()

    def accept(self, token: int) -> None:
        """Most samplers keep no history."""

    def reset(self) -> None:
        """Most samplers have no state to reset."""

    def clone(self) -> Sampler:
        """An independent copy, state included (llama_sampler_clone)."""
        return copy.deepcopy(self)


def temp_impl(cur: TokenDataArray, temp: float) -> None:
    """Divide logits by `temp`; `temp <= 0` keeps only the first maximum logit (llama_sampler_temp_impl)."""
    if cur.size == 0:
        return
    if temp <= 0.0:
        i = int(np.argmax(cur.logits))
        top = cur.logits[i]
        cur.logits.fill(-np.inf)
        cur.logits[i] = top
        return
    cur.logits /= F32(temp)


@dataclass(slots=True)
class GreedySampler(SamplerBase):
    """Select the first maximum logit (llama_sampler_init_greedy)."""

    @property
    def name(self) -> str:
        return "greedy"

    def apply(self, cur: TokenDataArray) -> None:
        cur.selected = int(np.argmax(cur.logits)) if cur.size else -1


@dataclass(slots=True)
class DistSampler(SamplerBase):
    """Sample from softmax(logits) with an own `std::mt19937` (llama_sampler_init_dist).

    `seed` LLAMA_DEFAULT_SEED (or -1) draws a random seed, reported as `seed_cur`. Writes normalised `probs`.
    """

    seed: int = LLAMA_DEFAULT_SEED
    seed_cur: int = field(init=False)
    rng: StdMt19937 = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.seed = check_seed(self.seed)
        self.reset()

    @property
    def name(self) -> str:
        return "dist"

    def reset(self) -> None:
        self.seed_cur = get_rng_seed(self.seed)
        self.rng = StdMt19937(self.seed_cur)

    def apply(self, cur: TokenDataArray) -> None:
        n = cur.size
        if n == 0:
            cur.selected = -1
            return
        cur.selected = 0
        if n == 1:
            self.rng.uniform()  # keep the stream aligned with llama.cpp, which draws once per output
            cur.probs = np.ones(1, dtype=F32)
            return
        max_l = cur.logits[0] if cur.sorted else cur.logits.max()
        p = np.exp(cur.logits - max_l)  # (n,) float32, as expf
        u = self.rng.uniform()
        probs = np.empty(n, dtype=F32)  # (n,)
        i = dist_pick(p, u, probs)  # sequential double sums, as llama.cpp
        if i < 0:  # a NaN total: numpy's searchsorted places NaNs, keep its answer
            cum = np.cumsum(p, dtype=np.float64)  # (n,)
            total = cum[-1]
            i = min(int(np.searchsorted(cum, total * u, side="left")), n - 1)
            probs = (p / total).astype(F32)
        cur.selected = i
        cur.probs = probs


@dataclass(slots=True)
class TopKSampler(SamplerBase):
    """Keep the `k` highest logits, sorted; `k <= 0` is off (llama_sampler_init_top_k)."""

    k: int

    def __post_init__(self) -> None:
        self.k = int_param("top_k", self.k, -(2**31))

    @property
    def name(self) -> str:
        return "top-k" if self.k > 0 else "?top-k"

    def apply(self, cur: TokenDataArray) -> None:
        top_k_impl(cur, self.k)


def top_k_impl(cur: TokenDataArray, k: int) -> None:
    """llama_sampler_top_k_impl: partial sort unless already sorted, then truncate."""
    if k <= 0:
        return
    if cur.sorted:
        cur.keep(slice(0, k))
    else:
        cur.sort(k)


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True in `mask`, or None."""
    i = int(np.argmax(mask))
    return i if mask.shape[0] and mask[i] else None


@dataclass(slots=True)
class TopPSampler(SamplerBase):
    """Nucleus sampling: keep the smallest sorted prefix with probability mass >= p
    (llama_sampler_init_top_p).

    `p >= 1` is off. Like llama.cpp, a large unsorted array is first cut to its top 256; when those do not
    reach `p`, we widen the sorted part step by step instead of sorting everything at once.
    """

    p: float
    min_keep: int = 0

    def __post_init__(self) -> None:
        self.p = f32_param("top_p", self.p)
        self.min_keep = int_param("min_keep", self.min_keep, 0)

    @property
    def name(self) -> str:
        return "top-p" if self.p < 1.0 else "?top-p"

    def _cut(self, probs: np.ndarray) -> int | None:
        last = top_p_cut(probs, self.p, self.min_keep)  # sequential float32 sum, as llama.cpp
        return None if last < 0 else last

    def apply(self, cur: TokenDataArray) -> None:
        if self.p >= 1.0:
            return
        probs = cur.softmax(False)
        n = cur.size
        if cur.sorted:
            last = self._cut(probs)
            cur.keep(slice(0, n if last is None else last))
            return
        cur.keep(ordered_prefix(cur.logits, lambda order: self._cut(probs[order]), 256 if n > 1024 else n))
        cur.sorted = True


@dataclass(slots=True)
class MinPSampler(SamplerBase):
    """Keep tokens with p >= p_min * p_max, i.e. logit >= max + log(p_min); `p <= 0` is off
    (llama_sampler_init_min_p).

    An unsorted array is filtered in place (order kept); only when that leaves fewer than `min_keep` tokens is
    it sorted and cut, as in llama.cpp.
    """

    p: float
    min_keep: int = 0

    def __post_init__(self) -> None:
        self.p = f32_param("min_p", self.p)
        self.min_keep = int_param("min_keep", self.min_keep, 0)

    @property
    def name(self) -> str:
        return "min-p" if self.p > 0.0 else "?min-p"

    def apply(self, cur: TokenDataArray) -> None:
        if self.p <= 0.0 or cur.size == 0:
            return
        log_p = np.log(F32(self.p))
        if not cur.sorted:
            mask = cur.logits >= cur.logits.max() + log_p
            n_keep = int(np.count_nonzero(mask))
            if n_keep > 0 and n_keep >= self.min_keep:
                cur.keep(mask)
                return
            cur.sort()
        # the first token always matches; cut at the first later one below max + log(p)
        cur.keep(slice(0, min_p_cut(cur.logits, cur.logits[0] + log_p, self.min_keep)))


@dataclass(slots=True)
class TypicalSampler(SamplerBase):
    """Locally typical sampling; `p >= 1` is off (llama_sampler_init_typical).

    Keeps the tokens whose surprise is closest to the entropy until their mass exceeds `p`; the result is
    ordered by that distance, so `sorted` is cleared. Only the needed prefix of that order is sorted.
    Deviation: a zero probability adds 0 to the entropy (llama.cpp adds 0 * log 0 = NaN, which poisons the
    ordering when a previous sampler masked tokens to -inf).
    """

    p: float
    min_keep: int = 0

    def __post_init__(self) -> None:
        self.p = f32_param("typical_p", self.p)
        self.min_keep = int_param("min_keep", self.min_keep, 0)

    @property
    def name(self) -> str:
        return "typical" if self.p < 1.0 else "?typical"

    def apply(self, cur: TokenDataArray) -> None:
        if self.p >= 1.0:
            return
        probs = cur.softmax(False)
        with np.errstate(divide="ignore", invalid="ignore"):
            neg_log_p = -np.log(probs)  # (n,)
            entropy = np.where(probs > 0, probs * neg_log_p, F32(0)).sum(dtype=F32)
        shifted = np.abs(neg_log_p - entropy)  # (n,) distance of each surprise from the entropy
        cur.keep(ordered_prefix(-shifted, lambda order: self._cut(probs[order]), 256))
        cur.sorted = False

    def _cut(self, probs: np.ndarray) -> int | None:
        cum = np.cumsum(probs, dtype=F32)  # (k,)
        i = np.arange(cum.shape[0])
        last = _first((cum > self.p) & ((self.min_keep == 0) | (i >= self.min_keep - 1)))
        return None if last is None else last + 1


@dataclass(slots=True)
class TempSampler(SamplerBase):
    """Divide logits by `t`; `t <= 0` keeps only the max logit (greedy-like); `t == 1` is off
    (llama_sampler_init_temp)."""

    t: float

    def __post_init__(self) -> None:
        self.t = f32_param("temperature", self.t)

    @property
    def name(self) -> str:
        return "temp" if self.t != 1.0 else "?temp"

    def apply(self, cur: TokenDataArray) -> None:
        if self.t != 1.0:
            temp_impl(cur, self.t)


@dataclass(slots=True)
class TempExtSampler(SamplerBase):
    """Dynamic temperature (llama_sampler_init_temp_ext): with `delta > 0` the temperature moves in
    [max(0, t - delta), t + delta] with the normalised entropy raised to `exponent`; otherwise plain `temp`.
    """

    t: float
    delta: float = 0.0
    exponent: float = 1.0

    def __post_init__(self) -> None:
        self.t = f32_param("temperature", self.t)
        self.delta = f32_param("dynatemp_range", self.delta)
        self.exponent = f32_param("dynatemp_exponent", self.exponent)

    @property
    def name(self) -> str:
        return "?temp-ext" if self.t == 1.0 and self.delta <= 0.0 else "temp-ext"

    def apply(self, cur: TokenDataArray) -> None:
        if self.delta <= 0.0:
            temp_impl(cur, self.t)
            return
        n = cur.size
        if n <= 1:
            return
        min_temp = max(F32(0), F32(self.t) - F32(self.delta))
        max_temp = F32(self.t) + F32(self.delta)
        max_entropy = -np.log(F32(1) / F32(n))
        probs = cur.softmax(True)
        pos = probs[probs > 0]
        entropy = -(pos * np.log(pos)).sum(dtype=F32)
        dyn_temp = min_temp + (max_temp - min_temp) * np.power(entropy / max_entropy, F32(self.exponent))
        temp_impl(cur, float(dyn_temp))
        logits = cur.logits.astype(np.float64)  # (n,) llama.cpp re-normalises in double
        p = np.exp(logits - logits[0]).astype(F32)  # (n,)
        cur.probs = (p / p.sum(dtype=np.float64)).astype(F32)


@dataclass(slots=True)
class XtcSampler(SamplerBase):
    """Exclude Top Choices (llama_sampler_init_xtc): with chance `probability`, drop every token with
    p >= `threshold` except the least likely of them. Off when `probability <= 0` or `threshold > 0.5`.
    """

    probability: float
    threshold: float
    min_keep: int = 0
    seed: int = LLAMA_DEFAULT_SEED
    seed_cur: int = field(init=False)
    rng: StdMt19937 = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.probability = f32_param("xtc_probability", self.probability)
        self.threshold = f32_param("xtc_threshold", self.threshold)
        self.min_keep = int_param("min_keep", self.min_keep, 0)
        self.seed = check_seed(self.seed)
        self.reset()

    @property
    def name(self) -> str:
        return "?xtc" if self.probability <= 0.0 or self.threshold > 0.5 else "xtc"

    def reset(self) -> None:
        self.seed_cur = get_rng_seed(self.seed)
        self.rng = StdMt19937(self.seed_cur)

    def apply(self, cur: TokenDataArray) -> None:
        if self.probability <= 0.0 or self.threshold > 0.5 or cur.size < 2:
            return
        if self.rng.uniform_float() > self.probability:
            return
        probs = cur.softmax(True)
        # pos_last: the last index of the leading run of tokens with p >= threshold (0 when there is none)
        below = _first(probs < self.threshold)
        pos_last = 0 if below == 0 else (cur.size if below is None else below) - 1
        if cur.size - pos_last >= self.min_keep and pos_last > 0:
            cur.keep(slice(pos_last, None))


@dataclass(slots=True)
class TopNSigmaSampler(SamplerBase):
    """Keep logits within `n` standard deviations of the max, ignoring -inf; `n <= 0` is off
    (llama_sampler_init_top_n_sigma). Masks with -inf instead of dropping, so order is kept.
    """

    n: float

    def __post_init__(self) -> None:
        self.n = f32_param("top_n_sigma", self.n)

    @property
    def name(self) -> str:
        return "top-n-sigma" if self.n > 0.0 else "?top-n-sigma"

    def apply(self, cur: TokenDataArray) -> None:
        if self.n <= 0.0 or cur.size <= 1:
            return
        valid = cur.logits[cur.logits != -np.inf]  # (m,)
        if valid.shape[0] == 0:
            return
        top = valid.max()
        mean = valid.sum(dtype=F32) / F32(valid.shape[0])
        std = F32(np.sqrt(((valid.astype(np.float64) - mean) ** 2).sum() / valid.shape[0]))
        cur.logits[cur.logits < top - F32(self.n) * std] = -np.inf


@dataclass(slots=True)
class LogitBiasSampler(SamplerBase):
    """Add a bias to chosen tokens' logits; -inf bans a token (llama_sampler_init_logit_bias).

    `logit_bias` is a mapping token -> bias or (token, bias) pairs; a token listed twice gets the sum of its
    biases. Raises ValueError for a token outside [0, n_vocab) or a NaN / +inf bias.
    """

    n_vocab: int
    logit_bias: Mapping[int, float] | Iterable[tuple[int, float]] = ()
    tokens: np.ndarray = field(init=False, repr=False)  # (m,) int64, unique
    biases: np.ndarray = field(init=False, repr=False)  # (m,) float32

    def __post_init__(self) -> None:
        self.n_vocab = int_param("n_vocab", self.n_vocab, 1)
        pairs = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        merged: dict[int, float] = {}
        for tok, bias in pairs:
            t = int_param("logit_bias token", tok, 0)
            if t >= self.n_vocab:
                raise SamplingParamsError(f"logit_bias: token {t} is outside the vocabulary [0, {self.n_vocab})")
            b = f32_param(f"logit_bias[{t}]", bias, allow_inf=True)
            if b == math.inf:
                raise SamplingParamsError(f"logit_bias[{t}]: +inf is not a bias (use -inf or false to ban a token)")
            merged[t] = merged.get(t, 0.0) + b
        self.logit_bias = tuple(merged.items())
        self.tokens = np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))
        self.biases = np.fromiter(merged.values(), dtype=F32, count=len(merged))

    @property
    def name(self) -> str:
        return "logit-bias" if self.tokens.shape[0] else "?logit-bias"

    def apply(self, cur: TokenDataArray) -> None:
        if self.tokens.shape[0] == 0:
            return
        pos, which = find_tokens(cur, self.tokens)
        cur.logits[pos] += self.biases[which]

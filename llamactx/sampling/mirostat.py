"""Mirostat 1.0 and 2.0 (src/llama-sampler.cpp llama_sampler_init_mirostat / _mirostat_v2).

Both select the token themselves, with `std::discrete_distribution` over their own `std::mt19937`, and then
steer their state `mu` towards the target surprise `tau` with learning rate `eta`. They replace the tail of
the chain (temperature -> mirostat) in common_sampler_init.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llamactx.sampling.rng import LLAMA_DEFAULT_SEED, StdMt19937, check_seed, get_rng_seed
from llamactx.sampling.samplers import F32, SamplerBase, f32_param, int_param, top_k_impl
from llamactx.sampling.token_data import TokenDataArray, top_order

_INT32_MIN = -(2**31)


def _c_int(x: np.float32) -> int:
    """`int(x)` as x86-64 converts a float: truncation, and INT32_MIN for NaN, inf and out-of-range values."""
    if not np.isfinite(x) or not _INT32_MIN <= x < 2**31:
        return _INT32_MIN
    return int(x)


@dataclass(slots=True)
class MirostatSampler(SamplerBase):
    """Mirostat 1.0 (llama_sampler_init_mirostat): estimate the Zipf exponent from the top `m` tokens, derive
    the top-k that hits the target surprise, sample from it. `mu` starts at 2 * tau.
    """

    n_vocab: int
    seed: int = LLAMA_DEFAULT_SEED
    tau: float = 5.0
    eta: float = 0.1
    m: int = 100
    mu: float = field(init=False)
    seed_cur: int = field(init=False)
    rng: StdMt19937 = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.n_vocab = int_param("n_vocab", self.n_vocab, 1)
        self.seed = check_seed(self.seed)
        self.tau = f32_param("mirostat_tau", self.tau)
        self.eta = f32_param("mirostat_eta", self.eta)
        self.m = int_param("m", self.m, 1)
        self.reset()

    @property
    def name(self) -> str:
        return "mirostat"

    def reset(self) -> None:
        self.mu = float(F32(2) * F32(self.tau))
        self.seed_cur = get_rng_seed(self.seed)
        self.rng = StdMt19937(self.seed_cur)

    def _k(self, probs: np.ndarray) -> int:
        count = min(self.m - 1, probs.shape[0] - 1)
        i = np.arange(count, dtype=F32)  # (count,)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_i = np.log((i + F32(2)) / (i + F32(1)))  # (count,)
            b_i = np.log(probs[:count] / probs[1 : count + 1])  # (count,)
            s_hat = (t_i * b_i).sum(dtype=F32) / (t_i * t_i).sum(dtype=F32)
            eps = s_hat - F32(1)
            num = eps * np.power(F32(2), F32(self.mu))
            k = np.power(num / (F32(1) - np.power(F32(self.n_vocab), -eps)), F32(1) / s_hat)
        return max(_c_int(k), 1)

    def apply(self, cur: TokenDataArray) -> None:
        # llama.cpp sorts everything first; only the top m probabilities are read before the top-k cut
        probs = cur.softmax(False)
        top = top_order(cur.logits, min(self.m, cur.size)) if not cur.sorted else slice(0, self.m)
        top_k_impl(cur, self._k(probs[top]))
        probs = cur.softmax(True)
        idx = self.rng.discrete(probs)
        cur.selected = idx
        self.mu = _next_mu(self.mu, self.eta, self.tau, probs[idx])


def _next_mu(mu: float, eta: float, tau: float, p: np.float32) -> float:
    """mu -= eta * (observed surprise - tau), in float32 as llama.cpp."""
    with np.errstate(divide="ignore"):
        observed_surprise = -np.log2(p)
    return float(F32(mu) - F32(eta) * (observed_surprise - F32(tau)))


@dataclass(slots=True)
class MirostatV2Sampler(SamplerBase):
    """Mirostat 2.0 (llama_sampler_init_mirostat_v2): drop tokens whose surprise -log2(p) exceeds `mu`
    (keeping at least one), sample from the rest. `mu` starts at 2 * tau.
    """

    seed: int = LLAMA_DEFAULT_SEED
    tau: float = 5.0
    eta: float = 0.1
    mu: float = field(init=False)
    seed_cur: int = field(init=False)
    rng: StdMt19937 = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.seed = check_seed(self.seed)
        self.tau = f32_param("mirostat_tau", self.tau)
        self.eta = f32_param("mirostat_eta", self.eta)
        self.reset()

    @property
    def name(self) -> str:
        return "mirostat-v2"

    def reset(self) -> None:
        self.mu = float(F32(2) * F32(self.tau))
        self.seed_cur = get_rng_seed(self.seed)
        self.rng = StdMt19937(self.seed_cur)

    def apply(self, cur: TokenDataArray) -> None:
        # llama.cpp sorts, then cuts at the first too-surprising token; p falls along that order, so filtering
        # first and sorting only the survivors gives the same list
        probs = cur.softmax(False)
        with np.errstate(divide="ignore"):
            ok = -np.log2(probs) <= F32(self.mu)  # (n,)
        cur.keep(ok if ok.any() else np.array([int(np.argmax(cur.logits))]))
        cur.sort()
        probs = cur.softmax(True)
        idx = self.rng.discrete(probs)
        cur.selected = idx
        self.mu = _next_mu(self.mu, self.eta, self.tau, probs[idx])

"""The random numbers of llama.cpp's samplers: `std::mt19937` and libstdc++'s distributions, on numpy.

llama.cpp's `dist`, `xtc` and `mirostat` samplers each own a `std::mt19937` seeded with `get_rng_seed(seed)`
(src/llama-sampler.cpp) and draw from it with `std::uniform_real_distribution` and
`std::discrete_distribution`. `StdMt19937` reproduces that stream exactly: numpy's MT19937 bit generator is
the same generator, so we give it the state that `std::mt19937(seed)` starts from (Matsumoto-Nishimura
`init_genrand`) and turn raw 32-bit draws into doubles and floats the way libstdc++'s `generate_canonical`
does. A given seed therefore yields the same draws as llama.cpp built with GCC, and every sampler instance
owns its generator: no global RNG, so one seed gives the same tokens on any thread.
"""

from __future__ import annotations

import os

import numpy as np

from llamactx.sampling.token_data import SamplingParamsError

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.h: "use a random seed"

_MT_N = 624
_TWO_32 = 4294967296.0
_ONE_BELOW_F64 = float(np.nextafter(1.0, 0.0))
_ONE_BELOW_F32 = float(np.nextafter(np.float32(1.0), np.float32(0.0)))


def check_seed(seed: int, name: str = "seed") -> int:
    """A seed as llama.cpp's uint32: -1 (llama-server's "random") maps to LLAMA_DEFAULT_SEED.

    Raises ValueError for anything that is not an int in [-1, 2**32 - 1].
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise SamplingParamsError(f"{name}: expected an int in [-1, {LLAMA_DEFAULT_SEED}], got {seed!r}")
    seed = int(seed)
    if seed == -1:
        return LLAMA_DEFAULT_SEED
    if not 0 <= seed <= LLAMA_DEFAULT_SEED:
        raise SamplingParamsError(f"{name}: {seed} is outside [-1, {LLAMA_DEFAULT_SEED}] (-1 = random)")
    return seed


def get_rng_seed(seed: int) -> int:
    """LLAMA_DEFAULT_SEED -> a fresh random seed from the OS; any other seed as is (llama-sampler.cpp
    get_rng_seed)."""
    if seed == LLAMA_DEFAULT_SEED:
        return int.from_bytes(os.urandom(4), "little")
    return seed


def _init_genrand(seed: int) -> np.ndarray:
    key = np.empty(_MT_N, dtype=np.uint32)  # (624,)
    x = seed & 0xFFFFFFFF
    key[0] = x
    for i in range(1, _MT_N):
        x = (1812433253 * (x ^ (x >> 30)) + i) & 0xFFFFFFFF
        key[i] = x
    return key


class StdMt19937:
    """`std::mt19937` with libstdc++'s `uniform_real_distribution` and `discrete_distribution` on top.

    Not thread-safe by itself (neither is llama.cpp's); each sampler owns one.
    """

    __slots__ = ("_bitgen",)

    def __init__(self, seed: int) -> None:
        self._bitgen = np.random.MT19937(0)
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """Restart the stream as `std::mt19937(seed)` does."""
        self._bitgen.state = {"bit_generator": "MT19937", "state": {"key": _init_genrand(seed), "pos": _MT_N}}

    def next_u32(self) -> int:
        """One raw 32-bit output."""
        return int(self._bitgen.random_raw())

    def uniform(self) -> float:
        """`std::uniform_real_distribution<double>(0, 1)`: generate_canonical<double, 53> from two draws."""
        lo, hi = self._bitgen.random_raw(2).tolist()  # python ints: cheaper than numpy scalars
        r = (float(lo) + float(hi) * _TWO_32) / (_TWO_32 * _TWO_32)
        return _ONE_BELOW_F64 if r >= 1.0 else r

    def uniform_float(self) -> float:
        """`std::uniform_real_distribution<float>(0, 1)`: generate_canonical<float, 24> from one draw."""
        r = np.float32(self._bitgen.random_raw()) / np.float32(_TWO_32)
        return _ONE_BELOW_F32 if r >= 1.0 else float(r)

    def discrete(self, weights: np.ndarray) -> int:
        """`std::discrete_distribution<int>(weights)(rng)` as libstdc++ implements it.

        Fewer than two weights draw nothing and return 0; otherwise the weights are normalised in double,
        accumulated, the last cumulative value is forced to 1.0, and one uniform double picks the first bucket
        whose cumulative value is >= the draw.
        """
        if weights.shape[0] < 2:
            return 0
        w = weights.astype(np.float64)  # (n,)
        cp = np.cumsum(w / np.cumsum(w)[-1])  # (n,)
        cp[-1] = 1.0
        return int(np.searchsorted(cp, self.uniform(), side="left"))

    def __deepcopy__(self, memo: dict) -> StdMt19937:
        out = StdMt19937.__new__(StdMt19937)
        out._bitgen = np.random.MT19937(0)
        out._bitgen.state = self._bitgen.state
        return out

"""The numba fast paths of the sampling package (kernels.py) against the numpy code they replaced.

The reference functions below are the previous implementations, kept verbatim as oracles: a stable descending
argsort for top-k, numpy cumsums and masks for the top-p / min-p cuts and the dist draw. Every comparison is bit
for bit (probabilities compared as uint32), on many random rows: realistic logits, heavy ties, -inf and +inf
logits, k >= n, vocabularies of one to a few tokens, values in ascending order (where the scan gives up).
"""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.sampling import SamplerChain, SamplingParams, StdMt19937
from llamactx.sampling.kernels import dist_pick, min_p_cut, top_k_scan, top_p_cut
from llamactx.sampling.token_data import TokenDataArray, top_order

F32 = np.float32


def _first(mask: np.ndarray) -> int | None:
    i = int(np.argmax(mask))
    return i if mask.shape[0] and mask[i] else None


def _slow_top_order(x: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-x, kind="stable")[:k]


def _slow_top_p_cut(probs: np.ndarray, p: float, min_keep: int) -> int | None:
    cum = np.cumsum(probs, dtype=F32)  # (n,)
    i = _first((cum >= p) & (np.arange(1, cum.shape[0] + 1) >= min_keep))
    return None if i is None else i + 1


def _slow_min_p_end(logits: np.ndarray, log_p: np.float32, min_keep: int) -> int:
    stop = (logits < logits[0] + log_p) & (np.arange(logits.shape[0]) >= min_keep)
    stop[0] = False
    i = _first(stop)
    return logits.shape[0] if i is None else i


def _slow_dist(p: np.ndarray, u: float) -> tuple[int, np.ndarray]:
    cum = np.cumsum(p, dtype=np.float64)  # (n,)
    total = cum[-1]
    i = int(np.searchsorted(cum, total * u, side="left"))
    return min(i, p.shape[0] - 1), (p / total).astype(F32)


def _slow_default_chain(logits: np.ndarray, params: SamplingParams, rng: StdMt19937) -> TokenDataArray:
    """top-k -> top-p -> min-p -> temp -> dist as the samplers did it before kernels.py (top_k > 0, so every
    stage after top-k sees a sorted array)."""
    n = logits.shape[0]
    order = _slow_top_order(logits.astype(F32), params.top_k)
    ids, x = np.arange(n, dtype=np.int32)[order], logits.astype(F32)[order]  # (k,)
    probs = None
    if params.top_p < 1.0:
        probs = np.exp(x - x[0])
        probs /= probs.sum(dtype=F32)
        last = _slow_top_p_cut(probs, F32(params.top_p), params.min_keep)
        end = x.shape[0] if last is None else last
        ids, x, probs = ids[:end], x[:end], probs[:end]
    if params.min_p > 0.0:
        end = _slow_min_p_end(x, np.log(F32(params.min_p)), params.min_keep)
        ids, x = ids[:end], x[:end]
        probs = None if probs is None else probs[:end]
    if params.temperature <= 0.0:
        i = int(np.argmax(x))
        top = x[i]
        x.fill(-np.inf)
        x[i] = top
    elif params.temperature != 1.0:
        x /= F32(params.temperature)
    if x.shape[0] == 1:
        rng.uniform()
        return TokenDataArray(ids, x, np.ones(1, F32), 0, True)
    p = np.exp(x - x[0])
    selected, probs = _slow_dist(p, rng.uniform())
    return TokenDataArray(ids, x, probs, selected, True)


def _rows(rng: np.random.Generator, n: int, count: int) -> list[np.ndarray]:
    """Logit rows of every kind the fast paths must agree on."""
    rows = []
    for r in range(count):
        kind = r % 7
        if kind == 0:  # realistic
            x = rng.standard_normal(n) * 3
        elif kind == 1:  # heavy ties
            x = rng.integers(-3, 4, n).astype(np.float64)
        elif kind == 2:  # mostly banned
            x = np.where(rng.random(n) < 0.9, -np.inf, rng.standard_normal(n))
            x[rng.integers(0, n)] = 1.0
        elif kind == 3:  # a handful of finite values (fewer than k on large vocabularies)
            x = np.full(n, -np.inf)
            x[rng.integers(0, n, 5)] = rng.integers(0, 3, 5)
        elif kind == 4:  # ties with the maximum, +0 / -0
            x = rng.choice(np.array([0.0, -0.0, 1.5, 1.5, -2.0]), n)
        elif kind == 5:  # a +inf logit among ordinary ones
            x = rng.standard_normal(n)
            x[rng.integers(0, n)] = np.inf
        else:  # spikes on every 16th id: top-k's sample overestimates how many values reach its threshold
            x = rng.standard_normal(n)
            x[::16] += 100 + np.arange(x[::16].shape[0])
        rows.append(x.astype(F32))
    return rows


def _bits(a: np.ndarray | None) -> list[int] | None:
    return None if a is None else np.ascontiguousarray(a, dtype=F32).view(np.uint32).tolist()


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64, 65, 130, 2048, 2049, 49152])
def test_top_order_matches_a_stable_sort_on_every_kind_of_row(n):
    rng = np.random.default_rng(n)
    for x in _rows(rng, n, 14):
        for k in sorted({1, 2, 4, 7, 40, 64, 128, 129, n - 1, n, n + 3}):
            if k >= 1:
                assert top_order(x, k).tolist() == _slow_top_order(x, k).tolist(), (n, k)


def test_top_k_scan_gives_up_on_nans_and_long_ascending_runs():
    x = np.random.default_rng(0).standard_normal(5000).astype(F32)
    assert top_k_scan(x, 40, 10**9)[1]
    y = x.copy()
    y[3000] = np.nan
    assert not top_k_scan(y, 40, 10**9)[1]
    y = x.copy()
    y[7] = np.nan  # among the first k
    assert not top_k_scan(y, 40, 10**9)[1]
    ramp = np.arange(3000, dtype=F32)  # too short for the sampled threshold: every value is inserted
    assert not top_k_scan(ramp, 40, 16 * 40 + 256)[1]
    assert top_k_scan(ramp, 40, 10**9)[0].tolist() == list(range(2999, 2959, -1))
    assert top_order(ramp, 40).tolist() == list(range(2999, 2959, -1))  # the general path after the scan gives up
    ramp = np.arange(49152, dtype=F32)  # the sampled threshold leaves about 4k values to insert
    assert top_k_scan(ramp, 40, 16 * 40 + 256)[0].tolist() == list(range(49151, 49111, -1))


def test_top_p_cut_matches_the_cumsum_mask():
    rng = np.random.default_rng(1)
    for n in [1, 2, 3, 8, 40, 256]:
        for x in _rows(rng, n, 12):
            with np.errstate(invalid="ignore"):
                probs = np.exp(x - x.max())
                probs /= probs.sum(dtype=F32)
            for p in [0.0, 0.3, 0.95, 0.9999, 1.0]:
                for min_keep in [0, 1, 3, n, n + 1]:
                    got = top_p_cut(probs, float(F32(p)), min_keep)
                    assert (None if got < 0 else got) == _slow_top_p_cut(probs, F32(p), min_keep)


def test_min_p_cut_matches_the_mask():
    rng = np.random.default_rng(2)
    for n in [1, 2, 3, 8, 40, 256]:
        for x in _rows(rng, n, 12):
            x = np.sort(x)[::-1].copy()  # (n,) min-p's cut runs on a sorted array
            for p in [0.01, 0.05, 0.5, 1.0]:
                log_p = np.log(F32(p))
                for min_keep in [0, 1, 2, n, n + 1]:
                    assert min_p_cut(x, x[0] + log_p, min_keep) == _slow_min_p_end(x, log_p, min_keep)


def test_dist_pick_matches_cumsum_and_searchsorted():
    rng = np.random.default_rng(3)
    for n in [2, 3, 8, 40, 256]:
        for x in _rows(rng, n, 12):
            x = np.sort(x)[::-1].copy()
            with np.errstate(invalid="ignore"):
                p = np.exp(x - x[0])  # (n,)
            for u in [0.0, 1e-9, 0.25, 0.5, 0.999999, float(np.nextafter(1.0, 0.0)), *rng.random(4)]:
                probs = np.empty(n, F32)
                i = dist_pick(p, u, probs)
                if np.isnan(p.astype(np.float64).sum()):
                    assert i == -1
                    continue
                j, expected = _slow_dist(p, u)
                assert i == j and _bits(probs) == _bits(expected)


CHAIN_PARAMS = [
    SamplingParams(),
    SamplingParams(top_k=1),
    SamplingParams(top_k=64, top_p=0.5, min_p=0.2, min_keep=5),
    SamplingParams(top_k=200, top_p=0.99, min_p=0.01),  # top-k past the scan: the threshold search
    SamplingParams(top_p=1.0, min_p=0.0, temperature=1.0),
    SamplingParams(top_p=0.0, min_keep=3),
    SamplingParams(temperature=0.0),
]


@pytest.mark.parametrize("params", CHAIN_PARAMS, ids=lambda p: f"k{p.top_k}-p{p.top_p}-m{p.min_p}-t{p.temperature}")
@pytest.mark.parametrize("n", [1, 3, 40, 2048, 49152])
def test_default_chain_matches_the_numpy_samplers(params, n):
    rng = np.random.default_rng(n)
    chain = SamplerChain.default(params, n)
    ref_rng = StdMt19937(chain.get_seed())  # the default seed draws a random one
    for x in _rows(rng, n, 14 if n == 49152 else 42):
        with np.errstate(invalid="ignore"):
            expected = _slow_default_chain(x, params, ref_rng)
        if expected.logits[expected.selected] == -np.inf:  # every candidate banned: the chain refuses
            with pytest.raises(RuntimeError):
                chain.sample_logits(x)
            continue
        token = chain.sample_logits(x)
        cur = chain.cur
        assert token == expected.selected_token
        assert cur.ids.tolist() == expected.ids.tolist() and cur.sorted
        assert _bits(cur.logits) == _bits(expected.logits) and _bits(cur.probs) == _bits(expected.probs)

"""Sampling: samplers on tiny arrays, chains against llama.cpp's own token choices, SamplingParams validation.

Three kinds of expected values:
- the cases of llama.cpp's tests/test-sampling.cpp, ported with their numbers;
- goldens made by compiling this tree's src/llama-sampler.cpp (llama.cpp 0c1e570, g++ 12 / libstdc++) into a
  small harness that runs the same chains over the logit rows of `_rows()` below and prints the sampled
  tokens. Our `StdMt19937` reproduces std::mt19937 and libstdc++'s distributions, so the tokens must agree
  exactly;
- llama.cpp's logits of the reference prompts (tests/data), for top-k on real 49k / 262k vocabularies.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from llamactx.sampling import (
    LLAMA_DEFAULT_SEED,
    DistSampler,
    DryBreakers,
    DrySampler,
    GreedySampler,
    LogitBiasSampler,
    MinPSampler,
    MirostatSampler,
    MirostatV2Sampler,
    PenaltiesSampler,
    SamplerChain,
    SamplingParams,
    TempExtSampler,
    TempSampler,
    TokenDataArray,
    TopKSampler,
    TopNSigmaSampler,
    TopPSampler,
    TypicalSampler,
    XtcSampler,
)
from llamactx.sampling.dry import TokenRing
from llamactx.sampling.rng import StdMt19937
from llamactx.sampling.token_data import find_tokens, top_order
from tests.conftest import REFERENCE_DIRS

F32 = np.float32


def _tester(probs: list[float]) -> TokenDataArray:
    """test-sampling.cpp sampler_tester: logits log(p), p preset."""
    p = np.array(probs, dtype=F32)
    with np.errstate(divide="ignore"):
        return TokenDataArray(np.arange(p.shape[0], dtype=np.int32), np.log(p), p.copy())


def _apply(probs: list[float], *samplers) -> TokenDataArray:
    cur = _tester(probs)
    for s in samplers:
        s.apply(cur)
    return cur


def _check(cur: TokenDataArray, expected: list[float]) -> None:
    assert cur.size == len(expected)
    np.testing.assert_allclose(cur.probs, expected, atol=1e-5)


# ---------------------------------------------------------------- tests/test-sampling.cpp


def test_dist_singleton_draws_like_larger_arrays():
    singleton, control = DistSampler(4242), DistSampler(4242)
    singleton.apply(TokenDataArray.from_logits(np.zeros(1)))
    control.apply(TokenDataArray.from_logits(np.zeros(2)))
    for _ in range(4):
        a, b = TokenDataArray.from_logits(np.zeros(256)), TokenDataArray.from_logits(np.zeros(256))
        singleton.apply(a)
        control.apply(b)
        assert a.selected_token == b.selected_token


@pytest.mark.parametrize(
    ("sampler", "expected"),
    [
        (TempSampler(1.0), [0.1, 0.2, 0.3, 0.4]),
        (TempSampler(0.0), [0.0, 0.0, 0.0, 1.0]),
        (TempExtSampler(1.0, 0.0, 1.0), [0.1, 0.2, 0.3, 0.4]),
        (TempExtSampler(0.0, 0.0, 1.0), [0.0, 0.0, 0.0, 1.0]),
        (TopKSampler(1), [1.0]),
        (TopKSampler(3), [0.44444, 0.33333, 0.22222]),
        (TopKSampler(4), [0.4, 0.3, 0.2, 0.1]),
        (TopKSampler(0), [0.1, 0.2, 0.3, 0.4]),
        (TopPSampler(0.0), [1.0]),
        (TopPSampler(0.7), [0.571429, 0.428571]),
        (TopPSampler(0.8), [0.44444, 0.33333, 0.22222]),
        (TopPSampler(1.0), [0.1, 0.2, 0.3, 0.4]),
        (MinPSampler(0.00), [0.1, 0.2, 0.3, 0.4]),
        (MinPSampler(0.24), [0.1, 0.2, 0.3, 0.4]),
        (MinPSampler(0.26), [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
        (MinPSampler(0.49), [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
        (MinPSampler(0.51), [0.3 / 0.7, 0.4 / 0.7]),
        (MinPSampler(0.74), [0.3 / 0.7, 0.4 / 0.7]),
        (MinPSampler(0.76), [1.0]),
        (MinPSampler(1.00), [1.0]),
        (MinPSampler(1.05), [1.0]),
        (TopNSigmaSampler(1.0), [0.0, 0.0, 0.428571, 0.571429]),
        (TopNSigmaSampler(0.0), [0.1, 0.2, 0.3, 0.4]),
        (TopNSigmaSampler(3.0), [0.1, 0.2, 0.3, 0.4]),
    ],
    ids=repr,
)
def test_filter_then_dist(sampler, expected):
    _check(_apply([0.1, 0.2, 0.3, 0.4], sampler, DistSampler(0)), expected)


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [(0.09, [0.1]), (0.19, [0.2, 0.1]), (0.29, [0.3, 0.2, 0.1]), (0.39, [0.4, 0.3, 0.2, 0.1])],
)
def test_xtc(threshold, expected):
    _check(_apply([0.4, 0.3, 0.2, 0.1], XtcSampler(0.99, threshold, 0, 0)), expected)


@pytest.mark.parametrize(
    ("probs", "expected"), [([0.97, 0.01, 0.01, 0.01], [0.97]), ([0.4, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2])]
)
def test_typical(probs, expected):
    _check(_apply(probs, TypicalSampler(0.5, 0)), expected)


@pytest.mark.parametrize(
    ("last", "expected", "repeat", "freq", "present"),
    [
        ([0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
        ([0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
        ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
        ([0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
    ],
)
def test_penalties(last, expected, repeat, freq, present):
    sampler = PenaltiesSampler(5, len(last), repeat, freq, present)
    for t in last:
        sampler.accept(t)
    _check(_apply([0.2] * 5, sampler, DistSampler(0)), expected)


def _dry(multiplier, base, allowed, last_n, breakers) -> DrySampler:
    return DrySampler(0, multiplier, base, allowed, last_n, DryBreakers.from_token_seqs(breakers))


@pytest.mark.parametrize(
    ("probs", "last", "expected", "args"),
    [
        ([0.25] * 4, [0, 1], [0.25] * 4, (1.0, 1.1, 2, 4, [])),
        ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], (1.0, 1.1, 2, 5, [])),
        ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, (1.0, 1.1, 2, 6, [[3]])),
        ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], (2, 1.1, 2, 5, [])),
        ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, (1.0, 1.1, 4, 7, [])),
    ],
)
def test_dry(probs, last, expected, args):
    sampler = _dry(*args)
    for t in last:
        sampler.accept(t)
    _check(_apply(probs, sampler, DistSampler(0)), expected)


QUEUE_CASES = [
    ("k", 10000, 1.0, 1.0), ("k", 1, 1.0, 1.0), ("p", 10000, 1.0, 1.0), ("p", 10000, 0.0, 1.0),
    ("m", 10000, 1.0, 1.0), ("m", 10000, 1.0, 1e-12), ("k", 100, 1.0, 1.0), ("p", 10000, 0.0003, 1.0),
    ("p", 10000, 0.8, 1.0), ("m", 10000, 1.0, F32(9997.9) / F32(9999.0)), ("m", 10000, 1.0, 0.1),
    ("kp", 100, 0.8, 0.1), ("km", 100, 0.8, 0.1), ("pk", 100, 0.8, 0.1), ("pm", 100, 0.8, 0.1),
    ("mk", 100, 0.8, 0.1), ("mp", 100, 0.8, F32(9997.9) / F32(9999.0)), ("mp", 100, 0.8, 0.1),
    ("kpm", 100, 0.8, 0.1), ("kmp", 100, 0.8, 0.1), ("pkm", 100, 0.8, 0.1), ("pmk", 100, 0.8, 0.1),
    ("mkp", 100, 0.8, 0.1), ("mpk", 100, 0.8, 0.1),
]  # fmt: skip


@pytest.mark.parametrize(("seq", "top_k", "top_p", "min_p"), QUEUE_CASES)
def test_sampler_queue(seq, top_k, top_p, min_p):
    """test_sampler_queue: logits log(id) over 10000 tokens, so every expected size has a closed form."""
    n_vocab = 10000
    with np.errstate(divide="ignore"):
        cur = TokenDataArray(np.arange(n_vocab, dtype=np.int32), np.log(np.arange(n_vocab, dtype=F32)))
    min_id, max_id = 0, n_vocab - 1
    for s in seq:
        sampler = {"k": TopKSampler(top_k), "p": TopPSampler(top_p, 1), "m": MinPSampler(min_p, 1)}[s]
        sampler.apply(cur)
        DistSampler(0).apply(cur)
        size = cur.size
        if s == "k":
            expected = min(size, top_k)
            min_id = max(min_id, n_vocab - top_k)
        elif s == "p":
            divisor = n_vocab * (n_vocab - 1) // 2 - min_id * (min_id - 1) // 2
            target = math.ceil(F32(top_p) * F32(divisor))
            min_id, expected, cumsum = n_vocab, 0, 0
            while True:
                min_id, expected, cumsum = min_id - 1, expected + 1, cumsum + min_id - 1
                if cumsum >= target:
                    break
            if min_id == 1:  # token 0 has p == 0
                min_id, expected = 0, expected + 1
        else:
            expected = min(max(math.ceil((F32(1.0) - F32(min_p)) * F32(n_vocab)), 1), size)
            min_id = min(max(math.floor(F32(min_p) * F32(n_vocab)), 1, n_vocab - size), n_vocab - 1)
        assert size == expected
        if s == "k" or cur.sorted:
            assert cur.ids[0] == max_id and cur.ids[expected - 1] == min_id


# ---------------------------------------------------------------- goldens from llama.cpp's sampler code

NV = 2048


def _rows(n_vocab: int = NV, n_rows: int = 8) -> np.ndarray:
    """The harness's logit rows (8, n_vocab): smooth noise, plus a boosted favourite cycling 10, 11, 12 so
    that penalties, DRY and mirostat see repetition.
    """
    i = np.arange(n_vocab, dtype=np.float64)
    rows = []
    for r in range(n_rows):
        x = 3.0 * np.sin(0.37 * i * (r + 1) + r) + 0.5 * np.cos(0.011 * i * (r + 3))
        x[10 + r % 3] += 6.0
        rows.append(x.astype(F32))
    return np.stack(rows)


ROWS = _rows()


def _ids(text: str) -> list[int]:
    return [int(t) for t in text.split()]


GOLDEN_CHAINS = {
    "dist_42": (
        lambda: [DistSampler(42)],
        _ids("1616 145 1505 1226 903 24 714 11 255 1249 12 1476 1931 1 2031 635"),
    ),
    "temp_dist_1234": (
        lambda: [TempSampler(1.5), DistSampler(1234)],
        _ids("994 1675 1233 1582 1768 274 350 1637 323 180 12 992 671 1635 134 11"),
    ),
    "default_order_7": (
        lambda: [
            PenaltiesSampler(NV, 64, 1.1, 0.1, 0.2),
            _dry(0.8, 1.75, 2, 64, [[5], [7, 8]]),
            TopNSigmaSampler(-1.0),
            TopKSampler(40),
            TypicalSampler(1.0),
            TopPSampler(0.95),
            MinPSampler(0.05),
            XtcSampler(0.0, 0.1, 0, 7),
            TempExtSampler(0.8, 0.0, 1.0),
            DistSampler(7),
        ],
        _ids(
            "1906 11 12 1523 1544 12 10 11 10 281 345 292 11 423 10 11 "
            "1533 1300 12 657 1218 638 10 11 956 145 12 483 1629 12 10 11"
        ),
    ),
    "dry_3": (
        lambda: [_dry(2.0, 1.75, 2, 32, [[13]]), TopKSampler(8), DistSampler(3)],
        _ids(
            "10 11 12 759 1792 12 10 11 10 11 12 1901 11 12 10 2002 "
            "1329 1283 12 759 1955 12 10 11 4 11 12 1243 87 12 10 11"
        ),
    ),
    "full_vocab_99": (
        lambda: [
            PenaltiesSampler(NV, 16, 1.3, 0.0, 0.0),
            TopKSampler(0),
            TypicalSampler(0.9, 1),
            TopPSampler(0.8, 1),
            MinPSampler(0.02, 1),
            XtcSampler(0.6, 0.05, 1, 99),
            TempExtSampler(0.9, 0.4, 1.5),
            DistSampler(99),
        ],
        _ids(
            "1157 434 12 1544 1296 335 10 11 1788 1435 1579 840 104 1994 1966 1898 "
            "38 332 486 1629 1632 1759 1095 66 462 11 12 292 882 1009 10 1900"
        ),
    ),
    "top_n_sigma_21": (
        lambda: [TopNSigmaSampler(2.0), TopPSampler(0.9), DistSampler(21)],
        _ids("1378 875 12 250 1500 1357 1648 11 766 11 12 466 590 2008 10 11"),
    ),
    "top_p_full_5": (
        lambda: [TopPSampler(0.9), DistSampler(5)],
        _ids("395 1520 362 1446 1313 1920 1597 11 1858 1359 667 975 980 1391 10 11"),
    ),
    "mirostat_11": (
        lambda: [TempSampler(0.9), MirostatSampler(NV, 11, 5.0, 0.1, 100)],
        _ids(
            "191 11 12 768 1707 12 10 11 1533 1283 12 840 274 12 10 11 "
            "1585 1852 12 1710 485 12 10 11 1058 11 12 199 685 12 10 11"
        ),
    ),
    "mirostat_v2_12": (
        lambda: [TempSampler(0.9), MirostatV2Sampler(12, 5.0, 0.1)],
        _ids(
            "583 536 12 831 1391 12 10 11 328 417 130 1022 1802 1643 10 11 "
            "1923 11 1166 271 19 856 10 11 1534 1589 1845 1519 1802 12 10 11"
        ),
    ),
    "temp_0_13": (
        lambda: [TopKSampler(40), TempExtSampler(0.0, 0.0, 1.0), DistSampler(13)],
        _ids("10 11 12 10 11 12 10 11"),
    ),
}


def _run_rows(chain: SamplerChain, steps: int) -> list[int]:
    return [chain.sample_logits(ROWS[t % ROWS.shape[0]]) for t in range(steps)]


@pytest.mark.parametrize("name", list(GOLDEN_CHAINS))
def test_chain_tokens_match_llama_cpp(name):
    build, expected = GOLDEN_CHAINS[name]
    assert _run_rows(SamplerChain(build()), len(expected)) == expected


def _slice(row: int) -> TokenDataArray:
    """Tokens 100..163 of a row: the harness's small arrays."""
    return TokenDataArray(np.arange(100, 164, dtype=np.int32), ROWS[row, 100:164].copy())


def test_typical_matches_llama_cpp():
    cur = _slice(2)
    TypicalSampler(0.5, 0).apply(cur)
    assert cur.ids.tolist() == [136, 158, 147, 135, 101, 102, 152, 119, 141, 112, 118, 108, 129]
    expected = [0.0372695588, 0.0349788629, 0.042495165, 0.0430702008]
    np.testing.assert_allclose(cur.probs[:4], expected, rtol=1e-5)
    cur = _slice(5)
    TypicalSampler(0.9, 3).apply(cur)
    expected_ids = _ids(
        "120 146 106 160 134 151 126 109 103 129 123 157 148 154 143 117 137 163 100 112 131 140"
    )
    assert cur.ids.tolist() == expected_ids
    assert not cur.sorted


def test_top_n_sigma_matches_llama_cpp():
    cur = _slice(4)
    TopNSigmaSampler(1.5).apply(cur)
    kept = cur.ids[np.isfinite(cur.logits)].tolist()
    assert kept == _ids(
        "100 101 104 107 108 110 111 114 117 118 121 124 125 128 131 134 135 138 141 142 144 145 148 151 152 "
        "155 158 159 161 162"
    )
    np.testing.assert_allclose(cur.logits[[0, 1, 4]], [1.52664077, 2.16349006, 2.91947651], rtol=1e-6)


def test_dynatemp_matches_llama_cpp():
    cur = _slice(1)
    SamplerChain([TopKSampler(50), TempExtSampler(1.0, 0.5, 2.0)]).apply(cur)
    assert cur.ids[:8].tolist() == [145, 128, 137, 162, 154, 120, 136, 153] and cur.size == 50
    np.testing.assert_allclose(cur.probs[:3], [0.0631093457, 0.0579664707, 0.0572728664], rtol=1e-5)
    np.testing.assert_allclose(cur.probs[-1], 0.000760971569, rtol=1e-5)


def test_penalties_match_llama_cpp():
    sampler = PenaltiesSampler(NV, 8, 1.5, 0.3, 0.7)
    for t in [10, 11, 12, 10, 300, 10, 2047, 5, 6, 11]:  # 10 and 11 fall out of the window of 8
        sampler.accept(t)
    cur = TokenDataArray.from_logits(ROWS[0])
    sampler.apply(cur)
    np.testing.assert_allclose(
        cur.logits[[5, 6, 10, 11, 12, 300, 2047]],
        [1.2513566, 0.919951558, 1.95567536, -3.90187359, -4.64213085, -5.55737495, -2.17860579],
        rtol=1e-6,
    )


def test_dry_logits_match_llama_cpp():
    sampler = _dry(1.5, 2.0, 1, 40, [[3], [4, 5]])
    for t in [20, 21, 22, 3, 20, 21, 22, 30, 4, 5, 20, 21, 22, 31, 20, 21]:
        sampler.accept(t)
    cur = TokenDataArray.from_logits(ROWS[3])
    sampler.apply(cur)
    np.testing.assert_allclose(
        cur.logits[[20, 21, 22, 30, 31, 3, 4, 5]],
        [2.90253782, 1.47060502, -5.46916771, -1.01678514, -3.17739511, 3.23681021, 1.93351626, -2.01045823],
        rtol=1e-6,
    )


def test_std_mt19937_matches_libstdcxx():
    """Values printed by g++ 12: std::mt19937(0) through uniform_real_distribution<double> / <float>, and
    discrete_distribution({.1, .2, .3, .4}) over std::mt19937(1234)."""
    rng = StdMt19937(0)
    assert [rng.uniform() for _ in range(3)] == [0.5928446165166826, 0.8442657442565983, 0.8579456199898299]
    rng = StdMt19937(0)
    floats = [rng.uniform_float() for _ in range(3)]
    assert floats == pytest.approx([0.548813522, 0.592844605, 0.715189338], rel=1e-8)
    rng = StdMt19937(1234)
    assert [rng.discrete(np.array([0.1, 0.2, 0.3, 0.4], F32)) for _ in range(8)] == [2, 3, 3, 3, 3, 1, 1, 3]
    rng, control = StdMt19937(7), StdMt19937(7)
    assert rng.discrete(np.ones(1, F32)) == 0 and rng.next_u32() == control.next_u32()  # one weight: no draw


@pytest.mark.parametrize(("model", "ref_fixture"), [("smollm2", "smollm_ref"), ("gemma3", "gemma_ref")])
def test_top_k_on_reference_logits(model, ref_fixture, request):
    ref = request.getfixturevalue(ref_fixture)
    data = REFERENCE_DIRS[model]  # the reference set of this run's arithmetic, as ref_fixture's
    for i, prompt in enumerate(ref["prompts"]):
        logits = np.load(data / prompt["logits_file"])  # (n_vocab,)
        cur = TokenDataArray.from_logits(logits)
        TopKSampler(20).apply(cur)
        assert cur.ids.tolist() == prompt["top20_ids"] and cur.sorted
        greedy = SamplerChain.default(SamplingParams(temperature=0.0, seed=i), logits.shape[0])
        assert greedy.sample_logits(logits) == prompt["top20_ids"][0]


# ---------------------------------------------------------------- building blocks


def test_top_order_matches_a_full_stable_sort():
    rng = np.random.default_rng(1)
    for n, k in [(50_000, 1), (50_000, 40), (300_000, 256), (5_000, 4_999), (100_000, 3_000)]:
        x = rng.standard_normal(n).astype(F32)
        x[rng.integers(0, n, n // 10)] = x[0]  # plenty of ties
        assert (top_order(x, k) == np.argsort(-x, kind="stable")[:k]).all()
    flat = np.zeros(100_000, F32)
    assert top_order(flat, 5).tolist() == [0, 1, 2, 3, 4]


def test_find_tokens_fast_and_general_paths():
    cur = TokenDataArray.from_logits(np.zeros(10))
    pos, which = find_tokens(cur, np.array([7, 2]))
    assert pos.tolist() == [7, 2] and which.tolist() == [0, 1]
    cur.keep(np.array([9, 7, 5, 3]))
    pos, which = find_tokens(cur, np.array([3, 4, 9]))
    assert dict(zip(cur.ids[pos].tolist(), which.tolist(), strict=True)) == {3: 0, 9: 2}


def test_greedy_and_selected_token():
    cur = TokenDataArray.from_logits(np.array([1.0, 3.0, 3.0, 2.0]))
    GreedySampler().apply(cur)
    assert cur.selected == 1 and cur.selected_token == 1
    with pytest.raises(RuntimeError, match="no token selected"):
        _ = TokenDataArray.from_logits(np.zeros(3)).selected_token


def test_logit_bias():
    sampler = LogitBiasSampler(5, {1: 2.5, 3: -math.inf})
    cur = TokenDataArray.from_logits(np.zeros(5))
    sampler.apply(cur)
    assert cur.logits.tolist() == [0.0, 2.5, 0.0, -math.inf, 0.0]
    cur = TokenDataArray.from_logits(np.zeros(5))
    cur.keep(np.array([4, 3, 1]))  # shuffled: the slow path finds them by id
    sampler.apply(cur)
    assert cur.logits.tolist() == [0.0, -math.inf, 2.5]
    assert LogitBiasSampler(5, [(2, 1.0), (2, 0.5)]).biases.tolist() == [1.5]
    with pytest.raises(ValueError, match="token 5 is outside the vocabulary"):
        LogitBiasSampler(5, {5: 1.0})
    assert LogitBiasSampler(5).name == "?logit-bias"


def test_typical_ignores_masked_tokens():
    """Deviation from llama.cpp: -inf logits contribute 0 (not NaN) to the entropy."""
    cur = TokenDataArray.from_logits(np.array([2.0, -np.inf, 1.0, 0.5, -np.inf], F32))
    TypicalSampler(0.9).apply(cur)
    assert set(cur.ids.tolist()) <= {0, 2, 3} and np.isfinite(cur.probs).all()


def test_mirostat_state_moves_and_resets():
    sampler = MirostatV2Sampler(seed=3, tau=3.0, eta=0.5)
    assert sampler.mu == 6.0
    sampler.apply(TokenDataArray.from_logits(ROWS[0]))
    assert sampler.mu != 6.0
    sampler.reset()
    assert sampler.mu == 6.0
    assert MirostatSampler(NV, seed=1).m == 100


class _ToyVocab:
    """A vocabulary of whole pieces; tokenize splits greedily on the longest piece (enough for breakers)."""

    pieces = ["a", "b", "\n", "x:", ":", "ab", "\n\n", "y", "Q:", "A", "Q"]

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self.pieces[token].encode()

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        out = []
        while text:
            best = max((p for p in self.pieces if text.startswith(p)), key=len)
            out.append(self.pieces.index(best))
            text = text[len(best) :]
        return out


def test_dry_breakers_from_strings():
    """get_overlapping_token_sequences: tokens containing a breaker are whole breakers; a token ending with a
    prefix of one is a head followed by the tokenised rest ("Q" + "A:" -> head Q, tail [A, :]; "Q:" contains
    ":" and does not end with a prefix of "QA:")."""
    vocab = _ToyVocab()
    breakers = DryBreakers.from_strings(["\n", ":", "QA:"], vocab, len(vocab.pieces))
    assert breakers.seqs == {2: ((),), 6: ((),), 3: ((),), 4: ((),), 8: ((),), 10: ((9, 4),)}
    with pytest.raises(ValueError, match=r"dry_sequence_breakers\[0\]"):
        DryBreakers.from_strings([3], vocab, 3)


def test_dry_breaker_limits_the_lookback():
    """y : a b y y : a b -> "y : a b" reappears followed by y (a repeat of 4), but the newest ':' is 2 tokens
    back, so with ':' as a breaker the repeat counts only 2."""
    vocab = _ToyVocab()
    breakers = DryBreakers.from_strings([":"], vocab, len(vocab.pieces))
    free, broken = _dry(1.0, 2.0, 1, 20, []), DrySampler(0, 1.0, 2.0, 1, 20, breakers)
    for t in [7, 4, 0, 1, 7, 7, 4, 0, 1]:
        free.accept(t)
        broken.accept(t)
    a, b = TokenDataArray.from_logits(np.zeros(11)), TokenDataArray.from_logits(np.zeros(11))
    free.apply(a)
    broken.apply(b)
    assert a.logits.tolist() == [0.0] * 7 + [-(2.0 ** (4 - 1))] + [0.0] * 3
    assert b.logits.tolist() == [0.0] * 7 + [-(2.0 ** (2 - 1))] + [0.0] * 3


def test_token_ring_grows_and_wraps():
    ring = TokenRing(1000)
    for t in range(600):
        ring.push(t)
    assert ring.latest_first(600).tolist() == list(range(599, -1, -1))
    small = TokenRing(5)
    for t in range(1, 13):
        small.push(t)
    assert small.size == 5 and small.latest_first(5).tolist() == [12, 11, 10, 9, 8]
    TokenRing(0).push(3)  # a disabled sampler's ring stays empty


def test_dry_minus_one_uses_n_ctx_train():
    assert DrySampler(4096, 0.8, 1.75, 2, -1).penalty_last_n == 4096
    assert DrySampler(4096, 0.0, 1.75, 2, -1).name == "?dry"


# ---------------------------------------------------------------- the chain


def test_default_chain_order():
    names = SamplerChain.default(SamplingParams(), 100, n_ctx=512).names
    assert names == ["?penalties", "?dry", "?top-n-sigma", "top-k", "?typical", "top-p", "min-p", "?xtc",
                     "temp-ext", "dist"]  # fmt: skip
    params = SamplingParams(logit_bias={3: 1.0}, repeat_penalty=1.1, top_n_sigma=1.0, typical_p=0.9)
    names = SamplerChain.default(params, 100, n_ctx=512).names
    assert names == ["logit-bias", "penalties", "?dry", "top-n-sigma", "top-k", "typical", "top-p", "min-p",
                     "?xtc", "temp-ext", "dist"]  # fmt: skip
    assert SamplerChain.default(SamplingParams(mirostat=1, logit_bias={1: 1}), 100).names == [
        "logit-bias", "temp", "mirostat"]  # fmt: skip
    assert SamplerChain.default(SamplingParams(mirostat=2), 100).names == ["temp", "mirostat-v2"]
    assert SamplerChain.default(SamplingParams(samplers="kt"), 100).names == ["top-k", "temp-ext", "dist"]
    assert SamplerChain.default(SamplingParams(samplers=["Top-P", "temp"]), 100).names == [
        "top-p", "temp-ext", "dist"]  # fmt: skip


def test_default_resolves_context_sizes():
    chain = SamplerChain.default(SamplingParams(penalty_last_n=-1, repeat_penalty=1.2), 100, n_ctx=333)
    assert chain.samplers[0].penalty_last_n == 333
    params = SamplingParams(dry_multiplier=0.5, dry_sequence_breakers=())
    chain = SamplerChain.default(params, 100, n_ctx_train=777)
    assert chain.samplers[1].penalty_last_n == 777
    with pytest.raises(ValueError, match="penalty_last_n"):
        SamplerChain.default(SamplingParams(penalty_last_n=-1, repeat_penalty=1.2), 100)
    with pytest.raises(ValueError, match="dry_sequence_breakers"):
        SamplerChain.default(SamplingParams(dry_multiplier=0.5), 100, n_ctx=64)


def test_temperature_zero_is_greedy_whatever_the_seed():
    logits = ROWS[5]
    for seed in (0, 1, 2, LLAMA_DEFAULT_SEED):
        for t in (0.0, -1.0):
            chain = SamplerChain.default(SamplingParams(temperature=t, seed=seed, top_k=0), NV)
            assert chain.sample_logits(logits) == int(np.argmax(logits))


def _tokens(seed: int, steps: int = 24) -> list[int]:
    params = SamplingParams(seed=seed, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    chain = SamplerChain.default(params, NV)
    return _run_rows(chain, steps)


def test_same_seed_same_tokens_different_seed_different_tokens():
    assert _tokens(5) == _tokens(5)
    assert _tokens(5) != _tokens(6)
    random_seeded = SamplerChain.default(SamplingParams(seed=-1), NV)
    assert random_seeded.get_seed() != LLAMA_DEFAULT_SEED


def test_dist_is_reproducible_across_threads():
    seeds = list(range(8))
    serial = [_tokens(s) for s in seeds]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(_tokens, seeds))
    assert threaded == serial


def test_clone_and_reset():
    chain = SamplerChain.default(SamplingParams(seed=9, repeat_penalty=1.3, temperature=1.2), NV, n_ctx=64)
    first = _run_rows(chain, 5)
    twin = chain.clone()
    assert _run_rows(chain, 6) == _run_rows(twin, 6)
    chain.reset()
    assert _run_rows(chain, 5) == first
    assert chain.last() == first[-1]


def test_sample_reads_the_context_and_leaves_logits_alone():
    class Ctx:
        def __init__(self):
            self.asked = []

        def get_logits_ith(self, i):
            self.asked.append(i)
            return ROWS[2]

    before = ROWS[2].copy()
    ctx = Ctx()
    chain = SamplerChain([TopKSampler(3), TempSampler(0.5), DistSampler(1)])
    token = chain.sample(ctx, -1)
    assert ctx.asked == [-1] and token in np.argsort(-ROWS[2])[:3]
    assert (ROWS[2] == before).all()
    sorted_cur = chain.candidates()
    assert sorted_cur.selected_token == token and (np.diff(sorted_cur.probs) <= 0).all()


class _OnlyEven:
    """A stand-in grammar: even tokens only."""

    name = "grammar"

    def __init__(self):
        self.accepted: list[int] = []

    def apply(self, cur):
        cur.logits[cur.ids % 2 == 1] = -np.inf

    def accept(self, token):
        self.accepted.append(token)

    def reset(self):
        self.accepted.clear()

    def clone(self):
        return _OnlyEven()


@pytest.mark.parametrize("grammar_first", [False, True])
def test_grammar_hook(grammar_first):
    grammar = _OnlyEven()
    chain = SamplerChain([TopKSampler(4), DistSampler(3)], grammar=grammar)
    tokens = [chain.sample_logits(ROWS[t % 8], grammar_first=grammar_first) for t in range(12)]
    assert all(t % 2 == 0 for t in tokens) and grammar.accepted == tokens
    chain.accept(7, is_generated=False)  # a prompt token: the samplers see it, the grammar does not
    assert grammar.accepted == tokens and chain.last() == 7
    assert repr(chain) == "SamplerChain(grammar + top-k -> dist)"


def test_chain_without_selector_and_bad_members():
    with pytest.raises(RuntimeError, match="selecting sampler"):
        SamplerChain([TopKSampler(3)]).sample_logits(ROWS[0])
    with pytest.raises(TypeError, match=r"samplers\[1\]"):
        SamplerChain([TopKSampler(3), object()])
    with pytest.raises(ValueError, match="logits"):
        SamplerChain([GreedySampler()]).sample_logits(np.zeros((2, 3)))


# ---------------------------------------------------------------- SamplingParams


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan), ("temperature", math.inf), ("top_p", 1.5), ("top_p", -0.1), ("min_p", 2.0),
        ("typical_p", -1.0), ("top_k", -2), ("top_k", 1.5), ("penalty_last_n", -2),
        ("dry_penalty_last_n", -5),
        ("mirostat", 3), ("repeat_penalty", 0.0), ("repeat_penalty", -1.0), ("frequency_penalty", math.inf),
        ("xtc_probability", 1.1), ("xtc_threshold", -0.5), ("dynatemp_range", -1.0), ("seed", 2**32),
        ("seed", -2), ("min_keep", -1), ("n_probs", -3), ("dry_multiplier", -0.1), ("dry_allowed_length", -1),
        ("mirostat_tau", math.nan), ("top_n_sigma", math.inf), ("samplers", ["top_k", "bogus"]),
        ("samplers", ["infill"]), ("logit_bias", {-1: 1.0}), ("logit_bias", {3: math.nan}),
        ("logit_bias", {3: math.inf}), ("dry_sequence_breakers", "\n"),
    ],
)  # fmt: skip
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_negative_temperature_with_dynatemp_is_rejected():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-0.5, dynatemp_range=1.0)


def test_valid_params_are_normalised():
    p = SamplingParams(seed=-1, top_k=-1, temperature=-1.0, logit_bias={5: False, 7: 2}, samplers="kpm")
    assert p.seed == LLAMA_DEFAULT_SEED and p.greedy
    assert p.logit_bias == ((5, -math.inf), (7, 2.0))
    assert p.samplers == ("top_k", "top_p", "min_p")
    aliases = SamplingParams(samplers=["nucleus", "typ", "top-n-sigma"]).samplers
    assert aliases == ("top_p", "typ_p", "top_n_sigma")
    assert hash(SamplingParams()) == hash(SamplingParams())


def test_a_chain_with_every_token_banned_refuses_to_pick_one():
    chain = SamplerChain.default(SamplingParams(temperature=0.8, logit_bias={i: False for i in range(10)}), 10,
                                 None, n_ctx=64)
    with pytest.raises(RuntimeError, match="no token is possible"):
        chain.sample_logits(np.zeros(10, np.float32))
    assert list(chain.prev) == []  # nothing was accepted

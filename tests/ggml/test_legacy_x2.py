"""legacy_x2.x2_rows (two weight rows to a ymm register, the AVX2 tiling of Q4_0/Q4_1/Q5_0/Q5_1/Q8_0) against
ggml's x86 dot products (`matmul_exact`) bit for bit, on every target: the tile is called directly, so the host's
own compile checks it too, not only a haswell run (where legacy.x4_rows dispatches Q8_0 to it).

Partial row groups (19 rows: the last group half empty; 22: its second half empty), every activation row count
from 1 to 9 (four-row tiles, then a two-row tile, then a single row), random quants and the extreme bytes (Q8_0's
-128, Q5's fifth bits all set) against activations of +-127.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import njit

from llamactx.ggml import kernels
from llamactx.ggml.kernels import legacy
from llamactx.ggml.kernels.legacy_x2 import x2_rows
from llamactx.ggml.kernels.matmul import _activations
from llamactx.ggml.kernels.simd import PORTABLE, VNNI
from llamactx.ggml.vecdot import matmul_exact
from llamactx.model import Weight
from tests.conftest import SCALE_OFFSETS
from tests.ggml.test_kernels import random_weight

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
_Q4_0, _Q4_1, _Q5_0, _Q5_1 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1)


def _runner(path):
    @njit
    def run(kind, x, qs, qh, sc, mn, d, m, out):
        a = _activations(kind, x)
        W = (qs, qh, sc, mn, d, m)
        if kind == _Q4_0:
            x2_rows(path, legacy.DEC_Q4_0, W, a, 0, qs.shape[0], out)
        elif kind == _Q4_1:
            x2_rows(path, legacy.DEC_Q4_1, W, a, 0, qs.shape[0], out)
        elif kind == _Q5_0:
            x2_rows(path, legacy.DEC_Q5_0, W, a, 0, qs.shape[0], out)
        elif kind == _Q5_1:
            x2_rows(path, legacy.DEC_Q5_1, W, a, 0, qs.shape[0], out)
        else:
            x2_rows(path, legacy.DEC_Q8_0, W, a, 0, qs.shape[0], out)

    return run


_RUNNERS = {"portable": _runner(PORTABLE), "vnni": _runner(VNNI)}


def _paths():
    return ["vnni", "portable"] if kernels.cpu_features()["vnni"] else ["portable"]


def x2_matmul(x: np.ndarray, w: Weight, path: str) -> np.ndarray:
    pw = kernels.pack_weight(w)
    out = np.full((x.shape[0], pw.n_rows), np.nan, np.float32)  # (n, n_rows)
    _RUNNERS[path](int(w.ggml_type), x, pw.qs, pw.qh, pw.sc, pw.mn, pw.d, pw.m, out)
    return out


def assert_exact(x: np.ndarray, w: Weight, path: str) -> None:
    got = x2_matmul(x, w, path)
    want = matmul_exact(x, w, repacked=False)  # (n, n_rows)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: T(t).name)
def test_x2_rows_matches_ggml_for_every_row_count(t):
    rng = np.random.default_rng(int(t))
    for n_rows, k in ((19, 96), (22, 64)):
        w = random_weight(t, k, n_rows, rng)
        x = (rng.standard_normal((9, k)) * 2).astype(np.float32)  # (9, k)
        for path in _paths():
            for n in range(1, 10):
                assert_exact(x[:n], w, path)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: T(t).name)
def test_x2_rows_extreme_quants_stay_exact(t):
    """Every quant byte 0x00 / 0x7F / 0x80 / 0xFF against activations of +-1 (quants of +-127): the largest
    lanes (Q8_0's -128 x -127 pairs, which `pmaddubsw` must not saturate)."""
    rng = np.random.default_rng(7)
    w = random_weight(t, 96, 8, rng)
    data = np.repeat(np.array([0x00, 0x7F, 0x80, 0xFF] * 2, np.uint8)[:, None], w.data.shape[1], axis=1)
    size = w.data.shape[1] // 3  # bytes per block: 3 blocks of 32
    for off in SCALE_OFFSETS[t]:
        for b in range(3):
            data[:, b * size + off : b * size + off + 2] = w.data[:, b * size + off : b * size + off + 2]
    data.flags.writeable = False
    w = Weight(w.name, w.ggml_type, w.shape, data)
    x = np.ones((6, 96), np.float32)  # (6, 96)
    x[1::2] = -1.0
    x[4, 1::2] = -1.0
    for path in _paths():
        assert_exact(x, w, path)
        assert_exact(x[:1], w, path)


def test_matmul_rows_agree_with_single_rows_on_the_output_matrix_path():
    """legacy.x4_rows as matmul runs it (Q8_0 two rows to a register on AVX2, every row of a group while it is in
    L1): each of 6 rows equals that row alone."""
    rng = np.random.default_rng(8)
    for t in (T.Q8_0, T.Q4_1, T.Q5_0):
        pw = kernels.pack_weight(random_weight(t, 128, 37, rng))
        x = rng.standard_normal((6, 128)).astype(np.float32)  # (6, 128)
        many = kernels.matmul(x, pw, 1)
        single = np.concatenate([kernels.matmul(x[i : i + 1], pw, 1) for i in range(6)])
        assert many.view(np.uint32).tolist() == single.view(np.uint32).tolist()

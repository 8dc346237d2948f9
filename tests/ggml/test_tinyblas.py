"""llamactx.ggml.kernels.tinyblas against vecdot's tinyBLAS dots (vec.dot_tinyblas, through
vecdot.matmul_float_rows, the order llama.cpp's F32 matmuls are checked in by the tiny models' logits): the same
bits for every output, in the register tiles and the leftover rows and columns, on one thread or several."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.kernels.tinyblas import sgemm
from llamactx.ggml.vecdot import matmul_float_rows


# (tokens, weight rows, k): whole tiles; an odd last token; rows past a multiple of four; one token (a decode step)
@pytest.mark.parametrize(("n", "m", "k"), [(4, 8, 4 * F32_EPR), (7, 16, 2 * F32_EPR), (5, 6, F32_EPR),
                                           (1, 18, 5 * F32_EPR), (2, 3, 3 * F32_EPR)])
@pytest.mark.parametrize("n_tasks", [1, 3])
def test_sgemm_matches_tinyblas_dots(n, m, k, n_tasks):
    rng = np.random.default_rng(n * 100 + m + k)
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = (rng.standard_normal((n, k)) * np.logspace(-3, 3, k)).astype(np.float32)  # sums whose order shows
    want = np.empty((n, m), np.float32)
    matmul_float_rows(w, x, True, False, want)
    got = np.full((n, m), np.nan, np.float32)
    sgemm(w, x, n_tasks, got)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # the lanes' order matters: a plain float64 dot rounds differently somewhere
    assert not np.array_equal(got, (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32))

"""Q6_K decode (llamactx/ggml/kernels/q6k_gemv.py) against vecdot_k's ggml_vec_dot_q6_K_q8_K, bit for bit: rows of
1 to 9 super-blocks, one activation row and the n % 4 rows after groups of four, both threads' shares of the rows,
and the extremes of the int16 pairs and int32 lanes the kernel forms."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.ggml import kernels
from llamactx.ggml.kernels.kblocks import Q6K_BYTES, Q6K_D, Q6K_QH, Q6K_SCALES
from llamactx.ggml.vecdot_k import matmul_k
from llamactx.model import Weight
from tests.ggml.test_kernels import PATHS, THREADS, check_path, random_weight


def _bits(a: np.ndarray) -> list[int]:
    return a.view(np.uint32).ravel().tolist()


@pytest.mark.parametrize("path", PATHS)
def test_q6k_decode_matches_vec_dot_for_every_row_length(path):
    """1 to 9 super-blocks per row; 1, 3 (all on the gemv) and 5, 7 activation rows (a group of four, then the gemv
    on the rest); an odd number of weight rows split over one thread and both."""
    check_path(path)
    rng = np.random.default_rng(6)
    for nb in range(1, 10):
        w = random_weight(T.Q6_K, 256 * nb, 13, rng)
        pw = kernels.pack_weight(w)
        for n in (1, 3, 5, 7):
            x = (rng.standard_normal((n, 256 * nb)) * 3).astype(np.float32)
            want = matmul_k(x, w)  # (n, 13): ggml_vec_dot_q6_K_q8_K for n < 8
            for threads in {1, THREADS}:
                got = kernels.matmul(x, pw, threads, path=path, llama_order=True)
                assert _bits(got) == _bits(want), (nb, n, threads)


def _extreme_weight(nb: int) -> Weight:
    """Row 0: every quant 63 and every scale -128; row 1: quants 63 and scales 127; row 2: quants 0 and scales
    -128 (the -32 offset alone); row 3: quants alternating 0 / 63 by element, scales alternating 127 / -128."""
    rows = 4
    blocks = np.zeros((rows, nb, Q6K_BYTES), np.uint8)
    blocks[:, :, Q6K_D : Q6K_D + 2] = np.float16(0.01).reshape(1).view(np.uint8)
    blocks[0:2, :, :Q6K_SCALES] = 0xFF  # ql and qh: q = 63
    blocks[0, :, Q6K_SCALES:Q6K_D] = 0x80
    blocks[1, :, Q6K_SCALES:Q6K_D] = 0x7F
    blocks[2, :, Q6K_SCALES:Q6K_D] = 0x80
    blocks[3, :, :Q6K_QH] = 0xF0  # low nibbles 0 (elements 0-31, 32-63 of a half), high 15
    blocks[3, :, Q6K_QH:Q6K_SCALES] = 0xF0  # qh: quarters 0, 1 get 0, quarters 2, 3 get 3 -> 0 / 63
    blocks[3, :, Q6K_SCALES:Q6K_D] = np.tile(np.array([0x7F, 0x80], np.uint8), 8)
    data = blocks.reshape(rows, -1)
    data.flags.writeable = False
    return Weight("extreme.Q6_K", int(T.Q6_K), (256 * nb, rows), data)


@pytest.mark.parametrize("path", PATHS)
def test_q6k_decode_extreme_sums_stay_exact(path):
    """The largest pairs pmaddubsw forms (2 x 63 x -128 and 2 x 63 x 127: Q8_K maps the first largest |x| to -128,
    its negation to 127) times scales of -128 and 127, and lanes far past 2^24 (so that each lane's own float
    conversion is what is compared)."""
    check_path(path)
    nb = 3
    w = _extreme_weight(nb)
    pw = kernels.pack_weight(w)
    k = 256 * nb
    e = np.arange(k)
    for x in (np.full((1, k), 5.0, np.float32),  # Q8_K: -128 everywhere (ggml scales by -128 / max)
              np.where(e % 64 < 32, -5.0, 3.0).astype(np.float32)[None, :],
              np.where(e == 0, 5.0, -5.0).astype(np.float32)[None, :],  # 127 but the first (-128)
              np.vstack([np.full(k, 5.0), -np.full(k, 5.0), np.linspace(-9, 9, k)]).astype(np.float32)):
        got = kernels.matmul(x, pw, 1, path=path, llama_order=True)
        assert _bits(got) == _bits(matmul_k(x, w))
        assert np.abs(got).min(axis=1).max() > 0  # not a sum that cancels to nothing

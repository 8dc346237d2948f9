"""Q4_K decode (llamactx/ggml/kernels/kgemv.py, eight rows interleaved: kblocks.py) against vecdot_k's
ggml_gemv_q4_K_8x8_q8_K order, bit for bit: 1 to 9 super-blocks a row, the extremes of the integer sums, row counts
that leave a partial last group (every kernel that reads the layout: gemv, gemm of four, tiles, vec_dot order), and
the row share of each thread."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.ggml import kernels
from llamactx.ggml.vecdot_k import matmul_k
from llamactx.model import Weight
from tests.ggml.test_kernels import PATHS, THREADS, check_path, ggml_vec_dot_k, random_weight


def _bits(a: np.ndarray) -> list[int]:
    return a.view(np.uint32).ravel().tolist()


@pytest.mark.parametrize("path", PATHS)
def test_q4k_decode_every_tail_of_super_blocks(path):
    """Rows of 1 to 9 super-blocks, one and five activation rows (five: ggml's gemm on four, the gemv on the fifth),
    one thread and both."""
    check_path(path)
    rng = np.random.default_rng(47)
    for nb in range(1, 10):
        w = random_weight(T.Q4_K, 256 * nb, 16, rng)  # rows % 8 == 0: llama.cpp repacks it
        pw = kernels.pack_weight(w)
        for n in (1, 5):
            x = (rng.standard_normal((n, 256 * nb)) * 3).astype(np.float32)
            want = matmul_k(x, w)  # (n, 16)
            for threads in {1, THREADS}:
                got = kernels.matmul(x, pw, threads, path=path, llama_order=True)
                assert _bits(got) == _bits(want), (nb, n, threads)


@pytest.mark.parametrize("path", PATHS)
def test_q4k_decode_extreme_sums_stay_exact(path):
    """Every nibble 15 and every 6-bit scale and min 63 against activations of +-127 (one sign per sub-block, then
    alternating): the largest int16 pairs (2 x 15 x 127) and int32 sums the kernel forms, without saturating."""
    check_path(path)
    nb, rows = 5, 8
    blocks = np.zeros((rows, nb, 144), np.uint8)
    blocks[:, :, 0:2] = np.float16(0.01).reshape(1).view(np.uint8)  # d
    blocks[:, :, 2:4] = np.float16(0.002).reshape(1).view(np.uint8)  # dmin
    blocks[:, :, 4:16] = 0xFF  # scales and mins: all 63
    blocks[:, :, 16:] = 0xFF  # nibbles: all 15
    blocks[1, :, 4:16] = np.arange(12, dtype=np.uint8) * 21  # other scale bit patterns on row 1
    data = blocks.reshape(rows, -1)
    data.flags.writeable = False
    w = Weight("extreme.Q4_K", int(T.Q4_K), (256 * nb, rows), data)
    signs = np.where(np.arange(256 * nb) // 32 % 2 == 0, 1.0, -1.0)
    for x in (np.full((1, 256 * nb), 5.0, np.float32), np.full((1, 256 * nb), -5.0, np.float32),  # 127, -128
              (signs * 5.0).astype(np.float32)[None, :],
              (np.where(np.arange(256 * nb) % 2 == 0, 1.0, -1.0) * 7.0).astype(np.float32)[None, :]):
        got = kernels.matmul(x, kernels.pack_weight(w), 1, path=path, llama_order=True)
        assert _bits(got) == _bits(matmul_k(x, w))


def _padded(w: Weight, rows: int) -> Weight:
    """w with zero rows appended up to `rows` (a multiple of 8: what llama.cpp repacks)."""
    data = np.concatenate([w.data, np.zeros((rows - w.shape[1], w.data.shape[1]), np.uint8)])
    data.flags.writeable = False
    return Weight(w.name, int(T.Q4_K), (w.shape[0], rows), data)


@pytest.mark.parametrize("path", PATHS)
def test_q4k_partial_last_group(path):
    """Row counts that leave a partial last group of eight (repack.py fills it with zero rows): every row as
    ggml_gemv / gemm_q4_K_8x8_q8_K computes it (the same rows padded to a multiple of 8, where llama.cpp repacks),
    for the gemv (1, 2 activation rows), the gemm of four plus gemv (5) and the tiles (17); and in ggml_vec_dot's
    order (llama_order=False, what llama.cpp runs for such a matrix) against test_kernels' ggml_vec_dot_k."""
    check_path(path)
    rng = np.random.default_rng(8)
    for rows, nb in ((1, 2), (7, 1), (13, 3), (21, 2)):
        w = random_weight(T.Q4_K, 256 * nb, rows, rng)
        pw = kernels.pack_weight(w)
        assert pw.qs.shape[0] == -(-rows // 8)
        for n in (1, 2, 5, 17):
            x = (rng.standard_normal((n, 256 * nb)) * 2).astype(np.float32)
            want = matmul_k(x, _padded(w, -(-rows // 8) * 8))[:, :rows]
            for threads in {1, THREADS}:
                got = kernels.matmul(x, pw, threads, path=path, llama_order=True)
                assert _bits(got) == _bits(want), (rows, nb, n, threads)
        x = (rng.standard_normal((3, 256 * nb))).astype(np.float32)
        got = kernels.matmul(x, pw, THREADS, path=path, llama_order=False)
        assert _bits(got) == _bits(ggml_vec_dot_k(w, x)), (rows, nb)

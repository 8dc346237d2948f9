"""Q4_K decode (llamactx/ggml/kernels/kgemv.py) against vecdot_k's ggml_gemv_q4_K_8x8_q8_K order, bit for bit:
every count of super-blocks a row can end on (the kernel steps four at a time, then two, then one), the extremes of
the integer sums, and the row share of each thread."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.ggml import kernels
from llamactx.ggml.vecdot_k import matmul_k
from llamactx.model import Weight
from tests.ggml.test_kernels import PATHS, THREADS, check_path, random_weight


def _bits(a: np.ndarray) -> list[int]:
    return a.view(np.uint32).ravel().tolist()


@pytest.mark.parametrize("path", PATHS)
def test_q4k_decode_every_tail_of_super_blocks(path):
    """Rows of 1 to 9 super-blocks (steps of four, two, one and their mixes), one and five activation rows (five:
    ggml's gemm on four, the gemv on the fifth), one thread and both."""
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
    for x in (np.full((1, 256 * nb), 5.0, np.float32), (signs * 5.0).astype(np.float32)[None, :],
              (np.where(np.arange(256 * nb) % 2 == 0, 1.0, -1.0) * 7.0).astype(np.float32)[None, :]):
        got = kernels.matmul(x, kernels.pack_weight(w), 1, path=path, llama_order=True)
        assert _bits(got) == _bits(matmul_k(x, w))

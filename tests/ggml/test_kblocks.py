"""Q4_K / Q6_K weights in ggml's own block layout (llamactx/ggml/kernels/kblocks.py): the scale unpacking and the
embedding lookup against llamactx.gguf's dequantizers (gguf-py's and ggml-quants.c's arithmetic), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.ggml import kernels
from llamactx.ggml.kernels.kblocks import Q4K_BYTES, Q6K_BYTES, byte_of, q4k_scales, rows_q4_k, rows_q6_k
from llamactx.gguf.quants import dequantize
from llamactx.gguf.quants_k import scale_min_k4
from tests.ggml.test_kernels import random_weight


def test_q4k_scales_unpack_as_get_scale_min_k4():
    w = random_weight(T.Q4_K, 1024, 7, np.random.default_rng(3))
    pw = kernels.pack_weight(w)
    assert pw.qs.shape == (7, 4 * Q4K_BYTES) and np.array_equal(pw.qs, w.data)  # the stored rows, copied
    assert not np.shares_memory(pw.qs, w.data) and not pw.qs.flags.writeable
    sc, mn = scale_min_k4(w.data.reshape(7 * 4, Q4K_BYTES)[:, 4:16])  # (28, 8) each
    for r in range(7):
        for b in range(4):
            got_sc, got_mn = q4k_scales(pw.qs, r, b)
            assert [byte_of(got_sc, s) for s in range(8)] == list(sc[4 * r + b])
            assert [byte_of(got_mn, s) for s in range(8)] == list(mn[4 * r + b])


@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K], ids=lambda t: T(t).name)
def test_rows_bit_identical_to_dequantize(t):
    w = random_weight(t, 768, 11, np.random.default_rng(5))
    pw = kernels.pack_weight(w)
    assert pw.qs.shape[1] == 3 * (Q4K_BYTES if t == T.Q4_K else Q6K_BYTES)
    ids = np.array([10, 0, 3, 3, 7], np.int64)
    out = np.full((len(ids), 768), np.nan, np.float32)
    (rows_q4_k if t == T.Q4_K else rows_q6_k)(pw.qs, ids, out)
    want = dequantize(w.data.reshape(-1), int(t), (768, 11))  # (11, 768)
    assert np.array_equal(out.view(np.uint32), want[ids].view(np.uint32))

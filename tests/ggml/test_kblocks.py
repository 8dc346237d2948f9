"""Q4_K / Q6_K weights in kblocks.py's layouts (Q4_K eight rows interleaved, Q6_K ggml's rows): the fields of every
row, the scale unpacking and the embedding lookup against llamactx.gguf's dequantizers (gguf-py's and ggml-quants.c's
arithmetic), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.ggml import kernels
from llamactx.ggml.kernels.kblocks import (
    Q4K_BYTES,
    Q4K_GBYTES,
    Q6K_BYTES,
    byte_of,
    q4k_d,
    q4k_dmin,
    q4k_qs_col,
    q4k_scales,
    rows_q4_k,
    rows_q6_k,
)
from llamactx.gguf.quants import dequantize
from llamactx.gguf.quants_k import scale_min_k4
from tests.ggml.test_kernels import random_weight


def test_q4k_groups_hold_every_field_of_every_row():
    """Eight rows to a group (7 rows: one zero row pads the group): q4k_scales unpacks as get_scale_min_k4, d,
    dmin and every nibble byte are where kblocks' accessors look, and nothing else is stored."""
    w = random_weight(T.Q4_K, 1024, 7, np.random.default_rng(3))
    pw = kernels.pack_weight(w)
    assert pw.qs.shape == (1, 4 * Q4K_GBYTES) and pw.qs.nbytes == 8 * w.data.shape[1]
    assert not np.shares_memory(pw.qs, w.data) and not pw.qs.flags.writeable
    blocks = w.data.reshape(7, 4, Q4K_BYTES)
    sc, mn = scale_min_k4(blocks.reshape(7 * 4, Q4K_BYTES)[:, 4:16])  # (28, 8) each
    for r in range(8):
        for b in range(4):
            got_sc, got_mn = q4k_scales(pw.qs, r, b)
            want_sc, want_mn = (sc[4 * r + b], mn[4 * r + b]) if r < 7 else ([0] * 8, [0] * 8)
            assert [byte_of(got_sc, s) for s in range(8)] == list(want_sc)
            assert [byte_of(got_mn, s) for s in range(8)] == list(want_mn)
            d, dmin = (blocks[r, b, 0:2], blocks[r, b, 2:4]) if r < 7 else (np.zeros(2, np.uint8),) * 2
            assert q4k_d(pw.qs, r, b) == d.view(np.float16)[0] and q4k_dmin(pw.qs, r, b) == dmin.view(np.float16)[0]
            cols = [q4k_qs_col(r, b, j) for j in range(128)]
            want = blocks[r, b, 16:] if r < 7 else np.zeros(128, np.uint8)
            assert np.array_equal(pw.qs[0, cols], want)


@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K], ids=lambda t: T(t).name)
def test_rows_bit_identical_to_dequantize(t):
    w = random_weight(t, 768, 11, np.random.default_rng(5))
    pw = kernels.pack_weight(w)
    assert pw.qs.shape[1] == 3 * (Q4K_GBYTES if t == T.Q4_K else Q6K_BYTES)
    ids = np.array([10, 0, 3, 3, 7], np.int64)
    out = np.full((len(ids), 768), np.nan, np.float32)
    (rows_q4_k if t == T.Q4_K else rows_q6_k)(pw.qs, ids, out)
    want = dequantize(w.data.reshape(-1), int(t), (768, 11))  # (11, 768)
    assert np.array_equal(out.view(np.uint32), want[ids].view(np.uint32))

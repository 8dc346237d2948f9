"""kernels/attention8.py (the non-flash attention of an 8-lane, AVX2 target) against the reference kernel.

The kernel's sums are the AVX2 build's (tinyBLAS<8, __m256>), which ggml.attention computes only when compiled for
such a target: the comparisons run under `NUMBA_CPU_NAME=haswell` (`make test-target CPU=haswell`); on an
AVX-512 target they are skipped and only the lane reduction, which does not depend on the target, is checked.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from llamactx.ggml.attention import attention_f16_cells, sink_values
from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.inputs import VisibleCells
from llamactx.ggml.kernels.attention8 import attend8, fsum8x8
from llamactx.ggml.kernels.simd import fsum, vload_f32, vstore

EPR8_ONLY = pytest.mark.skipif(F32_EPR != 8, reason="the reference computes the 8-lane order only when compiled "
                               "for an AVX2 target (NUMBA_CPU_NAME=haswell)")


@numba.njit(cache=True)
def _sums(a):  # pragma: no cover - compiled
    """(fsum8x8 of rows 0..7 of a, fsum of each row): the two ways of reducing eight 8-lane vectors."""
    together = np.empty((1, 8), np.float32)
    vstore(together, 0, 0, fsum8x8((vload_f32(a, 0, 0), vload_f32(a, 1, 0), vload_f32(a, 2, 0), vload_f32(a, 3, 0),
                                    vload_f32(a, 4, 0), vload_f32(a, 5, 0), vload_f32(a, 6, 0), vload_f32(a, 7, 0))))
    one_by_one = np.empty(8, np.float32)
    for c in range(8):
        one_by_one[c] = fsum(vload_f32(a, c, 0))
    return together[0], one_by_one


def test_eight_horizontal_sums_at_once_are_hsum_float_8s():
    """fsum8x8 gives each vector's `hsum_float_8` (simd.fsum) bit for bit, on values whose sum depends on the
    order (mixed magnitudes and signs)."""
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((8, 8)) * 10.0 ** rng.integers(-6, 6, (8, 8))).astype(np.float32)  # (8 vectors, 8)
    together, one_by_one = _sums(a)
    assert together.view(np.uint32).tolist() == one_by_one.view(np.uint32).tolist()
    assert not np.array_equal(one_by_one, a.astype(np.float64).sum(axis=1).astype(np.float32))  # the order shows


def _case(n, n_head, n_head_kv, d, n_kv, kind, seed):
    """q (n, n_head, d), an f16 k, v (n_kv, n_head_kv * d) and the VisibleCells of `kind`: 'scattered' (half the
    cells of several sequences, ranked in a position order unlike cell order), 'causal' (the last n cells are
    the ubatch's own), 'lanes' (a sliding window on position lanes: slots of -inf between visible cells)."""
    rng = np.random.default_rng(seed)
    k = (rng.standard_normal((n_kv, n_head_kv * d)) * 2).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float16)
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    if kind == "scattered":
        visible = rng.random((n, n_kv)) < 0.5
        visible[:, 3] = True
        mask = np.where(visible, 0.0, -np.inf).astype(np.float32)  # (n, n_kv)
        return q, k, v, VisibleCells.from_mask(mask, rng.permutation(n_kv))
    pos = np.arange(n_kv)
    tok = np.arange(n_kv - n, n_kv)
    visible = pos[None, :] <= tok[:, None]
    if kind == "lanes":
        visible &= (tok[:, None] - pos[None, :] < n_kv // 2) & (pos[None, :] % 5 != 2)
    mask = np.where(visible, 0.0, -np.inf).astype(np.float32)
    return q, k, v, (VisibleCells.on_lanes(mask, pos) if kind == "lanes" else VisibleCells.from_mask(mask))


@EPR8_ONLY
@pytest.mark.parametrize("n, n_head, n_head_kv, d, n_kv, kind", [
    (1, 9, 3, 64, 150, "scattered"), (7, 9, 3, 64, 150, "scattered"), (5, 4, 1, 80, 150, "scattered"),
    (3, 9, 3, 64, 20, "scattered"), (40, 9, 3, 64, 300, "causal"), (6, 4, 2, 128, 200, "lanes"),
    (1, 9, 3, 64, 1500, "scattered"), (2, 9, 3, 64, 1300, "causal"), (1, 4, 1, 80, 1200, "lanes"),
    (1, 6, 6, 48, 700, "causal")])
def test_attend8_matches_the_reference_kernel(n, n_head, n_head_kv, d, n_kv, kind):
    """attend8 against ggml.attention (ReferenceOps) bit for bit, with 1 thread ((token, KV head) groups) and 4
    (decode at depth splits over cell blocks and lanes): GQA 1-4, head sizes 48-128 (8-column blocks that are not
    a multiple of 32), V chunks, masked slots, probabilities that round to zero, attention sinks."""
    q, k, v, vis = _case(n, n_head, n_head_kv, d, n_kv, kind, n * d + n_kv)
    sinks = np.random.default_rng(n_kv).standard_normal(n_head).astype(np.float32) if kind == "lanes" else None
    want = attention_f16_cells(q, k, v, n_head_kv, vis, 0.125, sinks=sinks)
    for n_threads in (1, 4):
        got = np.full((n, n_head * d), np.nan, np.float32)
        attend8(q.reshape(n, -1), k.view(np.uint16), v.view(np.uint16), n_head, n_head_kv, vis.cells, vis.n_cells,
                vis.mask_add, np.float32(0.125), got, n_threads, sink_values(sinks, n_head))
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), n_threads

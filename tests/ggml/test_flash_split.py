"""kernels.flash's decode-at-depth path (`_flash_split`: scores by runs of tiles with the next tile's K rows
prefetched, VKQ a chunk of V_SLOTS cells at a time, its chains carried across chunks) against ggml.flash_attn's
tiled arithmetic (ReferenceOps), bit for bit, where the chunks and the thread split have edges: tokens whose
visible cells end in different chunks, chunk boundaries inside and at the end of a token's cells, one thread
(which takes this path too) and more threads than tasks."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.ggml.flash_attn import flash_attn_f16_cells
from llamactx.ggml.inputs import VisibleCells
from llamactx.ggml.kernels.flash import SPLIT_MIN_CELLS, V_SLOTS, flash_attend


def _case(rng, n, n_head, n_head_kv, d, n_visible, n_kv):
    """q, f16 k / v rows and VisibleCells where token t sees n_visible[t] cells scattered over n_kv."""
    k = (rng.standard_normal((n_kv, n_head_kv * d)) * 3).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float16)
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    mask = np.full((n, n_kv), -np.inf, np.float32)  # (n, n_kv)
    for t, m in enumerate(n_visible):
        mask[t, np.sort(rng.choice(n_kv, m, replace=False))] = 0.0
    return q, k, v, VisibleCells.from_mask(mask)


@pytest.mark.parametrize("n_visible, n_head, n_head_kv, d", [
    ((SPLIT_MIN_CELLS + 3,), 9, 3, 64),  # one token, a partial last chunk
    ((2 * V_SLOTS,), 4, 1, 128),  # the last chunk ends exactly at the token's last cell
    ((3 * V_SLOTS + 70, 40), 6, 2, 48),  # the second token's cells end in the first chunk; a 16-column block
    ((SPLIT_MIN_CELLS, 2 * V_SLOTS + 1, 1), 10, 2, 32),  # five heads per KV head (three, then one at a time)
])
@pytest.mark.parametrize("n_threads", [1, 2, 16])
def test_decode_at_depth_gives_the_reference_bits(n_visible, n_head, n_head_kv, d, n_threads):
    rng = np.random.default_rng(sum(n_visible) + d)
    n = len(n_visible)
    q, k, v, vis = _case(rng, n, n_head, n_head_kv, d, n_visible, max(n_visible) + 37)
    want = flash_attn_f16_cells(q, k, v, n_head_kv, vis, 0.125, k.shape[0], 1)
    got = np.full((n, n_head * d), np.nan, np.float32)  # (n, n_head * d)
    flash_attend(q.reshape(n, -1), k.view(np.uint16), v.view(np.uint16), n_head, n_head_kv, vis.cells, vis.n_cells,
                 vis.mask_add, np.float32(0.125), got, n_threads)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("n, n_threads", [(4, 2), (8, 2), (13, 2), (8, 3), (8, 1)])
def test_a_draft_verified_at_depth_gives_the_reference_bits(n, n_threads):
    """n tokens of one sequence at depth (a speculative draft being verified) see causal prefixes of the same cells:
    they share K tiles in token blocks, cut smaller where few blocks would leave a thread idle (`_block_limit`)."""
    rng = np.random.default_rng(n + n_threads)
    depth, n_head, n_head_kv, d = 150, 9, 3, 64
    k = (rng.standard_normal((depth + n + 5, n_head_kv * d)) * 3).astype(np.float16)
    v = rng.standard_normal(k.shape).astype(np.float16)
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    mask = np.full((n, k.shape[0]), -np.inf, np.float32)
    for t in range(n):
        mask[t, : depth + t + 1] = 0.0
    vis = VisibleCells.from_mask(mask)
    want = flash_attn_f16_cells(q, k, v, n_head_kv, vis, 0.125, k.shape[0], 1)
    got = np.full((n, n_head * d), np.nan, np.float32)
    flash_attend(q.reshape(n, -1), k.view(np.uint16), v.view(np.uint16), n_head, n_head_kv, vis.cells, vis.n_cells,
                 vis.mask_add, np.float32(0.125), got, n_threads)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()

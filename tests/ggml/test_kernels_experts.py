"""A decoded token's experts as one prefetched stream (llamactx.ggml.kernels.experts): matmul_id of Q4_0 / Q5_0 /
Q8_0 experts, single-row experts streamed beside multi-row ones, bit for bit against ReferenceOps.matmul_rows
(every row alone, as ggml_mul_mat_id computes it), on one and two threads."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.backend.reference import ReferenceOps
from llamactx.ggml import kernels
from llamactx.model import Weight
from tests.ggml.test_kernels import random_weight
from tests.ggml.test_kernels_hub import assert_bits

OPS = ReferenceOps()


@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0, T.Q4_0], ids=lambda t: T(t).name)
@pytest.mark.parametrize("n_ff", [20, 36])  # whole groups of four rows; Q4_0 experts of these are not repacked
@pytest.mark.parametrize("threads", [1, 2])
def test_streamed_experts_match_rows_alone(t, n_ff, threads):
    """Experts of 1, 0, 2, 1, 1, 5, 0 and 1 routed rows: the single-row ones (first, between and after multi-row
    experts, and last) streamed, each output equal to the reference's row alone."""
    from llamactx.ggml.kernels.matmul import expert_order, matmul_id

    rng = np.random.default_rng(47 + int(t) + n_ff)
    k, counts = 256, [1, 0, 2, 1, 1, 5, 0, 1]
    n_expert = len(counts)
    assert expert_order(t, n_ff) == 0
    stacked = random_weight(t, k, n_expert * n_ff, rng)  # (k, n_expert * n_ff): the experts' rows stacked
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (n_expert + 1,)
    x = (rng.standard_normal((int(starts[-1]), k)) * 2).astype(np.float32)  # (M, k) grouped by expert
    got = matmul_id(x, kernels.pack_weight(stacked), starts, n_ff, threads)  # (M, n_ff)
    for e in range(n_expert):
        expert = Weight(f"expert{e}", int(t), (k, n_ff), stacked.data[e * n_ff : (e + 1) * n_ff])
        r0, r1 = starts[e], starts[e + 1]
        if r1 > r0:
            assert_bits(got[r0:r1], OPS.matmul_rows(x[r0:r1], expert), (e, r1 - r0))



@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0, T.Q4_0], ids=lambda t: T(t).name)
def test_experts_of_partial_row_groups_are_left_to_the_reference(t):
    """Experts of n_ff % 4 != 0 rows would share a packed group of four rows with their neighbour: matmul_id
    refuses them (the caller computes them row by row) instead of slicing across two experts."""
    from llamactx.ggml.kernels.matmul import expert_order, matmul_id

    rng = np.random.default_rng(22)
    stacked = random_weight(t, 256, 3 * 22, rng)
    assert expert_order(t, 22) == -1
    with pytest.raises(ValueError, match="experts of 22 rows are not on the kernels"):
        matmul_id(np.ones((3, 256), np.float32), kernels.pack_weight(stacked), np.arange(4), 22, 1)


@pytest.mark.parametrize("t", [T.Q8_0, T.Q5_0, T.Q4_0], ids=lambda t: T(t).name)
@pytest.mark.parametrize("shared,fused", [(True, True), (True, False), (False, False)],
                         ids=["gate+up", "shared", "per-slot"])
@pytest.mark.parametrize("threads", [1, 2])
def test_decoded_token_experts_match_rows_alone(t, shared, fused, threads):
    """One token on k = 3 of 5 experts (experts.decode_experts, the graph's MUL_MAT_ID of one row): the shared row
    (gate, up: with `fused` both matrices in one stream) or one row per slot (down), each slot's output row equal
    to the reference's row alone on its expert, whatever order the slots' experts come in."""
    from llamactx.ggml.cpu import active_path, set_threads
    from llamactx.ggml.kernels.experts import decode_experts_portable, decode_experts_vnni, streams_one

    rng = np.random.default_rng(470 + int(t) + 2 * shared + fused)
    k_in, n_ff, n_expert, k = 256, 20, 5, 3
    assert streams_one(int(t), n_ff, False) and not streams_one(int(t), 22, False)
    mats = [random_weight(t, k_in, n_expert * n_ff, rng) for _ in range(2)]  # gate, up: (k_in, n_expert * n_ff)
    packed = [kernels.pack_weight(w) for w in mats]
    slots = [tuple(np.array(getattr(p, s)) for s in ("qs", "qh", "sc")) for p in packed]  # writeable, as the graph's
    x = (rng.standard_normal((1 if shared else k, k_in)) * 2).astype(np.float32)  # (1 or k, k_in)
    ids = np.array([3, 0, 4], np.float32)  # (k,): the slots' experts, not in expert order
    out = [np.full((k, n_ff), np.nan, np.float32) for _ in range(2)]  # (k, n_ff) each
    set_threads(threads)
    kernel = decode_experts_vnni if active_path() == "vnni" else decode_experts_portable
    kernel(threads, int(t), slots[0], slots[1] if fused else slots[0], fused, x, shared, ids, k, n_ff // 4, out[0],
           out[1] if fused else out[0])
    for m in range(2 if fused else 1):
        for s, e in enumerate(ids.astype(int)):
            expert = Weight(f"expert{e}", int(t), (k_in, n_ff), mats[m].data[e * n_ff : (e + 1) * n_ff])
            assert_bits(out[m][s : s + 1], OPS.matmul_rows(x[0 if shared else s][None], expert), (m, s, e))

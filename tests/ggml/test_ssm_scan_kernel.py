"""llamactx.ggml.kernels.ssm_scan (Mamba-2's scan, heads in parallel, the state in place) against the reference
llamactx.ggml.ssm.ssm_scan, bit for bit: d_state below, at and beyond the SIMD step (a scalar tail), one and several
groups, one token and many."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.ggml.kernels.ssm_scan import ssm_scan_
from llamactx.ggml.ssm import ssm_scan


@pytest.mark.parametrize("n_t, n_head, head_dim, n_group, d_state",
                         [(1, 4, 8, 2, 16), (7, 4, 16, 1, 128), (5, 6, 4, 3, 72), (3, 2, 8, 2, 12)])
def test_scan_in_place_equals_reference(n_t, n_head, head_dim, n_group, d_state):
    rng = np.random.default_rng(n_t * 1000 + d_state)
    f = np.float32
    state = rng.standard_normal((n_head, head_dim, d_state)).astype(f)
    x = rng.standard_normal((n_t, n_head, head_dim)).astype(f)
    dt = (rng.standard_normal((n_t, n_head)) * 8).astype(f)  # some beyond softplus's threshold of 20
    dt[0, 0] = f(25.0)
    a = -np.exp(rng.standard_normal(n_head)).astype(f)
    b = rng.standard_normal((n_t, n_group, d_state)).astype(f)
    c = rng.standard_normal((n_t, n_group, d_state)).astype(f)
    want_y, want_state = ssm_scan(state, x, dt, a, b, c)
    s = state.copy()
    y = ssm_scan_(s, x, dt, a, b, c)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(s, want_state)
    assert not np.array_equal(s, state)  # updated in place


def test_refuses_a_state_it_cannot_update():
    f = np.float32
    x, dt, a = np.zeros((1, 2, 4), f), np.zeros((1, 2), f), np.zeros(2, f)
    b = c = np.zeros((1, 1, 16), f)
    with pytest.raises(ValueError, match="writable C-contiguous float32"):
        ssm_scan_(np.zeros((2, 4, 16), np.float64), x, dt, a, b, c)

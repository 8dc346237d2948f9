"""llamactx.ggml.kernels.delta_rule against the reference ops it speeds up (llamactx.ggml.delta_net.gated_delta_net,
llamactx.ggml.ssm.ssm_conv, themselves checked against llama.cpp's logits by tests/models/test_tiny_qwen35.py):
the same bits, the state updated in place."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.ggml.delta_net import gated_delta_net, l2_norm
from llamactx.ggml.kernels import delta_rule as fast
from llamactx.ggml.kernels.delta_rule import gated_delta_net_, ssm_conv_rows
from llamactx.ggml.ssm import ssm_conv


def _inputs(rng, n_t, h_k, h_v, s):
    q = l2_norm(rng.standard_normal((n_t, h_k, s)).astype(np.float32), 1e-6)
    k = l2_norm(rng.standard_normal((n_t, h_k, s)).astype(np.float32), 1e-6)
    v = rng.standard_normal((n_t, h_v, s)).astype(np.float32)
    g = -rng.uniform(0.01, 2.0, (n_t, h_v)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (n_t, h_v)).astype(np.float32)
    state = rng.standard_normal((h_v, s, s)).astype(np.float32)
    return q, k, v, g, beta, state


# heads of 128 (Qwen3.5) and 64 (the tiny models), and rows with a tail after the SIMD lanes (72, 40, 7)
@pytest.mark.parametrize(("n_t", "h_k", "h_v", "s"), [(5, 2, 4, 128), (1, 2, 2, 64), (3, 1, 2, 72), (4, 2, 2, 40),
                                                      (2, 1, 1, 7)])
def test_gated_delta_net_in_place_matches_reference(n_t, h_k, h_v, s):
    rng = np.random.default_rng(s + n_t)
    q, k, v, g, beta, state = _inputs(rng, n_t, h_k, h_v, s)
    want_out, want_state = gated_delta_net(q, k, v, g, beta, state)
    s_fast = state.copy()
    out = gated_delta_net_(q, k, v, g, beta, s_fast)
    assert not np.array_equal(want_state, state)  # the update changed something
    np.testing.assert_array_equal(out.view(np.uint32), want_out.view(np.uint32))
    np.testing.assert_array_equal(s_fast.view(np.uint32), want_state.view(np.uint32))


def test_gated_delta_net_in_place_refuses_a_read_only_state():
    rng = np.random.default_rng(0)
    q, k, v, g, beta, state = _inputs(rng, 1, 1, 1, 16)
    state.flags.writeable = False
    with pytest.raises(ValueError, match="writable C-contiguous float32"):
        gated_delta_net_(q, k, v, g, beta, state)


@pytest.mark.parametrize(("n_t", "d_conv"), [(1, 4), (2, 4), (7, 4), (5, 3)])
def test_ssm_conv_rows_matches_reference(n_t, d_conv):
    rng = np.random.default_rng(n_t * 10 + d_conv)
    n_ch = 40  # two blocks of 16 channels and a partial one
    state = rng.standard_normal((n_ch, d_conv - 1)).astype(np.float32)
    x = rng.standard_normal((n_t, n_ch)).astype(np.float32)
    w = rng.standard_normal((n_ch, d_conv)).astype(np.float32)
    conv_x = np.concatenate([state, x.T], axis=1)
    want = ssm_conv(conv_x, w)
    st = state.copy()
    got = ssm_conv_rows(st, x, w)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(st, conv_x[:, conv_x.shape[1] - (d_conv - 1):])
    np.testing.assert_array_equal(fast.ssm_conv(conv_x, w).view(np.uint32), want.view(np.uint32))
    xt = np.ascontiguousarray(conv_x.T)  # token-major, passed transposed: read in place
    np.testing.assert_array_equal(fast.ssm_conv(xt.T, w).view(np.uint32), want.view(np.uint32))


# Qwen3.5's 4 taps (token by token on the state) and other widths (the token-major pass), sets of 1 to 9 tokens
@pytest.mark.parametrize("d_conv", [4, 3, 5])
def test_ssm_conv_sets_matches_reference_per_set(d_conv):
    rng = np.random.default_rng(d_conv)
    n_ch, sizes, slots = 40, [1, 9, 3], np.array([2, 0, 3], np.int64)
    n = sum(sizes)
    states = rng.standard_normal((4, n_ch * (d_conv - 1))).astype(np.float32)  # (n_seq, n_embd_r)
    x = rng.standard_normal((n, n_ch + 5)).astype(np.float32)  # rows of a wider buffer region
    w = rng.standard_normal((n_ch, d_conv)).astype(np.float32)
    rows = rng.permutation(n).astype(np.int64)  # each set's rows, scattered over the ubatch
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    y = np.full((n, n_ch + 2), np.nan, np.float32)
    st = states.copy()
    fast.ssm_conv_sets(st, slots, starts, rows, x.reshape(-1), 2, n_ch + 5, w, y.reshape(-1), 1, n_ch + 2)
    for k, slot in enumerate(slots):
        mine = rows[starts[k] : starts[k + 1]]
        conv_x = np.concatenate([states[slot].reshape(n_ch, d_conv - 1), x[mine, 2 : 2 + n_ch].T], axis=1)
        want = ssm_conv(conv_x, w)
        np.testing.assert_array_equal(y[mine, 1 : 1 + n_ch].view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(st[slot], conv_x[:, -(d_conv - 1) :].reshape(-1))
    np.testing.assert_array_equal(st[1], states[1])  # no set of sequence 1: its state unchanged

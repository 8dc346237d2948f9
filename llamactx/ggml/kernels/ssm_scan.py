"""Mamba-2's selective scan on the thread pool, its state updated in place: ggml_ssm_scan with a {1, n_head} A
(ggml-cpu/ops.cpp, ggml_compute_forward_ssm_scan_f32) with the bits of llamactx.ggml.ssm.ssm_scan (the reference;
tests/ggml/test_ssm_scan_kernel.py compares).

ggml splits the heads over its threads and runs, per token and head, `dt_soft_plus = softplus(dt)`,
`dA = expf(dt_soft_plus * A)`, then per row i1 of the head's state `state = s0*dA + B*x_dt` (the product fused
into the add) and `y += state*C` fused, the first d_state & ~(GGML_F32_STEP - 1) elements in 4 x F32_EPR lanes
reduced as GGML_F32_VEC_REDUCE, the rest in order after them. A head reads only its own state rows, x, dt and A,
and its group's B and C, so `scan_heads` runs the heads in parallel, each one's tokens in order: the same
arithmetic element by element, no copy of the state.

`ssm_scan_rs_node` is the compiled graph's SSM_SCAN_RS node (llamactx.ggml.kernels.compute): each sequence set's
rows of x, dt, B and C gathered from the program's buffers, scanned from the set's state in the recurrent memory,
the outputs scattered back to the set's rows.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.ssm import _softplus
from llamactx.ggml.vec import reduce_add16, reduce_hadd8

_F32 = np.float32
_STEP = 4 * F32_EPR  # GGML_F32_STEP


@numba.njit(cache=True)
def _scan_head(s, x, dt, a, b, c, y, h, acc):  # pragma: no cover - compiled
    """Head h of every token in order: s (head_dim, d_state) its state, in place; acc (_STEP,) scratch."""
    n_t, n_head, head_dim = x.shape
    n_group, d_state = b.shape[1], b.shape[2]
    n_simd = d_state // _STEP * _STEP
    g = h // (n_head // n_group)  # repeat_interleave
    for t in range(n_t):
        dt_sp = _softplus(dt[t, h])
        da = _F32(math.exp(dt_sp * a[h]))
        bt, ct = b[t, g], c[t, g]
        for i1 in range(head_dim):
            x_dt = x[t, h, i1] * dt_sp
            row = s[i1]
            sumf = _F32(0.0)
            if n_simd:
                acc[:] = 0
                for i in range(0, n_simd, _STEP):
                    for j in range(_STEP):
                        st = fma32(row[i + j], da, bt[i + j] * x_dt)
                        acc[j] = fma32(st, ct[i + j], acc[j])
                        row[i + j] = st
                for ln in range(F32_EPR):  # GGML_F32_VEC_REDUCE: (0+2), (1+3), then (0+1), then the lanes
                    acc[ln] = acc[ln] + acc[2 * F32_EPR + ln]
                    acc[F32_EPR + ln] = acc[F32_EPR + ln] + acc[3 * F32_EPR + ln]
                for ln in range(F32_EPR):
                    acc[ln] = acc[ln] + acc[F32_EPR + ln]
                sumf = reduce_add16(acc, 0) if F32_EPR == 16 else reduce_hadd8(acc, 0)
            for i0 in range(n_simd, d_state):
                st = fma32(row[i0], da, bt[i0] * x_dt)
                sumf = fma32(st, ct[i0], sumf)
                row[i0] = st
            y[t, h, i1] = sumf


@numba.njit(parallel=True, cache=True)
def scan_heads(s, x, dt, a, b, c, y):  # pragma: no cover - compiled
    """ggml_ssm_scan of one sequence's tokens, the heads in parallel. s (n_head, head_dim, d_state) float32, the
    state before the first token, updated in place; x (n_t, n_head, head_dim); dt (n_t, n_head) before softplus;
    a (n_head,); b, c (n_t, n_group, d_state); y (n_t, n_head, head_dim) the output."""
    for h in numba.prange(x.shape[1]):
        _scan_head(s[h], x, dt, a, b, c, y, h, np.empty(_STEP, np.float32))


def ssm_scan_(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
              c: np.ndarray) -> np.ndarray:
    """llamactx.ggml.ssm.ssm_scan with `state` (n_head, head_dim, d_state) float32 C-contiguous updated in place.
    -> y (n_t, n_head, head_dim) float32. Raises ValueError for a state it cannot update in place."""
    if state.dtype != np.float32 or not state.flags.c_contiguous or not state.flags.writeable:
        raise ValueError(f"ssm_scan_: the state must be a writable C-contiguous float32 array, not {state.dtype} "
                         f"{state.flags}")
    y = np.empty(x.shape, np.float32)
    f32 = [np.ascontiguousarray(v, np.float32) for v in (x, dt, a, b, c)]
    scan_heads(state, *f32, y)
    return y


@numba.njit(cache=True)
def _gather(buf, off, stride, rows, r0, n_t, cols):  # pragma: no cover - compiled
    """Rows rows[r0:r0 + n_t] of a buffer region (row stride `stride`), their first `cols` values. -> (n_t, cols)"""
    out = np.empty((n_t, cols), np.float32)
    for t in range(n_t):
        src = off + rows[r0 + t] * stride
        out[t] = buf[src : src + cols]
    return out


@numba.njit(cache=True)
def ssm_scan_rs_node(states, slots, starts, rows, x, xo, xl, dt, do, dl, b, bo, bl, c, co, cl, a, head_dim,
                     n_group, d_state, y, yo, yl):  # pragma: no cover - compiled
    """SSM_SCAN_RS: each sequence set's rows through `scan_heads` from its state states[slots[k]]
    (n_head * head_dim * d_state floats), updated in place. x / dt / b / c: buffers with offset and row stride
    (x (n, n_head * head_dim), dt (n, n_head), b and c (n, n_group * d_state)); a (n_head,); y the output's."""
    n_head = a.shape[0]
    for k in range(slots.shape[0]):
        r0, n_t = starts[k], starts[k + 1] - starts[k]
        xs = _gather(x, xo, xl, rows, r0, n_t, n_head * head_dim).reshape((n_t, n_head, head_dim))
        dts = _gather(dt, do, dl, rows, r0, n_t, n_head)
        bs = _gather(b, bo, bl, rows, r0, n_t, n_group * d_state).reshape((n_t, n_group, d_state))
        cs = _gather(c, co, cl, rows, r0, n_t, n_group * d_state).reshape((n_t, n_group, d_state))
        out = np.empty((n_t, n_head, head_dim), np.float32)
        scan_heads(states[slots[k]].reshape((n_head, head_dim, d_state)), xs, dts, a, bs, cs, out)
        for t in range(n_t):
            dst = yo + rows[r0 + t] * yl
            y[dst : dst + n_head * head_dim] = out[t].reshape(-1)

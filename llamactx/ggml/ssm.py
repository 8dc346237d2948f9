"""The state-space ops of ggml-cpu: `ggml_ssm_conv`, `ggml_ssm_scan` and the `ggml_silu` they are used with
(ggml/src/ggml-cpu/ops.cpp: ggml_compute_forward_ssm_conv_f32 / _ssm_scan_f32; vec.cpp: ggml_vec_silu_f32).

Each works on one sequence at a time; the model calls it once per sequence set of the ubatch, which is what ggml's
outer loop over `n_seqs` does. The arithmetic follows ggml's x86 (AVX-512) build, where GCC contracts
`a*b + c` into one fused multiply-add (`-ffp-contract=fast`, see llamactx.ggml.vec):

- ssm_conv: per channel and token a float sum over the d_conv taps in order, `sumf += s*c` fused in the AVX-512
  build; in the AVX2 build the taps of whole groups of 4 are a rounded product then an add, the rest fused (GCC
  vectorizes the products 4 at a time; measured on each build's tensors: d_conv 4 unfused, lfm2's 3 fused).
  ggml does not use ggml_vec_dot_f32 here, so no double accumulation.
- ssm_scan (Mamba-2, one scalar decay per head): `dt_soft_plus = x > 20 ? x : logf(1 + expf(x))`,
  `dA = expf(dt_soft_plus * A)`; per state element `state = s0*dA + B*x_dt` (the first product fused into the
  add) and `y += state*C` fused. The first d_state & ~(4 F32_EPR - 1) elements run in 4 x F32_EPR SIMD
  lanes reduced as GGML_F32_VEC_REDUCE (AVX-512: 4 x 16; AVX2: 4 x 8); the rest in scalar order after them.
- silu: F32_EPR-lane `ggml_v_silu` (x / (1 + ggml_v_expf(-x))) over each row's first n & ~(F32_EPR - 1)
  values, libm `expf` in the scalar tail.

Shapes are numpy order (the reverse of ggml's ne).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.vec import reduce_add16, reduce_hadd8, v_expf

_F32 = np.float32


@numba.njit(cache=True)
def _ssm_conv(conv_x, w, out):  # pragma: no cover - compiled
    n_ch, d_conv = w.shape
    n_t = out.shape[0]
    n_unfused = d_conv // 4 * 4  # AVX2: the taps GCC multiplies 4 at a time
    for t in range(n_t):
        for c in range(n_ch):
            s = _F32(0.0)
            for i in range(d_conv):
                if F32_EPR == 16 or i >= n_unfused:
                    s = fma32(conv_x[c, t + i], w[c, i], s)
                else:  # the AVX2 build's groups of 4 taps are not fused (measured on its tensors)
                    s = s + conv_x[c, t + i] * w[c, i]
            out[t, c] = s


def ssm_conv(conv_x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Depthwise causal convolution of one sequence (ggml_ssm_conv). conv_x (n_ch, d_conv - 1 + n_t): the
    conv state followed by the new tokens, per channel; weight (n_ch, d_conv). -> (n_t, n_ch) float32"""
    conv_x = np.ascontiguousarray(conv_x, np.float32)
    weight = np.ascontiguousarray(weight, np.float32)
    n_t = conv_x.shape[1] - weight.shape[1] + 1
    out = np.empty((n_t, weight.shape[0]), np.float32)
    _ssm_conv(conv_x, weight, out)
    return out


@numba.njit(cache=True)
def _softplus(x):  # pragma: no cover - compiled
    """ggml_compute_softplus_f32 (ggml-impl.h) with libm expf / logf."""
    if x > _F32(20.0):
        return x
    return _F32(math.log(_F32(1.0) + _F32(math.exp(x))))


@numba.njit(cache=True)
def _ssm_scan(s, x, dt, a, b, c, y, acc):  # pragma: no cover - compiled
    n_t, n_head, head_dim = x.shape
    n_group, d_state = b.shape[1], b.shape[2]
    step = 4 * F32_EPR  # GGML_F32_STEP
    n_simd = d_state // step * step
    for t in range(n_t):
        for h in range(n_head):
            dt_sp = _softplus(dt[t, h])
            da = _F32(math.exp(dt_sp * a[h]))
            g = h // (n_head // n_group)
            for i1 in range(head_dim):
                x_dt = x[t, h, i1] * dt_sp
                sumf = _F32(0.0)
                if n_simd:
                    acc[:] = 0
                    for i in range(0, n_simd, step):
                        for j in range(step):
                            st = fma32(s[h, i1, i + j], da, b[t, g, i + j] * x_dt)
                            acc[j] = fma32(st, c[t, g, i + j], acc[j])
                            s[h, i1, i + j] = st
                    for ln in range(F32_EPR):  # GGML_F32_VEC_REDUCE: (0+2), (1+3), then (0+1), then the lanes
                        acc[ln] = acc[ln] + acc[2 * F32_EPR + ln]
                        acc[F32_EPR + ln] = acc[F32_EPR + ln] + acc[3 * F32_EPR + ln]
                    for ln in range(F32_EPR):
                        acc[ln] = acc[ln] + acc[F32_EPR + ln]
                    sumf = reduce_add16(acc, 0) if F32_EPR == 16 else reduce_hadd8(acc, 0)
                for i0 in range(n_simd, d_state):
                    st = fma32(s[h, i1, i0], da, b[t, g, i0] * x_dt)
                    sumf = fma32(st, c[t, g, i0], sumf)
                    s[h, i1, i0] = st
                y[t, h, i1] = sumf


def ssm_scan(state: np.ndarray, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
             c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mamba-2's selective scan over one sequence's tokens (ggml_ssm_scan with a {1, n_head} A).
    state (n_head, head_dim, d_state): the state before the first token; x (n_t, n_head, head_dim);
    dt (n_t, n_head) before softplus; a (n_head,); b and c (n_t, n_group, d_state).
    -> y (n_t, n_head, head_dim) and the state after the last token, both float32."""
    s = np.array(state, np.float32)  # a copy: updated token by token
    y = np.empty(x.shape, np.float32)
    f32 = [np.ascontiguousarray(v, np.float32) for v in (x, dt, a, b, c)]
    _ssm_scan(s, *f32, y, np.zeros(64, np.float32))
    return y, s


@numba.njit(parallel=True, cache=True)
def silu_rows(x, out):  # pragma: no cover - compiled
    n, k = x.shape
    k16 = k - k % F32_EPR
    for r in numba.prange(n):
        for i in range(k16):
            v = x[r, i]
            out[r, i] = v / (_F32(1.0) + v_expf(_F32(0.0) - v))
        for i in range(k16, k):
            v = x[r, i]
            out[r, i] = v / (_F32(1.0) + _F32(math.exp(-v)))


def silu(x: np.ndarray) -> np.ndarray:
    """ggml_silu over rows of the last axis (ggml_vec_silu_f32). (..., k) float32 -> (..., k) float32"""
    xr = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    out = np.empty_like(xr)
    silu_rows(xr, out)
    return out.reshape(x.shape)

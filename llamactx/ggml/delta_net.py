"""The Gated DeltaNet ops of ggml-cpu: `ggml_gated_delta_net` (ggml/src/ggml-cpu/ops.cpp,
ggml_compute_forward_gated_delta_net_one_chunk), the `ggml_softplus` and `ggml_sigmoid` around it (unary-ops.cpp
op_softplus / op_sigmoid) and the L2 norm llama.cpp builds from `ggml_rms_norm` and `ggml_scale`
(src/models/models.h, build_gdn_l2_norm).

llama.cpp at 0c1e570 runs the fused op on a CPU for prompts and decode alike (llama_context's fused_gdn_ar /
fused_gdn_ch are on, and ggml-cpu supports GGML_OP_GATED_DELTA_NET): one token after another, per value head and
sequence, on the head's S_v x S_v state kept transposed (row j holds column j of S). Per token, in float32:

    s *= expf(g)                                   ggml_vec_scale_f32 (exact products)
    delta[j] = (v[j] - dot(s[j], k)) * beta        ggml_vec_dot_f32: 4 x F32_EPR FMA lanes, GGML_F32_VEC_REDUCE
    s[j] += k * delta[j]                           ggml_vec_mad_f32: one FMA per element
    out[j] = dot(s[j], q) * (1 / sqrtf(S_v))

Value head h reads key head h % H_k (the op's `iv1 % neq1`: ggml_repeat's tiling, not an interleave). The dots
are llamactx.ggml.vec.dot_vec (ggml_vec_dot_f32, its GCC-vectorized tail included); a state row whose length is
not a multiple of 4 x F32_EPR would also take ggml_vec_mad_f32's scalar tail, computed fused here (GCC contracts
`y[i] += x[i]*v`); Qwen3.5's heads (128) and the tiny model's (64) have no tail on either ISA.

Shapes are numpy order (the reverse of ggml's ne).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.vec import dot_vec, rms_norm

_F32 = np.float32


@numba.njit(parallel=True, cache=True)
def _gated_delta_net(q, k, v, g, beta, s, scale, out):  # pragma: no cover - compiled
    n_t, h_v, s_v = v.shape
    h_k = q.shape[1]
    for h in numba.prange(h_v):  # heads are independent (ggml splits them over its threads)
        hk = h % h_k
        delta = np.empty(s_v, np.float32)
        acc = np.empty(64, np.float32)
        for t in range(n_t):
            e = _F32(math.exp(g[t, h]))
            for j in range(s_v):
                for i in range(s_v):
                    s[h, j, i] = s[h, j, i] * e
            for j in range(s_v):
                delta[j] = (v[t, h, j] - dot_vec(s[h, j], k[t, hk], acc, False)) * beta[t, h]
            for j in range(s_v):
                dj = delta[j]
                for i in range(s_v):
                    s[h, j, i] = fma32(k[t, hk, i], dj, s[h, j, i])
            for j in range(s_v):
                out[t, h, j] = dot_vec(s[h, j], q[t, hk], acc, False) * scale


def gated_delta_net(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                    state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml_gated_delta_net of one sequence (scalar decay per head: Qwen3.5's GDA, not Kimi's per-channel KDA).
    q, k (n_t, H_k, S): L2-normed; v (n_t, H_v, S); g (n_t, H_v): the log-decay softplus(alpha + dt) * A;
    beta (n_t, H_v): sigmoid(beta); state (H_v, S, S) before the first token, row j = column j of S.
    -> the output (n_t, H_v, S) and the state after the last token, float32."""
    s = np.array(state, np.float32)  # (H_v, S, S) a copy, updated token by token
    out = np.empty(v.shape, np.float32)  # (n_t, H_v, S)
    s_v = v.shape[-1]
    scale = _F32(1.0) / np.sqrt(_F32(s_v))  # 1.0f / sqrtf((float) S_v)
    f32 = [np.ascontiguousarray(a, np.float32) for a in (q, k, v, g, beta)]
    _gated_delta_net(*f32, s, scale, out)
    return out, s


@numba.njit(cache=True)
def _softplus(x, y):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        xi = x[i]
        y[i] = xi if xi > _F32(20.0) else _F32(math.log(_F32(1.0) + _F32(math.exp(xi))))


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml_softplus: x > 20 ? x : logf(1 + expf(x)), libm, element by element. (...) -> (...) float32"""
    xr = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(xr)
    _softplus(xr.reshape(-1), y.reshape(-1))
    return y


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """build_gdn_l2_norm: ggml_rms_norm(x, eps / n) then ggml_scale by 1 / sqrtf(n), n = the row length (eps / n
    and the scale in float32), in one pass: rms_norm makes (x * scale) * w, and w = 1 / sqrtf(n) is that scale.
    (..., n) -> (..., n) float32"""
    n = _F32(x.shape[-1])
    return rms_norm(x, np.full(x.shape[-1], _F32(1.0) / np.sqrt(n), np.float32), _F32(eps) / n)

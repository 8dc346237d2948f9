"""The Gated DeltaNet layer's recurrent kernels, fast: ggml_gated_delta_net (ggml-cpu/ops.cpp,
ggml_compute_forward_gated_delta_net_one_chunk) and ggml_ssm_conv (ggml_compute_forward_ssm_conv_f32) with the
bits of llamactx.ggml.delta_net / llamactx.ggml.ssm (the reference, tests/ggml/test_delta_rule_kernels.py compares).

- `gated_delta_net_`: the state is updated in place, one row at a time. Every step of ggml's per-token update
  touches row j of a head's transposed state alone (s[j] *= e; delta[j] = (v[j] - s[j].k) beta; s[j] += k delta[j];
  out[j] = s[j].q), so the four passes over the S x S state become two passes over each 512-byte row while it
  sits in L1, with every element's arithmetic (products, FMAs, the dots' lane order and reduction) unchanged.
  Rows of 128 on AVX-512 (Qwen3.5's heads: `_head128`) keep the scaled row's 16 vectors in registers between
  the two dots, so a row is read once and written once (~10% less time per prompt token). Heads run on the
  thread pool, as ggml splits them over its threads.
- `ssm_conv`: the depthwise causal conv read from a token-major input (d_conv - 1 + n_t, n_ch), one pass over a row
  of channels per tap (vectorized across them, each output's taps in order): no transposed copy of the ubatch;
  `ssm_conv_rows` the same sums from the conv state (n_ch, d_conv - 1) and the new rows, the state in place;
  `ssm_conv_sets` the compiled graph's node (each sequence set on its state): with 4 taps token by token on the
  flat state (`_conv_step4`: each channel's three state floats and its weights beside it, vectorized across
  channels: a decode step's 6144 channels in ~4 us instead of ~25 us through the token-major copies).

The memory traffic of a decode step (`recurrent_traffic`): per delta-net layer and sequence, the S x S float32
state of each value head is read once and written once (H_v * S * S * 4 bytes each way), the conv state
(d_conv - 1) * n_ch floats likewise; bench/profile_forward.py prints the totals.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.cpu import F32_EPR, F32_TAIL_EPILOGUE
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.kernels.simd import f32x8, fmadd, fzero, splat, vload_f32, vstore
from llamactx.ggml.ssm import ssm_conv as ref_ssm_conv
from llamactx.ggml.vec import f32_tail

_F32 = np.float32
_STEP = 4 * F32_EPR  # GGML_F32_STEP: ggml_vec_dot_f32's lanes
_V8F32 = ir.VectorType(ir.FloatType(), 8)


@intrinsic
def _vmul_s(typingctx, v, x):
    """v * x lane-wise, x a float32 scalar (ggml_vec_scale_f32's products)."""
    sig = f32x8(f32x8, types.float32)

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], splat(builder, args[1], 8))

    return sig, codegen


@intrinsic
def _vfma_s(typingctx, a, x, c):
    """a * x + c lane-wise with one rounding, x a float32 scalar (ggml_vec_mad_f32)."""
    sig = f32x8(f32x8, types.float32, f32x8)

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
        return builder.call(fn, [args[0], splat(builder, args[1], 8), args[2]])

    return sig, codegen


@intrinsic
def _vadd(typingctx, a, b):
    sig = f32x8(f32x8, f32x8)

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return sig, codegen


@intrinsic
def _lane(typingctx, v, i):
    sig = types.float32(f32x8, types.intp)

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], args[1])

    return sig, codegen


@numba.njit(cache=True, inline="always")
def _reduce(a0, a1, a2, a3, a4, a5, a6, a7):  # pragma: no cover - compiled
    """GGML_F32_VEC_REDUCE of ggml_vec_dot_f32's 4 x F32_EPR lanes held as eight (AVX-512) or four (AVX2, a4..a7
    unused) <8 x float>: registers (0+2), (1+3), then (0+1), then `_mm512_reduce_add_ps` / the two hadds
    (llamactx.ggml.vec.dot_vec: the same sums, each float addition commutative)."""
    if F32_EPR == 16:  # register r = (a[2r], a[2r+1])
        lo = _vadd(_vadd(a0, a4), _vadd(a2, a6))
        hi = _vadd(_vadd(a1, a5), _vadd(a3, a7))
        t = _vadd(hi, lo)  # reduce_add16: t_i = r[8 + i] + r[i]
        u0 = _lane(t, 4) + _lane(t, 0)
        u1 = _lane(t, 5) + _lane(t, 1)
        u2 = _lane(t, 6) + _lane(t, 2)
        u3 = _lane(t, 7) + _lane(t, 3)
        return (u0 + u2) + (u1 + u3)
    r = _vadd(_vadd(a0, a2), _vadd(a1, a3))
    t0 = _lane(r, 0) + _lane(r, 4)
    t1 = _lane(r, 1) + _lane(r, 5)
    t2 = _lane(r, 2) + _lane(r, 6)
    t3 = _lane(r, 3) + _lane(r, 7)
    return (t0 + t1) + (t2 + t3)


@numba.njit(cache=True, inline="always")
def _scaled8(s, j, i, e, k, kr, a0, a1, a2, a3, a4, a5, a6, a7):  # pragma: no cover - compiled
    """s[j, i:i + 64] * e as eight vectors, and the dot lanes a0..a7 advanced by their products with k."""
    x0, x1 = _vmul_s(vload_f32(s, j, i), e), _vmul_s(vload_f32(s, j, i + 8), e)
    x2, x3 = _vmul_s(vload_f32(s, j, i + 16), e), _vmul_s(vload_f32(s, j, i + 24), e)
    x4, x5 = _vmul_s(vload_f32(s, j, i + 32), e), _vmul_s(vload_f32(s, j, i + 40), e)
    x6, x7 = _vmul_s(vload_f32(s, j, i + 48), e), _vmul_s(vload_f32(s, j, i + 56), e)
    a0, a1 = fmadd(a0, x0, vload_f32(k, kr, i)), fmadd(a1, x1, vload_f32(k, kr, i + 8))
    a2, a3 = fmadd(a2, x2, vload_f32(k, kr, i + 16)), fmadd(a3, x3, vload_f32(k, kr, i + 24))
    a4, a5 = fmadd(a4, x4, vload_f32(k, kr, i + 32)), fmadd(a5, x5, vload_f32(k, kr, i + 40))
    a6, a7 = fmadd(a6, x6, vload_f32(k, kr, i + 48)), fmadd(a7, x7, vload_f32(k, kr, i + 56))
    return x0, x1, x2, x3, x4, x5, x6, x7, a0, a1, a2, a3, a4, a5, a6, a7


@numba.njit(cache=True, inline="always")
def _updated8(s, j, i, dj, k, q, kr, x0, x1, x2, x3, x4, x5, x6, x7,
              a0, a1, a2, a3, a4, a5, a6, a7):  # pragma: no cover - compiled
    """x + k * dj (one FMA each) stored to s[j, i:i + 64], and the dot lanes a0..a7 advanced by their products
    with q."""
    x0, x1 = _vfma_s(vload_f32(k, kr, i), dj, x0), _vfma_s(vload_f32(k, kr, i + 8), dj, x1)
    x2, x3 = _vfma_s(vload_f32(k, kr, i + 16), dj, x2), _vfma_s(vload_f32(k, kr, i + 24), dj, x3)
    x4, x5 = _vfma_s(vload_f32(k, kr, i + 32), dj, x4), _vfma_s(vload_f32(k, kr, i + 40), dj, x5)
    x6, x7 = _vfma_s(vload_f32(k, kr, i + 48), dj, x6), _vfma_s(vload_f32(k, kr, i + 56), dj, x7)
    vstore(s, j, i, x0)
    vstore(s, j, i + 8, x1)
    vstore(s, j, i + 16, x2)
    vstore(s, j, i + 24, x3)
    vstore(s, j, i + 32, x4)
    vstore(s, j, i + 40, x5)
    vstore(s, j, i + 48, x6)
    vstore(s, j, i + 56, x7)
    a0, a1 = fmadd(a0, x0, vload_f32(q, kr, i)), fmadd(a1, x1, vload_f32(q, kr, i + 8))
    a2, a3 = fmadd(a2, x2, vload_f32(q, kr, i + 16)), fmadd(a3, x3, vload_f32(q, kr, i + 24))
    a4, a5 = fmadd(a4, x4, vload_f32(q, kr, i + 32)), fmadd(a5, x5, vload_f32(q, kr, i + 40))
    a6, a7 = fmadd(a6, x6, vload_f32(q, kr, i + 48)), fmadd(a7, x7, vload_f32(q, kr, i + 56))
    return a0, a1, a2, a3, a4, a5, a6, a7


@numba.njit(cache=True)
def _head128(s, q, k, v, g, beta, scale, out, h, hk, h_k):  # pragma: no cover - compiled
    """_head for rows of 128 on AVX-512 (two steps of ggml_vec_dot_f32's 64 lanes, Qwen3.5's heads): each row
    read once and written once, its 16 scaled vectors kept in registers between the two dots (_head stores them
    and reads them back); the same operations on every element, the same lanes."""
    z = fzero()
    for t in range(v.shape[0]):
        e = _F32(math.exp(g[t, h]))
        b = beta[t, h]
        kr = t * h_k + hk
        for j in range(128):
            x0, x1, x2, x3, x4, x5, x6, x7, a0, a1, a2, a3, a4, a5, a6, a7 = _scaled8(
                s, j, 0, e, k, kr, z, z, z, z, z, z, z, z)
            y0, y1, y2, y3, y4, y5, y6, y7, a0, a1, a2, a3, a4, a5, a6, a7 = _scaled8(
                s, j, 64, e, k, kr, a0, a1, a2, a3, a4, a5, a6, a7)
            dj = (v[t, h, j] - _reduce(a0, a1, a2, a3, a4, a5, a6, a7)) * b
            a0, a1, a2, a3, a4, a5, a6, a7 = _updated8(s, j, 0, dj, k, q, kr, x0, x1, x2, x3, x4, x5, x6, x7,
                                                       z, z, z, z, z, z, z, z)
            a0, a1, a2, a3, a4, a5, a6, a7 = _updated8(s, j, 64, dj, k, q, kr, y0, y1, y2, y3, y4, y5, y6, y7,
                                                       a0, a1, a2, a3, a4, a5, a6, a7)
            out[t, h, j] = _reduce(a0, a1, a2, a3, a4, a5, a6, a7) * scale


@numba.njit(cache=True)
def _head(s, q, k, v, g, beta, scale, out, h, hk, h_k):  # pragma: no cover - compiled
    """Value head h (key head hk of h_k) over every token, its state s (S, S) updated in place; q, k
    (n_t * h_k, S), out (n_t, H_v, S)."""
    n_t = v.shape[0]
    s_v = v.shape[2]
    n_simd = s_v // _STEP * _STEP
    wide = F32_EPR == 16
    for t in range(n_t):
        e = _F32(math.exp(g[t, h]))
        b = beta[t, h]
        kr = t * h_k + hk
        for j in range(s_v):
            # s[j] *= e, and the dot of the scaled row with k (ggml_vec_scale_f32, then ggml_vec_dot_f32)
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = fzero()
            for i in range(0, n_simd, _STEP):
                x0 = _vmul_s(vload_f32(s, j, i), e)
                x1 = _vmul_s(vload_f32(s, j, i + 8), e)
                x2 = _vmul_s(vload_f32(s, j, i + 16), e)
                x3 = _vmul_s(vload_f32(s, j, i + 24), e)
                vstore(s, j, i, x0)
                vstore(s, j, i + 8, x1)
                vstore(s, j, i + 16, x2)
                vstore(s, j, i + 24, x3)
                a0 = fmadd(a0, x0, vload_f32(k, kr, i))
                a1 = fmadd(a1, x1, vload_f32(k, kr, i + 8))
                a2 = fmadd(a2, x2, vload_f32(k, kr, i + 16))
                a3 = fmadd(a3, x3, vload_f32(k, kr, i + 24))
                if wide:
                    x4 = _vmul_s(vload_f32(s, j, i + 32), e)
                    x5 = _vmul_s(vload_f32(s, j, i + 40), e)
                    x6 = _vmul_s(vload_f32(s, j, i + 48), e)
                    x7 = _vmul_s(vload_f32(s, j, i + 56), e)
                    vstore(s, j, i + 32, x4)
                    vstore(s, j, i + 40, x5)
                    vstore(s, j, i + 48, x6)
                    vstore(s, j, i + 56, x7)
                    a4 = fmadd(a4, x4, vload_f32(k, kr, i + 32))
                    a5 = fmadd(a5, x5, vload_f32(k, kr, i + 40))
                    a6 = fmadd(a6, x6, vload_f32(k, kr, i + 48))
                    a7 = fmadd(a7, x7, vload_f32(k, kr, i + 56))
            sk = _reduce(a0, a1, a2, a3, a4, a5, a6, a7)
            if n_simd < s_v:
                for i in range(n_simd, s_v):
                    s[j, i] = s[j, i] * e
                sk = f32_tail(s[j], k[kr], n_simd, sk, F32_TAIL_EPILOGUE)
            dj = (v[t, h, j] - sk) * b
            # s[j] += k * delta[j] (ggml_vec_mad_f32, one FMA each), and the dot of the new row with q
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = fzero()
            for i in range(0, n_simd, _STEP):
                x0 = _vfma_s(vload_f32(k, kr, i), dj, vload_f32(s, j, i))
                x1 = _vfma_s(vload_f32(k, kr, i + 8), dj, vload_f32(s, j, i + 8))
                x2 = _vfma_s(vload_f32(k, kr, i + 16), dj, vload_f32(s, j, i + 16))
                x3 = _vfma_s(vload_f32(k, kr, i + 24), dj, vload_f32(s, j, i + 24))
                vstore(s, j, i, x0)
                vstore(s, j, i + 8, x1)
                vstore(s, j, i + 16, x2)
                vstore(s, j, i + 24, x3)
                a0 = fmadd(a0, x0, vload_f32(q, kr, i))
                a1 = fmadd(a1, x1, vload_f32(q, kr, i + 8))
                a2 = fmadd(a2, x2, vload_f32(q, kr, i + 16))
                a3 = fmadd(a3, x3, vload_f32(q, kr, i + 24))
                if wide:
                    x4 = _vfma_s(vload_f32(k, kr, i + 32), dj, vload_f32(s, j, i + 32))
                    x5 = _vfma_s(vload_f32(k, kr, i + 40), dj, vload_f32(s, j, i + 40))
                    x6 = _vfma_s(vload_f32(k, kr, i + 48), dj, vload_f32(s, j, i + 48))
                    x7 = _vfma_s(vload_f32(k, kr, i + 56), dj, vload_f32(s, j, i + 56))
                    vstore(s, j, i + 32, x4)
                    vstore(s, j, i + 40, x5)
                    vstore(s, j, i + 48, x6)
                    vstore(s, j, i + 56, x7)
                    a4 = fmadd(a4, x4, vload_f32(q, kr, i + 32))
                    a5 = fmadd(a5, x5, vload_f32(q, kr, i + 40))
                    a6 = fmadd(a6, x6, vload_f32(q, kr, i + 48))
                    a7 = fmadd(a7, x7, vload_f32(q, kr, i + 56))
            sq = _reduce(a0, a1, a2, a3, a4, a5, a6, a7)
            if n_simd < s_v:
                for i in range(n_simd, s_v):
                    s[j, i] = fma32(k[kr, i], dj, s[j, i])
                sq = f32_tail(s[j], q[kr], n_simd, sq, F32_TAIL_EPILOGUE)
            out[t, h, j] = sq * scale


@numba.njit(parallel=True, cache=True)
def _gated_delta_net(q, k, v, g, beta, s, scale, out):  # pragma: no cover - compiled
    h_v = v.shape[1]
    h_k = q.shape[1]
    q2 = q.reshape((q.shape[0] * h_k, q.shape[2]))  # (n_t * H_k, S): rows for the vector loads
    k2 = k.reshape((k.shape[0] * h_k, k.shape[2]))
    for h in numba.prange(h_v):
        if F32_EPR == 16 and v.shape[2] == 128:
            _head128(s[h], q2, k2, v, g, beta, scale, out, h, h % h_k, h_k)
        else:
            _head(s[h], q2, k2, v, g, beta, scale, out, h, h % h_k, h_k)


def gated_delta_net_(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                     state: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """llamactx.ggml.delta_net.gated_delta_net with `state` (H_v, S, S) float32 C-contiguous updated in place.
    q, k (n_t, H_k, S); v (n_t, H_v, S); g, beta (n_t, H_v). -> the output (n_t, H_v, S) float32 (into `out`)"""
    if state.dtype != np.float32 or not state.flags.c_contiguous or not state.flags.writeable:
        raise ValueError(f"gated_delta_net_: the state must be a writable C-contiguous float32 array, not "
                         f"{state.dtype} {state.flags}")
    if out is None:
        out = np.empty(v.shape, np.float32)
    s_v = v.shape[-1]
    scale = _F32(1.0) / np.sqrt(_F32(s_v))  # 1.0f / sqrtf((float) S_v)
    f32 = [np.ascontiguousarray(a, np.float32) for a in (q, k, v, g, beta)]
    _gated_delta_net(*f32, state, scale, out)
    return out


@numba.njit(cache=True)
def _ssm_conv_rows(state, x, w, out):  # pragma: no cover - compiled
    """out[t, c] = sum_i conv_x[c, t + i] w[c, i] over conv_x = state | x.T, as llamactx.ggml.ssm._ssm_conv; then
    the state becomes conv_x's last d_conv - 1 columns."""
    n_t, n_ch = x.shape
    d_conv = w.shape[1]
    d_st = d_conv - 1
    n_unfused = d_conv // 4 * 4  # AVX2: the taps GCC multiplies 4 at a time
    for t in range(n_t):
        for c in range(n_ch):
            s = _F32(0.0)
            for i in range(d_conv):
                j = t + i  # column of conv_x: the state's first, then the tokens'
                xi = state[c, j] if j < d_st else x[j - d_st, c]
                if F32_EPR == 16 or i >= n_unfused:
                    s = fma32(xi, w[c, i], s)
                else:  # the AVX2 build's groups of 4 taps are not fused
                    s = s + xi * w[c, i]
            out[t, c] = s
    new = np.empty((n_ch, d_st), np.float32)  # conv_x's last d_st columns
    for i in range(d_st):
        j = n_t + i
        for c in range(n_ch):
            new[c, i] = state[c, j] if j < d_st else x[j - d_st, c]
    state[:, :] = new


def ssm_conv_rows(state: np.ndarray, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """ggml_ssm_conv of one sequence from the conv state (n_ch, d_conv - 1), float32 C-contiguous, updated in
    place, and the new inputs x (n_t, n_ch); weight (n_ch, d_conv). -> (n_t, n_ch) float32"""
    if state.dtype != np.float32 or not state.flags.c_contiguous or not state.flags.writeable:
        raise ValueError("ssm_conv_rows: the state must be a writable C-contiguous float32 array")
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty(x.shape, np.float32)
    _ssm_conv_rows(state, x, np.ascontiguousarray(weight, np.float32), out)
    return out


@numba.njit(cache=True)
def _ssm_conv_tokens(xt, w, out):  # pragma: no cover - compiled
    """The same sums from the token-major inputs xt (d_conv - 1 + n_t, n_ch): each tap a pass over a row of
    channels (vectorized across them), every output's taps still added in order from 0."""
    _conv_taps(xt, np.ascontiguousarray(w.T), out)


@numba.njit(cache=True)
def _conv_taps(xt, wt, out):  # pragma: no cover - compiled
    """_ssm_conv_tokens with the weight transposed, wt (d_conv, n_ch)."""
    n_t, n_ch = out.shape
    d_conv = wt.shape[0]
    n_unfused = d_conv // 4 * 4  # AVX2: the taps GCC multiplies 4 at a time
    for t in range(n_t):
        o = out[t]
        o[:] = 0
        for i in range(d_conv):
            x = xt[t + i]
            wi = wt[i]
            if F32_EPR == 16 or i >= n_unfused:
                for c in range(n_ch):
                    o[c] = fma32(x[c], wi[c], o[c])
            else:  # the AVX2 build's groups of 4 taps are not fused
                for c in range(n_ch):
                    o[c] = o[c] + x[c] * wi[c]


def ssm_conv(conv_x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """llamactx.ggml.ssm.ssm_conv (ggml_ssm_conv of one sequence). conv_x (n_ch, d_conv - 1 + n_t): the transpose
    of a token-major C-contiguous float32 array (xt.T, as qwen35's delta-net block passes it) is read in place,
    vectorized across channels; anything else goes to the reference kernel. weight (n_ch, d_conv).
    -> (n_t, n_ch) float32"""
    if not (conv_x.dtype == np.float32 and conv_x.T.flags.c_contiguous and conv_x.shape[1] > 1):
        return ref_ssm_conv(conv_x, weight)
    weight = np.ascontiguousarray(weight, np.float32)
    out = np.empty((conv_x.shape[1] - weight.shape[1] + 1, weight.shape[0]), np.float32)
    _ssm_conv_tokens(conv_x.T, weight, out)
    return out


@numba.njit(cache=True)
def _conv_step4(st, xs, w, y):  # pragma: no cover - compiled
    """One token through a conv of 4 taps, from the flat state st (n_ch * 3,) and the new inputs xs (n_ch,): each
    channel's taps in order as _ssm_conv_rows sums them, then its state shifted by one. Each channel reads and
    writes its own three floats beside it, which LLVM vectorizes across channels (8 or 16 at a time)."""
    for c in range(xs.shape[0]):
        a0, a1, a2, xc = st[3 * c], st[3 * c + 1], st[3 * c + 2], xs[c]
        if F32_EPR == 16:
            s = fma32(a0, w[4 * c], _F32(0.0))
            s = fma32(a1, w[4 * c + 1], s)
            s = fma32(a2, w[4 * c + 2], s)
            s = fma32(xc, w[4 * c + 3], s)
        else:  # the AVX2 build's groups of 4 taps are not fused
            s = _F32(0.0) + a0 * w[4 * c]
            s = s + a1 * w[4 * c + 1]
            s = s + a2 * w[4 * c + 2]
            s = s + xc * w[4 * c + 3]
        y[c] = s
        st[3 * c], st[3 * c + 1], st[3 * c + 2] = a1, a2, xc


@numba.njit(cache=True)
def ssm_conv_sets(states, slots, starts, rows, x, xo, xl, w, y, yo, yl):  # pragma: no cover - compiled
    """The compiled graph's SSM_CONV_RS node: each sequence set's rows of x (rows[starts[k]:starts[k + 1]], at
    xo + row * xl) after its conv state states[slots[k]] (n_ch * (d_conv - 1),: (n_ch, d_conv - 1) row-major),
    into y's rows; the state becomes the last d_conv - 1 inputs, in place. w (n_ch, d_conv). With 4 taps
    (Qwen3.5's) the tokens go one by one on the state itself (a 6144-channel token in ~4 us, a third of the
    token-major pass per tap even over 512 tokens); other widths through the token-major pass (_conv_taps, the
    weight transposed once per node). The same sums either way."""
    n_ch, d_conv = w.shape
    d_st = d_conv - 1
    wf = w.reshape(-1)
    wt = np.ascontiguousarray((w if d_conv != 4 else w[:0]).T)  # (d_conv, n_ch), or nothing when no set needs it
    for k in range(slots.shape[0]):
        r0, n_t = starts[k], starts[k + 1] - starts[k]
        if d_conv == 4:
            st = states[slots[k]][: n_ch * d_st]
            for t in range(n_t):
                xr, yr = xo + rows[r0 + t] * xl, yo + rows[r0 + t] * yl
                _conv_step4(st, x[xr : xr + n_ch], wf, y[yr : yr + n_ch])
            continue
        st = states[slots[k]].reshape((n_ch, d_st))
        xt = np.empty((d_st + n_t, n_ch), np.float32)  # (d_conv - 1 + n_t, n_ch): the state, then the tokens
        for c in range(n_ch):
            for i in range(d_st):
                xt[i, c] = st[c, i]
        for t in range(n_t):
            src = xo + rows[r0 + t] * xl
            xt[d_st + t] = x[src : src + n_ch]
        out = np.empty((n_t, n_ch), np.float32)
        _conv_taps(xt, wt, out)
        for c in range(n_ch):
            for i in range(d_st):
                st[c, i] = xt[n_t + i, c]
        for t in range(n_t):
            dst = yo + rows[r0 + t] * yl
            y[dst : dst + n_ch] = out[t]


def recurrent_traffic(hp) -> dict[str, int]:
    """Bytes of recurrent state one decode step reads and writes per sequence, for a delta-net hybrid's hparams:
    {"ssm": ..., "conv": ..., "layers": n} (each read once and written once)."""
    n_layers = sum(1 for il in range(hp.n_layer) if hp.is_recr(il))
    head, n_v = hp.ssm_d_state, hp.ssm_dt_rank
    conv_dim = 2 * head * hp.ssm_n_group + head * n_v
    return {"layers": n_layers, "ssm": n_layers * n_v * head * head * 4,
            "conv": n_layers * conv_dim * (hp.ssm_d_conv - 1) * 4}

"""ggml-cpu's float arithmetic on x86, reproduced operation for operation in numba, for the target's vector width.

The models are numerically chaotic (docs/numerics.md), so the elementwise ops have to give llama.cpp's bits, not
just close values. What decides the bits, and what this module copies:

- GCC compiles ggml with `-ffp-contract=fast`: `a*b + c` becomes one fused multiply-add. RoPE's rotation and
  the GELU table's `1 + 0.044715*x*x` are contracted that way (measured against llama.cpp's tensors).
- `expf` in softmax and SiLU is not libm's but `ggml_v_expf` (ggml-cpu/vec.h, AVX-512 variant): a degree-5
  polynomial after a 2^n range reduction, every step an FMA.
- Where ggml calls libm (`cosf`/`sinf` in the RoPE cache, `tanhf` in the GELU table, `expf` in tails) numba's
  `math` functions on float32 call the same glibc functions; numpy's own SIMD versions differ by an ulp.
- `_mm512_reduce_add_ps` (GCC's avx512fintrin.h) sums 16 lanes as a fixed tree: halves, quarters, pairs.
- ggml is built for one ISA, and its float loops follow the vector width `GGML_F32_EPR`: 16 lanes with AVX-512,
  8 with AVX2 (simd-mappings.h). `cpu.F32_EPR` is the target's (a compile-time constant of every kernel here),
  so the AVX2 target gets the AVX2 build's bits: 8-lane `ggml_v_expf` (another polynomial tail and scaling),
  softmax and SiLU 8 at a time, tinyBLAS `<8, __m256>` with its `hsum`, `ggml_vec_dot_f16` as 4 x 8 lanes
  reduced by `GGML_F32x8_REDUCE` (two `hadd`s).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from llamactx.ggml.cpu import F32_EPR, F32_TAIL_EPILOGUE
from llamactx.ggml.intrinsics import f16_bits, fma32, pow2_f64
from llamactx.ggml.libm import libm

_F32 = np.float32


def _hexf(s: str) -> np.float32:
    return np.float32(float.fromhex(s))


# ggml_v_expf constants (ggml-cpu/vec.h, "adapted from arm limited optimized routine")
_EXP_R = _hexf("0x1.8p23")
_EXP_LOG2E = _hexf("0x1.715476p+0")
_EXP_LN2_HI = _hexf("0x1.62e4p-1")
_EXP_LN2_LO = _hexf("0x1.7f7d1cp-20")
_EXP_C5 = _hexf("0x1.0e4020p-7")
_EXP_C4 = _hexf("0x1.573e2ep-5")
_EXP_C3 = _hexf("0x1.555e66p-3")
_EXP_C2 = _hexf("0x1.fffdb6p-2")
_EXP_C1 = _hexf("0x1.ffffecp-1")


@numba.njit(cache=True)
def v_expf(x):  # pragma: no cover - compiled
    """One lane of `ggml_v_expf` for the target's vector width (`_v_expf16` or `_v_expf8`)."""
    if F32_EPR == 16:
        return _v_expf16(x)
    return _v_expf8(x)


@numba.njit(cache=True)
def _v_expf16(x):  # pragma: no cover - compiled
    """One lane of `ggml_v_expf(__m512)`: exp(x) to 1.5 ulp; |n| > 192 saturates to 0 / inf. The saturation is a
    select, not an early return, so loops over it vectorize (NaN stays NaN, as in ggml)."""
    z = fma32(x, _EXP_LOG2E, _EXP_R)
    n = z - _EXP_R  # round(x / ln 2) as a float
    b = fma32(-n, _EXP_LN2_LO, fma32(-n, _EXP_LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(_EXP_C5, b, _EXP_C4), u, fma32(_EXP_C3, b, _EXP_C2)), u, fma32(_EXP_C1, b, _F32(1.0)))
    ok = not abs(n) > _F32(192.0)
    # _mm512_scalef_ps(j, n) = j * 2^n, one rounding (exact in float64, then rounded once)
    y = _F32(np.float64(j) * pow2_f64(np.int64(n if ok else _F32(0.0))))
    sat = _F32(0.0) if n <= _F32(0.0) else _F32(np.inf)
    return y if ok else sat


@numba.njit(cache=True)
def _v_expf8(x):  # pragma: no cover - compiled
    """One lane of `ggml_v_expf(__m256)` (AVX2 + FMA): the same reduction, but the polynomial ends in `c1*b` (not
    `fma(c1, b, 1)`) and the result is `fma(j, 2^n, 2^n)` (one rounding of 2^n (1 + j)); for 126 < |n| <= 192
    `(fma(s2, j, s2)) * s1` with s1 * s2 = 2^n (1 + j rounded, then the product rounded, subnormals included);
    |n| > 192: 0 or inf. Selects, not branches, so loops over it vectorize."""
    z = fma32(x, _EXP_LOG2E, _EXP_R)
    n = z - _EXP_R
    b = fma32(-n, _EXP_LN2_LO, fma32(-n, _EXP_LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(_EXP_C5, b, _EXP_C4), u, fma32(_EXP_C3, b, _EXP_C2)), u, _EXP_C1 * b)
    a = abs(n)
    k = pow2_f64(np.int64(n if not a > _F32(192.0) else _F32(0.0)))  # 2^n, exact
    y_k = _F32((np.float64(j) + 1.0) * k)  # fma(j, k, k): 1 + j is exact in double, the product too
    y_s = _F32(np.float64(_F32(np.float64(j) + 1.0)) * k)  # s2 (1 + j) rounded, then times s1 rounded
    sat = _F32(0.0) if n <= _F32(0.0) else _F32(np.inf)
    return y_k if not a > _F32(126.0) else (y_s if not a > _F32(192.0) else sat)


@numba.njit(cache=True, inline="always")
def vec_max(w, m):  # pragma: no cover - compiled
    """The max of w[:m] (ggml_vec_max_f32; -inf for none) in 8 interleaved chains: a max does not depend on the
    order, and NaNs are skipped in each chain."""
    m8 = m // 8 * 8
    mx0 = mx1 = mx2 = mx3 = mx4 = mx5 = mx6 = mx7 = np.float32(-np.inf)
    for r in range(0, m8, 8):
        mx0 = w[r] if w[r] > mx0 else mx0
        mx1 = w[r + 1] if w[r + 1] > mx1 else mx1
        mx2 = w[r + 2] if w[r + 2] > mx2 else mx2
        mx3 = w[r + 3] if w[r + 3] > mx3 else mx3
        mx4 = w[r + 4] if w[r + 4] > mx4 else mx4
        mx5 = w[r + 5] if w[r + 5] > mx5 else mx5
        mx6 = w[r + 6] if w[r + 6] > mx6 else mx6
        mx7 = w[r + 7] if w[r + 7] > mx7 else mx7
    mx = np.float32(-np.inf)
    for x in (mx0, mx1, mx2, mx3, mx4, mx5, mx6, mx7):
        mx = x if x > mx else mx
    for r in range(m8, m):
        mx = w[r] if w[r] > mx else mx
    return mx


@numba.njit(cache=True)
def reduce_add16(a, off):  # pragma: no cover - compiled
    """GCC's `_mm512_reduce_add_ps` over a[off:off+16]: 8 pair sums, then 4, then (0+2) + (1+3)."""
    t0 = a[off + 8] + a[off + 0]
    t1 = a[off + 9] + a[off + 1]
    t2 = a[off + 10] + a[off + 2]
    t3 = a[off + 11] + a[off + 3]
    t4 = a[off + 12] + a[off + 4]
    t5 = a[off + 13] + a[off + 5]
    t6 = a[off + 14] + a[off + 6]
    t7 = a[off + 15] + a[off + 7]
    u0 = t4 + t0
    u1 = t5 + t1
    u2 = t6 + t2
    u3 = t7 + t3
    return (u0 + u2) + (u1 + u3)


@numba.njit(cache=True)
def hsum_float_8(a):  # pragma: no cover - compiled
    """ggml's `hsum_float_8` (arch/x86/quants.c): (a4+a0, a5+a1, a6+a2, a7+a3), then (0+2) + (1+3)."""
    return hsum8(a, 0)


@numba.njit(cache=True)
def hsum8(a, off):  # pragma: no cover - compiled
    """`hsum_float_8` over a[off:off+8]; also tinyBLAS's `hsum(__m256)` and the AVX2 softmax's group sum (high
    half plus low half, `movehl`, `movehdup`: the same tree)."""
    r0 = a[off + 4] + a[off + 0]
    r1 = a[off + 5] + a[off + 1]
    r2 = a[off + 6] + a[off + 2]
    r3 = a[off + 7] + a[off + 3]
    return (r0 + r2) + (r1 + r3)


@numba.njit(cache=True)
def reduce_hadd8(a, off):  # pragma: no cover - compiled
    """The end of `GGML_F32x8_REDUCE` over a[off:off+8]: t = low half + high half, then two `_mm_hadd_ps`:
    (t0 + t1) + (t2 + t3)."""
    t0 = a[off + 0] + a[off + 4]
    t1 = a[off + 1] + a[off + 5]
    t2 = a[off + 2] + a[off + 6]
    t3 = a[off + 3] + a[off + 7]
    return (t0 + t1) + (t2 + t3)


@numba.njit(cache=True)
def hsum_vec(a, off):  # pragma: no cover - compiled
    """The horizontal sum of one ggml float vector a[off:off+F32_EPR] as tinyBLAS's `hsum` and the softmax's
    group sum take it: `_mm512_reduce_add_ps` (AVX-512) or `hsum8` (AVX2)."""
    if F32_EPR == 16:
        return reduce_add16(a, off)
    return hsum8(a, off)


# -- dot products of float vectors ------------------------------------------------------------------------------


@numba.njit(cache=True)
def dot_tinyblas(a, b, acc):  # pragma: no cover - compiled
    """llamafile tinyBLAS<F32_EPR, ...> (sgemm.cpp `gemm_bloc`): F32_EPR FMA lanes from zero over len(a) (a
    multiple of F32_EPR), then `hsum_vec`. `acc`: scratch of at least 16 floats."""
    acc[:F32_EPR] = 0
    for i in range(0, a.shape[0], F32_EPR):
        for ln in range(F32_EPR):
            acc[ln] = fma32(a[i + ln], b[i + ln], acc[ln])
    return hsum_vec(acc, 0)


@numba.njit(cache=True)
def dot_vec(a, b, acc, tail_in_double):  # pragma: no cover - compiled
    """ggml_vec_dot_f16 / ggml_vec_dot_f32 (ggml-cpu/vec.cpp): 4 x F32_EPR FMA lanes over the first
    n & ~(4 F32_EPR - 1) elements, reduced (0+2), (1+3), (0+1), then `_mm512_reduce_add_ps` (AVX-512) or
    `reduce_hadd8` (AVX2); the tail is summed in double (f16) or, for f32, as GCC compiles `sumf += x[i]*y[i]`: 8
    (AVX-512 build) or 4 (AVX2 build) at a time vectorized (the products rounded, then added in order), the rest
    fused (FMA). With Intel tuning (F32_TAIL_EPILOGUE: the AVX-512 build native on Emerald Rapids) 4 more are
    summed the same way when the 8-wide loop ran at least twice and more than 4 remain (GCC's vectorized epilogue);
    with AMD tuning (native on Zen 4/5) not. Checked against llama.cpp's LoRA B matmuls of ranks 4-88 (F32,
    k = rank: tails 5-24), BERT's mean pooling (k = tokens: tails 3-31, tests/models/test_tiny_bert.py), both
    builds, and the Zen 4 build's ggml_vec_dot_f32 itself for n = 1..200 (tests/ggml/test_vec_dot_f32_tail.py).
    `acc`: scratch of 64 floats."""
    n = a.shape[0]
    step = 4 * F32_EPR
    np_ = n // step * step
    acc[:64] = 0
    for i in range(0, np_, step):
        for j in range(step):
            acc[j] = fma32(a[i + j], b[i + j], acc[j])
    for ln in range(F32_EPR):
        acc[ln] = acc[ln] + acc[2 * F32_EPR + ln]
        acc[F32_EPR + ln] = acc[F32_EPR + ln] + acc[3 * F32_EPR + ln]
    for ln in range(F32_EPR):
        acc[ln] = acc[ln] + acc[F32_EPR + ln]
    sf = reduce_add16(acc, 0) if F32_EPR == 16 else reduce_hadd8(acc, 0)
    if tail_in_double:
        s = np.float64(sf)
        for i in range(np_, n):
            s += np.float64(a[i] * b[i])
        return _F32(s)
    return f32_tail(a, b, np_, sf, F32_TAIL_EPILOGUE)


@numba.njit(cache=True)
def f32_tail(a, b, start, sf, epilogue):  # pragma: no cover - compiled
    """sf + a[start:] . b[start:] as GCC vectorized ggml_vec_dot_f32's `sumf += x[i]*y[i]`: w = 8 (AVX-512 build)
    or 4 (AVX2) at a time, each product rounded and added in order, then (`epilogue`, Intel tuning) 4 more the same
    way when the w-wide loop ran at least twice and more than 4 remain, then the rest fused (FMA)."""
    n = a.shape[0]
    w = 8 if F32_EPR == 16 else 4
    n8 = start + (n - start) // w * w
    if epilogue and n8 - start >= 16 and n - n8 > 4:
        n8 += 4
    for i in range(start, n8):
        sf = _F32(sf + _F32(a[i] * b[i]))
    for i in range(n8, n):
        sf = fma32(a[i], b[i], sf)
    return sf


# -- SwiGLU ------------------------------------------------------------------------------------------------------


@numba.njit(cache=True, error_model="numpy")
def swiglu_row(g, go, u, uo, k, y, yo):  # pragma: no cover - compiled
    """y[yo:yo+k] = silu(g[go:go+k]) * u[uo:uo+k] (1-D buffers): `ggml_v_silu` on F32_EPR lanes, then a scalar tail
    with libm expf. Slices and numpy's error model (no ZeroDivisionError branch: 1 + e^-x is never 0) let LLVM
    vectorize the loop (several times faster than the scalar loop, with the same bits)."""
    k16 = k // F32_EPR * F32_EPR
    gv, uv, yv = g[go : go + k16], u[uo : uo + k16], y[yo : yo + k16]
    for i in range(k16):  # ggml_v_silu: x / (1 + v_expf(0 - x)), then * g
        x = gv[i]
        yv[i] = (x / (_F32(1.0) + v_expf(_F32(0.0) - x))) * uv[i]
    for i in range(k16, k):  # the scalar tail: ggml_silu_f32 with libm expf
        x = g[go + i]
        y[yo + i] = (x / (_F32(1.0) + math.exp(-x))) * u[uo + i]


@numba.njit(parallel=True, cache=True)
def _swiglu_rows(gate, up, out):  # pragma: no cover - compiled
    n, k = gate.shape
    for r in numba.prange(n):
        swiglu_row(gate[r], 0, up[r], 0, k, out[r], 0)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up as `ggml_vec_swiglu_f32` (ggml-cpu/vec.cpp): F32_EPR-lane `ggml_v_silu` then a scalar tail.
    (n, k) float32 -> (n, k) float32"""
    g = np.ascontiguousarray(gate, np.float32).reshape(-1, gate.shape[-1])
    u = np.ascontiguousarray(up, np.float32).reshape(g.shape)
    out = np.empty_like(g)  # (n, k)
    _swiglu_rows(g, u, out)
    return out.reshape(gate.shape)


# -- tanh (soft-capping) -----------------------------------------------------------------------------------------

@numba.njit(cache=True)
def tanhf(x):  # pragma: no cover - compiled
    """libm tanhf of a float32 (ggml_vec_tanh_f32 and flash attention's soft-cap call it; numpy's own SIMD tanh
    differs from it by an ulp in a third of the inputs)."""
    return _F32(math.tanh(_F32(x)))


@numba.njit(parallel=True, cache=True)
def _tanh_rows(x, out):  # pragma: no cover - compiled
    n, k = x.shape
    for r in numba.prange(n):
        for i in range(k):
            out[r, i] = tanhf(x[r, i])


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap) as llama.cpp's graphs build it: ggml_scale(x, 1.0f / cap) (a float32 product, not a
    division), ggml_tanh (libm tanhf per element), ggml_scale(cap). (..., k) float32 -> (..., k) float32"""
    cap32 = _F32(cap)
    y = np.ascontiguousarray(x, np.float32) * (_F32(1.0) / cap32)
    flat = y.reshape(-1, y.shape[-1]) if y.ndim else y.reshape(1, 1)
    out = np.empty_like(flat)  # (rows, k)
    _tanh_rows(flat, out)
    return out.reshape(y.shape) * cap32


# -- GELU table --------------------------------------------------------------------------------------------------

_GELU_COEF_A = _F32(0.044715)
_SQRT_2_OVER_PI = _F32(0.79788456080286535587989211986876)


@numba.njit(cache=True)
def _gelu_f16_inputs(x, out):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        v = x[i]
        inner = _SQRT_2_OVER_PI * v * fma32(_GELU_COEF_A * v, v, _F32(1.0))  # contracted 1 + A*x*x
        out[i] = _F32(0.5) * v * (_F32(1.0) + math.tanh(inner))


def gelu_table() -> np.ndarray:
    """`ggml_table_gelu_f16` (ggml-cpu.c, ggml_cpu_init): ggml_gelu_f32 of every f16 value, stored as f16.
    -> (65536,) float32 holding the f16 values"""
    x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)  # (65536,)
    y = np.empty_like(x)
    with np.errstate(all="ignore"):
        _gelu_f16_inputs(x, y)
    return y.astype(np.float16).astype(np.float32)


@numba.njit(cache=True)
def geglu_row(g, go, u, uo, k, table, y, yo):  # pragma: no cover - compiled
    """y[yo:yo+k] = gelu(g) * u through the f16 table (`ggml_vec_geglu_f32` under GGML_GELU_FP16): x <= -10 gives
    +0 (not 0 * u, which is -0 for a negative u), x >= 10 gives x * u, else table[f16(x)] * u."""
    for i in range(k):
        x = g[go + i]
        if x <= _F32(-10.0):
            y[yo + i] = _F32(0.0)
        elif x >= _F32(10.0):
            y[yo + i] = x * u[uo + i]
        else:
            y[yo + i] = table[f16_bits(x)] * u[uo + i]


@numba.njit(parallel=True, cache=True)
def _geglu_rows(gate, up, table, out):  # pragma: no cover - compiled
    n, k = gate.shape
    for r in numba.prange(n):
        geglu_row(gate[r], 0, up[r], 0, k, table, out[r], 0)


def geglu(gate: np.ndarray, up: np.ndarray, table: np.ndarray) -> np.ndarray:
    """gelu(gate) * up with the table of `gelu_table`. (n, k) float32 -> (n, k) float32"""
    g = np.ascontiguousarray(gate, np.float32).reshape(-1, gate.shape[-1])
    u = np.ascontiguousarray(up, np.float32).reshape(g.shape)
    out = np.empty_like(g)  # (n, k)
    _geglu_rows(g, u, table, out)
    return out.reshape(gate.shape)


@numba.njit(parallel=True, cache=True)
def _gelu_rows(x, table, out):  # pragma: no cover - compiled
    n, k = x.shape
    for r in numba.prange(n):
        for i in range(k):
            v = x[r, i]
            if v <= _F32(-10.0):
                out[r, i] = _F32(0.0)
            elif v >= _F32(10.0):
                out[r, i] = v
            else:
                out[r, i] = table[f16_bits(v)]


def gelu(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """`ggml_vec_gelu_f32` under GGML_GELU_FP16 (ggml_gelu): x <= -10 gives 0, x >= 10 gives x, else the table
    of `gelu_table` at f16(x). (..., k) float32 -> (..., k) float32"""
    xr = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    out = np.empty_like(xr)  # (rows, k)
    _gelu_rows(xr, table, out)
    return out.reshape(x.shape)


# -- LayerNorm ---------------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def norm_row(x, k, eps, y):  # pragma: no cover - compiled
    """y[:k] = (x - mean) / sqrt(var + eps), `ggml_compute_forward_norm_f32`: the sum in double in order
    (ggml_vec_sum_f32), mean = (float)sum / k in float; `ggml_vec_cvar_f32`: x - mean stored, the squares of each
    F32_EPR-lane vector reduced as the target's horizontal add (_mm512_reduce_add_ps / the AVX2 hadd tree) and
    summed in double, the tail one by one in double, divided by k in double and rounded to float; 1/sqrtf in
    float, then ggml_vec_scale_f32."""
    s = 0.0
    for i in range(k):
        s += np.float64(x[i])
    mean = _F32(s) / _F32(k)
    sq = np.empty(F32_EPR, np.float32)
    acc = 0.0
    i = 0
    while i + F32_EPR <= k:
        for j in range(F32_EPR):
            v = x[i + j] - mean
            y[i + j] = v
            sq[j] = v * v
        acc += np.float64(hsum_vec(sq, 0))
        i += F32_EPR
    while i < k:
        v = x[i] - mean
        y[i] = v
        acc += np.float64(v * v)
        i += 1
    variance = _F32(acc / k)
    scale = _F32(1.0) / np.sqrt(variance + eps)
    for i in range(k):
        y[i] = y[i] * scale


@numba.njit(parallel=True, cache=True)
def _norm_rows(x, eps, out):  # pragma: no cover - compiled
    n, k = x.shape
    for r in numba.prange(n):
        norm_row(x[r], k, eps, out[r])


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """build_norm(LLM_NORM): ggml_norm (`norm_row`), then ggml_mul by the weight and ggml_add of the bias, each
    rounded to float. (..., k) float32 -> (..., k) float32"""
    xr = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    out = np.empty_like(xr)  # (rows, k)
    _norm_rows(xr, _F32(eps), out)
    out = out * np.asarray(weight, np.float32) + np.asarray(bias, np.float32)  # two roundings, as two ggml ops
    return out.reshape(x.shape)


# -- RMSNorm -----------------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def rms_norm_row(x, xo, k, w, eps, y, yo):  # pragma: no cover - compiled
    """y[yo:yo+k] = rms_norm(x[xo:xo+k]) * w (1-D buffers): squares (float) summed in order in double, mean and
    1/sqrtf in float, x * scale * w."""
    s = 0.0
    for i in range(k):
        s += np.float64(x[xo + i] * x[xo + i])
    mean = _F32(s / k)
    scale = _F32(1.0) / np.sqrt(mean + eps)
    for i in range(k):
        y[yo + i] = (x[xo + i] * scale) * w[i]


@numba.njit(parallel=True, cache=True)
def _rms_norm_rows(x, w, eps, out):  # pragma: no cover - compiled
    n, k = x.shape
    for r in numba.prange(n):
        rms_norm_row(x[r], 0, k, w, eps, out[r], 0)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """`ggml_compute_forward_rms_norm_f32` then `ggml_mul`: squares (float) summed in order in double, mean and
    1/sqrtf in float, x * scale * w. (..., k) float32 -> (..., k) float32"""
    xr = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    out = np.empty_like(xr)  # (rows, k)
    _rms_norm_rows(xr, np.ascontiguousarray(weight, np.float32), _F32(eps), out)
    return out.reshape(x.shape)


# -- RoPE --------------------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _rope_cache(pos, n_half, theta_scale, freq_scale, mscale, freq_factors, corr0, corr1, ext_factor, yarn_mscale,
                cos, sin):  # pragma: no cover - compiled
    for t in range(pos.shape[0]):
        theta = _F32(pos[t])
        for i in range(n_half):
            theta_extrap = theta / freq_factors[i]
            th = freq_scale * theta_extrap  # theta_interp
            ms = mscale
            if ext_factor != 0.0:  # rope_yarn: ramp between interpolation and extrapolation
                y = (_F32(i) - corr0) / max(_F32(0.001), corr1 - corr0)
                ramp_mix = (_F32(1.0) - min(_F32(1.0), max(_F32(0.0), y))) * ext_factor
                th = fma32(th, _F32(1.0) - ramp_mix, theta_extrap * ramp_mix)
                ms = mscale * yarn_mscale
            cos[t, i] = math.cos(th) * ms
            sin[t, i] = math.sin(th) * ms
            theta = theta * theta_scale


@numba.njit(cache=True)
def _powf(a, b):  # pragma: no cover - compiled
    return math.pow(a, b)


def rope_cache(pos: np.ndarray, rp) -> tuple[np.ndarray, np.ndarray]:
    """`ggml_rope_cache_init` + `rope_yarn` for one layer's RopeParams: theta_scale = powf(base, -2/n_rot); theta
    starts at the position and is multiplied by theta_scale pair by pair in float, divided by the pair's frequency
    factor (Llama 3's rope_freqs); with YaRN (ext_factor != 0) mixed between interpolation and extrapolation by
    the ramp over ggml_rope_yarn_corr_dims, magnitude times 1 + 0.1 logf(1/freq_scale); cosf/sinf from libm,
    times attn_factor. -> cos, sin: (n, n_rot/2) float32"""
    n_half = rp.n_rot // 2
    theta_scale = _powf(_F32(rp.freq_base), _F32(-2.0) / _F32(rp.n_rot))
    ff = np.ones(n_half, np.float32) if rp.freq_factors is None else np.asarray(rp.freq_factors, np.float32)
    corr0, corr1, yarn_mscale = 0.0, 0.0, 1.0
    if rp.ext_factor != 0.0:
        corr0, corr1 = yarn_corr_dims(rp.n_rot, rp.n_ctx_orig, rp.freq_base, rp.beta_fast, rp.beta_slow)
        yarn_mscale = libm().fmaf(0.1, libm().logf(float(_F32(1.0) / _F32(rp.freq_scale))), 1.0)
    cos = np.empty((len(pos), n_half), np.float32)  # (n, n_rot/2)
    sin = np.empty_like(cos)
    _rope_cache(np.ascontiguousarray(pos, np.int64), n_half, _F32(theta_scale), _F32(rp.freq_scale),
                _F32(rp.attn_factor), ff, _F32(corr0), _F32(corr1), _F32(rp.ext_factor), _F32(yarn_mscale), cos, sin)
    return cos, sin


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims in float32 with libm's logf: the first and last pair the YaRN ramp mixes over."""
    f32 = np.float32

    def corr_dim(n_rot: float) -> float:
        x = f32(n_ctx_orig) / (f32(n_rot) * f32(2) * f32(math.pi))
        return float(f32(n_dims) * f32(libm().logf(float(x))) / (f32(2) * f32(libm().logf(float(f32(freq_base))))))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return float(max(0, start)), float(min(n_dims - 1, end))


@numba.njit(cache=True)
def rope_row(x, xo, n_head, d, cos, sin, t, n_rot, neox, y, yo):  # pragma: no cover - compiled
    """Token t's n_head heads of size d at x[xo:] rotated into y[yo:] (1-D buffers) with row t of the cos / sin
    tables, as GCC contracts `rotate_pairs`; dimensions past n_rot pass through."""
    half = n_rot // 2
    for h in range(n_head):
        xh, yh = xo + h * d, yo + h * d
        for i in range(half):
            i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x0 = x[xh + i0]
            x1 = x[xh + i1]
            c = cos[t, i]
            s = sin[t, i]
            y[yh + i0] = fma32(x0, c, -(x1 * s))  # x0*cos - x1*sin, first product fused
            y[yh + i1] = fma32(x0, s, x1 * c)
        for i in range(n_rot, d):
            y[yh + i] = x[xh + i]


@numba.njit(parallel=True, cache=True)
def _rope_rotate(x, cos, sin, n_rot, neox, out):  # pragma: no cover - compiled
    n, n_head, d = x.shape
    for t in numba.prange(n):
        rope_row(x[t].reshape(-1), 0, n_head, d, cos, sin, t, n_rot, neox, out[t].reshape(-1), 0)


def rope_rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """`rotate_pairs` (ggml-cpu/ops.cpp) as GCC contracts it. x (n, n_head, d) float32; NORM rotates
    (x[2i], x[2i+1]), NEOX (x[i], x[i + n_rot/2]); dimensions past n_rot pass through."""
    xc = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(xc)  # (n, n_head, d)
    _rope_rotate(xc, cos, sin, n_rot, neox, out)
    return out

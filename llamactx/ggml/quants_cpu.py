"""The quantizers ggml's CPU backend applies to activations and to a quantized KV cache, as built for x86.

A matmul against quantized weights first converts each activation row to the weight type's `vec_dot_type`
(ggml-cpu.c `type_traits_cpu[type].vec_dot_type` / `.from_float`) and then takes integer dot products per
block. These functions produce those blocks byte for byte as an x86 build with AVX2/AVX-512 does:

- Q8_0 and Q8_1 use the AVX path of ggml-cpu/arch/x86/quants.c `quantize_row_q8_0` / `quantize_row_q8_1`:
  id = 127 / amax (one division, not 1 / d), x * id rounded with `_mm256_round_ps(_MM_ROUND_NEAREST)`, i.e.
  ties to even, converted with `_mm256_cvtps_epi32` and saturated by `packs`. d = amax / 127 is stored as f16
  via F16C `_cvtss_sh(d, 0)` (round to nearest even, as numpy's astype(float16)). Q8_1's s is
  f16(d * sum(q)) with the f32 d (not the f16 one) and the int32 quants before saturation.
  ggml's *reference* `quantize_row_q8_0_ref` (and gguf-py's numpy copy of it) instead uses id = 1 / d and
  roundf (ties away from zero); the two differ on ties and where 1/d and 127/amax round apart.
- Q8_K: on x86 `quantize_row_q8_K` just calls ggml-quants.c `quantize_row_q8_K_ref`: signed max of the
  first element with the largest |x|, iscale = -127 / max, q = nearest_int(iscale * x) (the 1.5 * 2^23
  trick: ties to even), d = 1 / iscale stored as f32, bsums = sums of 16 quants.
- Q4_0 (the KV cache type): ggml-cpu/quants.c `quantize_row_q4_0` calls `quantize_row_q4_0_ref`:
  d = max / -8 (signed max), q = min(15, trunc(x / d + 8.5)), d stored with the software RNE fp32->fp16.

Non-finite activations are out of scope: NaN/inf blocks follow numpy's max, not the SIMD max order.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

GGMLType = GGMLQuantizationType

QK8_0 = 32
QK4_0 = 32
QK8_1 = 32
QK_K = 256

# ggml-cpu.c type_traits_cpu[].vec_dot_type, for the types gguf-py knows.
_VEC_DOT_TYPE: dict[int, int] = {
    GGMLType.F32: GGMLType.F32,
    GGMLType.F16: GGMLType.F16,
    GGMLType.BF16: GGMLType.BF16,
    GGMLType.Q4_0: GGMLType.Q8_0,
    GGMLType.Q4_1: GGMLType.Q8_1,
    GGMLType.Q5_0: GGMLType.Q8_0,
    GGMLType.Q5_1: GGMLType.Q8_1,
    GGMLType.Q8_0: GGMLType.Q8_0,
    GGMLType.Q8_1: GGMLType.Q8_1,
    GGMLType.Q1_0: GGMLType.Q8_0,
    GGMLType.MXFP4: GGMLType.Q8_0,
    GGMLType.NVFP4: GGMLType.Q8_0,
    GGMLType.IQ4_NL: GGMLType.Q8_0,
    GGMLType.Q2_K: GGMLType.Q8_K,
    GGMLType.Q3_K: GGMLType.Q8_K,
    GGMLType.Q4_K: GGMLType.Q8_K,
    GGMLType.Q5_K: GGMLType.Q8_K,
    GGMLType.Q6_K: GGMLType.Q8_K,
    GGMLType.IQ2_XXS: GGMLType.Q8_K,
    GGMLType.IQ2_XS: GGMLType.Q8_K,
    GGMLType.IQ2_S: GGMLType.Q8_K,
    GGMLType.IQ3_XXS: GGMLType.Q8_K,
    GGMLType.IQ3_S: GGMLType.Q8_K,
    GGMLType.IQ1_S: GGMLType.Q8_K,
    GGMLType.IQ1_M: GGMLType.Q8_K,
    GGMLType.IQ4_XS: GGMLType.Q8_K,
    GGMLType.TQ1_0: GGMLType.Q8_K,
    GGMLType.TQ2_0: GGMLType.Q8_K,
}


def vec_dot_type(weight_type: int) -> int:
    """The type activations are converted to before a dot product with `weight_type` weights.

    Follows ggml-cpu.c `type_traits_cpu[weight_type].vec_dot_type`. Raises ValueError for a type with no
    vec_dot (Q8_K, the integer types) or an unknown id.
    """
    vdt = _VEC_DOT_TYPE.get(int(weight_type))
    if vdt is None:
        raise ValueError(f"ggml type {int(weight_type)} has no vec_dot_type (not usable as a matmul weight)")
    return int(vdt)


def _blocks(x: np.ndarray, block: int, what: str) -> np.ndarray:
    """`x` (..., n) as float32 `(..., n // block, block)`; ValueError unless n is a multiple of block."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or n % block != 0:
        raise ValueError(f"{what}: row length {n} must be a multiple of {block} (x.shape = {x.shape})")
    return x.reshape(*x.shape[:-1], n // block, block)


def _simd_round_to_int(v: np.ndarray) -> np.ndarray:
    """`_mm256_round_ps(v, _MM_ROUND_NEAREST)`, `_mm256_cvtps_epi32` and int32 output: ties to even, and
    NaN or |v| >= 2^31 become INT32_MIN (x86's "integer indefinite")."""
    r = np.rint(v)  # (..., 32) float32, ties to even
    ok = np.abs(r) < np.float32(2.0**31)  # False for NaN too
    return np.where(ok, r, np.float32(-(2.0**31))).astype(np.int32)  # (..., 32)


def _q8_simd(x: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shared AVX body of x86 `quantize_row_q8_0` / `quantize_row_q8_1` (arch/x86/quants.c).

    Returns (d f32 (..., nb), qi int32 (..., nb, 32) before saturation, q int8 (..., nb, 32) as stored).
    """
    b = _blocks(x, QK8_0, what)  # (..., nb, 32)
    amax = np.abs(b).max(axis=-1)  # (..., nb)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = amax / np.float32(127.0)  # (..., nb)
        id_ = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)  # (..., nb)
        qi = _simd_round_to_int(b * id_[..., None])  # (..., nb, 32)
    q = np.clip(qi, -128, 127).astype(np.int8)  # packs_epi32 + packs_epi16 saturation
    return d, qi, q


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Quantize rows of float32 to Q8_0 blocks as x86 ggml-cpu does (`quantize_row_q8_0`, AVX path).

    x: (..., n) with n % 32 == 0. Returns uint8 (..., n // 32 * 34): per block f16 d then int8 qs[32]
    (ggml-common.h `block_q8_0`). Raises ValueError for a row length that is not whole blocks.
    """
    d, _, q = _q8_simd(x, "quantize_q8_0")
    out = np.empty((*q.shape[:-1], 34), dtype=np.uint8)  # (..., nb, 34)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:34] = q.view(np.uint8)
    return out.reshape(*out.shape[:-2], -1)


def quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """Quantize rows of float32 to Q8_1 blocks as x86 ggml-cpu does (`quantize_row_q8_1`, AVX2 path).

    x: (..., n) with n % 32 == 0. Returns uint8 (..., n // 32 * 36): per block f16 d, f16 s, int8 qs[32]
    (ggml-common.h `block_q8_1`), where s = f16(d * sum(q)) with the f32 d. Raises ValueError as above.
    """
    d, qi, q = _q8_simd(x, "quantize_q8_1")
    qsum = qi.sum(axis=-1, dtype=np.int32)  # (..., nb): hsum_i32_8 of the cvtps_epi32 results
    with np.errstate(over="ignore", invalid="ignore"):
        s = d * qsum.astype(np.float32)  # (..., nb) f32 product, then one rounding to f16
    out = np.empty((*q.shape[:-1], 36), dtype=np.uint8)  # (..., nb, 36)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:4] = s.astype(np.float16)[..., None].view(np.uint8)
    out[..., 4:36] = q.view(np.uint8)
    return out.reshape(*out.shape[:-2], -1)


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml-quants.c `nearest_int`: add 1.5 * 2^23 in f32 (round to nearest even) and read the low bits."""
    bits = (v + np.float32(12582912.0)).view(np.int32)  # (...,)
    return (bits & 0x007FFFFF) - 0x00400000


def _q8_K_parts(x: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_row_q8_K_ref` (ggml-quants.c): (d f32 (..., nb), q int8 (..., nb, 256))."""
    b = _blocks(x, QK_K, what)  # (..., nb, 256)
    first = np.abs(b).argmax(axis=-1)[..., None]  # (..., nb, 1): first index of the largest |x|
    vmax = np.take_along_axis(b, first, axis=-1)  # (..., nb, 1) signed
    zero = vmax == 0  # (..., nb, 1): all-zero block -> d = 0, qs = 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.where(zero, np.float32(0.0), np.float32(-127.0) / vmax).astype(np.float32)  # (..., nb, 1)
        q = np.minimum(_nearest_int(iscale * b), 127).astype(np.int8)  # (..., nb, 256)
        d = np.where(zero, np.float32(0.0), np.float32(1.0) / iscale).astype(np.float32)  # (..., nb, 1)
    return d[..., 0], q


def quantize_q8_K(x: np.ndarray) -> np.ndarray:
    """Quantize rows of float32 to Q8_K blocks as x86 ggml-cpu does (`quantize_row_q8_K` -> `_ref`).

    x: (..., n) with n % 256 == 0. Returns uint8 (..., n // 256 * 292): per block f32 d, int8 qs[256],
    int16 bsums[16] (ggml-common.h `block_q8_K`). For an all-zero block ggml leaves bsums unwritten; here they
    are 0. (The repacked Q4_K prefill path, arch/x86/repack.cpp `ggml_quantize_mat_q8_K_4x8`, prefers +amax
    over -amax when both occur; that flips the signs of d and q but not d * q.) Raises ValueError as above.
    """
    d, q = _q8_K_parts(x, "quantize_q8_K")
    bsums = q.reshape(*q.shape[:-1], 16, 16).sum(axis=-1, dtype=np.int16)  # (..., nb, 16)
    out = np.empty((*q.shape[:-1], 292), dtype=np.uint8)  # (..., nb, 292)
    out[..., 0:4] = d[..., None].view(np.uint8)
    out[..., 4:260] = q.view(np.uint8)
    out[..., 260:292] = bsums.astype("<i2").view(np.uint8)
    return out.reshape(*out.shape[:-2], -1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """Quantize rows of float32 to Q4_0 blocks (ggml-quants.c `quantize_row_q4_0_ref`), e.g. a KV cache.

    x: (..., n) with n % 32 == 0. Returns uint8 (..., n // 32 * 18): per block f16 d then 16 bytes whose low
    nibbles are elements 0-15 and high nibbles 16-31 (ggml-common.h `block_q4_0`). Raises ValueError as above.
    """
    b = _blocks(x, QK4_0, "quantize_q4_0")  # (..., nb, 32)
    first = np.abs(b).argmax(axis=-1)[..., None]  # (..., nb, 1): first index of the largest |x|
    vmax = np.take_along_axis(b, first, axis=-1)  # (..., nb, 1) signed
    # the C scan starts from max = +0.0 and only replaces it on a strictly larger |x|: an all-zero block
    # (even one of -0.0s) gets d = +0.0 / -8 = -0.0
    vmax = np.where(vmax == 0, np.float32(0.0), vmax)
    d = vmax / np.float32(-8.0)  # (..., nb, 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        id_ = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)  # (..., nb, 1)
        v = b * id_ + np.float32(8.5)  # (..., nb, 32) f32: two roundings, as the C expression
    q = np.minimum(np.trunc(v), 15).astype(np.uint8)  # (int8_t) cast truncates toward zero; v >= 0.5 here
    out = np.empty((*b.shape[:-1], 18), dtype=np.uint8)  # (..., nb, 18)
    out[..., 0:2] = d.astype(np.float16).view(np.uint8)
    out[..., 2:18] = q[..., :16] | (q[..., 16:] << 4)
    return out.reshape(*out.shape[:-2], -1)


def fake_quant(x: np.ndarray, vec_dot_type: int) -> np.ndarray:
    """What activations look like to ggml's integer dot product: quantize to `vec_dot_type`, decode back.

    x: float32 (..., n). Q8_0 / Q8_1 give f16(d) * q, Q8_K gives d * q (f32 d), F16 / BF16 the rounded
    values (F16C / ggml_compute_fp32_to_bf16, both round to nearest even), F32 a copy. Returns float32
    (..., n). Raises ValueError for another type or a row length that is not whole blocks.
    """
    t = int(vec_dot_type)
    if t in (GGMLType.Q8_0, GGMLType.Q8_1):
        d, _, q = _q8_simd(x, "fake_quant")
        d16 = d.astype(np.float16).astype(np.float32)[..., None]  # (..., nb, 1)
        return np.multiply(q, d16, dtype=np.float32).reshape(np.shape(x))
    if t == GGMLType.Q8_K:
        d, q = _q8_K_parts(x, "fake_quant")
        return np.multiply(q, d[..., None], dtype=np.float32).reshape(np.shape(x))
    xf = np.array(x, dtype=np.float32)  # (..., n) copy
    if t == GGMLType.F32:
        return xf
    if t == GGMLType.F16:
        with np.errstate(over="ignore"):  # |x| >= 65520 becomes inf, as F16C does
            return xf.astype(np.float16).astype(np.float32)
    if t == GGMLType.BF16:
        return _round_bf16(xf)
    raise ValueError(f"fake_quant: vec_dot_type {t} is not one of F32, F16, BF16, Q8_0, Q8_1, Q8_K")


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """ggml-impl.h `ggml_compute_fp32_to_bf16`: round to nearest even, NaN forced quiet. float32 -> uint16 bits"""
    u = x.view(np.uint32)  # (...,)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u.astype(np.uint64) + (0x7FFF + ((u >> 16) & 1))) >> 16
    return np.where(nan, (u >> 16) | np.uint32(64), rounded).astype(np.uint16)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """`bf16_bits` and back to float32."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)

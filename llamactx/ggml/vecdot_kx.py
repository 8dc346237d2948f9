"""Q2_K, Q3_K, Q5_K and IQ4_XS matmuls, and Q4_K where it is not repacked (ne1 % 8 != 0; llamactx.ggml.vecdot_k has the
repacked one), as llama.cpp's x86 CPU backend (build 0c1e570) computes them, bit for bit.

The activations are quantized to Q8_K (`quantize_row_q8_K_ref`, llamactx.ggml.vecdot_k). Every integer sum is
exact (no int16 pair of `maddubs` can saturate with these codes), so only where integers become floats and how
those floats are accumulated has to be copied. Each weight is unpacked once into the same five arrays: its integer
code per element (the value that multiplies q8: Q3_K's q - 4 without the high bit, IQ4_XS's codebook entry), a
scale and a min per 16 elements (32-element sub-blocks repeat theirs), and the super-block's f16 d and dmin.
Which kernel runs (ggml-cpu.c `ggml_compute_forward_mul_mat`, repack.cpp, tiled/tiled.cpp):

- Q2_K with ne1 % 8 == 0 in an AVX-512 build is repacked at load into `block_q2_Kx8` (repack.cpp
  `ggml_repack_get_optimal_repack_type`; not in an AVX2 build). Activation rows in groups of four go through
  `ggml_gemm_q2_K_8x8_q8_K` (arch/x86/repack.cpp), one FMA per 128 elements: acc = fma(float(isum), d_w*d_x,
  acc), acc_min = fma(float(sum m*bsum), dmin_w*d_x, acc_min); the last n % 4 rows through
  `ggml_gemv_q2_K_8x8_q8_K`, one FMA per super-block. The result is acc - acc_min.
- otherwise n >= 8 runs the tiled kernel (tiled-kernel.cpp `tiled_run_micro_vnni_8x16`, and its AVX2 twin
  `tiled_run_microtile_avx2`, same float steps): per super-block s1 = sum sc*dot, s2 = sum m*bsum (ints),
  result = float(s1) * d_w, then `fnmadd(dmin_w, float(s2), result)` for Q2_K / Q5_K, out = fma(result, d_x, out).
- and n < 8 runs `ggml_vec_dot_*_q8_K` (arch/x86/quants.c, the AVX2 code in both builds): 8 int32 lanes per
  super-block, lane j = sum over the eight 32-element groups of sc * (the 4 products at bytes 4j..4j+3), then
  acc_j = fma(d_x*d_w, float(lane_j), acc_j) and hsum_float_8. Q2_K first adds its mins into the same lanes
  (acc_j = fma(-d_x*dmin_w, float(m[2j]*bsum[2j] + m[2j+1]*bsum[2j+1]), acc_j)); Q5_K sums them apart
  (summs = fma(-d_x*dmin_w, float(sum m*bsum), summs), result hsum_float_8(acc) + summs); Q4_K in 4 lanes of
  its own (acc_m_i = fma(-d_x*dmin_w, float(sub-blocks 2i, 2i+1), acc_m_i), result hsum_float_8(acc) +
  ((m0 + m2) + (m1 + m3))).
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.vec import hsum_float_8
from llamactx.ggml.vecdot_k import quantize_activations_k
from llamactx.gguf.block_fields import SHIFT_2BIT, bit_planes, crumbs, f16_field, nibbles_k
from llamactx.gguf.quants import block_format
from llamactx.gguf.quants_iq import iq4_xs_codes
from llamactx.gguf.quants_k import scale_min_k4

KX_TYPES = (T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_XS)  # and Q4_K where is_exact_k (llamactx.ggml.vecdot_k) is False
_F32 = np.float32
_TILED_MIN_ROWS = 8  # tiled.cpp `ggml_tiled_min_batch`
# the float steps of ggml_vec_dot_*_q8_K: plain lanes, Q2_K's mins in the lanes, Q5_K's mins summed apart
_VEC_PLAIN, _VEC_MIN_LANES, _VEC_MIN_APART, _VEC_MIN_4 = 0, 1, 2, 3


def _per16(a: np.ndarray) -> np.ndarray:
    """(n, 8) values of 32-element sub-blocks -> (n, 16), one per 16 elements."""
    return np.repeat(a.astype(np.int32), 2, axis=1)


def _unpack_blocks(t: int, blocks: np.ndarray) -> tuple[np.ndarray, ...]:
    """One type's super-blocks (n, type_size) -> codes int8 (n, 256), scales and mins int32 (n, 16), d and dmin
    f32 (n,)."""
    n = blocks.shape[0]
    zero = np.zeros(n, np.float32)
    if t == T.Q2_K:  # scales[16] (4-bit scale | 4-bit min), qs[64], f16 d, f16 dmin
        q = crumbs(blocks[:, 16:80]).view(np.int8)  # (n, 8, 32)
        sc = blocks[:, 0:16]
        return (q.reshape(n, 256), (sc & 0xF).astype(np.int32), (sc >> 4).astype(np.int32),
                f16_field(blocks, 80)[:, 0], f16_field(blocks, 82)[:, 0])
    if t == T.Q3_K:  # hmask[32], qs[64], scales[12] (6-bit, offset 32), f16 d
        packed = blocks[:, 96:108]
        low = np.concatenate([packed[:, 0:8] & 0x0F, packed[:, 0:8] >> 4], axis=1)  # (n, 16)
        high = (packed[:, None, 8:12] >> SHIFT_2BIT[0]) & np.uint8(3)  # (n, 4, 4)
        sc = (low | (high.reshape(n, 16) << 4)).astype(np.int32) - 32  # (n, 16)
        q = (crumbs(blocks[:, 32:96]) | (bit_planes(blocks[:, 0:32]) << 2)).view(np.int8) - np.int8(4)
        return q.reshape(n, 256), sc, np.zeros_like(sc), f16_field(blocks, 108)[:, 0], zero
    if t == T.Q4_K:  # f16 d, f16 dmin, scales[12], qs[128]
        sc, mn = scale_min_k4(blocks[:, 4:16])  # (n, 8) each
        q = nibbles_k(blocks[:, 16:144]).view(np.int8)  # (n, 8, 32)
        return (q.reshape(n, 256), _per16(sc), _per16(mn), f16_field(blocks, 0)[:, 0],
                f16_field(blocks, 2)[:, 0])
    if t == T.Q5_K:  # f16 d, f16 dmin, scales[12], qh[32], qs[128]
        sc, mn = scale_min_k4(blocks[:, 4:16])  # (n, 8) each
        q = (nibbles_k(blocks[:, 48:176]) | (bit_planes(blocks[:, 16:48]) << 4)).view(np.int8)  # (n, 8, 32)
        return (q.reshape(n, 256), _per16(sc), _per16(mn), f16_field(blocks, 0)[:, 0],
                f16_field(blocks, 2)[:, 0])
    q, ls = iq4_xs_codes(blocks)  # IQ4_XS: (n, 256), (n, 8)
    return q, _per16(ls), np.zeros((n, 16), np.int32), f16_field(blocks, 0)[:, 0], zero


def unpack_weight_kx(weight) -> tuple[np.ndarray, ...]:
    """codes int8 (rows, k), scales and mins int32 (rows, k/16), d and dmin f32 (rows, k/256)."""
    rows = weight.n_rows
    blocks = weight.data.reshape(-1, block_format(weight.ggml_type).type_size)  # (rows * nb, type_size)
    q, sc, mn, d, dmin = _unpack_blocks(weight.ggml_type, blocks)
    return (np.ascontiguousarray(q).reshape(rows, -1), sc.reshape(rows, -1), mn.reshape(rows, -1),
            d.reshape(rows, -1), dmin.reshape(rows, -1))


@numba.njit(cache=True)
def _sums16(wr, xt, out):  # pragma: no cover - compiled
    """Dot products of 16-element groups: out[g] = sum of wr[16g + e] * xt[16g + e]."""
    for g in range(out.shape[0]):
        s = 0
        for e in range(16 * g, 16 * g + 16):
            s += np.int32(wr[e]) * np.int32(xt[e])
        out[g] = s


@numba.njit(parallel=True, cache=True)
def _repacked_q2_k(qw, sc, mn, dw, dmw, qx, dx, bsums, n_gemm, out):  # pragma: no cover - compiled
    rows, k = qw.shape
    n = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(rows):
        dots = np.empty(k // 16, np.int32)
        for t in range(n):
            _sums16(qw[r], qx[t], dots)
            acc = _F32(0.0)
            acc_min = _F32(0.0)
            for b in range(nb):
                dd = dw[r, b] * dx[t, b]
                dm = dmw[r, b] * dx[t, b]
                isum_b = 0
                imin_b = 0
                for half in range(2):  # gemm: one FMA per 128 elements (8 groups of 16)
                    isum = 0
                    imin = 0
                    for s in range(b * 16 + half * 8, b * 16 + half * 8 + 8):
                        isum += sc[r, s] * dots[s]
                        imin += mn[r, s] * bsums[t, s]
                    if t < n_gemm:
                        acc = fma32(_F32(isum), dd, acc)
                        acc_min = fma32(_F32(imin), dm, acc_min)
                    isum_b += isum
                    imin_b += imin
                if t >= n_gemm:  # gemv: one FMA per super-block
                    acc = fma32(_F32(isum_b), dd, acc)
                    acc_min = fma32(_F32(imin_b), dm, acc_min)
            out[t, r] = acc - acc_min


@numba.njit(parallel=True, cache=True)
def _tiled(qw, sc, mn, dw, dmw, qx, dx, bsums, has_min, out):  # pragma: no cover - compiled
    rows, k = qw.shape
    n = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(rows):
        dots = np.empty(k // 16, np.int32)
        for t in range(n):
            _sums16(qw[r], qx[t], dots)
            acc = _F32(0.0)
            for b in range(nb):
                s1 = 0
                s2 = 0
                for s in range(b * 16, b * 16 + 16):
                    s1 += sc[r, s] * dots[s]
                    s2 += mn[r, s] * bsums[t, s]
                result = _F32(s1) * dw[r, b]
                if has_min:  # _mm512_fnmadd_ps(dmin, f2, result)
                    result = fma32(-dmw[r, b], _F32(s2), result)
                acc = fma32(result, dx[t, b], acc)  # buf += result * d1, contracted
            out[t, r] = acc


@numba.njit(parallel=True, cache=True)
def _vec_dot(qw, sc, mn, dw, dmw, qx, dx, bsums, mode, out):  # pragma: no cover - compiled
    rows, k = qw.shape
    n = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(rows):
        quads = np.empty(k // 4, np.int32)  # sums of 4 consecutive products
        lanes = np.zeros(8, np.int32)
        acc = np.zeros(8, np.float32)
        acc_m = np.zeros(4, np.float32)
        for t in range(n):
            for i in range(k // 4):
                s = 0
                for e in range(4 * i, 4 * i + 4):
                    s += np.int32(qw[r, e]) * np.int32(qx[t, e])
                quads[i] = s
            acc[:] = 0
            acc_m[:] = 0
            summs = _F32(0.0)
            for b in range(nb):
                d = dx[t, b] * dw[r, b]
                dmin = -dx[t, b] * dmw[r, b]
                if mode == _VEC_MIN_LANES:  # _mm256_madd_epi16(mins, bsums): lane j = sub-blocks 2j, 2j + 1
                    for j in range(8):
                        s0 = b * 16 + 2 * j
                        m = mn[r, s0] * bsums[t, s0] + mn[r, s0 + 1] * bsums[t, s0 + 1]
                        acc[j] = fma32(dmin, _F32(m), acc[j])
                elif mode == _VEC_MIN_4:  # _mm_madd_epi16(mins, pair sums of bsums): lane i = sub-blocks 2i, 2i + 1
                    for i in range(4):
                        m = 0
                        for s in range(b * 16 + 4 * i, b * 16 + 4 * i + 4):
                            m += mn[r, s] * bsums[t, s]
                        acc_m[i] = fma32(dmin, _F32(m), acc_m[i])
                elif mode == _VEC_MIN_APART:
                    m = 0
                    for s in range(b * 16, b * 16 + 16):
                        m += mn[r, s] * bsums[t, s]
                    summs = fma32(dmin, _F32(m), summs)
                lanes[:] = 0
                for g in range(8):  # 32-element groups; lanes 0-3 in sub-block 2g, 4-7 in 2g + 1
                    for j in range(8):
                        lanes[j] += sc[r, b * 16 + 2 * g + j // 4] * quads[b * 64 + g * 8 + j]
                for j in range(8):
                    acc[j] = fma32(d, _F32(lanes[j]), acc[j])
            if mode == _VEC_MIN_4:
                summs = (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3])
            out[t, r] = hsum_float_8(acc) + summs


def is_repacked_kx(weight) -> bool:
    """Whether llama.cpp repacks this weight (Q2_K, ne1 % 8 == 0, an AVX-512 build)."""
    return weight.ggml_type == T.Q2_K and weight.n_rows % 8 == 0 and F32_EPR == 16


def matmul_kx(x: np.ndarray, weight) -> np.ndarray:
    """y = x @ W^T for a Q2_K, Q3_K, Q5_K, IQ4_XS or (not repacked) Q4_K weight with the kernel llama.cpp picks for
    this weight and n (module docstring). (n, k) float32 -> (n, rows) float32. Raises ValueError for another type."""
    t = weight.ggml_type
    if t not in KX_TYPES and t != T.Q4_K:
        raise ValueError(f"matmul_kx: {block_format(t).name} is not one of Q2_K, Q3_K, Q4_K, Q5_K, IQ4_XS")
    n = x.shape[0]
    qx, dx, bsums = quantize_activations_k(x)
    parts = unpack_weight_kx(weight)
    out = np.empty((n, weight.n_rows), np.float32)  # (n, rows)
    if is_repacked_kx(weight):
        _repacked_q2_k(*parts, qx, dx, bsums, n - n % 4, out)
    elif n >= _TILED_MIN_ROWS:
        _tiled(*parts, qx, dx, bsums, t in (T.Q2_K, T.Q4_K, T.Q5_K), out)
    else:
        mode = {T.Q2_K: _VEC_MIN_LANES, T.Q4_K: _VEC_MIN_4, T.Q5_K: _VEC_MIN_APART}.get(t, _VEC_PLAIN)
        _vec_dot(*parts, qx, dx, bsums, mode, out)
    return out

"""Q4_K and Q6_K matmuls as llama.cpp's x86 CPU backend (AVX-512 VNNI build) computes them, bit for bit.

The activations are quantized to Q8_K (`quantize_row_q8_K_ref`; f32 d, int8 q, int16 sums of 16). Every integer
sum below is exact, so what has to match is where the integers become floats and how those are accumulated.
Which kernel runs depends on the weight and on the number of activation rows n (ggml-cpu.c
`ggml_compute_forward_mul_mat`, repack.cpp, tiled/tiled.cpp):

- Q4_K with ne1 % 8 == 0 is repacked at load into `block_q4_Kx8` (repack.cpp
  `ggml_repack_get_optimal_repack_type`). Rows of the activation in groups of four go through
  `ggml_gemm_q4_K_8x8_q8_K`, the last n % 4 rows through `ggml_gemv_q4_K_8x8_q8_K` (arch/x86/repack.cpp). gemm
  converts once per 64 elements: acc = fma(float(sc0*dot0 + sc1*dot1), d_w*d_x, acc) and the same for the mins
  (dmin_w*d_x, m0*bsum0 + m1*bsum1); gemv once per 256-element super-block. The result is acc - acc_min.
- Q6_K (and Q4_K that is not repacked) with n >= 8 runs the tiled kernel (tiled-kernel.cpp,
  `tiled_run_micro_vnni_8x16`): per super-block s1 = sum of sc * (dot - 32 * bsum), result = float(s1) * d_w,
  and the output accumulates out += result * d_x over super-blocks.
- Q6_K with n < 8 runs `ggml_vec_dot_q6_K_q8_K` (arch/x86/quants.c, AVX2): 8 int32 lanes per super-block, lane j
  holding bytes 4j..4j+3 of every 32-element group times their sub-block scale, minus 32 * (bsum * sc) of
  sub-blocks 2j and 2j+1; acc_j = fma(d_x * d_w, float(lane_j), acc_j); hsum_float_8 at the end.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.quants_cpu import quantize_q8_K
from llamactx.ggml.vec import hsum_float_8
from llamactx.gguf.block_fields import crumbs, f16_field, nibbles_k
from llamactx.gguf.quants import block_format
from llamactx.gguf.quants_k import scale_min_k4

_QK_K = 256
_F32 = np.float32
_TILED_MIN_ROWS = 8  # tiled.cpp `ggml_tiled_min_batch`


def quantize_activations_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (n, k) as Q8_K blocks: int8 q (n, k), f32 d (n, k/256), int32 sums of 16 (n, k/16)."""
    n, k = x.shape
    raw = quantize_q8_K(np.ascontiguousarray(x, np.float32)).reshape(n, k // _QK_K, 292)
    d = np.ascontiguousarray(raw[..., 0:4]).view(np.float32).reshape(n, -1)
    q = np.ascontiguousarray(raw[..., 4:260]).view(np.int8).reshape(n, k)
    bsums = np.ascontiguousarray(raw[..., 260:292]).view("<i2").astype(np.int32).reshape(n, -1)
    return q, d, bsums


def _unpack_q4_k(weight) -> tuple[np.ndarray, ...]:
    """q uint8 (rows, k) in 0..15, scales and mins int32 (rows, k/32), d and dmin f32 (rows, k/256)."""
    rows = weight.n_rows
    blocks = weight.data.reshape(-1, block_format(T.Q4_K).type_size)  # (rows * nb, 144)
    sc, mn = scale_min_k4(blocks[:, 4:16])  # (rows * nb, 8)
    q = nibbles_k(blocks[:, 16:144])  # (rows * nb, 8, 32)
    return (
        q.reshape(rows, -1),
        sc.astype(np.int32).reshape(rows, -1),
        mn.astype(np.int32).reshape(rows, -1),
        f16_field(blocks, 0).reshape(rows, -1),
        f16_field(blocks, 2).reshape(rows, -1),
    )


def _unpack_q6_k(weight) -> tuple[np.ndarray, ...]:
    """q uint8 (rows, k) in 0..63 (stored value, offset 32), scales int32 (rows, k/16), d f32 (rows, k/256)."""
    rows = weight.n_rows
    blocks = weight.data.reshape(-1, block_format(T.Q6_K).type_size)  # (rows * nb, 210)
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 64)  # (n, half, 64)
    nib = np.empty((n, 2, 2, 64), dtype=np.uint8)  # (n, half, lo/hi, 64)
    np.bitwise_and(ql, 0x0F, out=nib[:, :, 0])
    np.right_shift(ql, 4, out=nib[:, :, 1])
    q = nib.reshape(n, 8, 32) | (crumbs(blocks[:, 128:192]) << 4)  # (n, 8, 32) in 0..63
    sc = blocks[:, 192:208].view(np.int8).astype(np.int32)  # (n, 16)
    return q.reshape(rows, -1), sc.reshape(rows, -1), f16_field(blocks, 208).reshape(rows, -1)


@numba.njit(cache=True)
def _products(wr, xt, p):  # pragma: no cover - compiled
    for i in range(p.shape[0]):
        p[i] = np.int32(wr[i]) * np.int32(xt[i])


@numba.njit(cache=True)
def _group_sums(p, size, out):  # pragma: no cover - compiled
    for g in range(out.shape[0]):
        s = 0
        for e in range(size):
            s += p[g * size + e]
        out[g] = s


@numba.njit(parallel=True, cache=True)
def _q4_k_repacked(qw, sc, mn, dw, dmw, qx, dx, bsums, n_gemm, out):  # pragma: no cover - compiled
    rows, k = qw.shape
    n = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(rows):
        p = np.empty(k, np.int32)
        dots = np.empty(k // 32, np.int32)  # per 32-element sub-block
        for t in range(n):
            _products(qw[r], qx[t], p)
            _group_sums(p, 32, dots)
            acc = _F32(0.0)
            acc_min = _F32(0.0)
            for b in range(nb):
                dd = dw[r, b] * dx[t, b]
                dm = dmw[r, b] * dx[t, b]
                isum_b = 0
                imin_b = 0
                for sb in range(4):
                    s = b * 8 + 2 * sb
                    isum = sc[r, s] * dots[s] + sc[r, s + 1] * dots[s + 1]
                    imin = mn[r, s] * (bsums[t, 2 * s] + bsums[t, 2 * s + 1]) + mn[r, s + 1] * (
                        bsums[t, 2 * s + 2] + bsums[t, 2 * s + 3]
                    )
                    if t < n_gemm:  # ggml_gemm_q4_K_8x8_q8_K: one FMA per 64 elements
                        acc = fma32(_F32(isum), dd, acc)
                        acc_min = fma32(_F32(imin), dm, acc_min)
                    isum_b += isum
                    imin_b += imin
                if t >= n_gemm:  # ggml_gemv_q4_K_8x8_q8_K: one FMA per super-block
                    acc = fma32(_F32(isum_b), dd, acc)
                    acc_min = fma32(_F32(imin_b), dm, acc_min)
            out[t, r] = acc - acc_min


@numba.njit(parallel=True, cache=True)
def _q6_k_tiled(qw, sc, dw, qx, dx, bsums, out):  # pragma: no cover - compiled
    rows, k = qw.shape
    n = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(rows):
        p = np.empty(k, np.int32)
        dots = np.empty(k // 16, np.int32)  # per 16-element sub-block
        for t in range(n):
            _products(qw[r], qx[t], p)
            _group_sums(p, 16, dots)
            acc = _F32(0.0)
            for b in range(nb):
                s1 = 0
                for s in range(b * 16, b * 16 + 16):
                    s1 += sc[r, s] * (dots[s] - 32 * bsums[t, s])
                result = _F32(s1) * dw[r, b]
                acc = fma32(result, dx[t, b], acc)  # buf += result * d1, contracted by GCC
            out[t, r] = acc


@numba.njit(parallel=True, cache=True)
def _q6_k_vec_dot(qw, sc, dw, qx, dx, bsums, out):  # pragma: no cover - compiled
    rows, k = qw.shape
    n = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(rows):
        p = np.empty(k, np.int32)
        quads = np.empty(k // 4, np.int32)  # sums of 4 consecutive products
        lanes = np.zeros(8, np.int32)
        acc = np.zeros(8, np.float32)
        for t in range(n):
            _products(qw[r], qx[t], p)
            _group_sums(p, 4, quads)
            acc[:] = 0
            for b in range(nb):
                d = dx[t, b] * dw[r, b]
                lanes[:] = 0
                for g in range(8):  # 32-element groups; lanes 0-3 in sub-block 2g, 4-7 in 2g + 1
                    for j in range(8):
                        lanes[j] += sc[r, b * 16 + 2 * g + j // 4] * quads[b * 64 + g * 8 + j]
                for j in range(8):
                    s0 = b * 16 + 2 * j
                    lanes[j] -= 32 * (bsums[t, s0] * sc[r, s0] + bsums[t, s0 + 1] * sc[r, s0 + 1])
                    acc[j] = fma32(d, _F32(lanes[j]), acc[j])
            out[t, r] = hsum_float_8(acc)


def is_exact_k(weight) -> bool:
    """Whether `matmul_k` reproduces llama.cpp for this weight: Q6_K, and Q4_K when ggml repacks it."""
    return weight.ggml_type == T.Q6_K or (weight.ggml_type == T.Q4_K and weight.n_rows % 8 == 0)


def matmul_k(x: np.ndarray, weight) -> np.ndarray:
    """y = x @ W^T for a Q4_K or Q6_K weight, with the kernel llama.cpp picks for this weight and n (module
    docstring). (n, k) float32 -> (n, rows) float32. Raises NotImplementedError unless `is_exact_k(weight)`."""
    n = x.shape[0]
    qx, dx, bsums = quantize_activations_k(x)
    out = np.empty((n, weight.n_rows), np.float32)  # (n, rows)
    if weight.ggml_type == T.Q4_K and weight.n_rows % 8 == 0:
        qw, sc, mn, dw, dmw = _unpack_q4_k(weight)
        _q4_k_repacked(qw, sc, mn, dw, dmw, qx, dx, bsums, n - n % 4, out)
    elif weight.ggml_type == T.Q6_K and n >= _TILED_MIN_ROWS:
        _q6_k_tiled(*_unpack_q6_k(weight), qx, dx, bsums, out)
    elif weight.ggml_type == T.Q6_K:
        _q6_k_vec_dot(*_unpack_q6_k(weight), qx, dx, bsums, out)
    else:
        raise NotImplementedError(f"matmul_k: {block_format(weight.ggml_type).name} with {weight.n_rows} rows")
    return out

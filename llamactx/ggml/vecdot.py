"""ggml-cpu's x86 dot products of 32-element blocks, reproduced operation for operation.

SmolLM2 under 8-bit activation quantization is numerically chaotic (docs/numerics.md): an ulp of difference in a
matmul output flips activation quants later on and moves logits by tenths. So for the 32-block types the
reference ops do not use BLAS but follow `ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0` and `ggml_vec_dot_{q4_1,q5_1}_q8_1`
(ggml-cpu/arch/x86/quants.c, AVX2 + VNNI) exactly:

    for each block b:  d = d_w * d_x                      (f32)
                       lane_j = sum of 4 products, j < 8  (int32, `_mm256_dpbusd_epi32`)
                       acc_j = fma(d, float(lane_j), acc_j)
                       summs = fma(m_w, s_x, summs)       (Q4_1 / Q5_1 only)
    result = hsum_float_8(acc) + summs

llamafile's tinyBLAS (prompt processing for Q8_0 / Q4_0 / Q5_0) has the same lanes and FMA chain. Every output
element is computed the same way whatever else is in the batch, so results are row invariant.

F32 / F16 weights (`matmul_float`) follow `ggml_compute_forward_mul_mat`'s choice: tinyBLAS (16 FMA lanes) when
the shapes allow it, else `ggml_vec_dot_f32` / `ggml_vec_dot_f16` (llamactx.ggml.vec); llama.cpp's switch to vec_dot
for a single row is optional.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.quants_cpu import quantize_q8_0, quantize_q8_1
from llamactx.ggml.vec import dot_tinyblas, dot_vec, hsum_float_8
from llamactx.gguf.block_fields import f16_field, high_bits, nibbles
from llamactx.gguf.quants import block_format

EXACT_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
FLOAT_TYPES = (T.F32, T.F16)
_WITH_MIN = (T.Q4_1, T.Q5_1)


def unpack_weight(weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integer quants, scales and mins of a 32-block weight: int8 (rows, k), f32 (rows, nb), f32 (rows, nb)
    (mins are zero for the symmetric types). Quants are in element order, as `bytes_from_nibbles_32` gives them."""
    t = weight.ggml_type
    rows = weight.data.shape[0]
    blocks = weight.data.reshape(-1, block_format(t).type_size)  # (rows * nb, type_size)
    d = f16_field(blocks, 0)  # (rows * nb, 1)
    m = f16_field(blocks, 2) if t in _WITH_MIN else np.zeros_like(d)
    if t == T.Q8_0:
        q = blocks[:, 2:34].view(np.int8)
    elif t == T.Q4_0:
        q = nibbles(blocks[:, 2:18]).view(np.int8) - np.int8(8)
    elif t == T.Q4_1:
        q = nibbles(blocks[:, 4:20]).view(np.int8)
    elif t == T.Q5_0:
        q = (nibbles(blocks[:, 6:22]) | high_bits(blocks[:, 2:6])).view(np.int8) - np.int8(16)
    else:  # Q5_1
        q = (nibbles(blocks[:, 8:24]) | high_bits(blocks[:, 4:8])).view(np.int8)
    return (np.ascontiguousarray(q).reshape(rows, -1), d.reshape(rows, -1), m.reshape(rows, -1))


def quantize_activations(x: np.ndarray, weight_type: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (n, k) as ggml's Q8_0 / Q8_1 blocks: int8 (n, k), f32 d (n, nb), f32 s (n, nb) (s = 0 for Q8_0)."""
    n, k = x.shape
    nb = k // 32
    if weight_type in _WITH_MIN:
        raw = quantize_q8_1(np.ascontiguousarray(x, np.float32)).reshape(n, nb, 36)
        d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        s = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        q = raw[..., 4:36]
    else:
        raw = quantize_q8_0(np.ascontiguousarray(x, np.float32)).reshape(n, nb, 34)
        d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        s = np.zeros_like(d)
        q = raw[..., 2:34]
    return np.ascontiguousarray(q).view(np.int8).reshape(n, k), d, s


def _lane_major(q: np.ndarray) -> np.ndarray:
    """Reorder each 32-block from element order (lane j = elements 4j..4j+3) to product-major order (element
    4j + e at 8e + j), so that the kernel's 8 lanes are contiguous. (n, k) int8 -> (n, k) int8"""
    n, k = q.shape
    return np.ascontiguousarray(q.reshape(n, k // 32, 8, 4).transpose(0, 1, 3, 2)).reshape(n, k)


@numba.njit(parallel=True, cache=True)
def _matmul_blocks(qw, dw, mw, qx, dx, sx, with_min, out):  # pragma: no cover - compiled
    n_rows, k = qw.shape
    n_tok = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(n_rows):
        p = np.empty(k, np.int32)  # products, lane-major within each block
        lanes = np.empty(nb * 8, np.int32)  # `_mm256_dpbusd_epi32`: lane j = 4 products of elements 4j..4j+3
        acc = np.empty(8, np.float32)
        wr = qw[r]
        for t in range(n_tok):
            xt = qx[t]
            for i in range(k):
                p[i] = np.int32(wr[i]) * np.int32(xt[i])
            for b in range(nb):
                for j in range(8):
                    o = b * 32 + j
                    lanes[b * 8 + j] = p[o] + p[o + 8] + p[o + 16] + p[o + 24]
            acc[:] = 0
            for b in range(nb):
                d = np.float32(dw[r, b] * dx[t, b])
                for j in range(8):
                    acc[j] = fma32(d, np.float32(lanes[b * 8 + j]), acc[j])
            summs = np.float32(0)
            if with_min:
                for b in range(nb):
                    summs = fma32(mw[r, b], sx[t, b], summs)
            out[t, r] = np.float32(hsum_float_8(acc) + summs)


@numba.njit(parallel=True, cache=True)
def matmul_repacked_blocks(qw, dw, qx, dx, out):  # pragma: no cover - compiled
    """The repacked 8x8 kernels of the 4-bit 32-block types (x86 repack.cpp `gemm_q4_b32_8x8_q8_0_lut_avx` for
    groups of 4 activation rows, `gemv_...` for the rest; Q4_0, IQ4_NL, MXFP4): each block's whole integer dot
    product, one FMA per block, acc = fma(float(dot), d_w * d_x, acc). qw (rows, k) and qx (n, k) int8 in element
    order, dw (rows, nb), dx (n, nb) -> out (n, rows)"""
    rows, k = qw.shape
    for r in numba.prange(rows):
        for t in range(qx.shape[0]):
            acc = np.float32(0.0)
            for b in range(k // 32):
                dot = 0
                for e in range(32 * b, 32 * b + 32):
                    dot += np.int32(qw[r, e]) * np.int32(qx[t, e])
                acc = fma32(np.float32(dot), np.float32(dw[r, b] * dx[t, b]), acc)
            out[t, r] = acc


def is_repacked_q4_0(weight) -> bool:
    """llama.cpp repacks a Q4_0 weight with ne1 % 8 == 0 into block_q4_0x8 on every x86 build (AVX2 or better;
    repack.cpp ggml_repack_get_optimal_repack_type), and then multiplies it with `matmul_repacked_blocks`' order."""
    return weight.ggml_type == T.Q4_0 and weight.n_rows % 8 == 0


def matmul_exact(x: np.ndarray, weight, repacked: bool | None = None) -> np.ndarray:
    """y = x @ W^T as ggml-cpu computes it for a 32-block weight type: ggml_vec_dot's lanes (and tinyBLAS's, the
    same), or a repacked Q4_0 weight's one FMA per block (`repacked`: force either; None: as llama.cpp decides
    for this weight). (n, k) float32 -> (n, rows) float32"""
    qw, dw, mw = unpack_weight(weight)
    qx, dx, sx = quantize_activations(x, weight.ggml_type)
    out = np.empty((x.shape[0], qw.shape[0]), np.float32)  # (n, rows)
    if is_repacked_q4_0(weight) if repacked is None else repacked:
        matmul_repacked_blocks(qw, dw, qx, dx, out)
        return out
    qw, qx = _lane_major(qw), _lane_major(qx)
    _matmul_blocks(qw, dw, mw, qx, dx, sx, weight.ggml_type in _WITH_MIN, out)
    return out


@numba.njit(parallel=True, cache=True)
def matmul_float_rows(w, x, tinyblas, tail_in_double, out):  # pragma: no cover - compiled
    for r in numba.prange(w.shape[0]):
        acc = np.zeros(64, np.float32)
        for t in range(x.shape[0]):
            out[t, r] = dot_tinyblas(w[r], x[t], acc) if tinyblas else dot_vec(w[r], x[t], acc, tail_in_double)


def matmul_float(x: np.ndarray, weight, vec_dot_for_one: bool = False, each_row_alone: bool = False) -> np.ndarray:
    """y = x @ W^T for an F32 or F16 weight as ggml-cpu computes it: the activations rounded to f16 for an F16
    weight; tinyBLAS when k % F32_EPR == 0 and ne1 % 4 == 0 (llamafile_sgemm accepts the shape), else
    ggml_vec_dot_f32 / _f16. llama.cpp also uses vec_dot for a single row; `vec_dot_for_one` does the same,
    by default one row is computed like several. `each_row_alone`: vec_dot for every row (ggml_mul_mat_id).
    (n, k) float32 -> (n, rows) float32"""
    f16 = weight.ggml_type == T.F16
    w = np.ascontiguousarray(weight.data, np.float32).reshape(weight.n_rows, -1)  # (rows, k)
    xf = np.ascontiguousarray(x, np.float32)
    if f16:
        xf = xf.astype(np.float16).astype(np.float32)
    n, k = xf.shape
    tinyblas = (n >= 2 or not vec_dot_for_one) and not each_row_alone and k % F32_EPR == 0 and w.shape[0] % 4 == 0
    out = np.empty((n, w.shape[0]), np.float32)  # (n, rows)
    matmul_float_rows(w, xf, tinyblas, f16, out)
    return out

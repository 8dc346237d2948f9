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
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.gguf.quants import _half, _high_bits, _nibbles, block_format
from llamactx.gguf.quants_cpu import quantize_q8_0, quantize_q8_1

EXACT_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
_WITH_MIN = (T.Q4_1, T.Q5_1)


def unpack_weight(weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integer quants, scales and mins of a 32-block weight: int8 (rows, k), f32 (rows, nb), f32 (rows, nb)
    (mins are zero for the symmetric types). Quants are in element order, as `bytes_from_nibbles_32` gives them."""
    t = weight.ggml_type
    rows = weight.data.shape[0]
    blocks = weight.data.reshape(-1, block_format(t).type_size)  # (rows * nb, type_size)
    d = _half(blocks, 0)  # (rows * nb, 1)
    m = _half(blocks, 2) if t in _WITH_MIN else np.zeros_like(d)
    if t == T.Q8_0:
        q = blocks[:, 2:34].view(np.int8)
    elif t == T.Q4_0:
        q = _nibbles(blocks[:, 2:18]).view(np.int8) - np.int8(8)
    elif t == T.Q4_1:
        q = _nibbles(blocks[:, 4:20]).view(np.int8)
    elif t == T.Q5_0:
        q = (_nibbles(blocks[:, 6:22]) | _high_bits(blocks[:, 2:6])).view(np.int8) - np.int8(16)
    else:  # Q5_1
        q = (_nibbles(blocks[:, 8:24]) | _high_bits(blocks[:, 4:8])).view(np.int8)
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


@numba.njit(cache=True, inline="always")
def _fma32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    # a * b is exact in float64 (24 + 24 bits), so one rounding of (a*b + c) to float32 is a fused multiply-add
    # except when the addition itself is inexact in float64 (exponents more than 29 apart), which the lanes and
    # scales here never reach.
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@numba.njit(parallel=True, cache=True)
def _matmul_blocks(qw, dw, mw, qx, dx, sx, with_min, out):  # pragma: no cover - compiled
    n_rows = qw.shape[0]
    n_tok = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(n_rows):
        acc = np.zeros(8, np.float32)
        for t in range(n_tok):
            acc[:] = 0
            summs = np.float32(0)
            for b in range(nb):
                d = np.float32(dw[r, b] * dx[t, b])
                base = b * 32
                for j in range(8):
                    lane = np.int32(0)
                    for e in range(4):
                        i = base + 4 * j + e
                        lane += np.int32(qw[r, i]) * np.int32(qx[t, i])
                    acc[j] = _fma32(d, np.float32(lane), acc[j])
                if with_min:
                    summs = _fma32(mw[r, b], sx[t, b], summs)
            r0 = np.float32(acc[4] + acc[0])
            r1 = np.float32(acc[5] + acc[1])
            r2 = np.float32(acc[6] + acc[2])
            r3 = np.float32(acc[7] + acc[3])
            h = np.float32(np.float32(r0 + r2) + np.float32(r1 + r3))
            out[t, r] = np.float32(h + summs)


def matmul_exact(x: np.ndarray, weight) -> np.ndarray:
    """y = x @ W^T as ggml-cpu computes it for a 32-block weight type. (n, k) float32 -> (n, rows) float32"""
    qw, dw, mw = unpack_weight(weight)
    qx, dx, sx = quantize_activations(x, weight.ggml_type)
    out = np.empty((x.shape[0], qw.shape[0]), np.float32)  # (n, rows)
    _matmul_blocks(qw, dw, mw, qx, dx, sx, weight.ggml_type in _WITH_MIN, out)
    return out

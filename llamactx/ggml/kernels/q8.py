"""Activation quantizers for the matmul kernels: float32 rows -> Q8_0 / Q8_1 / Q8_K as structure-of-arrays.

Byte-for-byte the same rounding as `llamactx.ggml.quants_cpu` (which documents why): Q8_0/Q8_1 follow x86
ggml-cpu's AVX `quantize_row_q8_0` / `quantize_row_q8_1` (id = 127/amax, round half to even, d stored as f16),
Q8_K follows `quantize_row_q8_K_ref` (signed max, iscale = -127/max, nearest_int, f32 d, bsums of 16). Instead of
packed blocks the kernels get separate arrays, per activation row:

    xq    int8  (n, k)       the quants
    xd    f32   (n, nblk)    the block scale as the dot product uses it (f16-rounded for Q8_0/Q8_1)
    xoff  int32 (n, k/4)     Q8_0: -offset * (sum of each 4 quants), the start value of one `vdot` lane
    xs    f32   (nblk, n)    Q8_1: s = f16(d * sum(q)), the term a Q4_1/Q5_1 min multiplies; block-major, so
                             four rows' terms of a block are one load
    bsums int32 (n, k/16)    Q8_K: sums of 16 quants

The blocks are processed 32 floats at a time in vector registers (simd.vabsmax32 / vquant32).
Non-finite activations are out of scope, as in quants_cpu.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit

from llamactx.ggml.intrinsics import round_f16
from llamactx.ggml.kernels.simd import (
    vabsmax32,
    vload,
    vquant32,
    vstore,
)
from llamactx.ggml.kernels.vnni import (
    ihalves,
    ilanesum4,
    imuladd,
    izero,
)

QK8_0 = 32
_Q4_0, _Q5_0 = int(T.Q4_0), int(T.Q5_0)
QK_K = 256


@njit(cache=True)
def _q8_block(x, i, j, xq) -> np.float32:
    """One 32-element block of row i from column j (x86 AVX quantize_row_q8_0/q8_1): id = 127 / amax, quants
    rounded half to even into xq[i, j:j+32]. Returns the f32 d = amax / 127 (not yet rounded to f16)."""
    amax = vabsmax32(x, i, j)
    inv = np.float32(127.0) / amax if amax != np.float32(0.0) else np.float32(0.0)
    vstore(xq, i, j, vquant32(x, i, j, inv))
    return amax / np.float32(127.0)


@njit(cache=True)
def quantize_q8_0(x, xq, xd, xoff, offset) -> None:
    """Rows of x (n, k) float32 -> Q8_0: xq (n, k) int8, xd (n, k/32) f16-rounded scales, and xoff (n, k/4) int32
    = -offset * (sum of each 4 consecutive quants: one `vdot` lane). k % 32 == 0 (checked by the caller)."""
    minus = np.int32(-offset)
    for i in range(x.shape[0]):
        for b in range(x.shape[1] // QK8_0):
            xd[i, b] = round_f16(_q8_block(x, i, b * QK8_0, xq))
            vstore(xoff, i, b * 8, imuladd(izero(), ilanesum4(vload(xq, i, b * QK8_0)), minus))


@njit(cache=True)
def activations_q8_0(kind, x):
    """x (n, k) float32 as the kernels of Q4_0 / Q5_0 / Q8_0 weights (ggml type `kind`) read it -> (xq, xd, xoff):
    Q8_0 quants, f16 scales, xoff = -o * (sum of each 4 quants), o the weights' offset (8 / 16 / 128), so every
    `vdot` lane holds ggml's signed (q - o) . x."""
    n, k = x.shape
    xq = np.empty((n, k), np.int8)
    xd = np.empty((n, k // QK8_0), np.float32)
    xoff = np.empty((n, k // 4), np.int32)
    quantize_q8_0(x, xq, xd, xoff, 8 if kind == _Q4_0 else (16 if kind == _Q5_0 else 128))
    return xq, xd, xoff


@njit(cache=True)
def quantize_q8_1(x, xq, xd, xs) -> None:
    """Rows of x (n, k) float32 -> Q8_1 arrays: as Q8_0 plus xs (k/32, n) = f16(d * sum(q)) with the f32 d."""
    for i in range(x.shape[0]):
        for b in range(x.shape[1] // QK8_0):
            d = _q8_block(x, i, b * QK8_0, xq)
            lo, hi = ihalves(ilanesum4(vload(xq, i, b * QK8_0)))
            xd[i, b] = round_f16(d)
            xs[b, i] = round_f16(d * np.float32(lo + hi))


@njit(cache=True)
def quantize_q8_K(x, xq, xd, bsums) -> None:
    """Rows of x (n, k) float32 -> Q8_K (quantize_row_q8_K_ref): xd (n, k/256) f32, bsums (n, k/16). k % 256 == 0.

    The scale comes from the first element of largest |x| (signed): iscale = -127 / max, q = nearest_int(iscale *
    x) (at most 127), d = 1 / iscale; an all-zero block gets d = 0 and zero quants."""
    for i in range(x.shape[0]):
        for b in range(x.shape[1] // QK_K):
            j0 = b * QK_K
            amax = np.float32(0.0)
            for j in range(j0, j0 + QK_K, 32):
                amax = max(amax, vabsmax32(x, i, j))
            j = j0
            while abs(x[i, j]) != amax:
                j += 1
            iscale = np.float32(-127.0) / x[i, j] if amax != np.float32(0.0) else np.float32(0.0)
            for j in range(j0, j0 + QK_K, 32):
                vstore(xq, i, j, vquant32(x, i, j, iscale))
                lo, hi = ihalves(ilanesum4(vload(xq, i, j)))
                bsums[i, j // 16] = lo
                bsums[i, j // 16 + 1] = hi
            xd[i, b] = np.float32(1.0) / iscale if amax != np.float32(0.0) else np.float32(0.0)

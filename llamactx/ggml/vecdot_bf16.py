"""BF16 matmuls as llama.cpp's x86 CPU backend (build 0c1e570) computes them, bit for bit, for the target's ISA.

The activations are rounded to bf16 (`from_float` = `ggml_cpu_fp32_to_bf16`: ggml_compute_fp32_to_bf16, round to
nearest even). A bf16 times a bf16 is exact in float32, so only the order of the additions matters, and it
depends on the build (ggml-cpu.c `ggml_compute_forward_mul_mat`, llamafile/sgemm.cpp, vec.cpp):

- n >= 2, k % KN == 0 and ne1 % 4 == 0: llamafile's tinyBLAS. With AVX512_BF16 (`tinyBLAS<32, __m512,
  __m512bh>`, KN = 32) each of 16 lanes takes `_mm512_dpbf16_ps` of elements 2i and 2i+1 of every 32: the odd
  product is added first, then the even one, each add rounded (Intel SDM VDPBF16PS); then
  `_mm512_reduce_add_ps`. Without it (`tinyBLAS<16, __m512>` / `<8, __m256>`, KN = F32_EPR) the bf16 values are
  widened and summed as F32 weights are (llamactx.ggml.vec `dot_tinyblas`). `vdpbf16ps` reads denormal inputs as
  zero and flushes denormal results to zero (the widened FMAs do not).
- otherwise `ggml_vec_dot_bf16`: with AVX512_BF16 two `dpbf16` accumulators over 64 elements at a time (c1 the
  first 32, c2 the next); AVX-512 alone two 16-lane FMA accumulators over 32 at a time; AVX2 four 8-lane ones,
  then (c1+c3) + (c2+c4) and the `hsum_float_8` tree. Each accumulator's reduction is added in double, then the
  tail (float products) in double, and the sum rounded to float.

`ReferenceOps` computes one row like several unless `ggml_single_row` (as for F32 / F16 weights).
"""

from __future__ import annotations

import numba
import numpy as np

from llamactx.ggml.cpu import F32_EPR, arithmetic
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.quants_cpu import fake_quant, vec_dot_type
from llamactx.ggml.vec import dot_tinyblas, hsum8, reduce_add16

_F32 = np.float32


_FLT_MIN = np.float32(1.17549435e-38)


@numba.njit(cache=True)
def _ftz(v):  # pragma: no cover - compiled
    """A denormal float32 as a zero of its sign (vdpbf16ps's implied DAZ and FTZ)."""
    return _F32(np.copysign(_F32(0.0), v)) if abs(v) < _FLT_MIN else v


@numba.njit(cache=True)
def _dpbf16(a, b, off, acc, lo):  # pragma: no cover - compiled
    """`_mm512_dpbf16_ps` over a[off:off+32] * b[off:off+32] into acc[lo:lo+16]: odd product, then even, each
    add rounded; denormal inputs are read as zero and denormal products and sums flushed to zero (the
    instruction implies DAZ and FTZ whatever MXCSR says; measured on Zen 4)."""
    for i in range(16):
        for j in (2 * i + 1, 2 * i):
            acc[lo + i] = _ftz(acc[lo + i] + _ftz(_ftz(a[off + j]) * _ftz(b[off + j])))


@numba.njit(cache=True)
def _tinyblas_bf16dp(a, b, acc):  # pragma: no cover - compiled
    acc[:16] = 0
    for off in range(0, a.shape[0], 32):
        _dpbf16(a, b, off, acc, 0)
    return reduce_add16(acc, 0)


@numba.njit(cache=True)
def _vec_dot_bf16(a, b, acc, bf16dp):  # pragma: no cover - compiled
    n = a.shape[0]
    acc[:64] = 0
    sumf = 0.0
    i = 0
    if bf16dp:  # two dpbf16 accumulators, 64 elements a step
        while i + 64 <= n:
            _dpbf16(a, b, i, acc, 0)
            _dpbf16(a, b, i + 32, acc, 16)
            i += 64
        sumf += np.float64(reduce_add16(acc, 0))
        sumf += np.float64(reduce_add16(acc, 16))
    elif F32_EPR == 16:  # two FMA accumulators of 16, 32 elements a step
        while i + 32 <= n:
            for j in range(32):
                acc[j] = fma32(a[i + j], b[i + j], acc[j])
            i += 32
        sumf += np.float64(reduce_add16(acc, 0))
        sumf += np.float64(reduce_add16(acc, 16))
    else:  # four FMA accumulators of 8, 32 elements a step; (c1 + c3) + (c2 + c4), hsum
        while i + 32 <= n:
            for j in range(32):
                acc[j] = fma32(a[i + j], b[i + j], acc[j])
            i += 32
        for j in range(8):
            acc[32 + j] = (acc[j] + acc[16 + j]) + (acc[8 + j] + acc[24 + j])
        sumf += np.float64(hsum8(acc, 32))
    while i < n:
        sumf += np.float64(a[i] * b[i])
        i += 1
    return _F32(sumf)


@numba.njit(parallel=True, cache=True)
def _matmul_bf16(w, x, tinyblas, bf16dp, out):  # pragma: no cover - compiled
    for r in numba.prange(w.shape[0]):
        acc = np.zeros(64, np.float32)
        for t in range(x.shape[0]):
            if tinyblas and bf16dp:
                out[t, r] = _tinyblas_bf16dp(w[r], x[t], acc)
            elif tinyblas:
                out[t, r] = dot_tinyblas(w[r], x[t], acc)
            else:
                out[t, r] = _vec_dot_bf16(w[r], x[t], acc, bf16dp)


def matmul_bf16(x: np.ndarray, weight, vec_dot_for_one: bool = False) -> np.ndarray:
    """y = x @ W^T for a BF16 weight as the target's ggml build computes it (module docstring); vec_dot_for_one:
    a single row through ggml_vec_dot_bf16 as llama.cpp does. (n, k) float32 -> (n, rows) float32"""
    bf16dp = bool(arithmetic()["bf16_dot"])
    raw = np.ascontiguousarray(weight.data).reshape(weight.n_rows, -1).view(np.uint16)  # (rows, k) bf16 bits
    w = (raw.astype(np.uint32) << 16).view(np.float32)  # (rows, k)
    xb = fake_quant(np.ascontiguousarray(x, np.float32), vec_dot_type(weight.ggml_type))  # (n, k) bf16 values
    n, k = xb.shape
    kn = 32 if bf16dp else F32_EPR
    tinyblas = (n >= 2 or not vec_dot_for_one) and k % kn == 0 and w.shape[0] % 4 == 0
    out = np.empty((n, w.shape[0]), np.float32)  # (n, rows)
    _matmul_bf16(w, xb, tinyblas, bf16dp, out)
    return out

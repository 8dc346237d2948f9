"""Float32 weights through llamafile's tinyBLAS (ggml-cpu/llamafile/sgemm.cpp, tinyBLAS<F32_EPR, __m512 / __m256,
float, float, float>::gemm), in register tiles.

tinyBLAS gives every output out[t, r] one vector accumulator of F32_EPR lanes (16 on AVX-512, 8 on AVX2), starts
it at zero, adds fma(w[r, i:i + F32_EPR], x[t, i:i + F32_EPR]) lane-wise over k, and takes `hsum` of it at the end:
llamactx.ggml.vec.dot_tinyblas, which keeps the lanes in a scratch array, one output at a time. `sgemm` computes
the same lanes in registers, four weight rows by two activation rows at a time (eight accumulators, each one or two
<8 x float> registers), so each loaded weight vector serves two activation rows and each activation vector four
weight rows; the outputs left over (rows past a multiple of four, a last odd activation row) take the same lanes
one at a time. The lanes are stored to a 16-float scratch row only for the final `hsum_vec`, so every output is
bit-identical to dot_tinyblas (tests/ggml/test_tinyblas.py).

Used by the compiled graph for F32 matrices tinyBLAS accepts (k % F32_EPR == 0, rows % 4 == 0): the routers of
mixtures of experts (n_embd -> n_expert) and the delta-net gates of qwen35 (n_embd -> heads), which before took
a scratch-array dot per output (about 3 GFLOP/s).
"""

from __future__ import annotations

import numba
import numpy as np

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.kernels.simd import fmadd, fzero, vload_f32, vstore
from llamactx.ggml.vec import hsum_vec

_WIDE = F32_EPR == 16  # an accumulator is two <8 x float> registers (lanes 0-7, 8-15)


@numba.njit(cache=True, inline="always")
def _hsum(lo, hi, scratch):  # pragma: no cover - compiled
    """tinyBLAS's `hsum` of one accumulator (hi unused on AVX2), through hsum_vec's lane order."""
    vstore(scratch, 0, 0, lo)
    if _WIDE:
        vstore(scratch, 0, 8, hi)
    return hsum_vec(scratch[0], 0)


@numba.njit(cache=True)
def _dot1(w, r, x, t, scratch):  # pragma: no cover - compiled
    """One output: dot_tinyblas(w[r], x[t]) with its lanes in registers."""
    lo = hi = fzero()
    for i in range(0, w.shape[1], F32_EPR):
        lo = fmadd(lo, vload_f32(w, r, i), vload_f32(x, t, i))
        if _WIDE:
            hi = fmadd(hi, vload_f32(w, r, i + 8), vload_f32(x, t, i + 8))
    return _hsum(lo, hi, scratch)


@numba.njit(cache=True)
def _tile(w, r, x, t, scratch, out):  # pragma: no cover - compiled
    """out[t:t + 2, r:r + 4]: eight accumulators over k, then each one's hsum."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = fzero()  # (row r + j, token t + u) -> a[2j + u], lanes 0-7
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = fzero()  # lanes 8-15 (AVX-512)
    for i in range(0, w.shape[1], F32_EPR):
        x0, x1 = vload_f32(x, t, i), vload_f32(x, t + 1, i)
        w0, w1, w2, w3 = vload_f32(w, r, i), vload_f32(w, r + 1, i), vload_f32(w, r + 2, i), vload_f32(w, r + 3, i)
        a0, a1 = fmadd(a0, w0, x0), fmadd(a1, w0, x1)
        a2, a3 = fmadd(a2, w1, x0), fmadd(a3, w1, x1)
        a4, a5 = fmadd(a4, w2, x0), fmadd(a5, w2, x1)
        a6, a7 = fmadd(a6, w3, x0), fmadd(a7, w3, x1)
        if _WIDE:
            j = i + 8
            x0, x1 = vload_f32(x, t, j), vload_f32(x, t + 1, j)
            w0, w1, w2, w3 = vload_f32(w, r, j), vload_f32(w, r + 1, j), vload_f32(w, r + 2, j), vload_f32(w, r + 3, j)
            b0, b1 = fmadd(b0, w0, x0), fmadd(b1, w0, x1)
            b2, b3 = fmadd(b2, w1, x0), fmadd(b3, w1, x1)
            b4, b5 = fmadd(b4, w2, x0), fmadd(b5, w2, x1)
            b6, b7 = fmadd(b6, w3, x0), fmadd(b7, w3, x1)
    out[t, r], out[t + 1, r] = _hsum(a0, b0, scratch), _hsum(a1, b1, scratch)
    out[t, r + 1], out[t + 1, r + 1] = _hsum(a2, b2, scratch), _hsum(a3, b3, scratch)
    out[t, r + 2], out[t + 1, r + 2] = _hsum(a4, b4, scratch), _hsum(a5, b5, scratch)
    out[t, r + 3], out[t + 1, r + 3] = _hsum(a6, b6, scratch), _hsum(a7, b7, scratch)


@numba.njit(cache=True)
def _rows(w, x, g0, g1, out):  # pragma: no cover - compiled
    """Weight rows [4 g0, min(4 g1, rows)) for every activation row."""
    scratch = np.empty((1, 16), np.float32)
    n, m = x.shape[0], w.shape[0]
    r1 = min(4 * g1, m)
    for r in range(4 * g0, r1 - (r1 - 4 * g0) % 4, 4):
        for t in range(0, n - n % 2, 2):
            _tile(w, r, x, t, scratch, out)
        if n % 2:
            for j in range(4):
                out[n - 1, r + j] = _dot1(w, r + j, x, n - 1, scratch)
    for r in range(r1 - (r1 - 4 * g0) % 4, r1):
        for t in range(n):
            out[t, r] = _dot1(w, r, x, t, scratch)


@numba.njit(parallel=True, cache=True)
def sgemm(w, x, n_tasks, out):  # pragma: no cover - compiled
    """out (n, rows) = x (n, k) times w (rows, k)^T, every output as dot_tinyblas; k % F32_EPR == 0, both arrays
    C-contiguous float32. The groups of four weight rows are split over n_tasks tasks."""
    n_groups = (w.shape[0] + 3) // 4
    n_tasks = max(1, min(n_tasks, n_groups))
    for task in numba.prange(n_tasks):
        _rows(w, x, task * n_groups // n_tasks, (task + 1) * n_groups // n_tasks, out)

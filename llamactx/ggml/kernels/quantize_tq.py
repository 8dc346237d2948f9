"""ggml-quants.c's ternary quantizers: `quantize_row_tq1_0_ref` / `quantize_tq1_0` and `quantize_row_tq2_0_ref` /
`quantize_tq2_0` (an importance matrix is accepted and ignored, as in ggml). Each 256-block's scale is its
absolute maximum (fp16), each value `lroundf(x * (1 / amax))` in {-1, 0, 1} stored as a trit + 1.

TQ1_0 (`block_tq1_0`, 54 bytes): qs[48] packs five trits per byte (the first 32 bytes take elements m + 32 n of
the first 160, the next 16 elements m + 16 n of the next 80), qh[4] four trits per byte (elements j + 4 m of the
last 16), each byte as the base-3 number times 256 / 243 rounded up; then d. TQ2_0 (`block_tq2_0`, 66 bytes):
qs[64] four 2-bit trits per byte (elements m + 32 n of each 128), then d. Arithmetic in float32 as C does it
(quant_search.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamactx.ggml.kernels.quant_search import F32, ONE, ZERO, fp16_round

TQ1_0_SIZE = 54
TQ2_0_SIZE = 66


@njit(cache=True, inline="always")
def _trit(v, id_):
    """lroundf(v * id) + 1: round half away from zero."""
    p = v * id_
    r = np.floor(abs(p) + 0.5)  # exact in float64 for a float32 p
    return int(r if p >= 0 else -r) + 1


@njit(cache=True)
def _scale(x):
    amax = ZERO
    for j in range(256):
        a = abs(x[j])
        amax = amax if amax >= a else a  # MAX(amax, fabsf(v))
    id_ = ONE / amax if amax != 0 else ZERO
    return amax, id_


@njit(cache=True)
def _pack5(q):
    """q *= 3 in uint8, then ceiling division: ((uint16_t)q * 256 + 242) / 243."""
    return ((q & 0xFF) * 256 + 242) // 243


@njit(cache=True)
def tq1_0_block(x, y):
    """quantize_row_tq1_0_ref for one 256-block x (float32) into y (54 bytes)."""
    d, id_ = _scale(x)
    for m in range(32):
        q = 0
        for n in range(5):
            q = q * 3 + _trit(x[m + 32 * n], id_)
        y[m] = _pack5(q)
    for m in range(16):
        q = 0
        for n in range(5):
            q = q * 3 + _trit(x[160 + m + 16 * n], id_)
        y[32 + m] = _pack5(q)
    for j in range(4):
        q = 0
        for m in range(4):
            q = q * 3 + _trit(x[240 + j + 4 * m], id_)
        y[48 + j] = _pack5(q * 3)
    bits, _ = fp16_round(d)
    y[52] = bits & 0xFF
    y[53] = bits >> 8


@njit(cache=True)
def tq2_0_block(x, y):
    """quantize_row_tq2_0_ref for one 256-block x (float32) into y (66 bytes)."""
    d, id_ = _scale(x)
    for j in range(2):
        for m in range(32):
            q = 0
            for n in range(4):
                q += (_trit(x[128 * j + m + 32 * n], id_) & 3) << (2 * n)
            y[32 * j + m] = q
    bits, _ = fp16_round(d)
    y[64] = bits & 0xFF
    y[65] = bits >> 8


@njit(cache=True)
def quantize_rows_tq_kernel(rows, out, tq1):
    nrow, n = rows.shape
    size = TQ1_0_SIZE if tq1 else TQ2_0_SIZE
    for r in range(nrow):
        for ib in range(n // 256):
            x = rows[r, 256 * ib:256 * ib + 256]
            y = out[r, size * ib:size * ib + size]
            if tq1:
                tq1_0_block(x, y)
            else:
                tq2_0_block(x, y)


def quantize_rows_tq(rows: np.ndarray, tq1: bool) -> np.ndarray:
    """quantize_tq1_0 (tq1) / quantize_tq2_0: rows (nrow, n) float32, n a multiple of 256 -> (nrow, row_size)
    uint8."""
    rows = np.ascontiguousarray(rows, dtype=F32)
    nrow, n = rows.shape
    if n % 256:
        raise ValueError(f"quantize_rows_tq: a row of {n} values is not a whole number of 256-blocks")
    out = np.zeros((nrow, n // 256 * (TQ1_0_SIZE if tq1 else TQ2_0_SIZE)), np.uint8)
    quantize_rows_tq_kernel(rows, out, tq1)
    return out

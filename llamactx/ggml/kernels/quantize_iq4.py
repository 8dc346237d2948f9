"""ggml-quants.c's non-linear 4-bit quantizers: `quantize_iq4_nl` (32-blocks) and `quantize_iq4_xs` (256-blocks
of eight 32-blocks with 6-bit scales), both through `quantize_row_iq4_nl_impl` with ntry 7, with or without an
importance matrix. Levels are kvalues_iq4nl (ggml-common.h); block layouts `block_iq4_nl` / `block_iq4_xs`.
quantize_rows.py's `quantize_chunk` dispatches here; arithmetic as quant_search.py says (float32, C's order).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamactx.ggml.kernels.quant_search import F32, GROUP_MAX_EPS, ONE, ZERO, fp16_round, nearest_int

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
NTRY = 7  # quantize_iq4_nl / quantize_iq4_xs


@njit(cache=True, inline="always")
def best_index_int8(n, val, x):
    """ggml-quants.c `best_index_int8`: the level nearest x (ties to the upper one)."""
    if x <= F32(val[0]):
        return 0
    if x >= F32(val[n - 1]):
        return n - 1
    ml = 0
    mu = n - 1
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < F32(val[mav]):
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - F32(val[mu - 1]) < F32(val[mu]) - x else mu


@njit(cache=True)
def iq4_nl_impl(sbs, x, out, qw, use_qw, values, L, weight, scales):
    """`quantize_row_iq4_nl_impl(sbs, 32, ...)` with ntry 7: sbs 32 writes a block_iq4_nl (18 bytes), sbs 256 a
    block_iq4_xs (136 bytes)."""
    sigma2 = ZERO
    for j in range(sbs):
        sigma2 += x[j] * x[j]
    sigma2 *= F32(2.0) / F32(sbs)
    nb = sbs // 32
    max_scale = ZERO
    amax_scale = ZERO
    v0 = F32(values[0])
    for ib in range(nb):
        xb = x[32 * ib:32 * ib + 32]
        Lb = L[32 * ib:32 * ib + 32]
        for j in range(32):
            weight[j] = qw[32 * ib + j] * np.sqrt(sigma2 + xb[j] * xb[j]) if use_qw else xb[j] * xb[j]
        amax = ZERO
        mx = ZERO
        for j in range(32):
            ax = abs(xb[j])
            if ax > amax:
                amax = ax
                mx = xb[j]
        if amax < GROUP_MAX_EPS:
            scales[ib] = ZERO
            continue
        d = -mx / v0
        id_ = ONE / d
        sumqx = ZERO
        sumq2 = ZERO
        for j in range(32):
            k = best_index_int8(16, values, id_ * xb[j])
            Lb[j] = k
            q = F32(values[k])
            sumqx += weight[j] * q * xb[j]
            sumq2 += weight[j] * q * q
        d = sumqx / sumq2 if sumq2 > 0 else ZERO
        best = d * sumqx
        for itry in range(-NTRY, NTRY + 1):
            id_ = F32(itry + int(values[0])) / mx
            sumqx = ZERO
            sumq2 = ZERO
            for j in range(32):
                q = F32(values[best_index_int8(16, values, id_ * xb[j])])
                sumqx += weight[j] * q * xb[j]
                sumq2 += weight[j] * q * q
            if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                d = sumqx / sumq2
                best = d * sumqx
        scales[ib] = d
        if abs(d) > amax_scale:
            amax_scale = abs(d)
            max_scale = d
    if nb > 1:
        out[2] = 0
        out[3] = 0
        d = -max_scale / F32(32.0)
        fp16_put(out, 0, d)
        id_ = ONE / d if d != 0 else ZERO
        scales_h = 0
        for ib in range(nb):
            lv = max(-32, min(31, nearest_int(id_ * scales[ib])))
            dl = d * F32(lv)
            idl = ONE / dl if dl != 0 else ZERO
            for j in range(32):
                L[32 * ib + j] = best_index_int8(16, values, idl * x[32 * ib + j])
            lv += 32
            if ib % 2 == 0:
                out[4 + ib // 2] = lv & 0xF
            else:
                out[4 + ib // 2] = np.int64(out[4 + ib // 2]) | ((lv & 0xF) << 4)
            scales_h |= (lv >> 4) << (2 * (ib % 8))
        out[2] = scales_h & 0xFF
        out[3] = scales_h >> 8
        q4 = out[8:8 + sbs // 2]
    else:
        fp16_put(out, 0, scales[0])
        id_ = ONE / scales[0] if scales[0] != 0 else ZERO
        for j in range(sbs):
            L[j] = best_index_int8(16, values, id_ * x[j])
        q4 = out[2:2 + sbs // 2]
    for i in range(sbs // 32):
        for j in range(16):
            q4[16 * i + j] = np.int64(L[32 * i + j]) | (np.int64(L[32 * i + 16 + j]) << 4)


@njit(cache=True, inline="always")
def fp16_put(out, o, f):
    bits, _ = fp16_round(f)
    out[o] = bits & 0xFF
    out[o + 1] = bits >> 8


@njit(cache=True)
def quantize_rows_iq4(rows, out, qw, use_qw, sbs):
    """Each row of `rows` (nrow, n) float32 into `out` (nrow, row_size): IQ4_NL (sbs 32) or IQ4_XS (sbs 256)."""
    nrow, n = rows.shape
    bs = 18 if sbs == 32 else 136
    L = np.zeros(sbs, np.uint8)
    weight = np.zeros(32, np.float32)
    scales = np.zeros(8, np.float32)
    for r in range(nrow):
        for ibl in range(n // sbs):
            iq4_nl_impl(sbs, rows[r, sbs * ibl:sbs * ibl + sbs], out[r, bs * ibl:bs * ibl + bs],
                        qw[sbs * ibl:sbs * ibl + sbs], use_qw, KVALUES_IQ4NL, L, weight, scales)

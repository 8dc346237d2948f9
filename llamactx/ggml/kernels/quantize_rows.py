"""Row quantizers of ggml-quants.c for the K-quants and, with an importance matrix, the legacy 32-blocks:
`quantize_chunk(type, rows, imatrix)` is `ggml_quantize_chunk` for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS
(quantize_iq4.py), IQ3_S (quantize_iq3s.py), IQ2_XS (quantize_iq2xs.py), and Q4_0, Q4_1, Q5_0, Q5_1 when an
imatrix is given (without one those are the `_ref` quantizers gguf-py also has).

Without an imatrix ggml_quantize_chunk calls `quantize_row_q{2..6}_K_ref`; with one, `quantize_row_*_impl` with
the tensor's column weights (different scale searches: make_qkx3 / make_qp instead of make_qkx2 and a max). The
searches are quant_search.py's; block layouts are ggml-common.h `block_q{2..6}_K`, `block_q{4,5}_{0,1}`.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from numba import njit

from llamactx.ggml.kernels.quant_search import (
    F32,
    GROUP_MAX_EPS,
    ONE,
    ZERO,
    fp16_round,
    make_q3_quants,
    make_qkx,
    make_qp_quants,
    make_qx_quants,
    nearest_int,
)
from llamactx.ggml.kernels.quantize_iq2xs import quantize_rows_iq2xs
from llamactx.ggml.kernels.quantize_iq3s import quantize_rows_iq3s
from llamactx.ggml.kernels.quantize_iq4 import quantize_rows_iq4

T = GGMLQuantizationType
I64 = np.int64
QK_K = 256


@njit(cache=True, inline="always")
def _put_f16(out, o, f):
    """Store GGML_FP32_TO_FP16(f) at out[o:o+2]; returns GGML_FP16_TO_FP32 of it."""
    bits, value = fp16_round(f)
    out[o] = bits & 0xFF
    out[o + 1] = bits >> 8
    return value


@njit(cache=True, inline="always")
def _pack_2bit(L, qs):
    for j in range(0, QK_K, 128):
        for k in range(32):
            qs[j // 4 + k] = (I64(L[j + k]) | (I64(L[j + k + 32]) << 2) | (I64(L[j + k + 64]) << 4)
                              | (I64(L[j + k + 96]) << 6))


@njit(cache=True)
def q2_k_block(x, out, qw, use_qw, fb, ub):
    """`quantize_row_q2_K_ref` (use_qw False) / `quantize_row_q2_K_impl` for one super-block (84 bytes)."""
    L, Laux, w, mins, scales = ub[0:256], ub[256:272], fb[0:16], fb[32:48], fb[48:64]
    sc = out[0:16]
    if use_qw:
        sw = fb[64:80]
        sw[:] = 0
        sumx2 = ZERO
        for j in range(QK_K):
            sumx2 += x[j] * x[j]
        sigma2 = sumx2 / F32(QK_K)
        for j in range(16):
            for k in range(16):
                w[k] = qw[16 * j + k] * np.sqrt(sigma2 + x[16 * j + k] * x[16 * j + k])
            for k in range(16):
                sw[j] += w[k]
            scales[j], mins[j] = make_qkx(16, 3, x[16 * j:16 * j + 16], w, True, L[16 * j:16 * j + 16], Laux,
                                          F32(-0.9), F32(0.05), 36, False, True)
        Ls, Lm = ub[288:304], ub[304:320]
        dm = make_qp_quants(16, 15, scales, Ls, sw)
        mm = make_qp_quants(16, 15, mins, Lm, sw)
        dm = _put_f16(out, 80, dm)
        mm = _put_f16(out, 82, mm)
        for j in range(16):
            sc[j] = I64(Ls[j]) | (I64(Lm[j]) << 4)
    else:
        max_scale = ZERO
        max_min = ZERO
        for j in range(16):
            for k in range(16):
                w[k] = abs(x[16 * j + k])
            scales[j], mins[j] = make_qkx(16, 3, x[16 * j:16 * j + 16], w, True, L[16 * j:16 * j + 16], Laux,
                                          F32(-0.5), F32(0.1), 15, True, False)
            max_scale = max(max_scale, scales[j])
            max_min = max(max_min, mins[j])
        q4scale = F32(15.0)
        dm = ZERO
        mm = ZERO
        if max_scale > 0:
            iscale = q4scale / max_scale
            for j in range(16):
                sc[j] = nearest_int(iscale * scales[j])
            dm = _put_f16(out, 80, max_scale / q4scale)
        else:
            for j in range(16):
                sc[j] = 0
            dm = _put_f16(out, 80, ZERO)
        if max_min > 0:
            iscale = q4scale / max_min
            for j in range(16):
                sc[j] = I64(sc[j]) | nearest_int(iscale * mins[j]) << 4
            mm = _put_f16(out, 82, max_min / q4scale)
        else:
            mm = _put_f16(out, 82, ZERO)
    for j in range(16):
        d = dm * F32(sc[j] & 0xF)
        if d == 0:
            continue
        m = mm * F32(I64(sc[j]) >> 4)
        for ii in range(16):
            L[16 * j + ii] = max(0, min(3, nearest_int((x[16 * j + ii] + m) / d)))
    _pack_2bit(L, out[16:80])


@njit(cache=True)
def q3_k_block(x, out, qw, use_qw, fb, sb):
    """`quantize_row_q3_K_ref` / `quantize_row_q3_K_impl` for one super-block (110 bytes)."""
    L, scales = sb[0:256], fb[48:64]
    ysc = out[96:108]
    ysc[:] = 0
    if use_qw:
        w, sw, Ls = fb[0:16], fb[64:80], sb[256:272]
        sumx2 = ZERO
        for j in range(QK_K):
            sumx2 += x[j] * x[j]
        sigma2 = F32(2.0) * sumx2 / F32(QK_K)
        for j in range(16):
            for k in range(16):
                w[k] = qw[16 * j + k] * np.sqrt(sigma2 + x[16 * j + k] * x[16 * j + k])
            sumw = ZERO
            for k in range(16):
                sumw += w[k]
            sw[j] = sumw
            scales[j] = make_qx_quants(16, 4, x[16 * j:16 * j + 16], L[16 * j:16 * j + 16], 1, w, True)
        d_block = make_qx_quants(16, 32, scales, Ls, 1, sw, True)
        for j in range(16):
            _put_q3_scale(ysc, j, I64(Ls[j]))
        d_all = _put_f16(out, 108, d_block)
    else:
        max_scale = ZERO
        amax = ZERO
        for j in range(16):
            scales[j] = make_q3_quants(16, 4, x[16 * j:16 * j + 16], L[16 * j:16 * j + 16])
            scale = abs(scales[j])
            if scale > amax:
                amax = scale
                max_scale = scales[j]
        if max_scale != 0:
            iscale = F32(-32.0) / max_scale
            for j in range(16):
                k = max(-32, min(31, np.int8(nearest_int(iscale * scales[j])))) + 32
                _put_q3_scale(ysc, j, k)
            d_all = _put_f16(out, 108, ONE / iscale)
        else:
            d_all = _put_f16(out, 108, ZERO)
    for j in range(16):
        s = (I64(ysc[j]) & 0xF) if j < 8 else (I64(ysc[j - 8]) >> 4)
        s = (s | (((I64(ysc[8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32
        d = d_all * F32(s)
        if d == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-4, min(3, nearest_int(x[16 * j + ii] / d))) + 4
    hmask = out[0:32]
    hmask[:] = 0
    m = 0
    hm = 1
    for j in range(QK_K):
        if I64(L[j]) > 3:
            hmask[m] = I64(hmask[m]) | hm
            L[j] -= 4
        m += 1
        if m == 32:
            m = 0
            hm <<= 1
    _pack_2bit(L, out[32:96])


@njit(cache=True, inline="always")
def _put_q3_scale(ysc, j, k):
    if j < 8:
        ysc[j] = k & 0xF
    else:
        ysc[j - 8] = I64(ysc[j - 8]) | (k & 0xF) << 4
    ysc[j % 4 + 8] = I64(ysc[j % 4 + 8]) | (k >> 4) << (2 * (j // 4))


@njit(cache=True)
def q45_k_block(x, out, qw, use_qw, nmax, fb, ub):
    """`quantize_row_q4_K_ref` / `_impl` (nmax 15, 144 bytes) and `quantize_row_q5_K_ref` / `_impl` (nmax 31,
    176 bytes) for one super-block."""
    L, Laux, Ls, Lm = ub[0:256], ub[256:288], ub[288:296], ub[304:312]
    w, mins, scales = fb[0:32], fb[32:40], fb[48:56]
    if use_qw:
        sw = fb[64:72]
        sum_x2 = ZERO
        for k in range(QK_K):
            sum_x2 += x[k] * x[k]
        sigma2 = F32(2.0) * sum_x2 / F32(QK_K)
        for j in range(8):
            for k in range(32):
                w[k] = qw[32 * j + k] * np.sqrt(sigma2 + x[32 * j + k] * x[32 * j + k])
            sumw = ZERO
            for k in range(32):
                sumw += w[k]
            sw[j] = sumw
            scales[j], mins[j] = make_qkx(32, nmax, x[32 * j:32 * j + 32], w, True, L[32 * j:32 * j + 32], Laux,
                                          F32(-0.9), F32(0.05), 36, False, True)
        d_block = make_qp_quants(8, 63, scales, Ls, sw)
        m_block = make_qp_quants(8, 63, mins, Lm, sw)
    else:
        max_scale = ZERO
        max_min = ZERO
        rmin, nstep = (F32(-1.0), 20) if nmax == 15 else (F32(-0.5), 15)
        for j in range(8):
            sum_x2 = ZERO
            for k in range(32):
                sum_x2 += x[32 * j + k] * x[32 * j + k]
            av_x = np.sqrt(sum_x2 / F32(32.0))
            for k in range(32):
                w[k] = av_x + abs(x[32 * j + k])
            scales[j], mins[j] = make_qkx(32, nmax, x[32 * j:32 * j + 32], w, True, L[32 * j:32 * j + 32], Laux,
                                          rmin, F32(0.1), nstep, False, False)
            max_scale = max(max_scale, scales[j])
            max_min = max(max_min, mins[j])
        inv_scale = F32(63.0) / max_scale if max_scale > 0 else ZERO
        inv_min = F32(63.0) / max_min if max_min > 0 else ZERO
        for j in range(8):
            Ls[j] = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
            Lm[j] = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        d_block = max_scale / F32(63.0)
        m_block = max_min / F32(63.0)
    ysc = out[4:16]
    for j in range(8):
        ls = min(63, I64(Ls[j]))
        lm = min(63, I64(Lm[j]))
        if j < 4:
            ysc[j] = ls
            ysc[j + 4] = lm
        else:
            ysc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            ysc[j - 4] = I64(ysc[j - 4]) | (ls >> 4) << 6
            ysc[j] = I64(ysc[j]) | (lm >> 4) << 6
    d_all = _put_f16(out, 0, d_block)
    m_all = _put_f16(out, 2, m_block)
    for j in range(8):
        if j < 4:
            sc, m = ysc[j] & 63, ysc[j + 4] & 63
        else:
            sc = (I64(ysc[j + 4]) & 0xF) | ((I64(ysc[j - 4]) >> 6) << 4)
            m = (I64(ysc[j + 4]) >> 4) | ((I64(ysc[j]) >> 6) << 4)
        d = d_all * F32(sc)
        if d == 0:
            continue
        dm = m_all * F32(m)
        for ii in range(32):
            L[32 * j + ii] = max(0, min(nmax, nearest_int((x[32 * j + ii] + dm) / d)))
    if nmax == 15:
        q = out[16:144]
        for j in range(0, QK_K, 64):
            for k in range(32):
                q[j // 2 + k] = I64(L[j + k]) | (I64(L[j + k + 32]) << 4)
        return
    qh = out[16:48]
    ql = out[48:176]
    qh[:] = 0
    m1 = 1
    m2 = 2
    for n in range(0, QK_K, 64):
        for j in range(32):
            l1 = I64(L[n + j])
            if l1 > 15:
                l1 -= 16
                qh[j] = I64(qh[j]) | m1
            l2 = I64(L[n + j + 32])
            if l2 > 15:
                l2 -= 16
                qh[j] = I64(qh[j]) | m2
            ql[n // 2 + j] = l1 | (l2 << 4)
        m1 <<= 2
        m2 <<= 2


@njit(cache=True)
def q6_k_block(x, out, qw, use_qw, fb, sb):
    """`quantize_row_q6_K_ref` / `_impl` for one super-block (210 bytes)."""
    L, scales = sb[0:256], fb[48:64]
    max_scale = ZERO
    max_abs_scale = ZERO
    for ib in range(16):
        scale = make_qx_quants(16, 32, x[16 * ib:16 * ib + 16], L[16 * ib:16 * ib + 16], 1,
                               qw[16 * ib:16 * ib + 16], use_qw)
        scales[ib] = scale
        if abs(scale) > max_abs_scale:
            max_abs_scale = abs(scale)
            max_scale = scale
    if max_abs_scale < GROUP_MAX_EPS:
        out[:] = 0
        return
    iscale = F32(-128.0) / max_scale
    d_all = _put_f16(out, 208, ONE / iscale)
    ysc = out[192:208]
    for ib in range(16):
        ysc[ib] = np.uint8(np.int8(min(127, nearest_int(iscale * scales[ib]))))
    for j in range(16):
        d = d_all * F32(np.int8(ysc[j]))
        if d == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-32, min(31, nearest_int(x[16 * j + ii] / d))) + 32
    ql = out[0:128]
    qh = out[128:192]
    for j in range(0, QK_K, 128):
        for k in range(32):
            q1 = L[j + k] & 0xF
            q2 = L[j + k + 32] & 0xF
            q3 = L[j + k + 64] & 0xF
            q4 = L[j + k + 96] & 0xF
            ql[j // 2 + k] = q1 | (q3 << 4)
            ql[j // 2 + k + 32] = q2 | (q4 << 4)
            qh[j // 4 + k] = ((I64(L[j + k]) >> 4) | ((I64(L[j + k + 32]) >> 4) << 2) | ((I64(L[j + k + 64]) >> 4) << 4)
                              | ((I64(L[j + k + 96]) >> 4) << 6))


@njit(cache=True)
def legacy_block_w(x, out, qw, sigma2, kind, fb, ub):
    """`quantize_row_q4_0_impl` (kind 0), `q4_1` (1), `q5_0` (2), `q5_1` (3) for one 32-block, with weights."""
    w = fb[0:32]
    for j in range(32):
        w[j] = qw[j] * np.sqrt(sigma2 + x[j] * x[j])
    L = ub[0:32]
    if kind == 0 or kind == 2:
        d = make_qx_quants(32, 8 if kind == 0 else 16, x, L, 1, w, True)
        _put_f16(out, 0, d)
        o = 2
    else:
        Laux = ub[256:288]
        d, mn = make_qkx(32, 15 if kind == 1 else 31, x, w, True, L, Laux, F32(-0.9), F32(0.05), 36, False, True)
        _put_f16(out, 0, d)
        _put_f16(out, 2, -mn)
        o = 4
    if kind >= 2:
        qh = 0
        for j in range(16):
            qh |= ((I64(L[j]) & 0x10) >> 4) << j
            qh |= ((I64(L[j + 16]) & 0x10) >> 4) << (j + 16)
        for b in range(4):
            out[o + b] = (qh >> (8 * b)) & 0xFF
        o += 4
    for j in range(16):
        out[o + j] = (I64(L[j]) & 0xF) | ((I64(L[j + 16]) & 0xF) << 4)


@njit(cache=True)
def quantize_rows_k(rows, out, qw, use_qw, kind):
    """Each row of `rows` (nrow, n_per_row) float32 into `out` (nrow, row_size) uint8. kind: 2..6 for Q2_K..Q6_K
    (5 is Q5_K, 4 Q4_K), 10..13 for Q4_0, Q4_1, Q5_0, Q5_1 with weights."""
    nrow, n = rows.shape
    fb = np.zeros(80, np.float32)  # scratch: weights, mins, scales, sums of weights
    ub = np.zeros(320, np.uint8)  # scratch: levels L, Laux, Ls, Lm
    sb = np.zeros(272, np.int8)  # scratch: signed levels
    for r in range(nrow):
        x = rows[r]
        y = out[r]
        if kind >= 10:
            sum_x2 = ZERO
            for j in range(n):
                sum_x2 += x[j] * x[j]
            sigma2 = sum_x2 / F32(n)
            bs = (18, 20, 22, 24)[kind - 10]
            for ib in range(n // 32):
                legacy_block_w(x[32 * ib:32 * ib + 32], y[bs * ib:bs * ib + bs], qw[32 * ib:32 * ib + 32], sigma2,
                               kind - 10, fb, ub)
            continue
        bs = (84, 110, 144, 176, 210)[kind - 2]
        for ib in range(n // QK_K):
            xb = x[QK_K * ib:QK_K * ib + QK_K]
            yb = y[bs * ib:bs * ib + bs]
            wb = qw[QK_K * ib:QK_K * ib + QK_K]
            if kind == 2:
                q2_k_block(xb, yb, wb, use_qw, fb, ub)
            elif kind == 3:
                q3_k_block(xb, yb, wb, use_qw, fb, sb)
            elif kind == 6:
                q6_k_block(xb, yb, wb, use_qw, fb, sb)
            else:
                q45_k_block(xb, yb, wb, use_qw, 15 if kind == 4 else 31, fb, ub)


_KIND = {T.Q2_K: 2, T.Q3_K: 3, T.Q4_K: 4, T.Q5_K: 5, T.Q6_K: 6, T.Q4_0: 10, T.Q4_1: 11, T.Q5_0: 12, T.Q5_1: 13}
K_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.IQ3_S, T.IQ2_XS)  # IQ2_XS: imatrix only
WEIGHTED_LEGACY_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)


def quantize_chunk(qtype: T, rows: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
    """ggml_quantize_chunk for a K-quant (with or without imatrix) or a legacy 32-block type with an imatrix.
    rows: (nrow, n_per_row) float32, n_per_row a multiple of the block; imatrix: (n_per_row,) float32 or None.
    Returns (nrow, row_size) uint8."""
    if qtype not in K_TYPES and (qtype not in WEIGHTED_LEGACY_TYPES or imatrix is None):
        raise ValueError(f"quantize_chunk: {qtype.name} is not quantized here (imatrix given: {imatrix is not None})")
    rows = np.ascontiguousarray(rows, dtype=np.float32)  # (nrow, n_per_row)
    block, type_size = GGML_QUANT_SIZES[qtype]
    nrow, n = rows.shape
    out = np.zeros((nrow, n // block * type_size), np.uint8)  # (nrow, row_size)
    qw = np.zeros(n, np.float32) if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    if qtype == T.IQ2_XS:
        if imatrix is None:
            raise ValueError("quantize_chunk: IQ2_XS needs an importance matrix")
        quantize_rows_iq2xs(rows, out, qw)
    elif qtype == T.IQ3_S:
        quantize_rows_iq3s(rows, out, qw, imatrix is not None)
    elif qtype in (T.IQ4_NL, T.IQ4_XS):
        quantize_rows_iq4(rows, out, qw, imatrix is not None, block)
    else:
        quantize_rows_k(rows, out, qw, imatrix is not None, _KIND[qtype])
    return out

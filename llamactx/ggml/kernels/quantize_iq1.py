"""ggml-quants.c's IQ1_S and IQ1_M quantizers: `iq2xs_init_impl(GGML_TYPE_IQ1_S / IQ1_M)` (the 2048-point grid of
8 levels in {-1, 0, 1}, stored as 1, 3, 5; its map and the neighbours at the three nearest distances:
quant_search.iq2_grid_tables) and `quantize_row_iq1_s_impl` / `quantize_row_iq1_m_impl`. Each block of 32 (IQ1_S)
or 16 (IQ1_M) values is split exactly: sorted, then every pair of boundaries between the levels -1 - delta, -delta
and 1 - delta (or their + delta twins) scored by weighted least squares from prefix sums; the levels are then
snapped to the grid. IQ1_M picks the shift per half block and refits the super-block scale at the end.

The grid is ggml-common.h iq1s_grid (llamactx.gguf.iq_grids); the layouts `block_iq1_s` (d, qs[32]: grid index low
bytes, qh[8]: per block three 3-bit index highs, a 3-bit scale and the shift's sign) and `block_iq1_m` (qs[32],
qh[16]: two 3-bit index highs and two shift bits per block, scales[8]: twelve 3-bit scales and the f16 d in the top
nibbles). glibc's qsort for these small arrays is a merge sort, so ties keep their order: a stable argsort.
Arithmetic as quant_search.py says. cli/quantize.py calls it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from llamactx.ggml.kernels.quant_search import F32, ONE, ZERO, fp16_round, grid_code, iq2_grid_tables, nearest_int
from llamactx.gguf.iq_grids import IQ1S_GRID

NWANT = 3
FLT_MAX = F32(np.finfo(np.float32).max)
GROUP_MAX_EPS_IQ1_S = F32(1e-12)
GROUP_MAX_EPS_IQ1_M = F32(1e-7)
X_P = np.array([-1 + 0.125, 0.125, 1 + 0.125], np.float32)  # the levels shifted by +IQ1S_DELTA (= IQ1M_DELTA)
X_M = np.array([-1 - 0.125, -0.125, 1 - 0.125], np.float32)  # and by -delta
IQ1M_MASKS = np.array([0x00, 0x80, 0x08, 0x88], np.int64)  # qh bits of the shift: 0 +,+  1 +,-  2 -,+  3 -,-
TYPE_SIZE_IQ1_S = 50  # sizeof(block_iq1_s): d, qs[32], qh[8] (uint16)
TYPE_SIZE_IQ1_M = 56  # sizeof(block_iq1_m): qs[32], qh[16], scales[8]


@lru_cache(maxsize=1)
def iq1_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """iq2xs_init_impl(GGML_TYPE_IQ1_S), shared by IQ1_M: grid (2048, 8) int8 (2l + 1 for levels -1, 0, 1 as
    l = 0, 1, 2), kmap (43692,) int32, neighbours up to the third distinct distance. iq2_grid_tables reads a grid
    in IQ2's stored magnitudes (0x08, 0x19, 0x2b for l = 0, 1, 2), so the levels are spelled that way."""
    magnitudes = np.array([0x08, 0x19, 0x2B], np.uint8)[IQ1S_GRID.astype(np.int64) + 1]  # (2048, 8)
    return iq2_grid_tables(magnitudes, nwant=NWANT)


@njit(cache=True)
def iq1_best_neighbour(neigh, off, grid, xb, weight, scale, xg, L):
    """iq1_find_best_neighbour2: among the grid rows listed at neigh[off], the one minimizing
    sum_i weight_i (scale * xg[l_i] - xb_i)^2; its levels into L. -> its grid index. (ggml's fallback for no
    finite score reads past xb: refused here, it only happens for NaN / inf input.)"""
    best_d2 = FLT_MAX
    grid_index = -1
    for j in range(1, int(neigh[off]) + 1):
        g = int(neigh[off + j])
        d2 = ZERO
        for i in range(8):
            diff = scale * xg[(grid[g, i] - 1) // 2] - xb[i]
            d2 += weight[i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            grid_index = g
    if grid_index < 0:
        raise ValueError("quantize_row_iq1_impl: no grid point has a finite error (NaN or inf in the input?)")
    for i in range(8):
        L[i] = (grid[grid_index, i] - 1) // 2
    return grid_index


@njit(cache=True)
def iq1_snap(L, k, xb, weight, scale, xg, grid, kmap, neigh):
    """Group k of L (8 levels) as a grid index: its own when on the grid, else its best neighbour (whose levels
    replace it in L). -> (grid index, whether it was on the grid)."""
    u = grid_code(L, k, 8, 2)
    if kmap[u] >= 0:
        return int(kmap[u]), True
    g = iq1_best_neighbour(neigh, -kmap[u] - 1, grid, xb[8 * k:8 * k + 8], weight[8 * k:8 * k + 8], scale, xg,
                           L[8 * k:8 * k + 8])
    return g, False


@njit(cache=True)
def grid_sums(sumqx, sumq2, g, xb, weight, xg, mult, grid):
    """sumqx += w q x, sumq2 += w q^2 over the 8 values of grid row g, q = xg[l] * mult, in element order."""
    for j in range(8):
        q = xg[(grid[g, j] - 1) // 2] * mult
        sumqx += weight[j] * q * xb[j]
        sumq2 += weight[j] * q * q
    return sumqx, sumq2


@njit(cache=True)
def split_sums(sumx, sumw, i1, i2, n, xx):
    """The sums of quantize_row_iq1_s_impl's split: levels xx[0] below i1, xx[1] to i2, xx[2] above."""
    sumqx = (sumx[i1] - sumx[0]) * xx[0] + (sumx[i2] - sumx[i1]) * xx[1] + (sumx[n] - sumx[i2]) * xx[2]
    sumq2 = ((sumw[i1] - sumw[0]) * xx[0] * xx[0] + (sumw[i2] - sumw[i1]) * xx[1] * xx[1]
             + (sumw[n] - sumw[i2]) * xx[2] * xx[2])
    return sumqx, sumq2


@njit(cache=True)
def iq1s_split(sumx, sumw, n, scale):
    """The exhaustive split of quantize_row_iq1_s_impl over the sorted prefix sums: -> (scale, i1, i2, shift),
    shift +1 for X_P, -1 for X_M, 0 when nothing scored."""
    best = -FLT_MAX
    b1 = -1
    b2 = -1
    shift = 0
    for i1 in range(n + 1):
        for i2 in range(i1, n + 1):
            sumqx, sumq2 = split_sums(sumx, sumw, i1, i2, n, X_P)
            if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                scale = sumqx / sumq2
                best = scale * sumqx
                b1, b2, shift = i1, i2, 1
            sumqx, sumq2 = split_sums(sumx, sumw, i1, i2, n, X_M)
            if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                scale = sumqx / sumq2
                best = scale * sumqx
                b1, b2, shift = i1, i2, -1
    return scale, b1, b2, shift


@njit(cache=True)
def block_levels(L, idx, n, i1, i2):
    """L[idx[j]] = 0 below the first boundary, 1 to the second, 2 above (idx: the ascending order)."""
    for j in range(n):
        L[idx[j]] = 0 if j < i1 else 1 if j < i2 else 2


@njit(cache=True)
def abs_max(xb):
    mx = abs(xb[0])
    for i in range(1, len(xb)):
        v = abs(xb[i])
        mx = mx if mx > v else v
    return mx


@njit(cache=True)
def iq1_weights(weight, xb, qw, use_qw, sigma2):
    """qw * sqrt(sigma2 + x^2), or x^2 without an importance matrix (IQ1_M only)."""
    for i in range(len(xb)):
        weight[i] = qw[i] * np.sqrt(sigma2 + xb[i] * xb[i]) if use_qw else xb[i] * xb[i]


@njit(cache=True)
def sigma2_of(xbl):
    sumx2 = ZERO
    for i in range(256):
        sumx2 += xbl[i] * xbl[i]
    return F32(2.0) * sumx2 / F32(256.0)


@njit(cache=True)
def iq1s_superblock(xbl, y, qw, grid, kmap, neigh, scales, shifts, weight, sumx, sumw, L, qh):
    """quantize_row_iq1_s_impl for one super-block of 256 into y (50 bytes)."""
    y[:] = 0
    qh[:] = 0
    index = np.zeros(4, np.int64)
    max_scale = ZERO
    sigma2 = sigma2_of(xbl)
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        iq1_weights(weight, xb, qw[32 * ib:32 * ib + 32], True, sigma2)
        scales[ib] = ZERO
        shifts[ib] = 1
        mx = abs_max(xb)
        if mx < GROUP_MAX_EPS_IQ1_S:
            continue
        idx = np.argsort(xb, kind="mergesort")
        sumx[0] = ZERO
        sumw[0] = ZERO
        for j in range(32):
            sumx[j + 1] = sumx[j] + weight[idx[j]] * xb[idx[j]]
            sumw[j + 1] = sumw[j] + weight[idx[j]]
        scale, i1, i2, shift = iq1s_split(sumx, sumw, 32, mx)
        if i1 < 0 or i2 < 0 or shift == 0:
            continue
        block_levels(L, idx, 32, i1, i2)
        if scale < 0:
            for j in range(32):
                L[j] = 2 - L[j]
            scale = -scale
            shift = -shift
        xx = X_P if shift == 1 else X_M
        all_on_grid = True
        for k in range(4):
            g, on_grid = iq1_snap(L, k, xb, weight, scale, xx, grid, kmap, neigh)
            index[k] = g
            all_on_grid = all_on_grid and on_grid
        if not all_on_grid:
            sumqx = ZERO
            sumq2 = ZERO
            for k in range(4):
                sumqx, sumq2 = grid_sums(sumqx, sumq2, index[k], xb[8 * k:8 * k + 8], weight[8 * k:8 * k + 8], xx,
                                         ONE, grid)
            if sumqx > 0 and sumq2 > 0:
                scale = sumqx / sumq2
        for k in range(4):
            y[2 + 4 * ib + k] = index[k] & 255
            qh[ib] |= (index[k] >> 8) << (3 * k)
        scales[ib] = scale
        shifts[ib] = shift
        max_scale = max_scale if max_scale > scale else scale
    if max_scale != 0:
        d = max_scale / F32(15.0)
        bits, _ = fp16_round(d * F32(1.125))
        y[0] = bits & 0xFF
        y[1] = bits >> 8
        id_ = ONE / d
        for ib in range(8):
            lv = max(0, min(7, nearest_int(F32(0.5) * (id_ * scales[ib] - ONE))))
            qh[ib] |= (lv | (8 if shifts[ib] == -1 else 0)) << 12
    for ib in range(8):
        y[34 + 2 * ib] = qh[ib] & 0xFF
        y[35 + 2 * ib] = qh[ib] >> 8


@njit(cache=True)
def iq1m_split(xb, weight, idx, px, pw):
    """The exhaustive split of quantize_row_iq1_m_impl: prefix sums per half block (each half has its own shift;
    the 3-level sums collapse to T v[2] - px[i1] - px[i2]), every boundary pair scored for the four shift pairs.
    -> (scale, i1, i2, k), k = 2 * (first half's shift is -) + (second half's is -), -1 when nothing scored."""
    px[:, 0] = ZERO
    pw[:, 0] = ZERO
    for j in range(16):
        i = idx[j]
        h = 0 if i < 8 else 1
        px[h, j + 1] = px[h, j] + weight[i] * xb[i]
        px[1 - h, j + 1] = px[1 - h, j]
        pw[h, j + 1] = pw[h, j] + weight[i]
        pw[1 - h, j + 1] = pw[1 - h, j]
    p2 = X_P[2]
    m2 = X_M[2]
    cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1]
    cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2]
    cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1]
    cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2]
    qx_p = np.zeros(2, np.float32)
    qx_m = np.zeros(2, np.float32)
    q2_p = np.zeros(2, np.float32)
    q2_m = np.zeros(2, np.float32)
    sumqx = np.zeros(4, np.float32)
    sumq2 = np.zeros(4, np.float32)
    best = -FLT_MAX
    scale = abs_max(xb)
    b1 = -1
    b2 = -1
    best_k = -1
    for i1 in range(17):
        for i2 in range(i1, 17):
            for h in range(2):
                sx = px[h, i1] + px[h, i2]
                qx_p[h] = px[h, 16] * p2 - sx
                qx_m[h] = px[h, 16] * m2 - sx
                q2_p[h] = pw[h, 16] * p2 * p2 + pw[h, i1] * cp1 + pw[h, i2] * cp2
                q2_m[h] = pw[h, 16] * m2 * m2 + pw[h, i1] * cm1 + pw[h, i2] * cm2
            sumqx[0] = qx_p[0] + qx_p[1]
            sumqx[1] = qx_p[0] + qx_m[1]
            sumqx[2] = qx_m[0] + qx_p[1]
            sumqx[3] = qx_m[0] + qx_m[1]
            sumq2[0] = q2_p[0] + q2_p[1]
            sumq2[1] = q2_p[0] + q2_m[1]
            sumq2[2] = q2_m[0] + q2_p[1]
            sumq2[3] = q2_m[0] + q2_m[1]
            for k in range(4):
                if sumq2[k] > 0 and sumqx[k] * sumqx[k] > best * sumq2[k]:
                    scale = sumqx[k] / sumq2[k]
                    best = scale * sumqx[k]
                    b1, b2, best_k = i1, i2, k
    return scale, b1, b2, best_k


@njit(cache=True)
def iq1m_levels(k, shift):
    """The levels of half k of a block with shift pair `shift`: X_P or X_M."""
    minus = shift >= 2 if k == 0 else shift % 2 == 1
    return X_M if minus else X_P


@njit(cache=True)
def iq1m_superblock(xbl, y, qw, use_qw, grid, kmap, neigh, scales, shifts, weight, px, pw, L):
    """quantize_row_iq1_m_impl for one super-block of 256 into y (56 bytes)."""
    y[:] = 0
    index = np.zeros(2, np.int64)
    qh = np.zeros(16, np.int64)
    max_scale = ZERO
    sigma2 = sigma2_of(xbl)
    for ib in range(16):
        xb = xbl[16 * ib:16 * ib + 16]
        iq1_weights(weight, xb, qw[16 * ib:16 * ib + 16], use_qw, sigma2)
        scales[ib] = ZERO
        shifts[ib] = 0
        if abs_max(xb) < GROUP_MAX_EPS_IQ1_M:
            continue
        idx = np.argsort(xb, kind="mergesort")
        scale, i1, i2, best_k = iq1m_split(xb, weight, idx, px, pw)
        if i1 < 0 or i2 < 0 or best_k < 0:
            continue
        block_levels(L, idx, 16, i1, i2)
        if scale < 0:
            for j in range(16):
                L[j] = 2 - L[j]
            scale = -scale
            best_k = 3 - best_k
        all_on_grid = True
        for k in range(2):
            g, on_grid = iq1_snap(L, k, xb, weight, scale, iq1m_levels(k, best_k), grid, kmap, neigh)
            index[k] = g
            all_on_grid = all_on_grid and on_grid
        if not all_on_grid:
            sumqx = ZERO
            sumq2 = ZERO
            for k in range(2):
                sumqx, sumq2 = grid_sums(sumqx, sumq2, index[k], xb[8 * k:8 * k + 8], weight[8 * k:8 * k + 8],
                                         iq1m_levels(k, best_k), ONE, grid)
            if sumqx > 0 and sumq2 > 0:
                scale = sumqx / sumq2
        y[2 * ib] = index[0] & 255
        y[2 * ib + 1] = index[1] & 255
        qh[ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
        scales[ib] = scale
        shifts[ib] = best_k
        max_scale = max_scale if max_scale > scale else scale
    if max_scale != 0:
        iq1m_scales(xbl, y, qw, use_qw, grid, scales, shifts, weight, qh, max_scale, sigma2)
    for ib in range(16):
        y[32 + ib] = qh[ib]


@njit(cache=True)
def iq1m_scales(xbl, y, qw, use_qw, grid, scales, shifts, weight, qh, max_scale, sigma2):
    """The end of quantize_row_iq1_m_impl: 3-bit block scales from max_scale / 15, the shift bits into qh, then
    d refit by least squares over the whole super-block (blocks left empty count, as grid point 0 with scale 1)
    and stored, times 1.1125, as an f16 in the top nibbles of the four scale words."""
    sc = np.zeros(4, np.int64)
    d = max_scale / F32(15.0)
    id_ = ONE / d
    sumqx = ZERO
    sumq2 = ZERO
    for ib in range(16):
        lv = max(0, min(7, nearest_int(F32(0.5) * (id_ * scales[ib] - ONE))))
        sc[ib // 4] |= lv << (3 * (ib % 4))
        qh[ib] |= IQ1M_MASKS[shifts[ib]]
        xb = xbl[16 * ib:16 * ib + 16]
        iq1_weights(weight, xb, qw[16 * ib:16 * ib + 16], use_qw, sigma2)
        for k in range(2):
            g = int(y[2 * ib + k]) + ((qh[ib] << (8 - 4 * k)) & 0x700)
            sumqx, sumq2 = grid_sums(sumqx, sumq2, g, xb[8 * k:8 * k + 8], weight[8 * k:8 * k + 8],
                                     iq1m_levels(k, shifts[ib]), F32(2 * lv + 1), grid)
    if sumq2 > 0:
        d = sumqx / sumq2
    bits, _ = fp16_round(d * F32(1.1125))
    sc[0] |= (bits & 0x000F) << 12
    sc[1] |= (bits & 0x00F0) << 8
    sc[2] |= (bits & 0x0F00) << 4
    sc[3] |= bits & 0xF000
    for j in range(4):
        y[48 + 2 * j] = sc[j] & 0xFF
        y[49 + 2 * j] = sc[j] >> 8


@njit(cache=True)
def quantize_rows_iq1s_kernel(rows, out, qw, grid, kmap, neigh):
    nrow, n = rows.shape
    scales = np.zeros(8, np.float32)
    shifts = np.zeros(8, np.int64)
    weight = np.zeros(32, np.float32)
    sumx = np.zeros(33, np.float32)
    sumw = np.zeros(33, np.float32)
    L = np.zeros(32, np.int8)
    qh = np.zeros(8, np.int64)
    for r in range(nrow):
        for ibl in range(n // 256):
            iq1s_superblock(rows[r, 256 * ibl:256 * ibl + 256],
                            out[r, TYPE_SIZE_IQ1_S * ibl:TYPE_SIZE_IQ1_S * (ibl + 1)], qw[256 * ibl:256 * ibl + 256],
                            grid, kmap, neigh, scales, shifts, weight, sumx, sumw, L, qh)


@njit(cache=True)
def quantize_rows_iq1m_kernel(rows, out, qw, use_qw, grid, kmap, neigh):
    nrow, n = rows.shape
    scales = np.zeros(16, np.float32)
    shifts = np.zeros(16, np.int64)
    weight = np.zeros(16, np.float32)
    px = np.zeros((2, 17), np.float32)
    pw = np.zeros((2, 17), np.float32)
    L = np.zeros(16, np.int8)
    for r in range(nrow):
        for ibl in range(n // 256):
            iq1m_superblock(rows[r, 256 * ibl:256 * ibl + 256],
                            out[r, TYPE_SIZE_IQ1_M * ibl:TYPE_SIZE_IQ1_M * (ibl + 1)], qw[256 * ibl:256 * ibl + 256],
                            use_qw, grid, kmap, neigh, scales, shifts, weight, px, pw, L)


def _rows(rows: np.ndarray, what: str) -> np.ndarray:
    rows = np.ascontiguousarray(rows, dtype=F32)
    if rows.ndim != 2 or rows.shape[1] % 256:
        raise ValueError(f"{what}: rows of shape {rows.shape} are not rows of whole 256-blocks")
    return rows


def quantize_rows_iq1s(rows: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """quantize_iq1_s: rows (nrow, n) float32 with their imatrix weights qw (n,) -> (nrow, n / 256 * 50) uint8.
    Raises ValueError without qw (ggml asserts: IQ1_S needs an importance matrix)."""
    rows = _rows(rows, "quantize_rows_iq1s")
    if qw is None:
        raise ValueError("quantize_rows_iq1s: IQ1_S needs importance matrix weights (ggml asserts without them)")
    nrow, n = rows.shape
    out = np.zeros((nrow, n // 256 * TYPE_SIZE_IQ1_S), np.uint8)
    grid, kmap, neigh = iq1_tables()
    quantize_rows_iq1s_kernel(rows, out, np.ascontiguousarray(qw, dtype=F32), grid, kmap, neigh)
    return out


def quantize_rows_iq1m(rows: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """quantize_iq1_m: rows (nrow, n) float32, imatrix weights qw (n,) or None (then x^2) ->
    (nrow, n / 256 * 56) uint8."""
    rows = _rows(rows, "quantize_rows_iq1m")
    nrow, n = rows.shape
    out = np.zeros((nrow, n // 256 * TYPE_SIZE_IQ1_M), np.uint8)
    grid, kmap, neigh = iq1_tables()
    weights = np.zeros(n, F32) if qw is None else np.ascontiguousarray(qw, dtype=F32)
    quantize_rows_iq1m_kernel(rows, out, weights, qw is not None, grid, kmap, neigh)
    return out

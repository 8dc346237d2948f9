"""ggml-quants.c's IQ2_XXS quantizer: `iq2xs_init_impl(GGML_TYPE_IQ2_XXS)` (the 256-point grid of 8 levels in
{1, 3, 5}, its map and neighbours: quant_search.iq2_grid_tables) and `quantize_row_iq2_xxs_impl` (32-element
blocks started from make_qp_quants' scale, an importance matrix required). The grid is ggml-common.h iq2xxs_grid
(llamactx.gguf.iq_grids), the layout `block_iq2_xxs` (d, then per 32-block a uint32 of four grid indices and a
uint32 of four 7-bit sign sets and the 4-bit scale); arithmetic as quant_search.py says. cli/quantize.py calls it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from llamactx.ggml.kernels.quant_search import (
    F32,
    GROUP_MAX_EPS,
    ONE,
    ZERO,
    best_neighbour,
    even_signs,
    fp16_round,
    grid_code,
    iq2_grid_tables,
    level_sums,
    make_qp_quants,
    nearest_int,
)
from llamactx.gguf.iq_grids import IQ2XXS_GRID

K_MAX_Q = 3
TYPE_SIZE = 66  # sizeof(block_iq2_xxs): d, qs[32] (uint16)


@lru_cache(maxsize=1)
def iq2xxs_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """iq2xs_init_impl(GGML_TYPE_IQ2_XXS): grid (256, 8) int8, kmap, neighbours (two nearest distances)."""
    return iq2_grid_tables(IQ2XXS_GRID.view(np.uint8).reshape(256, 8), nwant=2)


@njit(cache=True)
def iq2xxs_superblock(xbl, y, qw, grid, kmap, neigh, scales, weight, waux, xval, L, Laux, Lqp, q2):
    """quantize_row_iq2_xxs_impl for one super-block of 256 into y (66 bytes)."""
    y[:] = 0
    q2[:] = 0
    block_signs = np.zeros(4, np.int64)
    max_scale = ZERO
    sumx2 = ZERO
    for i in range(256):
        sumx2 += xbl[i] * xbl[i]
    sigma2 = sumx2 / F32(256.0)
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        for i in range(32):
            weight[i] = qw[32 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i])
        for i in range(32):
            waux[i] = np.sqrt(weight[i])
        mx = even_signs(xb, weight, xval, block_signs, 4)
        if mx < GROUP_MAX_EPS:
            scales[ib] = ZERO
            L[:] = 0
            continue
        # uint8 levels as in C: the one flipped (negative) xval wraps, which its least squares then sees
        scale = make_qp_quants(32, K_MAX_Q + 1, xval, Lqp, weight)
        eff_max = scale * F32(K_MAX_Q)
        if eff_max <= 0:
            scales[ib] = ZERO
            L[:] = 0
            continue
        best = ZERO
        for is_ in range(-6, 7):
            id_ = (F32(2 * K_MAX_Q - 1) + F32(is_) * F32(0.1)) / eff_max
            this_scale = ONE / id_
            for k in range(4):
                for i in range(8):
                    lv = nearest_int(F32(0.5) * (id_ * xval[8 * k + i] - ONE))
                    Laux[8 * k + i] = max(0, min(K_MAX_Q - 1, lv))
                u = grid_code(Laux, k, 8, 2)
                if kmap[u] < 0:
                    best_neighbour(neigh, -kmap[u] - 1, grid, xval[8 * k:8 * k + 8], waux[8 * k:8 * k + 8],
                                   this_scale, Laux[8 * k:8 * k + 8])
            sumqx, sumq2 = level_sums(weight, xval, Laux)
            if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                scale = sumqx / sumq2
                best = scale * sumqx
                L[:] = Laux
        if scale > 0:
            id_ = ONE / scale
            for k in range(4):
                u = 0
                for i in range(8):
                    lv = max(0, min(K_MAX_Q - 1, nearest_int(F32(0.5) * (id_ * xval[8 * k + i] - ONE))))
                    u |= lv << (2 * i)
                g = kmap[u]
                if g < 0:
                    g = best_neighbour(neigh, -kmap[u] - 1, grid, xval[8 * k:8 * k + 8], waux[8 * k:8 * k + 8],
                                       scale, L[8 * k:8 * k + 8])
                for i in range(8):
                    L[8 * k + i] = (grid[g, i] - 1) // 2
            sumqx, sumq2 = level_sums(weight, xval, L)
            if sumq2 > 0:
                scale = sumqx / sumq2
        if scale < 0:
            scale = -scale
            for k in range(4):
                block_signs[k] = ~block_signs[k] & 127
        for k in range(4):
            g = kmap[grid_code(L, k, 8, 2)]
            if g < 0:
                raise ValueError("quantize_row_iq2_xxs_impl: found a point not on the grid")
            q2[2 * ib] |= g << (8 * k)
            q2[2 * ib + 1] |= block_signs[k] << (7 * k)
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == 0:
        return
    d = max_scale / F32(31.0)
    bits, _ = fp16_round(d)
    y[0] = bits & 0xFF
    y[1] = bits >> 8
    id_ = ONE / d
    for ib in range(8):
        lv = max(0, min(15, nearest_int(F32(0.5) * (id_ * scales[ib] - ONE))))
        q2[2 * ib + 1] |= lv << 28
    for j in range(16):
        for b in range(4):
            y[2 + 4 * j + b] = (q2[j] >> (8 * b)) & 0xFF


@njit(cache=True)
def quantize_rows_iq2xxs_kernel(rows, out, qw, grid, kmap, neigh):
    nrow, n = rows.shape
    scales = np.zeros(8, np.float32)
    weight = np.zeros(32, np.float32)
    waux = np.zeros(32, np.float32)
    xval = np.zeros(32, np.float32)
    L = np.zeros(32, np.int8)
    Laux = np.zeros(32, np.int8)
    Lqp = np.zeros(32, np.uint8)
    q2 = np.zeros(16, np.int64)
    for r in range(nrow):
        for ibl in range(n // 256):
            iq2xxs_superblock(rows[r, 256 * ibl:256 * ibl + 256],
                              out[r, TYPE_SIZE * ibl:TYPE_SIZE * ibl + TYPE_SIZE], qw[256 * ibl:256 * ibl + 256],
                              grid, kmap, neigh, scales, weight, waux, xval, L, Laux, Lqp, q2)


def quantize_rows_iq2xxs(rows: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """quantize_iq2_xxs: rows (nrow, n) float32 with their imatrix weights qw (n,) -> (nrow, n / 256 * 66) uint8."""
    rows = np.ascontiguousarray(rows, dtype=F32)
    nrow, n = rows.shape
    if n % 256:
        raise ValueError(f"quantize_rows_iq2xxs: a row of {n} values is not a whole number of 256-blocks")
    out = np.zeros((nrow, n // 256 * TYPE_SIZE), np.uint8)
    grid, kmap, neigh = iq2xxs_tables()
    quantize_rows_iq2xxs_kernel(rows, out, np.ascontiguousarray(qw, dtype=F32), grid, kmap, neigh)
    return out

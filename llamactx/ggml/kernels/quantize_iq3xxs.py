"""ggml-quants.c's IQ3_XXS quantizer: `iq3xs_init_impl(256)` (the 256-point grid of 4 levels in {1, 3, .., 15},
its map and the neighbours at the two nearest distances: quant_search.iq3_grid_tables) and
`quantize_row_iq3_xxs_impl(256, ...)` (32-element blocks, 31 trial scales, the sign parity of IQ2_XXS; weights
from an importance matrix or, without one, x^2). The grid is ggml-common.h iq3xxs_grid (llamactx.gguf.iq_grids,
whose magnitudes 4, 12, .. 62 stand for the levels 0..7), the layout `block_iq3_xxs` (d, 64 grid indices, then per
32-block a uint32 of four 7-bit sign sets and the 4-bit scale); arithmetic as quant_search.py says.
cli/quantize.py calls it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from llamactx.ggml.kernels.quant_search import (
    F32,
    ONE,
    ZERO,
    best_neighbour,
    even_signs,
    fp16_round,
    grid_code,
    iq3_grid_tables,
    level_sums,
    nearest_int,
)
from llamactx.gguf.iq_grids import IQ3XXS_GRID

K_MAX_Q = 8
GROUP_MAX_EPS_IQ3_XXS = F32(1e-8)
TYPE_SIZE = 98  # sizeof(block_iq3_xxs): d, qs[96]


@lru_cache(maxsize=1)
def iq3xxs_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """iq3xs_init_impl(256): grid (256, 4) int8 (2l + 1), kmap (4096,), neighbours (two nearest distances)."""
    magnitudes = np.array([4, 12, 20, 28, 36, 44, 52, 62])
    levels = np.searchsorted(magnitudes, IQ3XXS_GRID)  # (256, 4): 0..7
    return iq3_grid_tables((2 * levels + 1).astype(np.int8), nwant=2)


@njit(cache=True)
def iq3xxs_superblock(xbl, y, qw, use_qw, grid, kmap, neigh, scales, weight, waux, xval, L, Laux, on_grid, on_aux,
                      q3):
    """quantize_row_iq3_xxs_impl for one super-block of 256 into y (98 bytes); q3 (96,) scratch."""
    y[:] = 0
    q3[:] = 0
    block_signs = np.zeros(4, np.int64)
    max_scale = ZERO
    sumx2 = ZERO
    for i in range(256):
        sumx2 += xbl[i] * xbl[i]
    sigma2 = F32(2) * sumx2 / F32(256)
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        for i in range(32):
            weight[i] = qw[32 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i]) if use_qw else xb[i] * xb[i]
        for i in range(32):
            waux[i] = np.sqrt(weight[i])
        mx = even_signs(xb, weight, xval, block_signs, 4)
        L[:] = 0
        if mx < GROUP_MAX_EPS_IQ3_XXS:
            scales[ib] = ZERO
            continue
        best = ZERO
        scale = mx / F32(2 * K_MAX_Q - 1)
        on_grid[:] = True
        for is_ in range(-15, 16):
            id_ = (F32(2 * K_MAX_Q - 1) + F32(is_) * F32(0.2)) / mx
            this_scale = ONE / id_
            for k in range(8):
                for i in range(4):
                    lv = nearest_int(F32(0.5) * (id_ * xval[4 * k + i] - ONE))
                    Laux[4 * k + i] = max(0, min(K_MAX_Q - 1, lv))
                u = grid_code(Laux, k, 4, 3)
                on_aux[k] = True
                if kmap[u] < 0:
                    on_aux[k] = False
                    best_neighbour(neigh, -kmap[u] - 1, grid, xval[4 * k:4 * k + 4], waux[4 * k:4 * k + 4],
                                   this_scale, Laux[4 * k:4 * k + 4])
            sumqx, sumq2 = level_sums(weight, xval, Laux)
            if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                scale = sumqx / sumq2
                best = scale * sumqx
                L[:] = Laux
                on_grid[:] = on_aux
        n_not_ongrid = 0
        for k in range(8):
            if not on_grid[k]:
                n_not_ongrid += 1
        if n_not_ongrid > 0 and scale > 0:
            id_ = ONE / scale
            for k in range(8):
                if on_grid[k]:
                    continue
                u = 0
                for i in range(4):
                    lv = max(0, min(K_MAX_Q - 1, nearest_int(F32(0.5) * (id_ * xval[4 * k + i] - ONE))))
                    u |= lv << (3 * i)
                g = kmap[u]
                if g < 0:
                    g = best_neighbour(neigh, -kmap[u] - 1, grid, xval[4 * k:4 * k + 4], waux[4 * k:4 * k + 4],
                                       scale, L[4 * k:4 * k + 4])
                for i in range(4):
                    L[4 * k + i] = (grid[g, i] - 1) // 2
            sumqx, sumq2 = level_sums(weight, xval, L)
            if sumq2 > 0:
                scale = sumqx / sumq2
        if scale < 0:
            scale = -scale
            for k in range(4):
                block_signs[k] = ~block_signs[k] & 127
        for k in range(8):
            g = kmap[grid_code(L, k, 4, 3)]
            if g < 0:
                raise ValueError("quantize_row_iq3_xxs_impl: found a point not on the grid")
            q3[8 * ib + k] = g
        sas = block_signs[0] | (block_signs[1] << 7) | (block_signs[2] << 14) | (block_signs[3] << 21)
        for b in range(4):
            q3[64 + 4 * ib + b] = (sas >> (8 * b)) & 0xFF
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == 0:
        return
    d = max_scale / F32(31)
    bits, _ = fp16_round(d * F32(1.0125))
    y[0] = bits & 0xFF
    y[1] = bits >> 8
    id_ = ONE / d
    for ib in range(8):
        lv = max(0, min(15, nearest_int(F32(0.5) * (id_ * scales[ib] - ONE))))
        q3[64 + 4 * ib + 3] = int(q3[64 + 4 * ib + 3]) | (lv << 4)
    y[2:] = q3


@njit(cache=True)
def quantize_rows_iq3xxs_kernel(rows, out, qw, use_qw, grid, kmap, neigh):
    nrow, n = rows.shape
    scales = np.zeros(8, np.float32)
    weight = np.zeros(32, np.float32)
    waux = np.zeros(32, np.float32)
    xval = np.zeros(32, np.float32)
    L = np.zeros(32, np.int8)
    Laux = np.zeros(32, np.int8)
    on_grid = np.zeros(8, np.bool_)
    on_aux = np.zeros(8, np.bool_)
    q3 = np.zeros(96, np.uint8)
    for r in range(nrow):
        for ibl in range(n // 256):
            iq3xxs_superblock(rows[r, 256 * ibl:256 * ibl + 256],
                              out[r, TYPE_SIZE * ibl:TYPE_SIZE * ibl + TYPE_SIZE], qw[256 * ibl:256 * ibl + 256],
                              use_qw, grid, kmap, neigh, scales, weight, waux, xval, L, Laux, on_grid, on_aux, q3)


def quantize_rows_iq3xxs(rows: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """quantize_iq3_xxs: rows (nrow, n) float32, imatrix weights qw (n,) or None -> (nrow, n / 256 * 98) uint8."""
    rows = np.ascontiguousarray(rows, dtype=F32)
    nrow, n = rows.shape
    if n % 256:
        raise ValueError(f"quantize_rows_iq3xxs: a row of {n} values is not a whole number of 256-blocks")
    out = np.zeros((nrow, n // 256 * TYPE_SIZE), np.uint8)
    grid, kmap, neigh = iq3xxs_tables()
    weights = np.zeros(n, F32) if qw is None else np.ascontiguousarray(qw, dtype=F32)
    quantize_rows_iq3xxs_kernel(rows, out, weights, qw is not None, grid, kmap, neigh)
    return out

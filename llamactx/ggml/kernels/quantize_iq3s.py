"""ggml-quants.c's IQ3_S quantizer: `iq3xs_init_impl(512)` (the grid, the map from 3-bit level quadruples to grid
points, and for each quadruple off the grid its neighbours at the three nearest distances) and
`quantize_row_iq3_s_impl` (block size 32, with or without an importance matrix). The grid is ggml-common.h
iq3s_grid (llamactx.gguf.iq_grids), the layout `block_iq3_s`; arithmetic as quant_search.py says.
quantize_rows.py's `quantize_chunk` dispatches here.
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
    fp16_round,
    grid_code,
    iq3_grid_tables,
    nearest_int,
)
from llamactx.gguf.iq_grids import IQ3S_GRID

K_MAX_Q = 8
BLOCK = 32  # IQ3S_BLOCK_SIZE
BS4 = BLOCK // 4  # quadruples of a block
BS8 = BLOCK // 8  # sign bytes of a block
TYPE_SIZE = 110  # sizeof(block_iq3_s): d, qs[64], qh[8], signs[32], scales[4]


@lru_cache(maxsize=1)
def iq3s_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """iq3xs_init_impl(512): grid (512, 4) int8 (levels 1, 3, .. 15), kmap (4096,) int32, neighbours up to the third
    distinct distance (quant_search.iq3_grid_tables)."""
    return iq3_grid_tables(IQ3S_GRID.astype(np.int8), nwant=3)


@njit(cache=True)
def iq3s_superblock(xbl, y, qw, use_qw, grid, kmap, neigh, scales, weight, waux, xval, L, Laux, on_grid, on_aux,
                    block_signs):
    """quantize_row_iq3_s_impl for one super-block of 256 into y (110 bytes)."""
    y[:] = 0
    qs_off = 2
    signs_off = 74
    max_scale = ZERO
    sumx2 = ZERO
    for i in range(256):
        sumx2 += xbl[i] * xbl[i]
    sigma2 = F32(2.0) * sumx2 / F32(256.0)
    for ib in range(8):
        xb = xbl[BLOCK * ib:BLOCK * ib + BLOCK]
        for i in range(BLOCK):
            weight[i] = qw[BLOCK * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i]) if use_qw else xb[i] * xb[i]
        for i in range(BLOCK):
            waux[i] = np.sqrt(weight[i])
        for k in range(BS8):
            s = 0
            for i in range(8):
                if xb[8 * k + i] >= 0:
                    xval[8 * k + i] = xb[8 * k + i]
                else:
                    xval[8 * k + i] = -xb[8 * k + i]
                    s |= 1 << i
            block_signs[k] = s
        mx = xval[0]
        for i in range(1, BLOCK):
            mx = mx if mx > xval[i] else xval[i]
        L[:] = 0
        if mx == 0:
            scales[ib] = ZERO
            continue  # as the C: this block's qs and signs are not advanced past
        best = ZERO
        scale = mx / F32(2 * K_MAX_Q - 1)
        on_grid[:] = False
        for is_ in range(-9, 10):
            id_ = (F32(2 * K_MAX_Q - 1) + F32(is_) * F32(0.2)) / mx
            this_scale = ONE / id_
            for k in range(BS4):
                for i in range(4):
                    lv = nearest_int(F32(0.5) * (id_ * xval[4 * k + i] - ONE))
                    Laux[4 * k + i] = max(0, min(K_MAX_Q - 1, lv))
                u = grid_code(Laux, k, 4, 3)
                on_aux[k] = True
                if kmap[u] < 0:
                    on_aux[k] = False
                    best_neighbour(neigh, -kmap[u] - 1, grid, xval[4 * k:4 * k + 4], waux[4 * k:4 * k + 4],
                                    this_scale, Laux[4 * k:4 * k + 4])
            sumqx = ZERO
            sumq2 = ZERO
            for i in range(BLOCK):
                q = F32(2 * int(Laux[i]) + 1)
                sumqx += weight[i] * xval[i] * q
                sumq2 += weight[i] * q * q
            if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                scale = sumqx / sumq2
                best = scale * sumqx
                L[:] = Laux
                on_grid[:] = on_aux
        n_not_ongrid = 0
        for k in range(BS4):
            if not on_grid[k]:
                n_not_ongrid += 1
        if n_not_ongrid > 0 and scale > 0:
            id_ = ONE / scale
            for k in range(BS4):
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
            sumqx = ZERO
            sumq2 = ZERO
            for i in range(BLOCK):
                q = F32(2 * int(L[i]) + 1)
                sumqx += weight[i] * xval[i] * q
                sumq2 += weight[i] * q * q
            if sumq2 > 0:
                scale = sumqx / sumq2
        if scale < 0:
            scale = -scale
            for k in range(BS8):
                block_signs[k] = ~block_signs[k] & 0xFF
        for k in range(BS4):
            g = kmap[grid_code(L, k, 4, 3)]
            if g < 0:
                raise ValueError("quantize_row_iq3_s_impl: found a point not on the grid")
            y[qs_off + k] = g & 255
            y[66 + (ib * BS4 + k) // 8] = int(y[66 + (ib * BS4 + k) // 8]) | ((g >> 8) << ((ib * BS4 + k) % 8))
        qs_off += BS4
        for k in range(BS8):
            y[signs_off + k] = block_signs[k]
        signs_off += BS8
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == 0:
        return
    d = max_scale / F32(31.0)
    bits, _ = fp16_round(d * F32(1.033))
    y[0] = bits & 0xFF
    y[1] = bits >> 8
    id_ = ONE / d
    for ib in range(0, 8, 2):
        l1 = max(0, min(15, nearest_int(F32(0.5) * (id_ * scales[ib] - ONE))))
        l2 = max(0, min(15, nearest_int(F32(0.5) * (id_ * scales[ib + 1] - ONE))))
        y[106 + ib // 2] = l1 | (l2 << 4)


@njit(cache=True)
def quantize_rows_iq3s_kernel(rows, out, qw, use_qw, grid, kmap, neigh):
    nrow, n = rows.shape
    scales = np.zeros(8, np.float32)
    weight = np.zeros(BLOCK, np.float32)
    waux = np.zeros(BLOCK, np.float32)
    xval = np.zeros(BLOCK, np.float32)
    L = np.zeros(BLOCK, np.int8)
    Laux = np.zeros(BLOCK, np.int8)
    on_grid = np.zeros(BS4, np.bool_)
    on_aux = np.zeros(BS4, np.bool_)
    block_signs = np.zeros(BS8, np.uint8)
    for r in range(nrow):
        for ibl in range(n // 256):
            iq3s_superblock(rows[r, 256 * ibl:256 * ibl + 256], out[r, TYPE_SIZE * ibl:TYPE_SIZE * ibl + TYPE_SIZE],
                            qw[256 * ibl:256 * ibl + 256], use_qw, grid, kmap, neigh, scales, weight, waux, xval, L,
                            Laux, on_grid, on_aux, block_signs)


def quantize_rows_iq3s(rows: np.ndarray, out: np.ndarray, qw: np.ndarray, use_qw: bool) -> None:
    """quantize_iq3_s: rows (nrow, n) float32 -> out (nrow, n / 256 * 110) uint8."""
    grid, kmap, neigh = iq3s_tables()
    quantize_rows_iq3s_kernel(rows, out, qw, use_qw, grid, kmap, neigh)

"""ggml-quants.c's IQ2_XS quantizer: `iq2xs_init_impl(GGML_TYPE_IQ2_XS)` (the 512-point grid of 8 levels in
{1, 3, 5}, the map from octets of 2-bit levels to grid points, and for each octet off the grid its neighbours at
the two nearest distances) and `quantize_row_iq2_xs_impl` (16-element blocks, an importance matrix required).
The grid is ggml-common.h iq2xs_grid (llamactx.gguf.iq_grids), the layout `block_iq2_xs`; arithmetic as
quant_search.py says. quantize_rows.py's `quantize_chunk` dispatches here.
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
    even_signs,
    fp16_round,
    grid_code,
    iq2_grid_tables,
    iq2_scale_search,
    nearest_int,
)
from llamactx.gguf.iq_grids import IQ2XS_GRID

NWANT = 2
TYPE_SIZE = 74  # sizeof(block_iq2_xs): d, qs[32] (uint16), scales[8]


@lru_cache(maxsize=1)
def iq2xs_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """iq2xs_init_impl(GGML_TYPE_IQ2_XS): grid (512, 8) int8, kmap (43692,) int32, neighbours up to the second
    distinct distance (quant_search.iq2_grid_tables)."""
    return iq2_grid_tables(IQ2XS_GRID.view(np.uint8).reshape(512, 8), nwant=NWANT)


@njit(cache=True)
def iq2xs_superblock(xbl, y, qw, grid, kmap, neigh, scales, weight, waux, xval, L, Laux, q2):
    """quantize_row_iq2_xs_impl for one super-block of 256 into y (74 bytes)."""
    y[:] = 0
    q2[:] = 0
    on_grid = np.ones(2, np.bool_)
    on_aux = np.ones(2, np.bool_)
    block_signs = np.zeros(2, np.int64)
    max_scale = ZERO
    sumx2 = ZERO
    for i in range(256):
        sumx2 += xbl[i] * xbl[i]
    sigma2 = sumx2 / F32(256.0)
    for ib in range(16):
        xb = xbl[16 * ib:16 * ib + 16]
        for i in range(16):
            weight[i] = qw[16 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i])
        for i in range(16):
            waux[i] = np.sqrt(weight[i])
        mx = even_signs(xb, weight, xval, block_signs, 2)
        L[:] = 0
        if mx < GROUP_MAX_EPS:
            scales[ib] = ZERO
            continue
        scale = iq2_scale_search(xval, weight, waux, mx, grid, kmap, neigh, L, Laux, on_grid, on_aux)
        if scale < 0:
            scale = -scale
            for k in range(2):
                block_signs[k] = ~block_signs[k] & 127
        for k in range(2):
            g = kmap[grid_code(L, k, 8, 2)]
            if g < 0:
                raise ValueError("quantize_row_iq2_xs_impl: found a point not on the grid")
            q2[2 * ib + k] = g | (block_signs[k] << 9)
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == 0:
        return
    d = max_scale / F32(31.0)
    bits, _ = fp16_round(d)
    y[0] = bits & 0xFF
    y[1] = bits >> 8
    id_ = ONE / d
    for ib in range(16):
        lv = max(0, min(15, nearest_int(F32(0.5) * (id_ * scales[ib] - ONE))))
        if ib % 2 == 0:
            y[66 + ib // 2] = lv
        else:
            y[66 + ib // 2] = int(y[66 + ib // 2]) | (lv << 4)
    for j in range(32):
        y[2 + 2 * j] = q2[j] & 0xFF
        y[3 + 2 * j] = q2[j] >> 8


@njit(cache=True)
def quantize_rows_iq2xs_kernel(rows, out, qw, grid, kmap, neigh):
    nrow, n = rows.shape
    scales = np.zeros(16, np.float32)
    weight = np.zeros(16, np.float32)
    waux = np.zeros(16, np.float32)
    xval = np.zeros(16, np.float32)
    L = np.zeros(16, np.int8)
    Laux = np.zeros(16, np.int8)
    q2 = np.zeros(32, np.int64)
    for r in range(nrow):
        for ibl in range(n // 256):
            iq2xs_superblock(rows[r, 256 * ibl:256 * ibl + 256], out[r, TYPE_SIZE * ibl:TYPE_SIZE * ibl + TYPE_SIZE],
                             qw[256 * ibl:256 * ibl + 256], grid, kmap, neigh, scales, weight, waux, xval, L, Laux,
                             q2)


def quantize_rows_iq2xs(rows: np.ndarray, out: np.ndarray, qw: np.ndarray) -> None:
    """quantize_iq2_xs: rows (nrow, n) float32 with their imatrix weights qw (n,) -> out (nrow, n / 256 * 74)."""
    grid, kmap, neigh = iq2xs_tables()
    quantize_rows_iq2xs_kernel(rows, out, qw, grid, kmap, neigh)

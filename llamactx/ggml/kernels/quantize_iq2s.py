"""ggml-quants.c's IQ2_S quantizer: `iq2xs_init_impl(GGML_TYPE_IQ2_S)` (the 1024-point grid of 8 levels in
{1, 3, 5}, its map and the neighbours at the nearest distance: quant_search.iq2_grid_tables) and
`quantize_row_iq2_s_impl` (16-element blocks, IQ2_XS's scale search: quant_search.iq2_scale_search; no sign
parity, so eight sign bits per group; weights from an importance matrix or, without one, sigma2 / 4 + x^2).
The grid is ggml-common.h iq2s_grid (llamactx.gguf.iq_grids), the layout `block_iq2_s` (d, qs[64]: 32 grid index
low bytes then 32 sign bytes, qh[8]: the index high bits, scales[8]); arithmetic as quant_search.py says.
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
    fp16_round,
    grid_code,
    iq2_grid_tables,
    iq2_scale_search,
    nearest_int,
)
from llamactx.gguf.iq_grids import IQ2S_GRID

GROUP_MAX_EPS_IQ2_S = F32(1e-8)
TYPE_SIZE = 82  # sizeof(block_iq2_s): d, qs[64], qh[8], scales[8]


@lru_cache(maxsize=1)
def iq2s_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """iq2xs_init_impl(GGML_TYPE_IQ2_S): grid (1024, 8) int8, kmap, neighbours (nearest distance only)."""
    return iq2_grid_tables(IQ2S_GRID.view(np.uint8).reshape(1024, 8), nwant=1)


@njit(cache=True)
def iq2s_superblock(xbl, y, qw, use_qw, grid, kmap, neigh, scales, weight, waux, xval, L, Laux):
    """quantize_row_iq2_s_impl for one super-block of 256 into y (82 bytes)."""
    y[:] = 0
    on_grid = np.ones(2, np.bool_)
    on_aux = np.ones(2, np.bool_)
    block_signs = np.zeros(2, np.int64)
    max_scale = ZERO
    sumx2 = ZERO
    for i in range(256):
        sumx2 += xbl[i] * xbl[i]
    sigma2 = F32(2) * sumx2 / F32(256)
    for ib in range(16):
        xb = xbl[16 * ib:16 * ib + 16]
        for i in range(16):
            if use_qw:
                weight[i] = qw[16 * ib + i] * np.sqrt(sigma2 + xb[i] * xb[i])
            else:
                weight[i] = F32(0.25) * sigma2 + xb[i] * xb[i]
        for i in range(16):
            waux[i] = np.sqrt(weight[i])
        for k in range(2):
            s = 0
            for i in range(8):
                if xb[8 * k + i] >= 0:
                    xval[8 * k + i] = xb[8 * k + i]
                else:
                    xval[8 * k + i] = -xb[8 * k + i]
                    s |= 1 << i
            block_signs[k] = s
        mx = xval[0]
        for i in range(1, 16):
            mx = mx if mx > xval[i] else xval[i]
        L[:] = 0
        if mx < GROUP_MAX_EPS_IQ2_S:
            scales[ib] = ZERO
            continue
        scale = iq2_scale_search(xval, weight, waux, mx, grid, kmap, neigh, L, Laux, on_grid, on_aux)
        if scale < 0:
            scale = -scale
            for k in range(2):
                block_signs[k] = ~block_signs[k] & 255
        for k in range(2):
            g = kmap[grid_code(L, k, 8, 2)]
            if g < 0:
                raise ValueError("quantize_row_iq2_s_impl: found a point not on the grid")
            i8 = 2 * ib + k
            y[2 + i8] = g & 255
            y[66 + i8 // 4] = int(y[66 + i8 // 4]) | ((g >> 8) << (2 * (i8 % 4)))
            y[2 + 32 + i8] = block_signs[k]
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == 0:
        return
    d = max_scale / F32(31)
    bits, _ = fp16_round(d * F32(0.9875))
    y[0] = bits & 0xFF
    y[1] = bits >> 8
    id_ = ONE / d
    for ib in range(16):
        lv = max(0, min(15, nearest_int(F32(0.5) * (id_ * scales[ib] - ONE))))
        if ib % 2 == 0:
            y[74 + ib // 2] = lv
        else:
            y[74 + ib // 2] = int(y[74 + ib // 2]) | (lv << 4)


@njit(cache=True)
def quantize_rows_iq2s_kernel(rows, out, qw, use_qw, grid, kmap, neigh):
    nrow, n = rows.shape
    scales = np.zeros(16, np.float32)
    weight = np.zeros(16, np.float32)
    waux = np.zeros(16, np.float32)
    xval = np.zeros(16, np.float32)
    L = np.zeros(16, np.int8)
    Laux = np.zeros(16, np.int8)
    for r in range(nrow):
        for ibl in range(n // 256):
            iq2s_superblock(rows[r, 256 * ibl:256 * ibl + 256], out[r, TYPE_SIZE * ibl:TYPE_SIZE * ibl + TYPE_SIZE],
                            qw[256 * ibl:256 * ibl + 256], use_qw, grid, kmap, neigh, scales, weight, waux, xval, L,
                            Laux)


def quantize_rows_iq2s(rows: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """quantize_iq2_s: rows (nrow, n) float32, imatrix weights qw (n,) or None -> (nrow, n / 256 * 82) uint8."""
    rows = np.ascontiguousarray(rows, dtype=F32)
    nrow, n = rows.shape
    if n % 256:
        raise ValueError(f"quantize_rows_iq2s: a row of {n} values is not a whole number of 256-blocks")
    out = np.zeros((nrow, n // 256 * TYPE_SIZE), np.uint8)
    grid, kmap, neigh = iq2s_tables()
    weights = np.zeros(n, F32) if qw is None else np.ascontiguousarray(qw, dtype=F32)
    quantize_rows_iq2s_kernel(rows, out, weights, qw is not None, grid, kmap, neigh)
    return out

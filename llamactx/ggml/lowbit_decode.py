"""Compiled unpacking of the IQ2 / IQ3 super-blocks (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) into the integers their
matmuls multiply: the same codes and scales as llamactx.gguf.quants_lowbit's numpy unpacking (ggml-quants.c
`dequantize_row_iq2_xxs` ... `dequantize_row_iq3_s`, grids of ggml-common.h), one block per iteration, in parallel
and without the numpy path's full-size temporaries (index arrays, sign masks): the decode on every matmul of an
IQ2 / IQ3 weight, the MoE experts' hot path.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.gguf.iq_grids import IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS
from llamactx.gguf.quants_lowbit import LowbitParts, scale_of

COMPILED_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S)
_GRID = {T.IQ2_XXS: IQ2XXS_GRID, T.IQ2_XS: IQ2XS_GRID, T.IQ2_S: IQ2S_GRID, T.IQ3_XXS: IQ3XXS_GRID,
         T.IQ3_S: IQ3S_GRID}


@numba.njit(cache=True, inline="always")
def _u32(b, i):  # pragma: no cover - compiled
    return np.uint32(b[i]) | (np.uint32(b[i + 1]) << 8) | (np.uint32(b[i + 2]) << 16) | (np.uint32(b[i + 3]) << 24)


@numba.njit(cache=True, inline="always")
def _put(codes, o, v, neg):  # pragma: no cover - compiled
    codes[o] = -np.int8(v) if neg else np.int8(v)


@numba.njit(parallel=True, cache=True)
def _unpack(t, blocks, grid, ksigns, codes, scales):  # pragma: no cover - compiled
    for i in numba.prange(blocks.shape[0]):
        b = blocks[i]
        c = codes[i]
        for ib in range(8):
            if t == 16 or t == 18:  # IQ2_XXS / IQ3_XXS: a u32 of 4 x 7 sign bits and a 4-bit scale per 32
                aux = _u32(b, 2 + 8 * ib + 4) if t == 16 else _u32(b, 66 + 4 * ib)
                s = np.int32(2 * (aux >> 28) + 1)
                scales[i, 2 * ib] = s
                scales[i, 2 * ib + 1] = s
                for g in range(4):
                    signs = ksigns[(aux >> (7 * g)) & 127]
                    for j in range(8):
                        if t == 16:
                            v = grid[b[2 + 8 * ib + g], j]
                        else:
                            v = grid[b[2 + 8 * ib + 2 * g + j // 4], j % 4]
                        _put(c, 32 * ib + 8 * g + j, v, (signs >> j) & 1)
            elif t == 17 or t == 22:  # IQ2_XS (u16: 9-bit index, 7 sign bits) / IQ2_S (qs, qh, sign bytes)
                sb = b[66 + ib] if t == 17 else b[74 + ib]
                scales[i, 2 * ib] = 2 * np.int32(sb & 15) + 1
                scales[i, 2 * ib + 1] = 2 * np.int32(sb >> 4) + 1
                for g in range(4):
                    if t == 17:
                        q = np.int32(b[2 + 8 * ib + 2 * g]) | (np.int32(b[3 + 8 * ib + 2 * g]) << 8)
                        idx = q & 511
                        signs = ksigns[q >> 9]
                    else:
                        idx = np.int32(b[2 + 4 * ib + g]) | ((np.int32(b[66 + ib]) << (8 - 2 * g)) & 0x300)
                        signs = b[34 + 4 * ib + g]
                    for j in range(8):
                        _put(c, 32 * ib + 8 * g + j, grid[idx, j], (signs >> j) & 1)
            else:  # IQ3_S (21): 8 entries of 4 per 32, a ninth index bit each in qh, sign bytes, 4-bit scales
                s = np.int32((b[106 + ib // 2] >> (4 * (ib % 2))) & 15)
                scales[i, 2 * ib] = 2 * s + 1
                scales[i, 2 * ib + 1] = 2 * s + 1
                qh = np.int32(b[66 + ib])
                for e in range(8):
                    idx = np.int32(b[2 + 8 * ib + e]) | (((qh >> e) & 1) << 8)
                    signs = b[74 + 4 * ib + e // 2]
                    for j in range(4):
                        _put(c, 32 * ib + 4 * e + j, grid[idx, j], (signs >> (4 * (e % 2) + j)) & 1)


def unpack_iq(ggml_type: int, blocks: np.ndarray) -> LowbitParts:
    """`lowbit_parts` of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS or IQ3_S blocks (n, type_size), compiled: codes int8
    (n, 256), scales int32 (n, 16), delta zeros, d float32 (n,)."""
    t = T(ggml_type)
    n = blocks.shape[0]
    codes = np.empty((n, 256), np.int8)
    scales = np.empty((n, 16), np.int32)
    _unpack(int(t), np.ascontiguousarray(blocks), _GRID[t], KSIGNS_IQ2XS, codes, scales)
    return LowbitParts(codes, scales, np.zeros_like(codes), scale_of(t, blocks))

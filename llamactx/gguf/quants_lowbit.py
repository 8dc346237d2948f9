"""Decoders of ggml's low-bit codebook and ternary formats: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M,
TQ1_0 and TQ2_0 (256-element super-blocks).

Block layouts are ggml-common.h `block_iq2_xxs` ... `block_tq2_0`; element order, grid indices, signs and scales
follow ggml-quants.c `dequantize_row_iq2_xxs` ... `dequantize_row_tq2_0`, the codebooks are ggml-common.h's
(llamactx.gguf.iq_grids). Every super-block is unpacked into integers (`LowbitParts`): a code per element, a scale
per 16 elements, IQ1's ±1 shift per element, and the f16 scale d; the weight is then

    x = d * sc * code * POST[type]      (IQ1: x = d * sc * (8 * code + delta) / 8; TQ: x = d * (code - 1))

Each product is exact in float32 (an f16 times at most 11 more bits), so the result is ggml's bit for bit in any
order. The same integers are what ggml-cpu's integer dot products multiply (llamactx.ggml.vecdot_lowbit).

Every bit pattern of these formats is a valid grid index (the grids have 2^bits entries), so no block can point
outside its codebook; a non-finite d is what makes a block unusable (llamactx.gguf.row_data).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from llamactx.gguf.iq_grids import (
    IQ1S_GRID,
    IQ2S_GRID,
    IQ2XS_GRID,
    IQ2XXS_GRID,
    IQ3S_GRID,
    IQ3XXS_GRID,
    KSIGNS_IQ2XS,
)

LOWBIT_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0)
IQ1_TYPES = (T.IQ1_S, T.IQ1_M)
TQ_TYPES = (T.TQ1_0, T.TQ2_0)
# the power-of-two factor of each type's scale: ggml's `(0.5f + ls) * 0.25f` = (2 ls + 1) / 8, IQ3_XXS's `* 0.5f`
POST = {T.IQ2_XXS: 0.125, T.IQ2_XS: 0.125, T.IQ2_S: 0.125, T.IQ3_XXS: 0.25, T.IQ3_S: 1.0, T.IQ1_S: 0.125,
        T.IQ1_M: 0.125, T.TQ1_0: 1.0, T.TQ2_0: 1.0}
_BITS8 = np.uint8(1) << np.arange(8, dtype=np.uint8)  # kmask_iq2xs
_POW3 = np.array([1, 3, 9, 27, 81], np.uint8)


class LowbitParts(NamedTuple):
    """A tensor's super-blocks as integers: codes int8 (n, 256) (IQ2 / IQ3: signed grid values; IQ1: grid values
    -1..1; TQ: the stored trit 0..2, or 3 for a TQ2_0 crumb of 3), scales int32 (n, 16), one per 16 elements (odd,
    2 ls + 1; TQ: 1), delta int8 (n, 256) (IQ1's ±1 shift of 1/8, zero for the others) and d float32 (n,)."""

    codes: np.ndarray
    scales: np.ndarray
    delta: np.ndarray
    d: np.ndarray


def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    return blocks[:, off : off + 2].copy().view("<f2")[:, 0].astype(np.float32)  # (n,)


def _u32(b: np.ndarray) -> np.ndarray:
    """(..., 4) uint8 -> (...) uint32, little-endian."""
    return np.ascontiguousarray(b).view("<u4")[..., 0].astype(np.uint32)


def _signed(grid: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """grid values (..., 8) uint8 with sign bytes (...) -> int8 (..., 8), bit j of a sign byte negating element j."""
    neg = (signs[..., None] & _BITS8) != 0
    return np.where(neg, -grid.astype(np.int8), grid.astype(np.int8))


def _per32(ls: np.ndarray) -> np.ndarray:
    """4-bit scales of 32 elements (n, 8) -> 2 ls + 1 per 16 elements (n, 16)."""
    return np.repeat(2 * ls.astype(np.int32) + 1, 2, axis=1)


def _iq2_xxs(b: np.ndarray):
    n = b.shape[0]
    g = b[:, 2:66].reshape(n, 8, 8)  # per 32: 4 grid indices, then a u32 of 4 x 7 sign bits and a 4-bit scale
    aux = _u32(g[:, :, 4:8])  # (n, 8)
    signs = KSIGNS_IQ2XS[(aux[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]  # (n, 8, 4)
    codes = _signed(IQ2XXS_GRID[g[:, :, 0:4]], signs)  # (n, 8, 4, 8)
    return codes.reshape(n, 256), _per32(aux >> 28), _f16(b, 0)


def _iq2_xs(b: np.ndarray):
    n = b.shape[0]
    qs = b[:, 2:66].copy().view("<u2").astype(np.int64)  # (n, 32): 9-bit index, 7 sign bits
    codes = _signed(IQ2XS_GRID[qs & 511], KSIGNS_IQ2XS[qs >> 9])  # (n, 32, 8)
    sc = b[:, 66:74].astype(np.int32)  # (n, 8): low nibble first 16, high nibble next 16
    return codes.reshape(n, 256), np.stack([2 * (sc & 15) + 1, 2 * (sc >> 4) + 1], axis=2).reshape(n, 16), _f16(b, 0)


def _iq2_s(b: np.ndarray):
    n = b.shape[0]
    qs = b[:, 2:34].reshape(n, 8, 4).astype(np.int64)  # low 8 index bits
    qh = b[:, 66:74].astype(np.int64)  # (n, 8): 2 high bits per entry
    idx = qs | ((qh[:, :, None] << (8 - 2 * np.arange(4))) & 0x300)  # (n, 8, 4)
    codes = _signed(IQ2S_GRID[idx], b[:, 34:66].reshape(n, 8, 4))  # (n, 8, 4, 8)
    sc = b[:, 74:82].astype(np.int32)
    return codes.reshape(n, 256), np.stack([2 * (sc & 15) + 1, 2 * (sc >> 4) + 1], axis=2).reshape(n, 16), _f16(b, 0)


def _iq3_xxs(b: np.ndarray):
    n = b.shape[0]
    grid = IQ3XXS_GRID[b[:, 2:66].reshape(n, 8, 4, 2)].reshape(n, 8, 4, 8)  # per 32, 4 x (two 4-value entries)
    aux = _u32(b[:, 66:98].reshape(n, 8, 4))  # (n, 8)
    signs = KSIGNS_IQ2XS[(aux[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127]  # (n, 8, 4)
    return _signed(grid, signs).reshape(n, 256), _per32(aux >> 28), _f16(b, 0)


def _iq3_s(b: np.ndarray):
    n = b.shape[0]
    qs = b[:, 2:66].reshape(n, 8, 8).astype(np.int64)  # per 32: 8 entries of 4 values
    qh = b[:, 66:74].astype(np.int64)  # (n, 8): bit e is entry e's ninth index bit
    idx = qs | (((qh[:, :, None] >> np.arange(8)) & 1) << 8)  # (n, 8, 8)
    grid = IQ3S_GRID[idx].reshape(n, 8, 4, 8)
    codes = _signed(grid, b[:, 74:106].reshape(n, 8, 4))  # (n, 8, 4, 8)
    sc = b[:, 106:110].astype(np.int32)  # (n, 4): low nibble the even 32, high nibble the odd one
    ls = np.stack([sc & 15, sc >> 4], axis=2).reshape(n, 8)
    return codes.reshape(n, 256), _per32(ls), _f16(b, 0)


def _iq1_s(b: np.ndarray):
    n = b.shape[0]
    qh = b[:, 34:50].copy().view("<u2").astype(np.int64)  # (n, 8)
    qs = b[:, 2:34].reshape(n, 8, 4).astype(np.int64)
    idx = qs | (((qh[:, :, None] >> (3 * np.arange(4))) & 7) << 8)  # (n, 8, 4)
    codes = IQ1S_GRID[idx].reshape(n, 256)
    delta = np.repeat(np.where(qh & 0x8000, np.int8(-1), np.int8(1)), 32, axis=1)  # (n, 256)
    return codes, _per32((qh >> 12) & 7), delta, _f16(b, 0)


def iq1_m_scale(b: np.ndarray) -> np.ndarray:
    """IQ1_M's f16 super-block scale, packed in the top nibbles of its four u16 scale words (`iq1m_scale_t`)."""
    sc = b[:, 48:56].copy().view("<u2").astype(np.uint16)  # (n, 4)
    u = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    return u.astype(np.uint16).view(np.float16).astype(np.float32)  # (n,)


def _iq1_m(b: np.ndarray):
    n = b.shape[0]
    qs = b[:, 0:32].reshape(n, 8, 4).astype(np.int64)
    qh = b[:, 32:48].reshape(n, 8, 2).astype(np.int64)  # per 32: two bytes, each 2 x (3 index bits, a delta bit)
    hi = np.stack([(qh << 8) & 0x700, (qh << 4) & 0x700], axis=3).reshape(n, 8, 4)  # entries 0, 1 | 2, 3
    codes = IQ1S_GRID[qs | hi].reshape(n, 256)
    neg = np.stack([qh & 0x08, qh & 0x80], axis=3).reshape(n, 32)  # per 8 elements
    delta = np.repeat(np.where(neg != 0, np.int8(-1), np.int8(1)), 8, axis=1)  # (n, 256)
    sc = b[:, 48:56].copy().view("<u2").astype(np.int32)  # (n, 4): per 32-pair, 4 x 3-bit scales
    shifts = np.array([0, 3, 6, 9])  # (ib even: first 16, second 16), (ib odd: ...)
    ls = ((sc[:, :, None] >> shifts) & 7).reshape(n, 16)
    return codes, 2 * ls + 1, delta, iq1_m_scale(b)


def _trits(q: np.ndarray) -> np.ndarray:
    """ggml's base-3 digit of a byte already multiplied by a power of 3: ((uint16_t) q * 3) >> 8."""
    return ((q.astype(np.uint16) * 3) >> 8).astype(np.int8)


def _tq1_0(b: np.ndarray):
    n = b.shape[0]
    with np.errstate(over="ignore"):
        a = b[:, None, 0:32] * _POW3[:, None]  # (n, 5, 32) uint8: wraps as the C uint8_t product
        c = b[:, None, 32:48] * _POW3[:, None]  # (n, 5, 16)
        h = b[:, None, 48:52] * _POW3[:4, None]  # (n, 4, 4)
    codes = np.concatenate([_trits(a).reshape(n, 160), _trits(c).reshape(n, 80), _trits(h).reshape(n, 16)], axis=1)
    return codes, np.ones((n, 16), np.int32), _f16(b, 52)


def _tq2_0(b: np.ndarray):
    n = b.shape[0]
    qs = b[:, 0:64].reshape(n, 2, 1, 32)
    codes = ((qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3).astype(np.int8)  # (n, 2, 4, 32)
    return codes.reshape(n, 256), np.ones((n, 16), np.int32), _f16(b, 64)


_UNPACK = {T.IQ2_XXS: _iq2_xxs, T.IQ2_XS: _iq2_xs, T.IQ2_S: _iq2_s, T.IQ3_XXS: _iq3_xxs, T.IQ3_S: _iq3_s,
           T.IQ1_S: _iq1_s, T.IQ1_M: _iq1_m, T.TQ1_0: _tq1_0, T.TQ2_0: _tq2_0}


def lowbit_parts(ggml_type: int, blocks: np.ndarray) -> LowbitParts:
    """Unpack `(n, type_size)` uint8 super-blocks of a low-bit type (see `LowbitParts`)."""
    got = _UNPACK[T(ggml_type)](blocks)
    if len(got) == 4:
        return LowbitParts(*got)
    codes, scales, d = got
    return LowbitParts(codes, scales, np.zeros_like(codes), d)


def scale_of(ggml_type: int, blocks: np.ndarray) -> np.ndarray:
    """Each super-block's f16 scale d as float32 (n,)."""
    t = T(ggml_type)
    if t == T.IQ1_M:
        return iq1_m_scale(blocks)
    return _f16(blocks, {T.TQ1_0: 52, T.TQ2_0: 64}.get(t, 0))


def dequantize_lowbit(ggml_type: int):
    """The `(n, type_size)` uint8 -> `(n, 256)` float32 decoder of a low-bit type (ggml-quants.c
    `dequantize_row_*`): x = d * (sc * code) * POST, IQ1 with 8 * code + delta, TQ with code - 1."""
    t = T(ggml_type)
    post = np.float32(POST[t])

    def decode(blocks: np.ndarray) -> np.ndarray:
        p = lowbit_parts(t, blocks)
        if t in IQ1_TYPES:
            q = 8 * p.codes.astype(np.int32) + p.delta
        elif t in TQ_TYPES:
            q = p.codes.astype(np.int32) - 1
        else:
            q = p.codes.astype(np.int32)
        w = (q.reshape(-1, 16, 16) * p.scales[:, :, None]).astype(np.float32)  # exact integers
        out = np.multiply(w, p.d[:, None, None], dtype=np.float32)
        out *= post
        return out.reshape(-1, 256)

    decode.__name__ = f"dequantize_{t.name.lower()}"
    return decode

"""Embedding lookup (ggml_get_rows): dequantize only the selected rows of a stored weight matrix.

Values are bit-identical to `llamactx.gguf.quants.dequantize` of the same rows: for these formats every product
(f16 scale x small integer) is exact in float32 and the one rounding (`+ m`) happens in the same place. The
numba decoders read the raw GGUF blocks (the read-only `Weight.data`), so no repacked copy is needed; K-quant
embeddings (rare) go through `dequantize` row by row.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit

from llamactx.ggml.intrinsics import f16_to_f32
from llamactx.gguf.quants import block_format, dequantize

_FAST_TYPES = (T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
Q4_0, Q4_1, Q5_1, Q8_0 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_1), int(T.Q8_0)


@njit(cache=True, inline="always")
def _f16_at(row, o) -> np.float32:
    """The little-endian f16 at bytes o, o + 1 of a uint8 row, as float32 (exact)."""
    return f16_to_f32(np.uint16(row[o]) | (np.uint16(row[o + 1]) << np.uint16(8)))


@njit(cache=True)
def _get_rows_blocks(kind, data, ids, out) -> None:
    """out[i] = dequantized row ids[i] of raw blocks `data` (n_rows, row_bytes) of a 32-element block type."""
    for i in range(ids.shape[0]):
        row = data[ids[i]]
        for b in range(out.shape[1] // 32):
            y = out[i, b * 32 : b * 32 + 32]
            if kind == Q8_0:  # f16 d, int8 qs[32]
                o = b * 34
                d = _f16_at(row, o)
                for j in range(32):
                    y[j] = np.float32(np.int8(row[o + 2 + j])) * d
            elif kind == Q4_0:  # f16 d, qs[16]: element j low nibble, j + 16 high nibble; x = d * (q - 8)
                o = b * 18
                d = _f16_at(row, o)
                for j in range(16):
                    y[j] = np.float32(np.int32(row[o + 2 + j] & 15) - 8) * d
                    y[j + 16] = np.float32(np.int32(row[o + 2 + j] >> 4) - 8) * d
            elif kind == Q4_1:  # f16 d, f16 m, qs[16]; x = d * q + m
                o = b * 20
                d = _f16_at(row, o)
                m = _f16_at(row, o + 2)
                for j in range(16):
                    y[j] = np.float32(row[o + 4 + j] & 15) * d + m
                    y[j + 16] = np.float32(row[o + 4 + j] >> 4) * d + m
            else:  # Q5_0 (f16 d, u32 qh, qs[16]; d * (q - 16)) / Q5_1 (f16 d, f16 m, u32 qh, qs[16]; d * q + m)
                has_m = kind == Q5_1
                o = b * (24 if has_m else 22)
                d = _f16_at(row, o)
                m = _f16_at(row, o + 2) if has_m else np.float32(0.0)
                h = o + (4 if has_m else 2)
                qh = np.uint32(row[h]) | (np.uint32(row[h + 1]) << 8) | (np.uint32(row[h + 2]) << 16)
                qh |= np.uint32(row[h + 3]) << 24
                for j in range(16):
                    q0 = np.int32(row[h + 4 + j] & 15) | np.int32(((qh >> j) & 1) << 4)
                    q1 = np.int32(row[h + 4 + j] >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
                    if has_m:
                        y[j] = np.float32(q0) * d + m
                        y[j + 16] = np.float32(q1) * d + m
                    else:
                        y[j] = np.float32(q0 - 16) * d
                        y[j + 16] = np.float32(q1 - 16) * d


@njit(cache=True)
def _get_rows_f16(data, ids, out) -> None:
    """out[i] = row ids[i] of an F16 matrix given as its raw bytes (n_rows, 2k)."""
    for i in range(ids.shape[0]):
        row = data[ids[i]]
        for j in range(out.shape[1]):
            out[i, j] = _f16_at(row, 2 * j)


def get_rows(weight, ids: np.ndarray) -> np.ndarray:
    """The rows `ids` of a 2-D `Weight` dequantized to float32 (ggml_get_rows). -> (len(ids), ne0)

    Raises IndexError naming the first id outside 0..n_rows-1, ValueError for ids that are not 1-D integers.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"get_rows {weight.name!r}: ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    k, n_rows = int(weight.shape[0]), int(weight.n_rows)
    bad = np.flatnonzero((ids < 0) | (ids >= n_rows))
    if bad.size:
        raise IndexError(
            f"get_rows {weight.name!r}: id {int(ids[bad[0]])} at position {int(bad[0])} is outside 0..{n_rows - 1}"
        )
    ids = ids.astype(np.int64)
    t = int(weight.ggml_type)
    if t not in _FAST_TYPES:
        rows = weight.data[ids]  # (n, row_bytes)
        return dequantize(rows.reshape(-1), t, (k, len(ids)), weight.name)
    data = weight.data.reshape(n_rows, -1)  # (n_rows, k) typed or (n_rows, row_bytes)
    if t == T.F32:
        return np.array(data[ids], dtype=np.float32)
    out = np.empty((len(ids), k), dtype=np.float32)  # (n, k)
    if t == T.F16:
        _get_rows_f16(data.view(np.uint8), ids, out)
    else:
        if block_format(t).block_size != 32:
            raise AssertionError("unreachable: every fast quantized type has 32-element blocks")
        _get_rows_blocks(t, data, ids, out)
    return out


@njit(cache=True)
def rows_q8_0_x4(qs, sc, ids, out) -> None:
    """out[i] = row ids[i] of a packed Q8_0 matrix (repack.py: rows in groups of four, q + 128, f16 d)."""
    for i in range(ids.shape[0]):
        g, j = ids[i] // 4, ids[i] % 4
        for b in range(out.shape[1] // 32):
            d = f16_to_f32(np.uint16(sc[g, b * 8 + 2 * j]) | (np.uint16(sc[g, b * 8 + 2 * j + 1]) << np.uint16(8)))
            for e in range(16):
                out[i, b * 32 + e] = np.float32(np.int32(qs[g, b * 128 + j * 16 + e]) - 128) * d
                out[i, b * 32 + 16 + e] = np.float32(np.int32(qs[g, b * 128 + 64 + j * 16 + e]) - 128) * d


@njit(cache=True)
def rows_q4_x4(qs, sc, with_m, ids, out) -> None:
    """out[i] = row ids[i] of a packed Q4_0 / Q4_1 matrix (repack.py: rows in groups of four, per block the four
    rows' 16 bytes of nibbles, then their f16 d (Q4_1: then their f16 m)): (q - 8) * d, Q4_1's q * d + m (the
    product exact, one rounding), as dequantize_row_q4_0 / _q4_1."""
    step = 16 if with_m else 8
    for i in range(ids.shape[0]):
        g, j = ids[i] // 4, ids[i] % 4
        for b in range(out.shape[1] // 32):
            d = _f16_at(sc[g], b * step + 2 * j)
            m = _f16_at(sc[g], b * step + 8 + 2 * j) if with_m else np.float32(0.0)
            for e in range(16):
                q = qs[g, b * 64 + j * 16 + e]
                if with_m:
                    out[i, b * 32 + e] = np.float32(q & 15) * d + m
                    out[i, b * 32 + 16 + e] = np.float32(q >> 4) * d + m
                else:
                    out[i, b * 32 + e] = np.float32(np.int32(q & 15) - 8) * d
                    out[i, b * 32 + 16 + e] = np.float32(np.int32(q >> 4) - 8) * d


@njit(cache=True)
def rows_bf16(qs, ids, out) -> None:
    """out[i] = row ids[i] of a BF16 matrix's stored bytes qs (rows, 2 k), widened exactly to float32."""
    w = qs.view(np.uint16)  # (rows, k)
    bits = out.view(np.uint32)  # (n, k)
    for i in range(ids.shape[0]):
        for j in range(out.shape[1]):
            bits[i, j] = np.uint32(w[ids[i], j]) << np.uint32(16)


@njit(cache=True)
def rows_nl(qs, d, table, ids, out) -> None:
    """out[i] = row ids[i] of a packed IQ4_NL / MXFP4 matrix (repack.py `_interleave_nl`: rows in groups of eight,
    row 8g + j's bytes 4c..4c+3 of block b at qs[g, 128 b + 32 c + 4 j], low nibbles elements 4c.., high ones
    16+4c..; its f32 scale, MXFP4's E8M0 halved, at d[g, 8 b + j]) with its codebook `table` (int8 (16,)):
    code * d, one rounding, as ggml's dequantize_row_iq4_nl / _mxfp4."""
    for i in range(ids.shape[0]):
        g, j = ids[i] // 8, ids[i] % 8
        for b in range(out.shape[1] // 32):
            s = d[g, 8 * b + j]
            for c in range(4):
                for e in range(4):
                    q = qs[g, 128 * b + 32 * c + 4 * j + e]
                    out[i, b * 32 + 4 * c + e] = np.float32(table[q & 15]) * s
                    out[i, b * 32 + 16 + 4 * c + e] = np.float32(table[q >> 4]) * s


def get_rows_q8_0_packed(pw, ids: np.ndarray) -> np.ndarray:
    """The rows `ids` of a Q8_0 matrix from its packed copy, so that the file pages of a table shared with the
    output matrix stay released. q * d is exact in float32: the same bits as dequantizing. -> (len(ids), k)"""
    out = np.empty((len(ids), pw.k), np.float32)  # (n, k)
    rows_q8_0_x4(pw.qs, pw.sc, np.asarray(ids, np.int64), out)
    return out

"""Q4_K and Q6_K weights as ggml stores them: one stream of whole super-blocks per row (ggml-common.h).

A decode step reads every weight once, so how many streams a row is spread over matters as much as how many bytes
it has: a row split into five arrays (nibbles, scales, mins, d, dmin) is five streams for the hardware prefetcher,
and a matrix of short rows keeps restarting them. ggml's own block layout has none of that: a row is its
super-blocks back to back, each holding its scales next to its quants, and it is also the fewest bytes (llama.cpp's
repacked block_q4_Kx8 has the same 144 bytes per row and super-block). So repack.py copies Q4_K and Q6_K rows
as stored (a copy, so the file's pages can be released) into the `qs` slot, and the kernels find each field at its
offset in the super-block:

    block_q4_K (144 bytes): f16 d @0, f16 dmin @2, scales[12] @4 (6-bit scales and mins, get_scale_min_k4),
                            qs[128] @16 (nibbles: low = sub-block 2c, high = 2c + 1, 32 bytes each)
    block_q6_K (210 bytes): ql[128] @0, qh[64] @128, scales[16] (int8) @192, f16 d @208

`q4k_scales` unpacks a super-block's twelve scale bytes into eight 6-bit scales and eight mins, two per 64-bit
word, with the same three 32-bit masks as ggml_vec_dot_q4_K_q8_K (arch/x86/quants.c, utmp / kmask1..3).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from llamactx.ggml.kernels.simd import load_f16, ptr2d

Q4K_BYTES, Q4K_D, Q4K_DMIN, Q4K_SCALES, Q4K_QS = 144, 0, 2, 4, 16
Q6K_BYTES, Q6K_QL, Q6K_QH, Q6K_SCALES, Q6K_D = 210, 0, 128, 192, 208

_KMASK1, _KMASK2, _KMASK3 = np.uint64(0x3F3F3F3F), np.uint64(0x0F0F0F0F), np.uint64(0x03030303)
_S4, _S6, _S32 = np.uint64(4), np.uint64(6), np.uint64(32)


@intrinsic
def load_u32(typingctx, arr, row, col):
    """The little-endian uint32 at byte [row, col] of a C-contiguous 2-D uint8 array (unaligned), as uint64."""
    sig = types.uint64(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v = builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], ir.IntType(32)), align=1)
        return builder.zext(v, ir.IntType(64))

    return sig, codegen


@njit(cache=True, inline="always")
def q4k_scales(qs, r, b):
    """Super-block b of Q4_K row r -> (scales, mins), each a uint64 whose byte s is sub-block s's 6-bit value."""
    o = b * Q4K_BYTES + Q4K_SCALES
    u0, u1, u2 = load_u32(qs, r, o), load_u32(qs, r, o + 4), load_u32(qs, r, o + 8)
    sc = (u0 & _KMASK1) | (((u2 & _KMASK2) | (((u0 >> _S6) & _KMASK3) << _S4)) << _S32)
    mn = (u1 & _KMASK1) | ((((u2 >> _S4) & _KMASK2) | (((u1 >> _S6) & _KMASK3) << _S4)) << _S32)
    return sc, mn


@njit(cache=True, inline="always")
def byte_of(word, s):
    """Byte s of a uint64 as int32 (a 6-bit scale or min of `q4k_scales`)."""
    return np.int32((word >> np.uint64(8 * s)) & np.uint64(0xFF))


@njit(cache=True, inline="always")
def q4k_blocks(qs):
    """Super-blocks per row of a Q4_K matrix in this layout."""
    return qs.shape[1] // Q4K_BYTES


@njit(cache=True, inline="always")
def q6k_blocks(qs):
    """Super-blocks per row of a Q6_K matrix in this layout."""
    return qs.shape[1] // Q6K_BYTES


# --- embedding lookup (ggml_get_rows) of a table in this layout -------------------------------------------------


@njit(cache=True)
def rows_q4_k(qs, ids, out):
    """out[i] = row ids[i] of a Q4_K matrix in this layout, dequantized as ggml-quants.c dequantize_row_q4_K (and
    llamactx.gguf.quants_k): (d * sc) * q - dmin * m, where only the subtraction rounds. out (n, nb*256) f32."""
    for i in range(ids.shape[0]):
        r = ids[i]
        for b in range(q4k_blocks(qs)):
            o = b * Q4K_BYTES
            d, dmin = load_f16(qs, r, o + Q4K_D), load_f16(qs, r, o + Q4K_DMIN)
            sc, mn = q4k_scales(qs, r, b)
            for c in range(4):
                dl0, ml0 = d * np.float32(byte_of(sc, 2 * c)), dmin * np.float32(byte_of(mn, 2 * c))
                dl1, ml1 = d * np.float32(byte_of(sc, 2 * c + 1)), dmin * np.float32(byte_of(mn, 2 * c + 1))
                for e in range(32):
                    q = qs[r, o + Q4K_QS + 32 * c + e]
                    out[i, b * 256 + 64 * c + e] = np.float32(q & 15) * dl0 - ml0
                    out[i, b * 256 + 64 * c + 32 + e] = np.float32(q >> 4) * dl1 - ml1


@njit(cache=True)
def rows_q6_k(qs, ids, out):
    """out[i] = row ids[i] of a Q6_K matrix in this layout, dequantized as dequantize_row_q6_K in gguf-py's order:
    (d * sc) * (q - 32), the second product rounding. out (n, nb*256) f32."""
    for i in range(ids.shape[0]):
        r = ids[i]
        for b in range(q6k_blocks(qs)):
            o = b * Q6K_BYTES
            d = load_f16(qs, r, o + Q6K_D)
            for h in range(2):
                for t in range(4):  # quarter t: elements 128h + 32t .. +31
                    lo = qs[r, o + Q6K_QL + 64 * h + 32 * (t % 2) : o + Q6K_QL + 64 * h + 32 * (t % 2) + 32]
                    hb = qs[r, o + Q6K_QH + 32 * h : o + Q6K_QH + 32 * h + 32]
                    base = b * 256 + 128 * h + 32 * t
                    for e in range(32):
                        v, h2 = np.int32(lo[e]), np.int32(hb[e])
                        nib = (v >> 4) if t >= 2 else (v & 15)
                        q = (nib | (((h2 >> (2 * t)) & 3) << 4)) - 32
                        s = np.int8(qs[r, o + Q6K_SCALES + (128 * h + 32 * t + e) // 16])
                        out[i, base + e] = (d * np.float32(s)) * np.float32(q)

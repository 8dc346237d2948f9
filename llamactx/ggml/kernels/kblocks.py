"""Q4_K and Q6_K weights as the kernels store them: Q6_K as ggml's rows, Q4_K eight rows interleaved (ggml-common.h;
llama.cpp's `block_q4_Kx8`, ggml-cpu/repack.cpp).

A decode step reads every weight once, so how many streams a matrix is spread over matters as much as how many
bytes it has: a row split into five arrays (nibbles, scales, mins, d, dmin) is five streams for the hardware
prefetcher, and a matrix of short rows keeps restarting them. ggml's block layout has none of that (a row is its
super-blocks back to back, each with its scales beside its quants), and Q6_K keeps it:

    block_q6_K (210 bytes): ql[128] @0, qh[64] @128, scales[16] (int8) @192, f16 d @208

Q4_K goes one step further, as llama.cpp's repack does: rows in groups of eight, and per super-block the eight rows'
fields side by side (1152 = 8 x 144 bytes, the same bytes as ggml's blocks, in a new order), so that one 64-byte
load holds eight bytes of each of the eight rows and a whole matrix is one stream, group after group
(kgemv.q4k_gemv_rows). Row r is lane l = r % 8 of group g = r // 8 (`Q4K_GROUP`); a last partial group is filled
with zero rows (repack.py); group g's super-block b starts at byte 1152 b of slot row g:

    @0    f16 d[8]          (lane l at 2l)
    @16   f16 dmin[8]       (lane l at 16 + 2l)
    @32   u32 scales[3][8]  (word w of the lane's twelve scale bytes at 32 + 32w + 4l: ggml's u0, u1, u2)
    @128  nibbles[16][8][8] (bytes 8m .. 8m + 7 of the lane's 128 bytes of qs at 128 + 64m + 8l: low nibbles of
                             qs byte j = element 64(j // 32) + j % 32, high ones 32 further, as in block_q4_K)

`q4k_scales` unpacks a super-block's twelve scale bytes into eight 6-bit scales and eight mins, two per 64-bit
word, with the same three 32-bit masks as ggml_vec_dot_q4_K_q8_K (arch/x86/quants.c, utmp / kmask1..3);
`q4k_d`, `q4k_dmin`, `q4k_qs_col` find the other fields of row r for the kernels that read rows one by one
(ktile.py's tiles, kquants.py's vec_dot order, the embedding lookup `rows_q4_k`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from llamactx.ggml.kernels.simd import i8x32, load_f16, ptr2d

Q4K_BYTES = 144  # ggml's block_q4_K: one row's super-block
Q4K_GROUP, Q4K_GBYTES = 8, 1152  # rows per interleaved group, bytes of a group's super-block
Q4K_GD, Q4K_GDMIN, Q4K_GSC, Q4K_GQS = 0, 16, 32, 128  # the group super-block's fields (module docstring)
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
    g, o = r >> 3, b * Q4K_GBYTES + Q4K_GSC + 4 * (r & 7)
    u0, u1, u2 = load_u32(qs, g, o), load_u32(qs, g, o + 32), load_u32(qs, g, o + 64)
    sc = (u0 & _KMASK1) | (((u2 & _KMASK2) | (((u0 >> _S6) & _KMASK3) << _S4)) << _S32)
    mn = (u1 & _KMASK1) | ((((u2 >> _S4) & _KMASK2) | (((u1 >> _S6) & _KMASK3) << _S4)) << _S32)
    return sc, mn


@njit(cache=True, inline="always")
def q4k_d(qs, r, b):
    """d of super-block b of Q4_K row r, as float32."""
    return load_f16(qs, r >> 3, b * Q4K_GBYTES + Q4K_GD + 2 * (r & 7))


@njit(cache=True, inline="always")
def q4k_dmin(qs, r, b):
    """dmin of super-block b of Q4_K row r, as float32."""
    return load_f16(qs, r >> 3, b * Q4K_GBYTES + Q4K_GDMIN + 2 * (r & 7))


@njit(cache=True, inline="always")
def q4k_qs_col(r, b, j):
    """The column of slot row r // 8 that holds byte j (0..127; runs of eight bytes stay together) of super-block
    b's nibbles of Q4_K row r."""
    return b * Q4K_GBYTES + Q4K_GQS + (j >> 3) * 64 + (r & 7) * 8 + (j & 7)


@intrinsic
def q4k_load32(typingctx, qs, r, b, c):
    """Bytes 32c .. 32c + 31 of super-block b's nibbles of Q4_K row r (four runs of eight, 64 bytes apart) -> i8x32,
    as a 32-byte load of ggml's block_q4_K would give them."""
    sig = i8x32(qs, types.intp, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        arr, r, b, c = args
        i64 = ir.IntType(64)
        g = builder.ashr(r, ir.Constant(i64, 3))
        col = builder.add(builder.add(builder.mul(b, ir.Constant(i64, Q4K_GBYTES)),
                                      builder.mul(c, ir.Constant(i64, 4 * 64))),
                          builder.add(ir.Constant(i64, Q4K_GQS), builder.shl(builder.and_(r, ir.Constant(i64, 7)),
                                                                             ir.Constant(i64, 3))))
        v = ir.Constant(ir.VectorType(i64, 4), None)
        for k in range(4):
            p = ptr2d(context, builder, sig.args[0], arr, g, builder.add(col, ir.Constant(i64, 64 * k)), i64)
            v = builder.insert_element(v, builder.load(p, align=1), ir.Constant(ir.IntType(32), k))
        return builder.bitcast(v, ir.VectorType(ir.IntType(8), 32))

    return sig, codegen


@njit(cache=True, inline="always")
def byte_of(word, s):
    """Byte s of a uint64 as int32 (a 6-bit scale or min of `q4k_scales`)."""
    return np.int32((word >> np.uint64(8 * s)) & np.uint64(0xFF))


@njit(cache=True, inline="always")
def q4k_blocks(qs):
    """Super-blocks per row of a Q4_K matrix in this layout (groups of eight rows)."""
    return qs.shape[1] // Q4K_GBYTES


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
        g = r >> 3
        for b in range(q4k_blocks(qs)):
            d, dmin = q4k_d(qs, r, b), q4k_dmin(qs, r, b)
            sc, mn = q4k_scales(qs, r, b)
            for c in range(4):
                dl0, ml0 = d * np.float32(byte_of(sc, 2 * c)), dmin * np.float32(byte_of(mn, 2 * c))
                dl1, ml1 = d * np.float32(byte_of(sc, 2 * c + 1)), dmin * np.float32(byte_of(mn, 2 * c + 1))
                for e in range(32):
                    q = qs[g, q4k_qs_col(r, b, 32 * c + e)]
                    out[i, b * 256 + 64 * c + e] = np.float32(q & 15) * dl0 - ml0
                    out[i, b * 256 + 64 * c + 32 + e] = np.float32(q >> 4) * dl1 - ml1


def interleave_q4k(blocks: np.ndarray) -> np.ndarray:
    """ggml's block_q4_K rows (n, nb, 144) u8, n a multiple of 8 -> the groups of eight (n/8, nb*1152) u8 of the
    module docstring (repack.py)."""
    n, nb, _ = blocks.shape
    g = blocks.reshape(n // Q4K_GROUP, Q4K_GROUP, nb, Q4K_BYTES).transpose(0, 2, 1, 3)  # (group, b, lane, 144)
    scales = g[..., 4:16].reshape(*g.shape[:3], 3, 4).transpose(0, 1, 3, 2, 4)  # (group, b, word, lane, 4)
    nibbles = g[..., 16:].reshape(*g.shape[:3], 16, 8).transpose(0, 1, 3, 2, 4)  # (group, b, run, lane, 8)
    parts = [g[..., 0:2], g[..., 2:4], scales, nibbles]
    out = np.concatenate([p.reshape(*g.shape[:2], -1) for p in parts], axis=2)  # (group, b, 1152)
    return out.reshape(n // Q4K_GROUP, nb * Q4K_GBYTES)


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

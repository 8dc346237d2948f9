"""Q3_K, IQ4_XS and Q5_K for prompt-sized batches in llama.cpp's tiled order: 16 weight rows per tile, one int32
lane per row (ktile.py's design, which does this for Q4_K and Q6_K).

llama.cpp runs these types, never repacked, through its tiled kernel from 8 activation rows (tiled-kernel.cpp
`tiled_run_micro_vnni_8x16`): per super-block the whole integer sum s1 = sum sc * dot (and Q5_K's s2 = sum m * bsum),
then out = fma(float(s1) * d_w, d_x, out) (Q5_K: result = fnmadd(dmin_w, float(s2), float(s1) * d_w), out =
fma(result, d_x, out)); kxquants.kx_rows / q5k_tiled_rows compute that order one weight row at a time. Only the
super-block's total matters, so a tile holds unsigned codes and each sub-block's dot starts from minus their offset
(the activation sub-block's sum << shift), which makes it the signed codes' dot before its scale multiplies it:

- Q3_K: the stored 3-bit q (0..7, value q - 4): s1 = sum sc * (dot - 4 * bsum);
- IQ4_XS and klowbit's IQ tiles: the codebook entry + 128 (1..241: the portable path widens, `pmaddubsw` pairs
  would saturate past 128): s1 = sum sc * (dot - 128 * bsum). Where every lane's two 16-element scales of a
  32-element sub-block are equal (IQ4_XS, IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S: checked per tile), one multiply per 32
  elements (exact: sc * a + sc * b = sc * (a + b) in integers);
- Q5_K: 5-bit q (0..31) with the 32-element sub-blocks of ktile's Q4_K tile;
- IQ4_NL / MXFP4 (repacked in llama.cpp: one FMA per 32-element block, `fma(float(dot), d_w * d_x, acc)`, for
  every n): codebook entry + 128, the block's dot started at -128 * (its activation sum).

A tile transposes 16 rows once (registers of 16 rows x 4 codes), then activation rows stream through it four at a
time, each sub-block's registers loaded once for the four, with `vpdpbusd` against four broadcast activation quants
(`_kx_rows`: the helpers it inlines take no tuple of arrays, so no reference counting runs in the loop); `matmul`
takes this path from `ktile.TILE_MIN_ROWS` rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

from llamactx.ggml.kernels.ktile import TILE, _packed_pairs, _store_tile, _sub_dots
from llamactx.ggml.kernels.simd import splat
from llamactx.ggml.kernels.vnni import izero16, vdot16, vdot16_u8
from llamactx.ggml.kernels.wide import (
    ffma16s,
    fload16,
    fmul16i,
    i32x16,
    iadd16,
    iload16,
    imaddwd,
    imul2,
    wfmadd,
    wload,
    wscale,
    wzero,
    xbcast4,
)
from llamactx.gguf.quants_iq import KVALUES_IQ4NL, KVALUES_MXFP4

_NIB = np.uint32(0x0F0F0F0F)
_IQ4_U8 = (KVALUES_IQ4NL.astype(np.int16) + 128).astype(np.uint8)  # codebook entry + 128: 1..241
_MXFP4_U8 = (KVALUES_MXFP4.astype(np.int16) + 128).astype(np.uint8)  # 116..140
Q3K_SHIFT, IQ4XS_SHIFT = 2, 7  # the offsets 4 and 128 as shifts


# --- Q3_K / IQ4_XS: 16-element sub-blocks ------------------------------------------------------------------


@njit(cache=True)
def _kx_tile_scales(W, r, lane, tile):
    """Row r's int8 scales (16 per super-block) and d into lane `lane` of the tile."""
    _, _, sc, _, d, _ = W
    _, tsc, tsc2, td = tile
    s8 = sc[r].view(np.int8)
    for b in range(d.shape[1]):
        td[b, lane] = d[r, b]
        for s in range(16):
            tsc[b * 16 + s, lane] = s8[b * 16 + s]
            tsc2[b * 8 + s // 2, 2 * lane + s % 2] = s8[b * 16 + s]


@njit(cache=True)
def _q3k_tile(W, r0, r1, tile):
    """Rows r0..r0+15 of Q3_K (past r1 - 1 repeating it): wq (nb*64, 64) u8, register 64 b + 4 s + q = elements
    16 s + 4 q..+3 of super-block b for the 16 rows, the stored q in 0..7; scales (`_kx_tile_scales`)."""
    qs, qh, _, _, d, _ = W
    w32 = tile[0].view(np.uint32)  # (nb*64, 16)
    for lane in range(TILE):
        r = min(r0 + lane, r1 - 1)
        q32, h32 = qs[r].view(np.uint32), qh[r].view(np.uint32)
        _kx_tile_scales(W, r, lane, tile)
        for b in range(d.shape[1]):
            for s in range(16):
                h, t = s // 8, (s % 8) // 2  # element 16 s: half h, group t of 32
                for q in range(4):
                    l4 = ((16 * s + 4 * q) % 32) // 4  # the word of bytes l..l+3 of the 32-byte fields
                    low = (q32[b * 16 + h * 8 + l4] >> np.uint32(2 * t)) & np.uint32(0x03030303)
                    high = (h32[b * 8 + l4] >> np.uint32(4 * h + t)) & np.uint32(0x01010101)
                    w32[b * 64 + 4 * s + q, lane] = low | (high << np.uint32(2))


@njit(cache=True)
def _iq4xs_tile(W, r0, r1, tile):
    """Rows r0..r0+15 of IQ4_XS: register 64 b + 4 s + q = elements 16 s + 4 q..+3 as codebook entry + 128."""
    qs, _, _, _, d, _ = W
    wq = tile[0]  # (nb*64, 64)
    for lane in range(TILE):
        r = min(r0 + lane, r1 - 1)
        _kx_tile_scales(W, r, lane, tile)
        for b in range(d.shape[1]):
            for s in range(16):
                shift = 4 * (s % 2)  # sub-block 2g: low nibbles of group g's 16 bytes, 2g + 1: high
                for q in range(4):
                    for e in range(4):
                        byte = qs[r, b * 128 + 16 * (s // 2) + 4 * q + e]
                        wq[b * 64 + 4 * s + q, 4 * lane + e] = _IQ4_U8[(byte >> shift) & 15]


def vdot_w(path, wide, acc, w, x):
    """acc + w . x, four bytes per lane: `vdot16_u8` where `wide` (a literal: codes past 128, which the portable
    path must widen), else `vdot16`."""


@overload(vdot_w, jit_options={"cache": True})
def _vdot_w(path, wide, acc, w, x):
    if not isinstance(wide, types.BooleanLiteral):
        return lambda path, wide, acc, w, x: vdot16_u8(path, acc, w, x) if wide else vdot16(path, acc, w, x)
    if wide.literal_value:
        return lambda path, wide, acc, w, x: vdot16_u8(path, acc, w, x)
    return lambda path, wide, acc, w, x: vdot16(path, acc, w, x)


@njit(cache=True, inline="always")
def _off(pairs, i, p, half, shift):
    """-(offset) of activation row i for sub-block 2p + half (half 0 / 1: its 16 elements; 2: both, the
    32-element sub-block of equal scales): -(sum of its activation quants) << shift, from the int16 pair
    pairs[i, p] (`_packed_pairs`)."""
    x = np.int64(pairs[i, p])
    lo, hi = ((x & 0xFFFF) ^ 0x8000) - 0x8000, x >> 16
    s = lo if half == 0 else hi if half == 1 else lo + hi
    return ibcast16(np.int32(-(s << shift)))


@njit(cache=True, inline="always")
def _dot4(path, wide, acc, w0, w1, w2, w3, xq, i, col):
    """acc + (four registers of the tile's codes) . x[i, col:col + 16], lane r = row r."""
    acc = vdot_w(path, wide, acc, w0, xbcast4(xq, i, col))
    acc = vdot_w(path, wide, acc, w1, xbcast4(xq, i, col + 4))
    acc = vdot_w(path, wide, acc, w2, xbcast4(xq, i, col + 8))
    return vdot_w(path, wide, acc, w3, xbcast4(xq, i, col + 12))


@njit(cache=True)
def _kx_rows(path, wide, p32, wq, tsc, td, xq, xd, pairs, i, shift):
    """Activation rows i..i+3 against the tile: per super-block s1 = sum over its sub-blocks of sc * (codes . x -
    offset), each sub-block's dot started from -(offset) = -(its activation sum) << shift (so s1 is the signed
    codes' sum), then acc = fma(float(s1) * d_w, d_x, acc). One scale multiply per 32 elements where `p32` (the
    two scales of every 32 equal). The tile's registers of a sub-block are loaded once for the four rows.
    -> four f32x16, lane r = weight row r."""
    a0, a1, a2, a3 = wzero(), wzero(), wzero(), wzero()
    for b in range(td.shape[0]):
        s0, s1, s2, s3 = izero16(), izero16(), izero16(), izero16()
        if p32:
            for p in range(8):
                c, j, q = b * 64 + 8 * p, b * 256 + 32 * p, b * 8 + p
                w0, w1, w2, w3 = wload(wq, c, 0), wload(wq, c + 1, 0), wload(wq, c + 2, 0), wload(wq, c + 3, 0)
                w4, w5, w6, w7 = wload(wq, c + 4, 0), wload(wq, c + 5, 0), wload(wq, c + 6, 0), wload(wq, c + 7, 0)
                sc = iload16(tsc, b * 16 + 2 * p, 0)
                d0 = _dot4(path, wide, _off(pairs, i, q, 2, shift), w0, w1, w2, w3, xq, i, j)
                d1 = _dot4(path, wide, _off(pairs, i + 1, q, 2, shift), w0, w1, w2, w3, xq, i + 1, j)
                d2 = _dot4(path, wide, _off(pairs, i + 2, q, 2, shift), w0, w1, w2, w3, xq, i + 2, j)
                d3 = _dot4(path, wide, _off(pairs, i + 3, q, 2, shift), w0, w1, w2, w3, xq, i + 3, j)
                s0 = iadd16(s0, imul16(_dot4(path, wide, d0, w4, w5, w6, w7, xq, i, j + 16), sc))
                s1 = iadd16(s1, imul16(_dot4(path, wide, d1, w4, w5, w6, w7, xq, i + 1, j + 16), sc))
                s2 = iadd16(s2, imul16(_dot4(path, wide, d2, w4, w5, w6, w7, xq, i + 2, j + 16), sc))
                s3 = iadd16(s3, imul16(_dot4(path, wide, d3, w4, w5, w6, w7, xq, i + 3, j + 16), sc))
        else:
            for s in range(16):
                c, j, q, h = b * 64 + 4 * s, b * 256 + 16 * s, b * 8 + s // 2, s % 2
                w0, w1, w2, w3 = wload(wq, c, 0), wload(wq, c + 1, 0), wload(wq, c + 2, 0), wload(wq, c + 3, 0)
                sc = iload16(tsc, b * 16 + s, 0)
                s0 = iadd16(s0, imul16(_dot4(path, wide, _off(pairs, i, q, h, shift), w0, w1, w2, w3, xq, i, j), sc))
                s1 = iadd16(s1, imul16(_dot4(path, wide, _off(pairs, i + 1, q, h, shift), w0, w1, w2, w3, xq, i + 1,
                                             j), sc))
                s2 = iadd16(s2, imul16(_dot4(path, wide, _off(pairs, i + 2, q, h, shift), w0, w1, w2, w3, xq, i + 2,
                                             j), sc))
                s3 = iadd16(s3, imul16(_dot4(path, wide, _off(pairs, i + 3, q, h, shift), w0, w1, w2, w3, xq, i + 3,
                                             j), sc))
        dw = fload16(td, b, 0)
        a0, a1 = ffma16s(a0, fmul16i(s0, dw), xd[i, b]), ffma16s(a1, fmul16i(s1, dw), xd[i + 1, b])
        a2, a3 = ffma16s(a2, fmul16i(s2, dw), xd[i + 2, b]), ffma16s(a3, fmul16i(s3, dw), xd[i + 3, b])
    return a0, a1, a2, a3


@njit(cache=True)
def _kx_row(path, wide, wq, tsc, td, xq, xd, pairs, i, shift):
    """`_kx_rows` for the one activation row i (the last n % 4), 16-element sub-blocks. -> f32x16."""
    acc = wzero()
    for b in range(td.shape[0]):
        isum = izero16()
        for s in range(16):
            c = b * 64 + 4 * s
            w0, w1, w2, w3 = wload(wq, c, 0), wload(wq, c + 1, 0), wload(wq, c + 2, 0), wload(wq, c + 3, 0)
            dot = _dot4(path, wide, _off(pairs, i, b * 8 + s // 2, s % 2, shift), w0, w1, w2, w3, xq, i,
                        b * 256 + 16 * s)
            isum = iadd16(isum, imul16(dot, iload16(tsc, b * 16 + s, 0)))
        acc = ffma16s(acc, fmul16i(isum, fload16(td, b, 0)), xd[i, b])
    return acc


@njit(cache=True)
def _scales_paired(tsc2):
    """Whether every lane's two 16-element scales of each 32-element sub-block are equal (IQ4_XS and the IQ
    types with one scale per 32: `sc * dot_lo + sc * dot_hi == sc * (dot_lo + dot_hi)`, one multiply)."""
    w = tsc2.view(np.uint32)
    bad = np.uint32(0)
    for j in range(w.shape[0]):
        for lane in range(w.shape[1]):
            bad |= (w[j, lane] ^ (w[j, lane] >> np.uint32(16))) & np.uint32(0xFFFF)
    return bad == 0


@njit(cache=True)
def kx_tile_dot(path, iq4, tile, xq, xd, pairs, shift, t0, t1, out, buf):
    """out[:, t0:t1] from one filled tile (rows t0..t1 of the weights) and every activation row, four rows at a
    time sharing each sub-block's loads of the tile (klowbit's tiles use it too, with iq4 True)."""
    wq, tsc, tsc2, td = tile
    n = xq.shape[0]
    n4 = n - n % 4
    p32 = _scales_paired(tsc2)
    for i in range(0, n4, 4):
        y0, y1, y2, y3 = _kx_rows(path, iq4, p32, wq, tsc, td, xq, xd, pairs, i, shift)
        _store_tile(out, i, t0, t1, y0, buf)
        _store_tile(out, i + 1, t0, t1, y1, buf)
        _store_tile(out, i + 2, t0, t1, y2, buf)
        _store_tile(out, i + 3, t0, t1, y3, buf)
    for i in range(n4, n):
        _store_tile(out, i, t0, t1, _kx_row(path, iq4, wq, tsc, td, xq, xd, pairs, i, shift), buf)


@njit(cache=True)
def kx_tile_rows(path, iq4, W, a, r0, r1, out):
    """out[:, r0:r1] for Q3_K (`iq4` False) or IQ4_XS weights in llama.cpp's tiled order, 16 rows per tile."""
    xq, xd, bsums, _ = a
    nb = W[4].shape[1]
    n = xq.shape[0]
    pairs = np.empty((n, nb * 8), np.int32)  # the activation sums of 16, in int16 pairs
    _packed_pairs(bsums, 1, pairs)
    tile = (np.empty((nb * 64, 64), np.uint8), np.empty((nb * 16, TILE), np.int32),
            np.empty((nb * 8, 2 * TILE), np.int16), np.empty((nb, TILE), np.float32))
    buf = np.empty((1, TILE), np.float32)
    for t0 in range(r0, r1, TILE):
        t1 = min(t0 + TILE, r1)
        if iq4:
            _iq4xs_tile(W, t0, t1, tile)
            kx_tile_dot(path, True, tile, xq, xd, pairs, IQ4XS_SHIFT, t0, t1, out, buf)
        else:
            _q3k_tile(W, t0, t1, tile)
            kx_tile_dot(path, False, tile, xq, xd, pairs, Q3K_SHIFT, t0, t1, out, buf)


# --- Q5_K: 32-element sub-blocks with 6-bit scales and mins ----------------------------------------------------


@njit(cache=True)
def _q5k_tile(W, r0, r1, tile):
    """Rows r0..r0+15 of Q5_K: wq (nb*64, 64) u8, register (8 b + s) * 8 + q = bytes 4q..4q+3 of sub-block s
    for the 16 rows, q in 0..31 (ktile._q4k_tile's layout plus the fifth bit); sc (nb*8, 16) i32; mn2 (nb*4, 32)
    i16 the mins of sub-blocks 2c, 2c+1 as pairs per lane; d and -dmin (nb, 16) f32."""
    qs, qh, sc, mn, d, dmin = W
    wq, tsc, tmn2, td, tdm = tile
    w32 = wq.view(np.uint32)  # (nb*64, 16)
    for lane in range(TILE):
        r = min(r0 + lane, r1 - 1)
        q32, h32 = qs[r].view(np.uint32), qh[r].view(np.uint32)
        for b in range(d.shape[1]):
            td[b, lane] = d[r, b]
            tdm[b, lane] = -dmin[r, b]
            for s in range(8):
                tsc[b * 8 + s, lane] = sc[r, b * 8 + s]
                tmn2[b * 4 + s // 2, 2 * lane + s % 2] = mn[r, b * 8 + s]
                for q in range(8):
                    v = q32[b * 32 + (s // 2) * 8 + q] >> np.uint32(4 * (s % 2))
                    high = (h32[b * 8 + q] >> np.uint32(s)) & np.uint32(0x01010101)
                    w32[(b * 8 + s) * 8 + q, lane] = (v & _NIB) | (high << np.uint32(4))


@njit(cache=True, inline="always")
def _q5k_step(acc, path, tile, xq, xd, pairs, i, b):
    """Super-block b for activation row i: result = fnmadd(dmin_w, float(s2), float(s1) * d_w), acc = fma(result,
    d_x, acc)."""
    wq, tsc, tmn2, td, tdm = tile
    isum, imin = izero16(), izero16()
    for c in range(4):
        s, j = b * 8 + 2 * c, b * 256 + c * 64
        lo, hi = _sub_dots(path, wq, s, xq, i, j, 4)
        isum = iadd16(isum, imul2(lo, iload16(tsc, s, 0), hi, iload16(tsc, s + 1, 0)))
        imin = iadd16(imin, imaddwd(iload16(tmn2, b * 4 + c, 0), pairs[i, b * 4 + c]))
    result = wfmadd(fmul16i(isum, fload16(td, b, 0)), imin, fload16(tdm, b, 0))
    return ffma16s(acc, result, xd[i, b])


@njit(cache=True)
def q5k_tile_rows(path, W, a, r0, r1, out):
    """out[:, r0:r1] for Q5_K weights in llama.cpp's tiled order, 16 rows per tile."""
    xq, xd, bsums, _ = a
    nb = W[4].shape[1]
    n = xq.shape[0]
    pairs = np.empty((n, nb * 4), np.int32)  # (S_2c, S_2c+1): the activation sums of 32 that meet the mins
    _packed_pairs(bsums, 2, pairs)
    tile = (np.empty((nb * 64, 64), np.uint8), np.empty((nb * 8, TILE), np.int32),
            np.empty((nb * 4, 2 * TILE), np.int16), np.empty((nb, TILE), np.float32),
            np.empty((nb, TILE), np.float32))
    buf = np.empty((1, TILE), np.float32)
    n4 = n - n % 4
    for t0 in range(r0, r1, TILE):
        t1 = min(t0 + TILE, r1)
        _q5k_tile(W, t0, t1, tile)
        for i in range(0, n4, 4):
            a0, a1, a2, a3 = wzero(), wzero(), wzero(), wzero()
            for b in range(nb):
                a0 = _q5k_step(a0, path, tile, xq, xd, pairs, i, b)
                a1 = _q5k_step(a1, path, tile, xq, xd, pairs, i + 1, b)
                a2 = _q5k_step(a2, path, tile, xq, xd, pairs, i + 2, b)
                a3 = _q5k_step(a3, path, tile, xq, xd, pairs, i + 3, b)
            _store_tile(out, i, t0, t1, a0, buf)
            _store_tile(out, i + 1, t0, t1, a1, buf)
            _store_tile(out, i + 2, t0, t1, a2, buf)
            _store_tile(out, i + 3, t0, t1, a3, buf)
        for i in range(n4, n):
            acc = wzero()
            for b in range(nb):
                acc = _q5k_step(acc, path, tile, xq, xd, pairs, i, b)
            _store_tile(out, i, t0, t1, acc, buf)


# --- IQ4_NL / MXFP4, repacked: one FMA per 32-element block ----------------------------------------------------


@intrinsic
def imul16(typingctx, a, b):
    """a * b lane by lane in int32 (a sub-block's dot times its scale: exact)."""
    sig = i32x16(i32x16, i32x16)

    def codegen(context, builder, sig, args):
        return builder.mul(args[0], args[1])

    return sig, codegen


@intrinsic
def ibcast16(typingctx, v):
    """An int32 in all 16 lanes."""
    sig = i32x16(types.int32)

    def codegen(context, builder, sig, args):
        return splat(builder, args[0], 16)

    return sig, codegen


@njit(cache=True)
def _nl_tile(qs, d, lut, r0, r1, wq, td):
    """Rows r0..r0+15 of IQ4_NL / MXFP4 (past r1 - 1 repeating it): wq (nb*8, 64) u8, register 8 b + q =
    elements 4q..4q+3 of block b for the 16 rows as codebook entry + 128; td (nb, 16) the block scales. The
    packed rows are in groups of eight (repack.py `_interleave_nl`: row 8g + j's bytes 4c..4c+3 of block b at
    qs[g, 128 b + 32 c + 4 j], its scale at d[g, 8 b + j])."""
    nb = td.shape[0]
    for lane in range(TILE):
        r = min(r0 + lane, r1 - 1)
        g, j = r // 8, r % 8
        for b in range(nb):
            td[b, lane] = d[g, 8 * b + j]
            for q in range(8):
                shift = 4 * (q // 4)  # elements 0-15: low nibbles of the block's 16 bytes, 16-31: high
                for e in range(4):
                    byte = qs[g, 128 * b + 32 * (q % 4) + 4 * j + e]
                    wq[b * 8 + q, 4 * lane + e] = lut[(byte >> shift) & 15]


@njit(cache=True, inline="always")
def _nl_step(path, acc, wq, td, xq, xd, xoff, i, b):
    """acc = fma(float(block . x), d_w * d_x, acc), lane r = row r: the block's dot of the codes + 128 starts
    from -128 * (the activation block's sum), so it is the exact signed dot."""
    dot = ibcast16(xoff[i, b])
    for q in range(8):
        dot = vdot16_u8(path, dot, wload(wq, b * 8 + q, 0), xbcast4(xq, i, b * 32 + 4 * q))
    return wfmadd(acc, dot, wscale(fload16(td, b, 0), xd[i, b]))


@njit(cache=True)
def nl_tile_rows(path, mxfp4, W, a, r0, r1, out):
    """out[:, r0:r1] for IQ4_NL (or `mxfp4`) weights in llama.cpp's repacked order, 16 rows per tile."""
    qs, _, _, _, d, _ = W
    xq, xd, _, _ = a
    n, nb = xq.shape[0], xd.shape[1]
    xoff = np.empty((n, nb), np.int32)  # -128 * the sum of each activation block's quants
    for i in range(n):
        for b in range(nb):
            s = 0
            for e in range(32):
                s += np.int32(xq[i, b * 32 + e])
            xoff[i, b] = -128 * s
    lut = _MXFP4_U8 if mxfp4 else _IQ4_U8
    wq, td = np.empty((nb * 8, 64), np.uint8), np.empty((nb, TILE), np.float32)
    buf = np.empty((1, TILE), np.float32)
    n4 = n - n % 4
    for t0 in range(r0, r1, TILE):
        t1 = min(t0 + TILE, r1)
        _nl_tile(qs, d, lut, t0, t1, wq, td)
        for i in range(0, n4, 4):
            a0, a1, a2, a3 = wzero(), wzero(), wzero(), wzero()
            for b in range(nb):
                a0 = _nl_step(path, a0, wq, td, xq, xd, xoff, i, b)
                a1 = _nl_step(path, a1, wq, td, xq, xd, xoff, i + 1, b)
                a2 = _nl_step(path, a2, wq, td, xq, xd, xoff, i + 2, b)
                a3 = _nl_step(path, a3, wq, td, xq, xd, xoff, i + 3, b)
            _store_tile(out, i, t0, t1, a0, buf)
            _store_tile(out, i + 1, t0, t1, a1, buf)
            _store_tile(out, i + 2, t0, t1, a2, buf)
            _store_tile(out, i + 3, t0, t1, a3, buf)
        for i in range(n4, n):
            acc = wzero()
            for b in range(nb):
                acc = _nl_step(path, acc, wq, td, xq, xd, xoff, i, b)
            _store_tile(out, i, t0, t1, acc, buf)

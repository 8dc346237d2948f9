"""Q3_K, IQ4_XS and Q5_K for prompt-sized batches in llama.cpp's tiled order: 16 weight rows per tile, one int32
lane per row (ktile.py's design, which does this for Q4_K and Q6_K).

llama.cpp runs these types, never repacked, through its tiled kernel from 8 activation rows (tiled-kernel.cpp
`tiled_run_micro_vnni_8x16`): per super-block the whole integer sum s1 = sum sc * dot (and Q5_K's s2 = sum m * bsum),
then out = fma(float(s1) * d_w, d_x, out) (Q5_K: result = fnmadd(dmin_w, float(s2), float(s1) * d_w), out =
fma(result, d_x, out)); kxquants.kx_rows / q5k_tiled_rows compute that order one weight row at a time. Only the
super-block's total matters, so a tile holds unsigned codes and takes their offset off at the end:

- Q3_K: the stored 3-bit q (0..7, value q - 4): s1 = isum - 4 * sum(sc * bsum);
- IQ4_XS: the codebook entry + 128 (1..241: the portable path widens, `pmaddubsw` pairs would saturate past
  128): s1 = isum - 128 * sum(sc * bsum);
- Q5_K: 5-bit q (0..31) with the 32-element sub-blocks of ktile's Q4_K tile;
- IQ4_NL / MXFP4 (repacked in llama.cpp: one FMA per 32-element block, `fma(float(dot), d_w * d_x, acc)`, for
  every n): codebook entry + 128, the block's dot started at -128 * (its activation sum).

A tile transposes 16 rows once (registers of 16 rows x 4 codes), then every activation row streams through it with
`vpdpbusd` against four broadcast activation quants; `matmul` takes this path from `ktile.TILE_MIN_ROWS` rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

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
    ishl16,
    isub16,
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


@njit(cache=True, inline="always")
def _dot16(path, wide, wq, b, s, xq, i):
    """Sub-block s (16 elements) of super-block b of the tile . x[i], lane r = row r (unsigned codes; `wide`:
    codes past 128, which the portable path must widen)."""
    acc = izero16()
    for q in range(4):
        w, x = wload(wq, b * 64 + 4 * s + q, 0), xbcast4(xq, i, b * 256 + 16 * s + 4 * q)
        acc = vdot16_u8(path, acc, w, x) if wide else vdot16(path, acc, w, x)
    return acc


@njit(cache=True, inline="always")
def _kx_isum(path, wide, tile, xq, i, b):
    """sum over the 16 sub-blocks of sc * (codes . x), lane r = row r."""
    wq, tsc, _, _ = tile
    isum = izero16()
    for s in range(0, 16, 2):
        isum = iadd16(isum, imul2(_dot16(path, wide, wq, b, s, xq, i), iload16(tsc, b * 16 + s, 0),
                                  _dot16(path, wide, wq, b, s + 1, xq, i), iload16(tsc, b * 16 + s + 1, 0)))
    return isum


@njit(cache=True, inline="always")
def _kx_step(acc, isum, tile, pairs, xd, i, b, shift):
    """End of super-block b for activation row i: s1 = isum - offset * sum(sc bsum), acc = fma(float(s1) * d_w,
    d_x, acc)."""
    _, _, tsc2, td = tile
    off = izero16()
    for p in range(8):
        off = iadd16(off, imaddwd(iload16(tsc2, b * 8 + p, 0), pairs[i, b * 8 + p]))
    return ffma16s(acc, fmul16i(isub16(isum, ishl16(off, shift)), fload16(td, b, 0)), xd[i, b])


@njit(cache=True)
def kx_tile_dot(path, iq4, tile, xq, xd, pairs, shift, t0, t1, out, buf):
    """out[:, t0:t1] from one filled tile (rows t0..t1 of the weights) and every activation row, four rows at a
    time sharing each super-block's loads of the tile (klowbit's tiles use it too, with iq4 True)."""
    n = xq.shape[0]
    nb = tile[3].shape[0]
    n4 = n - n % 4
    for i in range(0, n4, 4):  # four activation rows share each super-block's loads of the tile
        a0, a1, a2, a3 = wzero(), wzero(), wzero(), wzero()
        for b in range(nb):
            a0 = _kx_step(a0, _kx_isum(path, iq4, tile, xq, i, b), tile, pairs, xd, i, b, shift)
            a1 = _kx_step(a1, _kx_isum(path, iq4, tile, xq, i + 1, b), tile, pairs, xd, i + 1, b, shift)
            a2 = _kx_step(a2, _kx_isum(path, iq4, tile, xq, i + 2, b), tile, pairs, xd, i + 2, b, shift)
            a3 = _kx_step(a3, _kx_isum(path, iq4, tile, xq, i + 3, b), tile, pairs, xd, i + 3, b, shift)
        _store_tile(out, i, t0, t1, a0, buf)
        _store_tile(out, i + 1, t0, t1, a1, buf)
        _store_tile(out, i + 2, t0, t1, a2, buf)
        _store_tile(out, i + 3, t0, t1, a3, buf)
    for i in range(n4, n):
        acc = wzero()
        for b in range(nb):
            acc = _kx_step(acc, _kx_isum(path, iq4, tile, xq, i, b), tile, pairs, xd, i, b, shift)
        _store_tile(out, i, t0, t1, acc, buf)


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
    shift = IQ4XS_SHIFT if iq4 else Q3K_SHIFT
    buf = np.empty((1, TILE), np.float32)
    for t0 in range(r0, r1, TILE):
        t1 = min(t0 + TILE, r1)
        if iq4:
            _iq4xs_tile(W, t0, t1, tile)
        else:
            _q3k_tile(W, t0, t1, tile)
        kx_tile_dot(path, iq4, tile, xq, xd, pairs, shift, t0, t1, out, buf)


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

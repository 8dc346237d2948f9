"""K-quant matmuls for prompt-sized batches: 16 weight rows per tile, one int32 lane per row.

llama.cpp runs Q4_K (rows repacked to `block_q4_Kx8`) through ggml_gemm_q4_K_8x8_q8_K for activation rows in groups
of four and ggml_gemv_q4_K_8x8_q8_K for the rest (arch/x86/repack.cpp); `kquants.q4k_x8_rows` computes that order
one weight row at a time, which costs a horizontal integer sum per 64 elements and row pair. Every integer sum is
exact, so only where the integers become floats has to match, and this module gets the integers another way:

- a tile transposes 16 weight rows once into a scratch buffer (per super-block and 32-element sub-block, eight
  registers of 16 rows x 4 nibbles, decoded to bytes; the rows' scales, mins, d and dmin likewise as 16 lanes);
- every activation row then streams through the tile: `vpdpbusd` of a register against four activation quants
  broadcast to all lanes adds row r's four products to lane r, so a sub-block's dot products for the 16 rows
  accumulate in one register with no horizontal sum;
- per 64 elements (gemm rows) or per super-block (gemv rows) the lanes are scaled and converted exactly as
  `q4k_x8_rows` does, lane r standing for weight row r: the same fma32 chain per output, the same bits.

Transposing a tile costs about what 16 activation rows do, so `matmul` takes this path only for ubatches of
`TILE_MIN_ROWS` rows or more (prompts), and the row-at-a-time kernels for decode.

On AVX2 (the portable path, 16 ymm registers: an i32x16 is two) `vdot16_short` sums `pmaddubsw` pairs in int16 and
the gemm takes another shape (`q4k_gemm4` / `q6k_gemm4` pick it per path): one 32-element sub-block per loop step
for four activation rows (Q4_K; two rows with their super-block sums held for Q6_K), so each weight register is
loaded once for several rows, and each run's pairs are summed and scaled by one `pmaddwd` by the scales, as ggml's
AVX2 gemm does (`_mm256_madd_epi16(iacc, scales)`). The integers are the same and the float steps are the same, in
the same order.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.kernels.kblocks import (
    Q6K_BYTES,
    Q6K_D,
    Q6K_QH,
    Q6K_QL,
    Q6K_SCALES,
    byte_of,
    load_u32,
    q4k_blocks,
    q4k_d,
    q4k_dmin,
    q4k_qs_col,
    q4k_scales,
    q6k_blocks,
)
from llamactx.ggml.kernels.simd import TagType, lane_index, load_f16, splat
from llamactx.ggml.kernels.vnni import _pairwise, izero16, vdot16_short, vshort_lanes
from llamactx.ggml.kernels.wide import (
    ffma16s,
    fload16,
    fmul16i,
    fstore16,
    fsub16,
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

TILE = 16  # weight rows per tile: one int32 lane each
TILE_MIN_ROWS = 16  # activation rows from which a tile's transposition pays for itself

_NIB = np.uint32(0x0F0F0F0F)


# --- Q4_K ----------------------------------------------------------------------------------------------------


@njit(cache=True)
def _q4k_tile(W, r0, r1, tile):
    """Rows r0..r0+15 of Q4_K weights (a row past r1 - 1 repeats row r1 - 1) into the tile's arrays:
    wq (nb*64, 64) u8: register (8 b + s) * 8 + q = bytes 4q..4q+3 of sub-block s of super-block b, for the
    16 rows side by side, decoded to 0..15; sc (nb*8, 16) i32 the 6-bit scales; mn2 (nb*4, 32) i16 the mins of
    sub-blocks 2c, 2c+1 as pairs per lane; d, dm (nb, 16) f32."""
    qs = W[0]  # ggml's block_q4_K bytes, eight rows interleaved (kblocks.py)
    wq, tsc, tmn2, td, tdm = tile
    w32 = wq.view(np.uint32)  # (nb*64, 16)
    nb = q4k_blocks(qs)
    for lane in range(TILE):
        r = min(r0 + lane, r1 - 1)
        q32 = qs[r >> 3].view(np.uint32)  # the row's group: its nibbles in runs of two words, 16 words apart
        for b in range(nb):
            td[b, lane] = q4k_d(qs, r, b)
            tdm[b, lane] = q4k_dmin(qs, r, b)
            sc, mn = q4k_scales(qs, r, b)
            for s in range(8):
                tsc[b * 8 + s, lane] = byte_of(sc, s)
                tmn2[b * 4 + s // 2, 2 * lane + s % 2] = byte_of(mn, s)
            for c in range(4):
                for q in range(8):
                    v = q32[q4k_qs_col(r, b, 32 * c + 4 * q) // 4]
                    w32[(b * 8 + 2 * c) * 8 + q, lane] = v & _NIB
                    w32[(b * 8 + 2 * c + 1) * 8 + q, lane] = (v >> np.uint32(4)) & _NIB


@njit(cache=True, inline="always")
def _sub_dots(path, wq, s, xq, i, j, run):
    """The tile's sub-block s . x[i, j:j+32] and sub-block s+1 . x[i, j+32:j+64], lane r = row r (i32x16 each).
    `run`: `vdot16_short`'s run length for the tile's weights, 8 (4-bit) or 4 (5-bit)."""
    lo, hi = izero16(), izero16()
    for q0 in range(0, 8, run):
        rlo, rhi = izero16(), izero16()
        for q in range(q0, q0 + run):
            rlo = vdot16_short(path, rlo, wload(wq, s * 8 + q, 0), xbcast4(xq, i, j + 4 * q))
            rhi = vdot16_short(path, rhi, wload(wq, (s + 1) * 8 + q, 0), xbcast4(xq, i, j + 32 + 4 * q))
        lo, hi = iadd16(lo, vshort_lanes(path, rlo)), iadd16(hi, vshort_lanes(path, rhi))
    return lo, hi


def _short_pairs(path) -> bool:
    """Whether `vdot16_short` sums in int16 pairs on this path (vnni.py): the portable path on an AVX2 target."""
    return path.tag_name == "portable" and bool(cpu_features()["avx2"])


def _pmaddwd(builder, a, b):
    """`vpmaddwd` of two <16 x i32> taken as 32 int16 (lane r = a_lo b_lo + a_hi b_hi, exact), on AVX2's 256-bit
    halves where the target has no AVX512BW (vnni._pairwise), which LLVM does not always find in the widened form
    (wide.imaddwd)."""
    v32 = ir.VectorType(ir.IntType(16), 32)
    return _pairwise(builder, "maddwd", builder.bitcast(a, v32), builder.bitcast(b, v32))


@intrinsic
def _scaled_lanes(typingctx, path, acc, sc):
    """sc * (the int32 lanes of a `vdot16_short` run), lane by lane. Where the run sums in int16 pairs, one
    `pmaddwd` of the pairs by the scale in both halves of each lane (ggml's AVX2 `_mm256_madd_epi16(iacc,
    scales)`): the pair sum and the scale multiply in one instruction, exact (|pair| <= 32767, |scale| < 2^15).
    Elsewhere `vshort_lanes`' lanes times sc."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None

    def codegen(context, builder, sig, args):
        _, acc, sc = args
        if not _short_pairs(sig.args[0]):
            return builder.mul(acc, sc)
        low = builder.and_(sc, ir.Constant(sc.type, [0xFFFF] * 16))
        return _pmaddwd(builder, acc, builder.or_(low, builder.shl(sc, ir.Constant(sc.type, [16] * 16))))

    return i32x16(path, i32x16, i32x16), codegen


@intrinsic
def _madd_bcast(typingctx, path, v, p):
    """`wide.imaddwd` (lane r = v_lo p_lo + v_hi p_hi, p an int32 broadcast) as `vpmaddwd` where `vdot16_short`
    sums in int16 pairs (AVX2), else imaddwd's own form."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None

    def codegen(context, builder, sig, args):
        _, v, p = args
        if _short_pairs(sig.args[0]):
            return _pmaddwd(builder, v, splat(builder, p, 16))
        v32i16 = ir.VectorType(ir.IntType(16), 32)
        a, b = builder.bitcast(v, v32i16), builder.bitcast(splat(builder, p, 16), v32i16)

        def half(x, odd):
            return builder.sext(builder.shuffle_vector(x, x, lane_index([2 * k + odd for k in range(16)])), v.type)

        return builder.add(builder.mul(half(a, 0), half(b, 0)), builder.mul(half(a, 1), half(b, 1)))

    return i32x16(path, i32x16, types.int32), codegen


@njit(cache=True, inline="always")
def _sub_dots4(path, wq, s, xq, i, j, sc):
    """sc * (the tile's sub-block s . x[i + k, j:j+32]) for activation rows i..i+3 (i32x16 each, lane r = row r):
    each weight register loaded once for the four rows, four int16-pair accumulators (8 ymm on AVX2)."""
    r0, r1, r2, r3 = izero16(), izero16(), izero16(), izero16()
    for q in range(8):
        w = wload(wq, s * 8 + q, 0)
        r0 = vdot16_short(path, r0, w, xbcast4(xq, i, j + 4 * q))
        r1 = vdot16_short(path, r1, w, xbcast4(xq, i + 1, j + 4 * q))
        r2 = vdot16_short(path, r2, w, xbcast4(xq, i + 2, j + 4 * q))
        r3 = vdot16_short(path, r3, w, xbcast4(xq, i + 3, j + 4 * q))
    return (_scaled_lanes(path, r0, sc), _scaled_lanes(path, r1, sc), _scaled_lanes(path, r2, sc),
            _scaled_lanes(path, r3, sc))


@njit(cache=True)
def _q4k_gemm4_pairs(path, tile, xq, xd, pairs, i):
    """`_q4k_gemm4` for 16 registers (AVX2): one 32-element sub-block per loop step for four activation rows
    (`_sub_dots4`: a weight register serves four rows, and the step's 8 accumulators, 2 weight registers and the
    broadcast fit 16 ymm), the float steps of `_q4k_gemm4` in its order after each odd sub-block."""
    wq, tsc, tmn2, td, tdm = tile
    a0, a1, a2, a3 = wzero(), wzero(), wzero(), wzero()
    m0, m1, m2, m3 = wzero(), wzero(), wzero(), wzero()
    t0, t1, t2, t3 = izero16(), izero16(), izero16(), izero16()
    for s in range(tsc.shape[0]):  # not unrolled: two sub-blocks in one body would spill (LLVM interleaves them)
        b, j = s >> 3, 32 * s
        u0, u1, u2, u3 = _sub_dots4(path, wq, s, xq, i, j, iload16(tsc, s, 0))
        if s & 1 == 0:
            t0, t1, t2, t3 = u0, u1, u2, u3
            continue
        dw, mw, p = fload16(td, b, 0), fload16(tdm, b, 0), s >> 1
        a0 = wfmadd(a0, iadd16(t0, u0), wscale(dw, xd[i, b]))
        a1 = wfmadd(a1, iadd16(t1, u1), wscale(dw, xd[i + 1, b]))
        a2 = wfmadd(a2, iadd16(t2, u2), wscale(dw, xd[i + 2, b]))
        a3 = wfmadd(a3, iadd16(t3, u3), wscale(dw, xd[i + 3, b]))
        mn = iload16(tmn2, p, 0)
        m0 = wfmadd(m0, _madd_bcast(path, mn, pairs[i, p]), wscale(mw, xd[i, b]))
        m1 = wfmadd(m1, _madd_bcast(path, mn, pairs[i + 1, p]), wscale(mw, xd[i + 1, b]))
        m2 = wfmadd(m2, _madd_bcast(path, mn, pairs[i + 2, p]), wscale(mw, xd[i + 2, b]))
        m3 = wfmadd(m3, _madd_bcast(path, mn, pairs[i + 3, p]), wscale(mw, xd[i + 3, b]))
    return fsub16(a0, m0), fsub16(a1, m1), fsub16(a2, m2), fsub16(a3, m3)


def q4k_gemm4(path, tile, xq, xd, pairs, i):
    """Activation rows i..i+3 against the Q4_K tile: `_q4k_gemm4_pairs` where `vdot16_short` sums int16 pairs
    (AVX2), else `_q4k_gemm4`. -> four f32x16."""


@overload(q4k_gemm4, jit_options={"cache": True})
def _q4k_gemm4_of(path, tile, xq, xd, pairs, i):
    if not isinstance(path, TagType):
        return None
    if _short_pairs(path):
        return lambda path, tile, xq, xd, pairs, i: _q4k_gemm4_pairs(path, tile, xq, xd, pairs, i)
    return lambda path, tile, xq, xd, pairs, i: _q4k_gemm4(path, tile, xq, xd, pairs, i)


@njit(cache=True)
def _q4k_gemm4(path, tile, xq, xd, pairs, i):
    """Activation rows i..i+3 against the tile as ggml_gemm_q4_K_8x8_q8_K: per 64 elements
    acc = fma(float(sc0 dot0 + sc1 dot1), d_w d_x, acc) and acc_min = fma(float(m0 S0 + m1 S1), dmin_w d_x,
    acc_min). -> four f32x16 of acc - acc_min, lane r = weight row r."""
    wq, tsc, tmn2, td, tdm = tile
    a0, a1, a2, a3 = wzero(), wzero(), wzero(), wzero()
    m0, m1, m2, m3 = wzero(), wzero(), wzero(), wzero()
    for b in range(td.shape[0]):
        dw, mw = fload16(td, b, 0), fload16(tdm, b, 0)
        d0, d1 = wscale(dw, xd[i, b]), wscale(dw, xd[i + 1, b])
        d2, d3 = wscale(dw, xd[i + 2, b]), wscale(dw, xd[i + 3, b])
        e0, e1 = wscale(mw, xd[i, b]), wscale(mw, xd[i + 1, b])
        e2, e3 = wscale(mw, xd[i + 2, b]), wscale(mw, xd[i + 3, b])
        for c in range(4):
            s, j = b * 8 + 2 * c, b * 256 + c * 64
            lo0, hi0 = _sub_dots(path, wq, s, xq, i, j, 8)
            lo1, hi1 = _sub_dots(path, wq, s, xq, i + 1, j, 8)
            lo2, hi2 = _sub_dots(path, wq, s, xq, i + 2, j, 8)
            lo3, hi3 = _sub_dots(path, wq, s, xq, i + 3, j, 8)
            sc0, sc1 = iload16(tsc, s, 0), iload16(tsc, s + 1, 0)
            a0 = wfmadd(a0, imul2(lo0, sc0, hi0, sc1), d0)
            a1 = wfmadd(a1, imul2(lo1, sc0, hi1, sc1), d1)
            a2 = wfmadd(a2, imul2(lo2, sc0, hi2, sc1), d2)
            a3 = wfmadd(a3, imul2(lo3, sc0, hi3, sc1), d3)
            mn = iload16(tmn2, b * 4 + c, 0)
            m0 = wfmadd(m0, imaddwd(mn, pairs[i, b * 4 + c]), e0)
            m1 = wfmadd(m1, imaddwd(mn, pairs[i + 1, b * 4 + c]), e1)
            m2 = wfmadd(m2, imaddwd(mn, pairs[i + 2, b * 4 + c]), e2)
            m3 = wfmadd(m3, imaddwd(mn, pairs[i + 3, b * 4 + c]), e3)
    return fsub16(a0, m0), fsub16(a1, m1), fsub16(a2, m2), fsub16(a3, m3)


@njit(cache=True)
def _q4k_gemv(path, tile, xq, xd, pairs, i):
    """Activation row i against the tile as ggml_gemv_q4_K_8x8_q8_K: one fma per super-block. -> f32x16."""
    wq, tsc, tmn2, td, tdm = tile
    acc, acc_min = wzero(), wzero()
    for b in range(td.shape[0]):
        isum, imin = izero16(), izero16()
        for c in range(4):
            s, j = b * 8 + 2 * c, b * 256 + c * 64
            lo, hi = _sub_dots(path, wq, s, xq, i, j, 8)
            isum = iadd16(isum, imul2(lo, iload16(tsc, s, 0), hi, iload16(tsc, s + 1, 0)))
            imin = iadd16(imin, imaddwd(iload16(tmn2, b * 4 + c, 0), pairs[i, b * 4 + c]))
        acc = wfmadd(acc, isum, wscale(fload16(td, b, 0), xd[i, b]))
        acc_min = wfmadd(acc_min, imin, wscale(fload16(tdm, b, 0), xd[i, b]))
    return fsub16(acc, acc_min)


@njit(cache=True)
def _store_tile(out, i, r0, r1, v, buf):
    """out[i, r0:r0+16] = v, clipped to r1."""
    if r0 + TILE <= r1:
        fstore16(out, i, r0, v)
    else:
        fstore16(buf, 0, 0, v)
        for lane in range(r1 - r0):
            out[i, r0 + lane] = buf[0, lane]


@njit(cache=True)
def q4k_tile_rows(path, W, a, r0, r1, out):
    """out[:, r0:r1] for Q4_K weights in llama.cpp's repacked order (`kquants.q4k_x8_rows`), 16 rows per tile:
    activation rows in groups of four as gemm, the last n % 4 as gemv."""
    xq, xd, bsums, _ = a
    nb = q4k_blocks(W[0])
    n = xq.shape[0]
    n_gemm = n - n % 4
    pairs = np.empty((n, nb * 4), np.int32)  # (S_2c, S_2c+1): the activation sums of 32 that meet the mins
    _packed_pairs(bsums, 2, pairs)
    tile = (
        np.empty((nb * 64, 64), np.uint8),
        np.empty((nb * 8, TILE), np.int32),
        np.empty((nb * 4, 2 * TILE), np.int16),
        np.empty((nb, TILE), np.float32),
        np.empty((nb, TILE), np.float32),
    )
    buf = np.empty((1, TILE), np.float32)
    for t0 in range(r0, r1, TILE):
        t1 = min(t0 + TILE, r1)
        _q4k_tile(W, t0, t1, tile)
        for i in range(0, n_gemm, 4):
            y0, y1, y2, y3 = q4k_gemm4(path, tile, xq, xd, pairs, i)
            _store_tile(out, i, t0, t1, y0, buf)
            _store_tile(out, i + 1, t0, t1, y1, buf)
            _store_tile(out, i + 2, t0, t1, y2, buf)
            _store_tile(out, i + 3, t0, t1, y3, buf)
        for i in range(n_gemm, n):
            _store_tile(out, i, t0, t1, _q4k_gemv(path, tile, xq, xd, pairs, i), buf)


@njit(cache=True)
def _packed_pairs(v, stride, out):
    """out[i, p] = the int16 pair (v[i, stride*p] + .. + v[i, stride*p + stride - 1], the next stride) packed low
    half first into an int32: `imaddwd`'s broadcast operand. v: sums that fit int16 (Q8_K's sums of 16 and of 32)."""
    for i in range(out.shape[0]):
        for p in range(out.shape[1]):
            lo = 0
            hi = 0
            for e in range(stride):
                lo += v[i, 2 * stride * p + e]
                hi += v[i, 2 * stride * p + stride + e]
            out[i, p] = (lo & 0xFFFF) | (hi << 16)


# --- Q6_K ----------------------------------------------------------------------------------------------------


@njit(cache=True)
def _q6k_tile(W, r0, r1, tile):
    """Rows r0..r0+15 of Q6_K weights (past r1 - 1 repeating it) into the tile: wq (nb*64, 64) u8, register
    64 b + g = elements 4g..4g+3 of super-block b for the 16 rows, decoded to 0..63 (stored value, offset 32);
    sc (nb*16, 16) i32 the int8 scales; sc2 (nb*8, 32) i16 the scales of sub-blocks 2p, 2p+1 as pairs per lane;
    d (nb, 16) f32."""
    qs = W[0]  # ggml's block_q6_K rows (kblocks.py)
    wq, tsc, tsc2, td = tile
    w32 = wq.view(np.uint32)
    lo2 = np.uint32(0x03030303)
    nb = q6k_blocks(qs)
    for lane in range(TILE):
        r = min(r0 + lane, r1 - 1)
        row = qs[r]  # (nb*210,) u8: super-blocks are not word-aligned
        for b in range(nb):
            o = b * Q6K_BYTES
            td[b, lane] = load_f16(qs, r, o + Q6K_D)
            for s in range(16):
                v = np.int32(np.int8(row[o + Q6K_SCALES + s]))
                tsc[b * 16 + s, lane] = v
                tsc2[b * 8 + s // 2, 2 * lane + s % 2] = v
            for h in range(2):
                for q in range(8):
                    l0 = np.uint32(load_u32(qs, r, o + Q6K_QL + 64 * h + 4 * q))
                    l1 = np.uint32(load_u32(qs, r, o + Q6K_QL + 64 * h + 32 + 4 * q))
                    hb = np.uint32(load_u32(qs, r, o + Q6K_QH + 32 * h + 4 * q))
                    g = b * 64 + 32 * h + q
                    w32[g, lane] = (l0 & _NIB) | ((hb & lo2) << np.uint32(4))
                    w32[g + 8, lane] = (l1 & _NIB) | (((hb >> np.uint32(2)) & lo2) << np.uint32(4))
                    w32[g + 16, lane] = ((l0 >> np.uint32(4)) & _NIB) | (((hb >> np.uint32(4)) & lo2) << np.uint32(4))
                    w32[g + 24, lane] = ((l1 >> np.uint32(4)) & _NIB) | (((hb >> np.uint32(6)) & lo2) << np.uint32(4))


@njit(cache=True, inline="always")
def _q6k_dot(path, wq, b, s, xq, i):
    """Sub-block s (16 elements) of super-block b of the tile . x[i], lane r = row r (stored values 0..63: runs
    of 2 `vdot16_short`)."""
    acc = izero16()
    for q0 in range(0, 4, 2):
        run = izero16()
        for q in range(q0, q0 + 2):
            run = vdot16_short(path, run, wload(wq, b * 64 + 4 * s + q, 0), xbcast4(xq, i, b * 256 + 16 * s + 4 * q))
        acc = iadd16(acc, vshort_lanes(path, run))
    return acc


@njit(cache=True, inline="always")
def _q6k_pair(path, isum, wq, b, s, xq, i, sc0, sc1):
    """isum + sc_s (sub-block s . x[i]) + sc_s+1 (sub-block s+1 . x[i]), lane r = row r."""
    return iadd16(isum, imul2(_q6k_dot(path, wq, b, s, xq, i), sc0, _q6k_dot(path, wq, b, s + 1, xq, i), sc1))


@njit(cache=True, inline="always")
def _q6k_step(path, acc, isum, tsc2, pairs, xd, i, b, dw):
    """End of super-block b for activation row i as tiled_run_micro_vnni_8x16: s1 = isum - 32 sum(sc bsum),
    acc = fma(float(s1) * d_w, d_x, acc)."""
    off = izero16()
    for p in range(8):
        off = iadd16(off, _madd_bcast(path, iload16(tsc2, b * 8 + p, 0), pairs[i, b * 8 + p]))
    return ffma16s(acc, fmul16i(isub16(isum, ishl16(off, 5)), dw), xd[i, b])


@njit(cache=True, inline="always")
def _q6k_sub2(path, wq, b, s, xq, i, sc):
    """sc * (sub-block s of super-block b of the tile . x[i], . x[i + 1]): each weight register loaded once for
    the two rows, runs of two `vdot16_short` (stored values 0..63) each scaled by one `pmaddwd` on AVX2."""
    t0, t1 = izero16(), izero16()
    for q0 in range(0, 4, 2):
        r0, r1 = izero16(), izero16()
        for q in range(q0, q0 + 2):
            w = wload(wq, b * 64 + 4 * s + q, 0)
            r0 = vdot16_short(path, r0, w, xbcast4(xq, i, b * 256 + 16 * s + 4 * q))
            r1 = vdot16_short(path, r1, w, xbcast4(xq, i + 1, b * 256 + 16 * s + 4 * q))
        t0, t1 = iadd16(t0, _scaled_lanes(path, r0, sc)), iadd16(t1, _scaled_lanes(path, r1, sc))
    return t0, t1


@njit(cache=True)
def _q6k_gemm2_pairs(path, tile, xq, xd, pairs, i):
    """Activation rows i, i + 1 against the tile for 16 registers (AVX2): two rows' integer sums (4 ymm), a run's
    two accumulators (4 ymm) and a weight register (2 ymm) stay in registers; `_q6k_gemm4`'s float steps."""
    wq, tsc, tsc2, td = tile
    a0, a1 = wzero(), wzero()
    for b in range(td.shape[0]):
        i0, i1 = izero16(), izero16()
        for s in range(16):
            u0, u1 = _q6k_sub2(path, wq, b, s, xq, i, iload16(tsc, b * 16 + s, 0))
            i0, i1 = iadd16(i0, u0), iadd16(i1, u1)
        dw = fload16(td, b, 0)
        a0 = _q6k_step(path, a0, i0, tsc2, pairs, xd, i, b, dw)
        a1 = _q6k_step(path, a1, i1, tsc2, pairs, xd, i + 1, b, dw)
    return a0, a1


def q6k_gemm4(path, tile, xq, xd, pairs, i):
    """Activation rows i..i+3 against the Q6_K tile: `_q6k_gemm2_pairs` twice where `vdot16_short` sums int16
    pairs (AVX2), else `_q6k_gemm4`. -> four f32x16."""


@overload(q6k_gemm4, jit_options={"cache": True})
def _q6k_gemm4_of(path, tile, xq, xd, pairs, i):
    if not isinstance(path, TagType):
        return None
    if _short_pairs(path):

        def pairs2(path, tile, xq, xd, pairs, i):
            y0, y1 = _q6k_gemm2_pairs(path, tile, xq, xd, pairs, i)
            y2, y3 = _q6k_gemm2_pairs(path, tile, xq, xd, pairs, i + 2)
            return y0, y1, y2, y3

        return pairs2
    return lambda path, tile, xq, xd, pairs, i: _q6k_gemm4(path, tile, xq, xd, pairs, i)


@njit(cache=True)
def _q6k_gemm4(path, tile, xq, xd, pairs, i):
    """Activation rows i..i+3 against the tile, llama.cpp's tiled Q6_K order. -> four f32x16."""
    wq, tsc, tsc2, td = tile
    a0, a1, a2, a3 = wzero(), wzero(), wzero(), wzero()
    for b in range(td.shape[0]):
        i0, i1, i2, i3 = izero16(), izero16(), izero16(), izero16()
        for s in range(0, 16, 2):
            sc0, sc1 = iload16(tsc, b * 16 + s, 0), iload16(tsc, b * 16 + s + 1, 0)
            i0 = _q6k_pair(path, i0, wq, b, s, xq, i, sc0, sc1)
            i1 = _q6k_pair(path, i1, wq, b, s, xq, i + 1, sc0, sc1)
            i2 = _q6k_pair(path, i2, wq, b, s, xq, i + 2, sc0, sc1)
            i3 = _q6k_pair(path, i3, wq, b, s, xq, i + 3, sc0, sc1)
        dw = fload16(td, b, 0)
        a0 = _q6k_step(path, a0, i0, tsc2, pairs, xd, i, b, dw)
        a1 = _q6k_step(path, a1, i1, tsc2, pairs, xd, i + 1, b, dw)
        a2 = _q6k_step(path, a2, i2, tsc2, pairs, xd, i + 2, b, dw)
        a3 = _q6k_step(path, a3, i3, tsc2, pairs, xd, i + 3, b, dw)
    return a0, a1, a2, a3


@njit(cache=True)
def _q6k_gemv(path, tile, xq, xd, pairs, i):
    """Activation row i against the tile (the same order as the gemm rows). -> f32x16."""
    wq, tsc, tsc2, td = tile
    acc = wzero()
    for b in range(td.shape[0]):
        isum = izero16()
        for s in range(0, 16, 2):
            sc0, sc1 = iload16(tsc, b * 16 + s, 0), iload16(tsc, b * 16 + s + 1, 0)
            isum = _q6k_pair(path, isum, wq, b, s, xq, i, sc0, sc1)
        acc = _q6k_step(path, acc, isum, tsc2, pairs, xd, i, b, fload16(td, b, 0))
    return acc


@njit(cache=True)
def q6k_tile_rows(path, W, a, r0, r1, out):
    """out[:, r0:r1] for Q6_K weights in llama.cpp's tiled order (`kquants.q6k_tiled_rows`), 16 rows per tile."""
    xq, xd, bsums, _ = a
    nb = q6k_blocks(W[0])
    n = xq.shape[0]
    pairs = np.empty((n, nb * 8), np.int32)
    _packed_pairs(bsums, 1, pairs)
    tile = (
        np.empty((nb * 64, 64), np.uint8),
        np.empty((nb * 16, TILE), np.int32),
        np.empty((nb * 8, 2 * TILE), np.int16),
        np.empty((nb, TILE), np.float32),
    )
    buf = np.empty((1, TILE), np.float32)
    n4 = n - n % 4
    for t0 in range(r0, r1, TILE):
        t1 = min(t0 + TILE, r1)
        _q6k_tile(W, t0, t1, tile)
        for i in range(0, n4, 4):
            y0, y1, y2, y3 = q6k_gemm4(path, tile, xq, xd, pairs, i)
            _store_tile(out, i, t0, t1, y0, buf)
            _store_tile(out, i + 1, t0, t1, y1, buf)
            _store_tile(out, i + 2, t0, t1, y2, buf)
            _store_tile(out, i + 3, t0, t1, y3, buf)
        for i in range(n4, n):
            _store_tile(out, i, t0, t1, _q6k_gemv(path, tile, xq, xd, pairs, i), buf)

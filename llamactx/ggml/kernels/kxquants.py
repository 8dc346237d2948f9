"""Rows of y = x @ W^T for the hub's other quant types: Q3_K, IQ4_XS, Q5_K in llama.cpp's tiled order, and the
repacked IQ4_NL / MXFP4, bit for bit as llamactx.ggml.vecdot_kx / vecdot_nl (the oracle) and so as ggml-cpu.

The integer sums are exact, so only where they become floats follows llama.cpp (vecdot_kx's docstring names the
kernel per type and n):

- Q3_K and IQ4_XS: 16 int8 scales per super-block (IQ4_XS's 8 repeated), codes decoded in registers to signed
  bytes (Q3_K: q - 4 in -4..3; IQ4_XS / IQ4_NL / MXFP4: codebook entries, `vlut16`). n < 8 (or llama_order off):
  ggml_vec_dot_{q3_K,iq4_xs}_q8_K's 8 lanes, acc_j = fma(d_x * d_w, float(lane_j), acc_j), hsum_float_8;
  n >= 8: the tiled kernel's out = fma(float(s1) * d_w, d_x, out) per super-block.
- Q5_K with n >= 8: the tiled kernel, result = float(s1) * d_w, fnmadd(dmin_w, float(s2), result), then
  out = fma(result, d_x, out) (n < 8 runs kquants.k45_rows, ggml_vec_dot_q5_K_q8_K's order).
- IQ4_NL and MXFP4 with ne1 % 8 == 0 (repacked to block_*x8, repack.cpp; Q8_0 activations): one FMA per block,
  acc = fma(float(dot), d_w * d_x, acc), for every n (`gemm_q4_b32_8x8_q8_0_lut_avx` and its gemv). Their packed
  rows are interleaved in groups of eight (repack.py `_interleave_nl`) so that, as in llama.cpp's gemv, the eight
  rows sit in the lanes of one register: each `vpdpbusd` of four bytes of every row against four broadcast
  activation quants adds to its row's lane, no horizontal sum (`nl_rows`).

Signed codes go through `vdot_s8`: ggml's own sign trick (`mul_add_epi8`: |w| as the unsigned operand, x with w's
sign), exact because |w| <= 127 and a Q8 quant is within +-127.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.kernels.kquants import DEC_Q5K, _k_min_lane, _k_step, decode_k
from llamactx.ggml.kernels.legacy import prefetch_ahead, prefetch_distance
from llamactx.ggml.kernels.simd import (
    Tag,
    TagType,
    f32x8,
    fmadd_i,
    fsum,
    fzero,
    i8x32,
    i32x8,
    ptr2d,
    splat,
    vload,
    vload_f32,
    vload_i32,
    vstore,
)
from llamactx.ggml.kernels.vnni import (
    _dot_small,
    _dot_vnni,
    ihsum,
    imul,
    imuladd_v,
    ipairs,
    izero,
    vdot,
    vload_s8,
    vscales_pair,
)
from llamactx.gguf.quants_iq import KVALUES_IQ4NL, KVALUES_MXFP4

_F0 = np.float32(0.0)
_I8 = ir.IntType(8)
_V32I8 = ir.VectorType(_I8, 32)

DEC_Q3K = Tag("dec_q3k")  # Q3_K: 64 bytes of 2-bit crumbs + 32 bytes of high bits per super-block
DEC_IQ4XS = Tag("dec_iq4xs")  # IQ4_XS: 128 bytes of nibbles (16 per 32 elements) indexing kvalues_iq4nl
LUT_IQ4NL = Tag("lut_iq4nl")
LUT_MXFP4 = Tag("lut_mxfp4")
_TABLES = {"lut_iq4nl": KVALUES_IQ4NL, "lut_mxfp4": KVALUES_MXFP4}


# --- intrinsics: the signed dot product, Q3_K's bit fields, the codebook lookup --------------------------------


def _dot_signed(dot):
    def signed(builder, acc, a, b):
        neg = builder.icmp_signed("<", a, ir.Constant(a.type, None))
        ax = builder.select(neg, builder.neg(a), a)  # |w| <= 127
        sy = builder.select(neg, builder.neg(b), b)  # x with w's sign (w = 0: any, the product is 0)
        return dot(builder, acc, ax, sy)

    return signed


@intrinsic
def vdot_s8(typingctx, path, acc, a, b):
    """acc + s8(a) . s8(b), 4 bytes per lane (ggml's `mul_add_epi8`): `vpdpbusd` on the VNNI path, `pmaddubsw`
    pairs on the portable one. |a| <= 127 and b within +-127 (an activation quant)."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None
    dot = _dot_signed(_dot_vnni if path.tag_name == "vnni" else _dot_small)

    def codegen(context, builder, sig, args):
        return dot(builder, *args[1:])

    return i32x8(path, i32x8, i8x32, i8x32), codegen


@intrinsic
def vq3(typingctx, q, h, shift, bit):
    """Q3_K codes of one 32-element group: ((q >> shift) & 3 | ((h >> bit) & 1) << 2) - 4 per byte (-4..3;
    ggml-quants.c dequantize_row_q3_K's q - (hm & m ? 0 : 4))."""
    sig = i8x32(i8x32, i8x32, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        def splat8(v):
            return ir.Constant(_V32I8, [v] * 32) if isinstance(v, int) else _splat_var(builder, v)

        low = builder.and_(builder.lshr(args[0], splat8(args[2])), splat8(3))
        high = builder.shl(builder.and_(builder.lshr(args[1], splat8(args[3])), splat8(1)), splat8(2))
        return builder.sub(builder.or_(low, high), splat8(4))

    return sig, codegen


def _splat_var(builder, v):
    v8 = builder.trunc(v, _I8)
    vec = builder.insert_element(ir.Constant(_V32I8, ir.Undefined), v8, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(vec, ir.Constant(_V32I8, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32),
                                                                                                    32), [0] * 32))


@intrinsic
def vlut16(typingctx, table, arr, row, col):
    """16 bytes of nibbles at arr[row, col] -> i8x32 codebook values: low nibbles (elements 0-15), then high
    nibbles (16-31), each looked up in `table` (a LUT_* tag): `pshufb` with AVX2, else a select per entry."""
    if not isinstance(table, TagType) or table.tag_name not in _TABLES:
        return None
    values = [int(v) for v in _TABLES[table.tag_name]]
    sig = i8x32(table, arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v16 = builder.load(ptr2d(context, builder, sig.args[1], args[1], args[2], args[3], ir.VectorType(_I8, 16)),
                           align=1)
        lo = builder.and_(v16, ir.Constant(v16.type, [0x0F] * 16))
        hi = builder.lshr(v16, ir.Constant(v16.type, [4] * 16))
        idx = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(ir.IntType(32), 32), list(range(32))))
        return _lookup(builder, values, idx)

    return sig, codegen


def _lookup(builder, values, idx):
    """Codebook entry values[idx] of every byte of idx (0..15): `pshufb` with AVX2, else a select per entry."""
    values = [int(v) for v in values]
    if cpu_features()["avx2"]:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V32I8, [_V32I8, _V32I8]),
                                            "llvm.x86.avx2.pshuf.b")
        return builder.call(fn, [ir.Constant(_V32I8, [v & 0xFF for v in values] * 2), idx])
    out = ir.Constant(_V32I8, None)
    for e, v in enumerate(values):
        hit = builder.icmp_unsigned("==", idx, ir.Constant(_V32I8, [e] * 32))
        out = builder.select(hit, ir.Constant(_V32I8, [v & 0xFF] * 32), out)
    return out


@intrinsic
def vcrumb(typingctx, q, shift):
    """(q >> shift) & 3 per byte: one 32-element group of Q2_K's 2-bit quants (0..3)."""
    sig = i8x32(i8x32, types.intp)

    def codegen(context, builder, sig, args):
        return builder.and_(builder.lshr(args[0], _splat_var(builder, args[1])), ir.Constant(_V32I8, [3] * 32))

    return sig, codegen


# --- Q3_K / IQ4_XS: 16 scales per super-block ---------------------------------------------------------------


def decode_kx(dec, qs, qh, r, b, h):
    """The four 32-element groups of half h (elements 128h..128h+127) of super-block b of row r as signed
    i8x32 codes."""


@overload(decode_kx, jit_options={"cache": True})
def _decode_kx(dec, qs, qh, r, b, h):
    if not isinstance(dec, TagType):
        return None
    if dec.tag_name == "dec_q3k":

        def q3k(dec, qs, qh, r, b, h):  # crumbs: group 4h + t at bits 2t of qs[32h..]; high bit g of hmask
            q = vload(qs, r, b * 64 + h * 32)
            hm = vload(qh, r, b * 32)
            g = 4 * h
            return vq3(q, hm, 0, g), vq3(q, hm, 2, g + 1), vq3(q, hm, 4, g + 2), vq3(q, hm, 6, g + 3)

        return q3k
    if dec.tag_name == "dec_iq4xs":

        def iq4xs(dec, qs, qh, r, b, h):  # 16 bytes per group: low nibbles elements 0-15, high 16-31
            c = b * 128 + h * 64
            return (vlut16(LUT_IQ4NL, qs, r, c), vlut16(LUT_IQ4NL, qs, r, c + 16),
                    vlut16(LUT_IQ4NL, qs, r, c + 32), vlut16(LUT_IQ4NL, qs, r, c + 48))

        return iq4xs
    return None


@njit(cache=True)
def _kx_half(path, isum, w, sc, r, xq, i, b, h):
    """isum + lanes(group . x) * [s_2g x 4, s_2g+1 x 4] over the four groups w of half h, activation row i."""
    j, c = b * 256 + h * 128, b * 16 + h * 8
    isum = imuladd_v(isum, vdot_s8(path, izero(), w[0], vload(xq, i, j)), vscales_pair(sc, r, c, 0))
    isum = imuladd_v(isum, vdot_s8(path, izero(), w[1], vload(xq, i, j + 32)), vscales_pair(sc, r, c, 1))
    isum = imuladd_v(isum, vdot_s8(path, izero(), w[2], vload(xq, i, j + 64)), vscales_pair(sc, r, c, 2))
    return imuladd_v(isum, vdot_s8(path, izero(), w[3], vload(xq, i, j + 96)), vscales_pair(sc, r, c, 3))


@njit(cache=True)
def _kx_lanes4(path, dec, qs, qh, sc, xq, r, b, i):
    """Integer lanes of super-block b of weight row r against activation rows i..i+3 (decoded once)."""
    i0, i1, i2, i3 = izero(), izero(), izero(), izero()
    for h in range(2):
        w = decode_kx(dec, qs, qh, r, b, h)
        i0 = _kx_half(path, i0, w, sc, r, xq, i, b, h)
        i1 = _kx_half(path, i1, w, sc, r, xq, i + 1, b, h)
        i2 = _kx_half(path, i2, w, sc, r, xq, i + 2, b, h)
        i3 = _kx_half(path, i3, w, sc, r, xq, i + 3, b, h)
    return i0, i1, i2, i3


@njit(cache=True)
def _kx_lanes1(path, dec, qs, qh, sc, xq, r, b, i):
    isum = izero()
    for h in range(2):
        isum = _kx_half(path, isum, decode_kx(dec, qs, qh, r, b, h), sc, r, xq, i, b, h)
    return isum


@njit(cache=True, inline="always")
def _tile_step(acc, isum, db, dx):
    """The tiled kernel's out += (float(s1) * d_w) * d_x, contracted."""
    return fma32(np.float32(ihsum(isum)) * db, dx, acc)


@njit(cache=True)
def kx_rows(path, dec, tiled, W, a, r0, r1, out):
    """Q3_K / IQ4_XS rows r0..r1-1: ggml_vec_dot's lanes, or with `tiled` the tiled kernel's order."""
    qs, qh, sc, _, d, _ = W
    xq, xd, _, _ = a
    n = xq.shape[0]
    ahead = prefetch_distance(qs, qh, sc) if n < 4 else 0  # decode streams the weights (legacy.x4_rows)
    for r in range(r0, r1):
        if ahead:
            prefetch_ahead(qs, qh, sc, r, r0, r1, ahead, 1)
        for i in range(0, n - n % 4, 4):
            if tiled:
                t0, t1, t2, t3 = _F0, _F0, _F0, _F0
                for b in range(d.shape[1]):
                    i0, i1, i2, i3 = _kx_lanes4(path, dec, qs, qh, sc, xq, r, b, i)
                    db = d[r, b]
                    t0, t1 = _tile_step(t0, i0, db, xd[i, b]), _tile_step(t1, i1, db, xd[i + 1, b])
                    t2, t3 = _tile_step(t2, i2, db, xd[i + 2, b]), _tile_step(t3, i3, db, xd[i + 3, b])
                out[i, r], out[i + 1, r], out[i + 2, r], out[i + 3, r] = t0, t1, t2, t3
            else:
                a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
                for b in range(d.shape[1]):
                    i0, i1, i2, i3 = _kx_lanes4(path, dec, qs, qh, sc, xq, r, b, i)
                    a0 = fmadd_i(a0, i0, xd[i, b] * d[r, b])
                    a1 = fmadd_i(a1, i1, xd[i + 1, b] * d[r, b])
                    a2 = fmadd_i(a2, i2, xd[i + 2, b] * d[r, b])
                    a3 = fmadd_i(a3, i3, xd[i + 3, b] * d[r, b])
                out[i, r], out[i + 1, r], out[i + 2, r], out[i + 3, r] = fsum(a0), fsum(a1), fsum(a2), fsum(a3)
        for i in range(n - n % 4, n):
            if tiled:
                t = _F0
                for b in range(d.shape[1]):
                    t = _tile_step(t, _kx_lanes1(path, dec, qs, qh, sc, xq, r, b, i), d[r, b], xd[i, b])
                out[i, r] = t
            else:
                acc = fzero()
                for b in range(d.shape[1]):
                    acc = fmadd_i(acc, _kx_lanes1(path, dec, qs, qh, sc, xq, r, b, i), xd[i, b] * d[r, b])
                out[i, r] = fsum(acc)


# --- Q5_K, tiled (n >= 8) ------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _q5k_tile_step(acc, isum, imin, db, dmb, dx):
    """result = float(s1) * d_w; result = fnmadd(dmin_w, float(s2), result); out += result * d_x (contracted)."""
    result = fma32(-dmb, np.float32(imin), np.float32(ihsum(isum)) * db)
    return fma32(result, dx, acc)


@njit(cache=True)
def _q5k_min(mn, r, bsums, i, b):
    """s2 = sum over the 8 sub-blocks of min * (activation sum): the tiled kernel's integer min term."""
    return (_k_min_lane(mn, r, bsums, i, b, 0) + _k_min_lane(mn, r, bsums, i, b, 1)
            + _k_min_lane(mn, r, bsums, i, b, 2) + _k_min_lane(mn, r, bsums, i, b, 3))


@njit(cache=True)
def q5k_tiled_rows(path, W, a, r0, r1, out):
    """Q5_K rows r0..r1-1 in the tiled kernel's order (tiled-kernel.cpp, n >= 8)."""
    qs, qh, sc, mn, d, dmin = W
    xq, xd, bsums, _ = a
    n = xq.shape[0]
    for r in range(r0, r1):
        for i in range(0, n - n % 4, 4):
            t0, t1, t2, t3 = _F0, _F0, _F0, _F0
            for b in range(d.shape[1]):
                i0, i1, i2, i3 = izero(), izero(), izero(), izero()
                for c in range(4):
                    lo, hi = decode_k(DEC_Q5K, qs, qh, r, b, c)
                    s0, s1, j = sc[r, b * 8 + 2 * c], sc[r, b * 8 + 2 * c + 1], b * 256 + c * 64
                    i0 = _k_step(path, i0, lo, hi, s0, s1, xq, i, j)
                    i1 = _k_step(path, i1, lo, hi, s0, s1, xq, i + 1, j)
                    i2 = _k_step(path, i2, lo, hi, s0, s1, xq, i + 2, j)
                    i3 = _k_step(path, i3, lo, hi, s0, s1, xq, i + 3, j)
                db, dmb = d[r, b], dmin[r, b]
                t0 = _q5k_tile_step(t0, i0, _q5k_min(mn, r, bsums, i, b), db, dmb, xd[i, b])
                t1 = _q5k_tile_step(t1, i1, _q5k_min(mn, r, bsums, i + 1, b), db, dmb, xd[i + 1, b])
                t2 = _q5k_tile_step(t2, i2, _q5k_min(mn, r, bsums, i + 2, b), db, dmb, xd[i + 2, b])
                t3 = _q5k_tile_step(t3, i3, _q5k_min(mn, r, bsums, i + 3, b), db, dmb, xd[i + 3, b])
            out[i, r], out[i + 1, r], out[i + 2, r], out[i + 3, r] = t0, t1, t2, t3
        for i in range(n - n % 4, n):
            t = _F0
            for b in range(d.shape[1]):
                isum = izero()
                for c in range(4):
                    lo, hi = decode_k(DEC_Q5K, qs, qh, r, b, c)
                    s0, s1 = sc[r, b * 8 + 2 * c], sc[r, b * 8 + 2 * c + 1]
                    isum = _k_step(path, isum, lo, hi, s0, s1, xq, i, b * 256 + c * 64)
                t = _q5k_tile_step(t, isum, _q5k_min(mn, r, bsums, i, b), d[r, b], dmin[r, b], xd[i, b])
            out[i, r] = t


# --- Q2_K: 2-bit quants, 4-bit scales and mins per 16 elements ------------------------------------------------


@njit(cache=True)
def _q2k_half(path, qs, sc, r, xq, i, b, h):
    """Lanes of half h (elements 128h..) of super-block b, row r, activation row i: sum over its four groups of
    lanes(crumbs . x) * [s_2g x 4, s_2g+1 x 4]."""
    q = vload(qs, r, b * 64 + h * 32)
    j, c = b * 256 + h * 128, b * 16 + h * 8
    isum = imuladd_v(izero(), vdot(path, izero(), vcrumb(q, 0), vload(xq, i, j)), vscales_pair(sc, r, c, 0))
    isum = imuladd_v(isum, vdot(path, izero(), vcrumb(q, 2), vload(xq, i, j + 32)), vscales_pair(sc, r, c, 1))
    isum = imuladd_v(isum, vdot(path, izero(), vcrumb(q, 4), vload(xq, i, j + 64)), vscales_pair(sc, r, c, 2))
    return imuladd_v(isum, vdot(path, izero(), vcrumb(q, 6), vload(xq, i, j + 96)), vscales_pair(sc, r, c, 3))


@njit(cache=True)
def _q2k_mins(mn, r, bsums, i, b, h):
    """sum of min * (16-element activation sum) over the 8 sub-blocks of half h (an exact integer)."""
    s = 0
    for g in range(b * 16 + h * 8, b * 16 + h * 8 + 8):
        s += np.int32(mn[r, g]) * bsums[i, g]
    return s


@njit(cache=True, inline="always")
def _q2k_min_lanes(mn, r, bsums, i, b):
    """Lane j = m_2j bsum_2j + m_2j+1 bsum_2j+1 (ggml_vec_dot_q2_K_q8_K's madd(mins, bsums))."""
    g = b * 16
    lo = imul(vload_i32(bsums, i, g), vload_s8(mn, r, g))
    hi = imul(vload_i32(bsums, i, g + 8), vload_s8(mn, r, g + 8))
    return ipairs(lo, hi)


@njit(cache=True)
def _q2k_repacked_row(path, W, a, r, i, gemm):
    """One output of ggml_gemm_q2_K_8x8_q8_K (`gemm`: one FMA per 128 elements) or ggml_gemv_q2_K_8x8_q8_K
    (one per super-block): acc = fma(float(isum), d_w d_x, acc), acc_min likewise with dmin_w d_x; acc - acc_min."""
    qs, _, sc, mn, d, dmin = W
    xq, xd, bsums, _ = a
    acc, acc_min = _F0, _F0
    for b in range(d.shape[1]):
        dd, dm = d[r, b] * xd[i, b], dmin[r, b] * xd[i, b]
        s0, s1 = ihsum(_q2k_half(path, qs, sc, r, xq, i, b, 0)), ihsum(_q2k_half(path, qs, sc, r, xq, i, b, 1))
        m0, m1 = _q2k_mins(mn, r, bsums, i, b, 0), _q2k_mins(mn, r, bsums, i, b, 1)
        if gemm:
            acc = fma32(np.float32(s1), dd, fma32(np.float32(s0), dd, acc))
            acc_min = fma32(np.float32(m1), dm, fma32(np.float32(m0), dm, acc_min))
        else:
            acc = fma32(np.float32(s0 + s1), dd, acc)
            acc_min = fma32(np.float32(m0 + m1), dm, acc_min)
    return acc - acc_min


@njit(cache=True)
def q2k_rows(path, repacked, W, a, r0, r1, out):
    """Q2_K rows r0..r1-1: with `repacked` llama.cpp's block_q2_Kx8 gemm (rows in groups of four) and gemv (the
    last n % 4), else ggml_vec_dot_q2_K_q8_K's lanes (the mins FMA'd into the same lanes first)."""
    qs, qh, sc, mn, d, dmin = W
    xq, xd, bsums, _ = a
    n = xq.shape[0]
    ahead = prefetch_distance(qs, qh, sc) if n < 4 else 0
    for r in range(r0, r1):
        if ahead:
            prefetch_ahead(qs, qh, sc, r, r0, r1, ahead, 1)
        for i in range(n):
            if repacked:
                out[i, r] = _q2k_repacked_row(path, W, a, r, i, i < n - n % 4)
                continue
            acc = fzero()
            for b in range(d.shape[1]):
                acc = fmadd_i(acc, _q2k_min_lanes(mn, r, bsums, i, b), -xd[i, b] * dmin[r, b])
                lanes = iadd(_q2k_half(path, qs, sc, r, xq, i, b, 0), _q2k_half(path, qs, sc, r, xq, i, b, 1))
                acc = fmadd_i(acc, lanes, xd[i, b] * d[r, b])
            out[i, r] = fsum(acc)


# --- IQ4_NL / MXFP4, repacked: one FMA per 32-element block ----------------------------------------------------


def _nibbles(high: bool):
    """The codegen of a load of 32 bytes of IQ4_NL / MXFP4 nibbles at arr[row, col], low or high ones, each
    looked up in the table (`vlut16`'s lookup) -> i8x32 codebook values."""

    def codegen(context, builder, sig, args):
        v = builder.load(ptr2d(context, builder, sig.args[1], args[1], args[2], args[3], _V32I8), align=1)
        nib = ir.Constant(_V32I8, [4 if high else 15] * 32)
        idx = builder.lshr(v, nib) if high else builder.and_(v, nib)
        return _lookup(builder, _TABLES[sig.args[0].tag_name], idx)

    return codegen


@intrinsic
def vnib_lo(typingctx, table, arr, row, col):
    """Low nibbles of 32 bytes at arr[row, col] as codebook values (a LUT_* tag) -> i8x32."""
    if isinstance(table, TagType) and table.tag_name in _TABLES:
        return i8x32(table, arr, types.intp, types.intp), _nibbles(False)


@intrinsic
def vnib_hi(typingctx, table, arr, row, col):
    """High nibbles of 32 bytes at arr[row, col] as codebook values (a LUT_* tag) -> i8x32."""
    if isinstance(table, TagType) and table.tag_name in _TABLES:
        return i8x32(table, arr, types.intp, types.intp), _nibbles(True)


@intrinsic
def vbcast4(typingctx, arr, row, col):
    """4 bytes of a 2-D int8 array from [row, col], repeated 8 times -> i8x32 (four activation quants for the
    eight rows of an interleaved group)."""
    sig = i8x32(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        word = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.IntType(32)), align=1)
        return builder.bitcast(splat(builder, word, 8), _V32I8)

    return sig, codegen


@intrinsic
def fmadd_iv(typingctx, acc, v, dw, s):
    """Lane j: acc + float(v_j) * (dw_j * s): eight rows' block sums, each scaled by its own d_w times the
    activation's d_x (that product rounded to float32 first, as ggml's), one fused rounding per lane."""
    sig = f32x8(f32x8, i32x8, f32x8, types.float32)

    def codegen(context, builder, sig, args):
        acc, v, dw, x = args
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(dw.type, [dw.type] * 3),
                                            "llvm.fma.v8f32")
        return builder.call(fn, [builder.sitofp(v, dw.type), builder.fmul(dw, splat(builder, x, 8)), acc])

    return sig, codegen


@njit(cache=True, inline="always")
def _nl_group_dot(path, lut, qs, g, xq, i, b):
    """Block b of the eight rows of group g . x[i]: lane j = row 8g + j's exact dot (repack.py `_interleave_nl`:
    run c's low nibbles are elements 4c..4c+3 of every row, its high nibbles 16+4c..)."""
    dot = izero()
    for c in range(4):
        col = b * 128 + 32 * c
        dot = vdot_s8(path, dot, vnib_lo(lut, qs, g, col), vbcast4(xq, i, b * 32 + 4 * c))
        dot = vdot_s8(path, dot, vnib_hi(lut, qs, g, col), vbcast4(xq, i, b * 32 + 16 + 4 * c))
    return dot


@njit(cache=True)
def nl_rows(path, lut, W, a, g0, g1, out):
    """IQ4_NL / MXFP4 row groups g0..g1-1 (eight rows each) as llama.cpp's repacked gemm/gemv (the same order for
    every n; prompts of `ktile.TILE_MIN_ROWS` rows or more take kxtile.nl_tile_rows): the eight rows in the lanes
    of one accumulator, acc = fma(float(dot_b), d_w * d_x, acc) block after block."""
    qs, _, _, _, d, _ = W
    xq, xd, _, _ = a
    n, nb = xq.shape[0], xd.shape[1]
    buf = np.empty((1, 8), np.float32)
    ahead = prefetch_distance(qs, W[1], W[2]) if n < 4 else 0
    for g in range(g0, g1):
        if ahead:
            prefetch_ahead(qs, W[1], W[2], g, g0, g1, ahead, 1)
        for i in range(n):
            acc = fzero()
            for b in range(nb):
                acc = fmadd_iv(acc, _nl_group_dot(path, lut, qs, g, xq, i, b), vload_f32(d, g, 8 * b), xd[i, b])
            if 8 * g + 8 <= out.shape[1]:
                vstore(out, i, 8 * g, acc)
            else:  # a last, partial group (a matrix of ne1 % 8 != 0 called directly)
                vstore(buf, 0, 0, acc)
                for j in range(out.shape[1] - 8 * g):
                    out[i, 8 * g + j] = buf[0, j]


KX_KERNEL_TYPES = (int(T.Q2_K), int(T.Q3_K), int(T.IQ4_XS), int(T.IQ4_NL), int(T.MXFP4))


@intrinsic
def iadd(typingctx, a, b):
    sig = i32x8(i32x8, i32x8)

    def codegen(context, builder, sig, args):
        return builder.add(args[0], args[1])

    return sig, codegen

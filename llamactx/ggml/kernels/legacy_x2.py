"""Several activation rows of the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on a 16-register target
(AVX / AVX2): two weight rows to a 256-bit register, four activation rows at a time (then two,
then one).

The same arithmetic as legacy.py (x86 ggml-cpu's AVX2 `ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0` and
`ggml_vec_dot_{q4_1,q5_1}_q8_1`, operation for operation: 8 int32 lanes of 4 products per block, each converted
and scaled by d_w * d_x on its own, ggml's `hsum_float_8`, plus the Q4_1/Q5_1 min chain), so every output is
bit-identical to legacy.py's and to ggml's, whatever the number of rows. Only the tiling differs. wide.py's four
weight rows fill two 512-bit registers; on AVX2 each is two ymm, and the accumulators of four activation rows
(16 ymm) alone fill the register file. Here a weight row group (repack.py's
four interleaved rows) is taken in halves: rows 2h, 2h + 1 are bytes 32h..32h+31 of each 64-byte register, one
ymm `A` (elements 0-15 of both rows) and one `B` (elements 16-31). Four activation rows then take 8 ymm of
accumulators (lane 4j + l of `A` / `B` = lane l / 4 + l of ggml's eight lanes of weight row j), one the min
chains, two the weights: the whole tile stays in registers, and each weight block is decoded once for the four
activation rows. The half's bytes are re-read from L1 for the next four activation rows.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.intrinsics import widen_half
from llamactx.ggml.kernels.simd import TagType, f32x8, i8x32, i32x8, lane_index, ptr2d, splat, vhi, vlo, vload
from llamactx.ggml.kernels.vnni import izero, vdot, vdot_q8, vdot_u8

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_F32 = ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V8F32 = ir.VectorType(_F32, 8)
_SPREAD2 = [0, 0, 0, 0, 1, 1, 1, 1]  # two rows' values over their four lanes each


# --- 256-bit pieces ------------------------------------------------------------------------------------------------


@intrinsic
def hbits(typingctx, arr, row, col, v):
    """v | 16 where bit e of the little-endian u32 at byte [row, col] is set: the fifth bits of half a Q5_0/Q5_1
    register (repack.py's 64-bit mask, bit e = byte e; bytes 32h.. are bits 32h.., the u32 at 4h)."""
    sig = i8x32(arr, types.intp, types.intp, i8x32)

    def codegen(context, builder, sig, args):
        word = builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], _I32), align=1)
        bits = builder.bitcast(word, ir.VectorType(ir.IntType(1), 32))
        high = builder.select(bits, ir.Constant(_V32I8, [16] * 32), ir.Constant(_V32I8, [0] * 32))
        return builder.or_(args[3], high)

    return sig, codegen


@intrinsic
def xbcast2(typingctx, arr, row, col):
    """16 bytes of a 2-D int8 array from [row, col], twice -> i8x32 (an activation half for two weight rows)."""
    sig = i8x32(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.VectorType(_I8, 16)), align=1)
        return builder.shuffle_vector(v, v, lane_index(list(range(16)) * 2))

    return sig, codegen


@intrinsic
def ibcast2(typingctx, arr, row, col):
    """4 int32 of a 2-D int32 array from [row, col], twice -> i32x8."""
    sig = i32x8(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.VectorType(_I32, 4)), align=4)
        return builder.shuffle_vector(v, v, lane_index(list(range(4)) * 2))

    return sig, codegen


@intrinsic
def fbcast2(typingctx, arr, row, col):
    """4 float32 of a 2-D float32 array from [row, col], twice -> f32x8 (lane 4j + r = value r)."""
    sig = f32x8(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.VectorType(_F32, 4)), align=4)
        return builder.shuffle_vector(v, v, lane_index(list(range(4)) * 2))

    return sig, codegen


@intrinsic
def hscales(typingctx, arr, row, col):
    """The two f16 values (scales or mins of rows 2h, 2h + 1) at byte [row, col], each over its row's four lanes:
    lane 4j + l = value j -> f32x8."""
    sig = f32x8(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        h = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.VectorType(ir.IntType(16), 2)), align=1)
        d = widen_half(builder, h)
        return builder.shuffle_vector(d, d, lane_index(_SPREAD2))

    return sig, codegen


@intrinsic
def hscale(typingctx, d, x):
    """d * x lane by lane, x a float32 broadcast: ggml's `d_w * d_x`, one rounding."""
    sig = f32x8(f32x8, types.float32)

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], splat(builder, args[1], 8))

    return sig, codegen


def _fma(builder, a, b, c):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
    return builder.call(fn, [a, b, c])


@intrinsic
def hfmadd(typingctx, acc, v, s):
    """acc + float(v) * s lane by lane, one rounding (ggml's `_mm256_fmadd_ps(d, cvt(lanes), acc)`)."""
    sig = f32x8(f32x8, i32x8, f32x8)

    def codegen(context, builder, sig, args):
        return _fma(builder, builder.sitofp(args[1], _V8F32), args[2], args[0])

    return sig, codegen


@intrinsic
def hfma(typingctx, acc, m, s):
    """acc + m * s lane by lane, one rounding (the Q4_1/Q5_1 chains `summs = fma(m_w, s_x, summs)`)."""
    sig = f32x8(f32x8, f32x8, f32x8)

    def codegen(context, builder, sig, args):
        return _fma(builder, args[1], args[2], args[0])

    return sig, codegen


@intrinsic
def hsplat(typingctx, x):
    sig = f32x8(types.float32)

    def codegen(context, builder, sig, args):
        return splat(builder, args[0], 8)

    return sig, codegen


@intrinsic
def hzero(typingctx):
    sig = f32x8()

    def codegen(context, builder, sig, args):
        return ir.Constant(_V8F32, None)

    return sig, codegen


@intrinsic
def hsum2(typingctx, a, b):
    """(row 0's, row 1's) `hsum_float_8` of lanes 4j..4j+3 of `a` (ggml's lanes 0-3) and of `b` (lanes 4-7):
    r_l = b_l + a_l, then (r_0 + r_2) + (r_1 + r_3) -> two float32."""
    sig = types.UniTuple(types.float32, 2)(f32x8, f32x8)

    def codegen(context, builder, sig, args):
        r = builder.fadd(args[1], args[0])
        t = builder.fadd(builder.shuffle_vector(r, r, lane_index([0, 1, 4, 5])),
                         builder.shuffle_vector(r, r, lane_index([2, 3, 6, 7])))
        y = builder.fadd(builder.shuffle_vector(t, t, lane_index([0, 2])),
                         builder.shuffle_vector(t, t, lane_index([1, 3])))
        rows = [builder.extract_element(y, ir.Constant(_I32, j)) for j in range(2)]
        return context.make_tuple(builder, sig.return_type, rows)

    return sig, codegen


@intrinsic
def hlane(typingctx, v, k):
    """Lane k of an f32x8."""
    sig = types.float32(f32x8, types.intp)

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], args[1])

    return sig, codegen


# --- per decoder (compile-time constants: legacy.py's Tags, by name) ------------------------------------------------


def _tag(dec, *names):
    return isinstance(dec, TagType) and dec.tag_name in names


def has_min(dec):
    """True for Q4_1 / Q5_1: a min per block instead of a fixed offset."""


@overload(has_min, jit_options={"cache": True})
def _has_min(dec):
    value = _tag(dec, "dec_q4_1", "dec_q5_1")
    return lambda dec: value


def decode_half(dec, qs, qh, g, h, b):
    """Block b of weight rows 2h, 2h + 1 of row group g as two i8x32 of unsigned quants (elements 0-15, 16-31)."""


@overload(decode_half, jit_options={"cache": True})
def _decode_half(dec, qs, qh, g, h, b):
    if _tag(dec, "dec_q4_0", "dec_q4_1"):

        def q4(dec, qs, qh, g, h, b):
            v = vload(qs, g, b * 64 + 32 * h)
            return vlo(v), vhi(v)

        return q4
    if _tag(dec, "dec_q5_0", "dec_q5_1"):

        def q5(dec, qs, qh, g, h, b):
            v = vload(qs, g, b * 64 + 32 * h)
            return hbits(qh, g, b * 16 + 4 * h, vlo(v)), hbits(qh, g, b * 16 + 8 + 4 * h, vhi(v))

        return q5
    if _tag(dec, "dec_q8_0"):
        return lambda dec, qs, qh, g, h, b: (vload(qs, g, b * 128 + 32 * h), vload(qs, g, b * 128 + 64 + 32 * h))
    return None


def hdot(path, dec, acc, w, x):
    """acc + the lanes of a decoded half block against an activation half (legacy.wdot on 32 bytes)."""


@overload(hdot, jit_options={"cache": True})
def _hdot(path, dec, acc, w, x):
    if not isinstance(dec, TagType) or not isinstance(path, TagType):
        return None
    if dec.tag_name == "dec_q8_0":
        if path.tag_name == "portable" and cpu_features()["avx2"]:
            return lambda path, dec, acc, w, x: vdot_q8(path, izero(), w, x)
        return lambda path, dec, acc, w, x: vdot_u8(path, acc, w, x)
    return lambda path, dec, acc, w, x: vdot(path, acc, w, x)


# --- the tile ------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _half_scales(dec, sc, g, h, b):
    """(d, mins) of block b of rows 2h, 2h + 1, each over its row's lanes (the mins zero without them)."""
    if has_min(dec):
        return hscales(sc, g, b * 16 + 4 * h), hscales(sc, g, b * 16 + 8 + 4 * h)
    return hscales(sc, g, b * 8 + 4 * h), hzero()


@njit(cache=True)
def _half_row(path, dec, wA, wB, d8, a, i, b, accA, accB):
    """Block b of the two weight rows against activation row i: ggml's lanes, scaled and accumulated."""
    xq, xd, xoff, _ = a
    if has_min(dec):
        la = hdot(path, dec, izero(), wA, xbcast2(xq, i, b * 32))
        lb = hdot(path, dec, izero(), wB, xbcast2(xq, i, b * 32 + 16))
    else:
        la = hdot(path, dec, ibcast2(xoff, i, b * 8), wA, xbcast2(xq, i, b * 32))
        lb = hdot(path, dec, ibcast2(xoff, i, b * 8 + 4), wB, xbcast2(xq, i, b * 32 + 16))
    s = hscale(d8, xd[i, b])
    return hfmadd(accA, la, s), hfmadd(accB, lb, s)


@njit(cache=True)
def _half_store(dec, out, i, c, accA, accB, mins, r):
    """out[i, c:c+2] (c + 1 only inside the matrix) = each row's hsum_float_8, + its min chain (lane 4j + r)."""
    y0, y1 = hsum2(accA, accB)
    if has_min(dec):
        y0 += hlane(mins, r)
        y1 += hlane(mins, 4 + r)
    out[i, c] = y0
    if c + 1 < out.shape[1]:
        out[i, c + 1] = y1


@njit(cache=True)
def _half_rows4(path, dec, W, a, g, h, i, out):
    """Rows 2h, 2h + 1 of group g against activation rows i..i+3; the min chains share one register (lane
    4j + r: weight row j, activation row i + r; the activations' s are block-major for it)."""
    qs, qh, sc, _, _, _ = W
    nb = a[1].shape[1]
    a0 = b0 = a1 = b1 = a2 = b2 = a3 = b3 = m = hzero()
    for b in range(nb):
        wA, wB = decode_half(dec, qs, qh, g, h, b)
        d8, m8 = _half_scales(dec, sc, g, h, b)
        a0, b0 = _half_row(path, dec, wA, wB, d8, a, i, b, a0, b0)
        a1, b1 = _half_row(path, dec, wA, wB, d8, a, i + 1, b, a1, b1)
        a2, b2 = _half_row(path, dec, wA, wB, d8, a, i + 2, b, a2, b2)
        a3, b3 = _half_row(path, dec, wA, wB, d8, a, i + 3, b, a3, b3)
        if has_min(dec):
            m = hfma(m, m8, fbcast2(a[3], b, i))
    c = 4 * g + 2 * h
    _half_store(dec, out, i, c, a0, b0, m, 0)
    _half_store(dec, out, i + 1, c, a1, b1, m, 1)
    _half_store(dec, out, i + 2, c, a2, b2, m, 2)
    _half_store(dec, out, i + 3, c, a3, b3, m, 3)


@njit(cache=True)
def _half_rows2(path, dec, W, a, g, h, i, out):
    """Rows 2h, 2h + 1 of group g against activation rows i, i + 1 (the tail of a row count that is not a multiple
    of four: speculative verification, batched decode): each weight block decoded once for both rows; the min
    chains one register per row (`_half_row1`'s, lane 4j of weight row j). (A three-row tile has no free register
    for Q8_0: LLVM kept one accumulator on the stack, a store-reload chain that made it slower than single rows.)"""
    qs, qh, sc, _, _, _ = W
    nb = a[1].shape[1]
    a0 = b0 = a1 = b1 = m0 = m1 = hzero()
    for b in range(nb):
        wA, wB = decode_half(dec, qs, qh, g, h, b)
        d8, m8 = _half_scales(dec, sc, g, h, b)
        a0, b0 = _half_row(path, dec, wA, wB, d8, a, i, b, a0, b0)
        a1, b1 = _half_row(path, dec, wA, wB, d8, a, i + 1, b, a1, b1)
        if has_min(dec):
            m0 = hfma(m0, m8, hsplat(a[3][b, i]))
            m1 = hfma(m1, m8, hsplat(a[3][b, i + 1]))
    c = 4 * g + 2 * h
    _half_store(dec, out, i, c, a0, b0, m0, 0)
    _half_store(dec, out, i + 1, c, a1, b1, m1, 0)


@njit(cache=True)
def _half_row1(path, dec, W, a, g, h, i, out):
    """Rows 2h, 2h + 1 of group g against the single activation row i."""
    qs, qh, sc, _, _, _ = W
    nb = a[1].shape[1]
    acc_a = acc_b = m = hzero()
    for b in range(nb):
        wA, wB = decode_half(dec, qs, qh, g, h, b)
        d8, m8 = _half_scales(dec, sc, g, h, b)
        acc_a, acc_b = _half_row(path, dec, wA, wB, d8, a, i, b, acc_a, acc_b)
        if has_min(dec):
            m = hfma(m, m8, hsplat(a[3][b, i]))
    _half_store(dec, out, i, 4 * g + 2 * h, acc_a, acc_b, m, 0)


@njit(cache=True)
def x2_rows(path, dec, W, a, g0, g1, out):
    """out[:, 4*g0 : 4*g1] (clipped to the matrix) for row groups g0..g1-1, two weight rows at a time: activation
    rows four at a time, then two, then one, while the half group's bytes are in L1."""
    n = a[1].shape[0]
    n4 = n - n % 4
    for g in range(g0, g1):
        for h in range(2):
            if 4 * g + 2 * h >= out.shape[1]:  # the zero rows that pad the last group
                break
            for i in range(0, n4, 4):
                _half_rows4(path, dec, W, a, g, h, i, out)
            if n - n4 >= 2:
                _half_rows2(path, dec, W, a, g, h, n4, out)
            if (n - n4) % 2 == 1:
                _half_row1(path, dec, W, a, g, h, n - 1, out)

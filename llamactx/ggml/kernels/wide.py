"""512-bit vectors for the matmul kernels of the 32-element block types: four weight rows in one register.

repack.py interleaves the rows of Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights in groups of four (as ggml-cpu's repack.cpp
does with `block_q4_0x4`), so one 64-byte load holds block b of four rows. Two `<64 x i8>` registers cover them:
`A` = elements 0-15 of rows 0..3 (16 bytes each), `B` = elements 16-31. Against the activation's 16-byte halves
broadcast four times, `vdot16` (vnni.py) gives 16 int32 lanes per register, lane 4j + l of `A` / `B` being lane l /
4 + l of ggml's eight `dpbusd` lanes of row j. Every lane is converted, scaled and accumulated on its own as in
ggml, so the registers only change where the lanes sit, not a bit of the arithmetic; `hsum_rows` then reduces
each row's eight lanes in `hsum_float_8`'s order. The repacked Q4_0 order (legacy.py `x4_rows_repacked`) instead
adds each row's lanes as integers (`rsum4`, `rsum4x4`: the block's exact dot) and makes one FMA per block
(`bfma4`, `bfma16`).

Types: `i8x64`, `i32x16`, `f32x16` and `f32x4` (one float per weight row of the group), all in registers.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.intrinsics import widen_half
from llamactx.ggml.kernels.simd import VecType, lane_index, ptr2d, splat

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_V64I8 = ir.VectorType(_I8, 64)
_V16I32 = ir.VectorType(_I32, 16)
_V16F32 = ir.VectorType(_F32, 16)
_V4F32 = ir.VectorType(_F32, 4)
_V4I32 = ir.VectorType(_I32, 4)

i8x64 = VecType(types.int8, 64)
i32x16 = VecType(types.int32, 16)
f32x16 = VecType(types.float32, 16)
f32x4 = VecType(types.float32, 4)
i32x4 = VecType(types.int32, 4)


def _const(vt, value):
    return ir.Constant(vt, [value] * vt.count)


# --- loads -------------------------------------------------------------------------------------------------


@intrinsic
def wload(typingctx, arr, row, col):
    """64 bytes of a 2-D uint8 array from [row, col] -> i8x64."""
    sig = i8x64(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return builder.load(ptr2d(context, builder, sig.args[0], *args, _V64I8), align=1)

    return sig, codegen


def _store(vt):
    """The codegen of a store of vector type `vt` at [row, col] of a 2-D array (args: arr, row, col, v)."""

    def codegen(context, builder, sig, args):
        builder.store(args[3], ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], vt), align=1)
        return context.get_dummy_value()

    return codegen


@intrinsic
def wsave(typingctx, arr, row, col, v):
    """Store an i8x64 as 64 bytes of a 2-D uint8 array at [row, col] (`wload`'s inverse)."""
    return types.void(arr, types.intp, types.intp, i8x64), _store(_V64I8)


@intrinsic
def wlo(typingctx, v):
    """Low nibble of every byte (elements 0-15 of a Q4/Q5 block)."""
    sig = i8x64(i8x64)

    def codegen(context, builder, sig, args):
        return builder.and_(args[0], _const(_V64I8, 0x0F))

    return sig, codegen


@intrinsic
def whi(typingctx, v):
    """High nibble of every byte (elements 16-31)."""
    sig = i8x64(i8x64)

    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], _const(_V64I8, 4))

    return sig, codegen


@intrinsic
def wbits(typingctx, arr, row, col, v):
    """v | 16 where bit e of the little-endian u64 at byte [row, col] is set: the fifth bits of Q5_0/Q5_1, which
    repack.py stores as one 64-bit mask per register (bit e = byte e)."""
    sig = i8x64(arr, types.intp, types.intp, i8x64)

    def codegen(context, builder, sig, args):
        word = builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], _I64), align=1)
        bits = builder.bitcast(word, ir.VectorType(ir.IntType(1), 64))
        high = builder.select(bits, _const(_V64I8, 16), _const(_V64I8, 0))
        return builder.or_(args[3], high)

    return sig, codegen


@intrinsic
def xbcast16(typingctx, arr, row, col):
    """16 bytes of a 2-D int8 array from [row, col], repeated four times -> i8x64 (an activation half for the
    four weight rows)."""
    sig = i8x64(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.VectorType(_I8, 16)), align=1)
        return builder.shuffle_vector(v, v, lane_index(list(range(16)) * 4))

    return sig, codegen


@intrinsic
def xbcast_i4(typingctx, arr, row, col):
    """4 int32 of a 2-D int32 array from [row, col], repeated four times -> i32x16."""
    sig = i32x16(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.VectorType(_I32, 4)), align=1)
        return builder.shuffle_vector(v, v, lane_index(list(range(4)) * 4))

    return sig, codegen


@intrinsic
def fbcast4(typingctx, arr, row, col):
    """4 float32 of a 2-D float32 array from [row, col], repeated four times -> f32x16 (lane 4j + r = value r)."""
    sig = f32x16(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v = builder.load(ptr2d(context, builder, sig.args[0], *args, _V4F32), align=4)
        return builder.shuffle_vector(v, v, lane_index(list(range(4)) * 4))

    return sig, codegen


def _halves4(context, builder, arrty, arr, row, col):
    """4 IEEE halves at byte [row, col] of a 2-D uint8 array, widened exactly -> <4 x float>."""
    h = builder.load(ptr2d(context, builder, arrty, arr, row, col, ir.VectorType(ir.IntType(16), 4)), align=1)
    return widen_half(builder, h)


@intrinsic
def wscales(typingctx, arr, row, col):
    """The f16 scales of the four rows at byte [row, col], each spread over its row's four lanes: lane 4j + l =
    d_j -> f32x16."""
    sig = f32x16(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        d = _halves4(context, builder, sig.args[0], *args)
        return builder.shuffle_vector(d, d, lane_index([j for j in range(4) for _ in range(4)]))

    return sig, codegen


@intrinsic
def wscale(typingctx, d, x):
    """d * x lane by lane, x a float32 broadcast: ggml's `d_w * d_x`, one rounding."""
    sig = f32x16(f32x16, types.float32)

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], splat(builder, args[1], 16))

    return sig, codegen


@intrinsic
def wscales4(typingctx, arr, row, col):
    """The f16 scales of the four rows at byte [row, col], one per lane -> f32x4."""
    sig = f32x4(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return _halves4(context, builder, sig.args[0], *args)

    return sig, codegen


@intrinsic
def wmins(typingctx, arr, row, col):
    """The f16 mins of the four rows at byte [row, col] -> f32x4."""
    sig = f32x4(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return _halves4(context, builder, sig.args[0], *args)

    return sig, codegen


# --- float arithmetic ------------------------------------------------------------------------------------------


def _fma(builder, vt, a, b, c):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * 3), f"llvm.fma.v{vt.count}f32")
    return builder.call(fn, [a, b, c])


@intrinsic
def wzero(typingctx):
    sig = f32x16()

    def codegen(context, builder, sig, args):
        return ir.Constant(_V16F32, None)

    return sig, codegen


@intrinsic
def wzero4(typingctx):
    sig = f32x4()

    def codegen(context, builder, sig, args):
        return ir.Constant(_V4F32, None)

    return sig, codegen


@intrinsic
def wfmadd(typingctx, acc, v, s):
    """acc + float(v) * s lane by lane, one rounding (ggml's `_mm256_fmadd_ps(d, cvt(lanes), acc)`)."""
    sig = f32x16(f32x16, i32x16, f32x16)

    def codegen(context, builder, sig, args):
        return _fma(builder, _V16F32, builder.sitofp(args[1], _V16F32), args[2], args[0])

    return sig, codegen


@intrinsic
def wlanes4(typingctx, v, r):
    """Lanes r, 4 + r, 8 + r, 12 + r of v -> f32x4 (one activation row's four chains of a (4 x 4) register)."""
    if not isinstance(r, types.IntegerLiteral) or not 0 <= r.literal_value <= 3:
        return None
    q = r.literal_value
    sig = f32x4(f32x16, r)

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], lane_index([4 * j + q for j in range(4)]))

    return sig, codegen


@intrinsic
def wfma4(typingctx, acc, m, s):
    """acc + m * s for four rows' chains, s a float32 broadcast (Q4_1/Q5_1 `summs = fma(m_w, s_x, summs)`)."""
    sig = f32x4(f32x4, f32x4, types.float32)

    def codegen(context, builder, sig, args):
        return _fma(builder, _V4F32, args[1], splat(builder, args[2], 4), args[0])

    return sig, codegen


@intrinsic
def hsum_rows(typingctx, a, b):
    """Row j's result from lanes 4j..4j+3 of `a` (ggml's lanes 0-3) and `b` (lanes 4-7), in `hsum_float_8`'s
    order: r_l = b_l + a_l, then (r_0 + r_2) + (r_1 + r_3) -> f32x4, one float per row."""
    sig = f32x4(f32x16, f32x16)

    def codegen(context, builder, sig, args):
        r = builder.fadd(args[1], args[0])
        even = builder.shuffle_vector(r, r, lane_index([4 * j + c for j in range(4) for c in (0, 1)]))
        odd = builder.shuffle_vector(r, r, lane_index([4 * j + c for j in range(4) for c in (2, 3)]))
        t = builder.fadd(even, odd)  # (r0 + r2, r1 + r3) per row
        t0 = builder.shuffle_vector(t, t, lane_index([2 * j for j in range(4)]))
        t1 = builder.shuffle_vector(t, t, lane_index([2 * j + 1 for j in range(4)]))
        return builder.fadd(t0, t1)

    return sig, codegen


@intrinsic
def wadd4(typingctx, a, b):
    sig = f32x4(f32x4, f32x4)

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return sig, codegen


@intrinsic
def wstore4(typingctx, arr, row, col, v, n):
    """Store the first `n` (at most 4) floats of v at [row, col:col+n] of a 2-D float32 array."""
    sig = types.void(arr, types.intp, types.intp, f32x4, types.intp)

    def codegen(context, builder, sig, args):
        arr, row, col, v, n = args
        full = builder.icmp_signed(">=", n, ir.Constant(n.type, 4))
        with builder.if_else(full) as (then, otherwise):
            with then:
                builder.store(v, ptr2d(context, builder, sig.args[0], arr, row, col, _V4F32), align=1)
            with otherwise:
                base = ptr2d(context, builder, sig.args[0], arr, row, col, _F32)
                for j in range(3):
                    with builder.if_then(builder.icmp_signed(">", n, ir.Constant(n.type, j))):
                        builder.store(builder.extract_element(v, ir.Constant(_I32, j)),
                                      builder.gep(base, [ir.Constant(_I32, j)]))
        return context.get_dummy_value()

    return sig, codegen


# --- whole-block dot products (the repacked Q4_0 order) ----------------------------------------------------------


@intrinsic
def rsum4(typingctx, v):
    """Lane j = the sum of lanes 4j..4j+3 of v (after `vdot16` of both halves: row j's whole block dot) -> i32x4.
    Integer adds: exact in any order."""
    sig = i32x4(i32x16)

    def codegen(context, builder, sig, args):
        v = args[0]
        pairs = builder.add(builder.shuffle_vector(v, v, lane_index(range(0, 16, 2))),
                            builder.shuffle_vector(v, v, lane_index(range(1, 16, 2))))
        return builder.add(builder.shuffle_vector(pairs, pairs, lane_index(range(0, 8, 2))),
                           builder.shuffle_vector(pairs, pairs, lane_index(range(1, 8, 2))))

    return sig, codegen


@intrinsic
def rsum4x4(typingctx, v0, v1, v2, v3):
    """`rsum4` of four registers at once, lane 4r + j = row j's sum in v_r (activation row r), with two rounds of
    two-source shuffles (pair sums of v0/v1 and v2/v3, then their pairs) instead of four reductions -> i32x16."""
    sig = i32x16(i32x16, i32x16, i32x16, i32x16)

    def codegen(context, builder, sig, args):
        def pair_sums(a, b):  # lane 4j + 2r + h = v_r[4j + 2h] + v_r[4j + 2h + 1], r in (a, b)
            first = [16 * r + 4 * j + 2 * h for j in range(4) for r in range(2) for h in range(2)]
            return builder.add(builder.shuffle_vector(a, b, lane_index(first)),
                               builder.shuffle_vector(a, b, lane_index([i + 1 for i in first])))

        p01, p23 = pair_sums(args[0], args[1]), pair_sums(args[2], args[3])
        first = [16 * (r // 2) + 4 * j + 2 * (r % 2) for r in range(4) for j in range(4)]
        return builder.add(builder.shuffle_vector(p01, p23, lane_index(first)),
                           builder.shuffle_vector(p01, p23, lane_index([i + 1 for i in first])))

    return sig, codegen


@intrinsic
def bfma4(typingctx, acc, dot, off, d, x):
    """acc + float(dot + off) * (d * x) for four rows' chains (f32x4): the repacked gemv's `fma(float(dot), d_w *
    d_x, acc)`, off the activation's offset term of the block (an int32 broadcast), x = d_x (a float32
    broadcast). One rounding for the scale, one for the FMA."""
    sig = f32x4(f32x4, i32x4, types.int32, f32x4, types.float32)

    def codegen(context, builder, sig, args):
        acc, dot, off, d, x = args
        total = builder.sitofp(builder.add(dot, splat(builder, off, 4)), _V4F32)
        return _fma(builder, _V4F32, total, builder.fmul(d, splat(builder, x, 4)), acc)

    return sig, codegen


@intrinsic
def bfma16(typingctx, acc, dot, off, dx, b, i, d):
    """`bfma4` for activation rows i..i+3 at once, lane 4r + j = (activation row i + r, weight row j), as `rsum4x4`
    lays them out: off and dx are block-major (nb, n) int32 / float32 (row b holds block b of every activation
    row), d the four weight rows' scales -> f32x16."""
    sig = f32x16(f32x16, i32x16, off, dx, types.intp, types.intp, f32x4)

    def codegen(context, builder, sig, args):
        acc, dot, off, dx, b, i, d = args
        per_row = lane_index([r for r in range(4) for _ in range(4)])
        o = builder.load(ptr2d(context, builder, sig.args[2], off, b, i, _V4I32), align=4)
        x = builder.load(ptr2d(context, builder, sig.args[3], dx, b, i, _V4F32), align=4)
        o, x = builder.shuffle_vector(o, o, per_row), builder.shuffle_vector(x, x, per_row)
        d16 = builder.shuffle_vector(d, d, lane_index(list(range(4)) * 4))
        total = builder.sitofp(builder.add(dot, o), _V16F32)
        return _fma(builder, _V16F32, total, builder.fmul(d16, x), acc)

    return sig, codegen


@intrinsic
def wquarter(typingctx, v, r):
    """Lanes 4r..4r+3 of v -> f32x4 (activation row r of a `bfma16` accumulator)."""
    if not isinstance(r, types.IntegerLiteral) or not 0 <= r.literal_value <= 3:
        return None
    q = r.literal_value
    sig = f32x4(f32x16, r)

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[0], lane_index(range(4 * q, 4 * q + 4)))

    return sig, codegen


# --- float32 rows, 16 at a time (attention) ----------------------------------------------------------------------


@intrinsic
def hload16(typingctx, arr, row, col):
    """16 IEEE halves from [row, col] of a 2-D uint16 array (an f16 KV cache's bits), widened exactly -> f32x16
    (`vcvtph2ps`)."""
    sig = f32x16(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        h = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.VectorType(ir.IntType(16), 16)), align=1)
        return widen_half(builder, h)

    return sig, codegen


@intrinsic
def fload16(typingctx, arr, row, col):
    """16 float32 from [row, col] of a 2-D float32 array -> f32x16."""
    sig = f32x16(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return builder.load(ptr2d(context, builder, sig.args[0], *args, _V16F32), align=1)

    return sig, codegen


@intrinsic
def fstore16(typingctx, arr, row, col, v):
    """Store an f32x16 at [row, col] of a 2-D float32 array."""
    return types.void(arr, types.intp, types.intp, f32x16), _store(_V16F32)


@intrinsic
def ffma16(typingctx, acc, a, b):
    """acc + a * b lane by lane, one rounding."""
    sig = f32x16(f32x16, f32x16, f32x16)

    def codegen(context, builder, sig, args):
        return _fma(builder, _V16F32, args[1], args[2], args[0])

    return sig, codegen


@intrinsic
def ffma16s(typingctx, acc, a, s):
    """acc + a * s lane by lane, s a float32 broadcast, one rounding."""
    sig = f32x16(f32x16, f32x16, types.float32)

    def codegen(context, builder, sig, args):
        return _fma(builder, _V16F32, args[1], splat(builder, args[2], 16), args[0])

    return sig, codegen


@intrinsic
def fadd16(typingctx, a, b):
    sig = f32x16(f32x16, f32x16)

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return sig, codegen


@intrinsic
def reduce_add16(typingctx, v):
    """GCC's `_mm512_reduce_add_ps`: 8 pair sums (i + i+8), 4 (i + i+4), then (0+2) + (1+3)."""
    sig = types.float32(f32x16)

    def codegen(context, builder, sig, args):
        v = args[0]
        for width in (8, 4):
            lo = builder.shuffle_vector(v, v, lane_index(range(width)))
            hi = builder.shuffle_vector(v, v, lane_index(range(width, 2 * width)))
            v = builder.fadd(hi, lo)
        e = [builder.extract_element(v, ir.Constant(_I32, j)) for j in range(4)]
        return builder.fadd(builder.fadd(e[0], e[2]), builder.fadd(e[1], e[3]))

    return sig, codegen


# --- int32 lanes, one per weight row (ktile.py) -------------------------------------------------------------------


@intrinsic
def xbcast4(typingctx, arr, row, col):
    """4 bytes of a 2-D int8 array from [row, col], repeated 16 times -> i8x64 (four activation quants for 16
    weight rows: `vpdpbusd`'s broadcast operand)."""
    sig = i8x64(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        word = builder.load(ptr2d(context, builder, sig.args[0], *args, _I32), align=1)
        return builder.bitcast(splat(builder, word, 16), _V64I8)

    return sig, codegen


@intrinsic
def iload16(typingctx, arr, row, col):
    """16 int32 of a 2-D int32 array from [row, col] -> i32x16."""
    sig = i32x16(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return builder.load(ptr2d(context, builder, sig.args[0], *args, _V16I32), align=1)

    return sig, codegen


@intrinsic
def imul2(typingctx, a, s, b, t):
    """a * s + b * t lane by lane in int32 (exact where it does not overflow)."""
    sig = i32x16(i32x16, i32x16, i32x16, i32x16)

    def codegen(context, builder, sig, args):
        a, s, b, t = args
        return builder.add(builder.mul(a, s), builder.mul(b, t))

    return sig, codegen


@intrinsic
def iadd16(typingctx, a, b):
    sig = i32x16(i32x16, i32x16)

    def codegen(context, builder, sig, args):
        return builder.add(args[0], args[1])

    return sig, codegen


@intrinsic
def fsub16(typingctx, a, b):
    sig = f32x16(f32x16, f32x16)

    def codegen(context, builder, sig, args):
        return builder.fsub(args[0], args[1])

    return sig, codegen


@intrinsic
def imaddwd(typingctx, a, p):
    """Lane r = a_lo * p_lo + a_hi * p_hi, with (a_lo, a_hi) the two int16 halves of a's lane r and (p_lo, p_hi)
    those of the int32 broadcast p (`vpmaddwd`: exact)."""
    sig = i32x16(i32x16, types.int32)

    def codegen(context, builder, sig, args):
        v32i16, v16i32 = ir.VectorType(ir.IntType(16), 32), _V16I32
        a = builder.bitcast(args[0], v32i16)
        p = builder.bitcast(splat(builder, args[1], 16), v32i16)

        def half(v, odd):
            return builder.sext(builder.shuffle_vector(v, v, lane_index([2 * i + odd for i in range(16)])), v16i32)

        return builder.add(builder.mul(half(a, 0), half(p, 0)), builder.mul(half(a, 1), half(p, 1)))

    return sig, codegen


@intrinsic
def fmul16i(typingctx, v, s):
    """float(v) * s lane by lane (one rounding each)."""
    sig = f32x16(i32x16, f32x16)

    def codegen(context, builder, sig, args):
        return builder.fmul(builder.sitofp(args[0], _V16F32), args[1])

    return sig, codegen


@intrinsic
def ishl16(typingctx, v, n):
    """v << n lane by lane (n a literal-sized int: multiplies by 2**n exactly)."""
    sig = i32x16(i32x16, types.int32)

    def codegen(context, builder, sig, args):
        return builder.shl(args[0], splat(builder, args[1], 16))

    return sig, codegen


@intrinsic
def isub16(typingctx, a, b):
    sig = i32x16(i32x16, i32x16)

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], args[1])

    return sig, codegen


@intrinsic
def reduce_add16x16(typingctx, vs):
    """Lane c = `reduce_add16(vs[c])` for 16 vectors at once: the same three halvings and final pairs per vector
    (so the same bits), done on pairs of vectors with shuffles instead of one horizontal sum each."""
    if not (isinstance(vs, types.UniTuple) and vs.count == 16 and vs.dtype == f32x16):
        return None
    sig = f32x16(vs)

    def codegen(context, builder, sig, args):
        v = [builder.extract_value(args[0], c) for c in range(16)]

        def combine(a, b, hi, lo):
            shuffled = builder.shuffle_vector(a, b, lane_index(hi)), builder.shuffle_vector(a, b, lane_index(lo))
            return builder.fadd(*shuffled)

        # lanes i + 8 and i: two cells' 8 partial sums per vector (cells 2p, 2p + 1)
        l1 = [combine(v[2 * p], v[2 * p + 1], [*range(8, 16), *range(24, 32)], [*range(8), *range(16, 24)])
              for p in range(8)]

        def quarters(offsets):  # lanes off..off+3 of each 8-lane cell group, over the 4 cells of a pair of vectors
            return [o + e for o in offsets for e in range(4)]

        # lanes i + 4 and i of each cell: four cells' 4 partial sums per vector (cells 4q..4q+3)
        l2 = [combine(l1[2 * q], l1[2 * q + 1], quarters([4, 12, 20, 28]), quarters([0, 8, 16, 24])) for q in range(4)]

        def pairs(first):  # lanes first, first+1 of each 4-lane cell over the 8 cells of a pair of vectors
            return [4 * cell + first + e for cell in range(8) for e in range(2)]

        # (e0 + e2, e1 + e3) per cell: eight cells per vector (cells 8s..8s+7)
        l3 = [combine(l2[2 * s], l2[2 * s + 1], pairs(0), pairs(2)) for s in range(2)]
        # (e0 + e2) + (e1 + e3) per cell
        return combine(l3[0], l3[1], [2 * c for c in range(16)], [2 * c + 1 for c in range(16)])

    return sig, codegen


def _transpose16(builder, rows):
    """The 16 x 16 transpose of 16 f32x16 rows: four butterfly stages, each swapping the off-diagonal b x b
    blocks of row pairs (i, i + b) for b = 8, 4, 2, 1 (one two-source shuffle per output vector)."""
    rows = list(rows)
    for b in (8, 4, 2, 1):
        lo = [j if j & b == 0 else 16 + j - b for j in range(16)]
        hi = [j + b if j & b == 0 else 16 + j for j in range(16)]
        out = list(rows)
        for i in range(16):
            if i & b == 0:
                out[i] = builder.shuffle_vector(rows[i], rows[i + b], lane_index(lo))
                out[i + b] = builder.shuffle_vector(rows[i], rows[i + b], lane_index(hi))
        rows = out
    return rows


@intrinsic
def htranspose16(typingctx, src, cl, ci, r, col, dst, drow, dcol):
    """dst[drow + j, dcol + s] = src[cl[ci, r + s], col + j] widened exactly to f32, for j, s < 16: 16 f16 rows
    (a KV cache's bits, the rows named by 16 consecutive entries of a 2-D int64 cell list) transposed in
    registers, so that 16 rows' elements of one column are one f32x16."""
    sig = types.void(src, cl, types.intp, types.intp, types.intp, dst, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        src_a, cl_a, ci_a, r_a, col_a, dst_a, drow_a, dcol_a = args
        vh = ir.VectorType(ir.IntType(16), 16)
        rows = []
        for s in range(16):
            cell_ptr = ptr2d(context, builder, sig.args[1], cl_a, ci_a, builder.add(r_a, ir.Constant(_I64, s)), _I64)
            cell = builder.load(cell_ptr)
            h = builder.load(ptr2d(context, builder, sig.args[0], src_a, cell, col_a, vh), align=1)
            rows.append(widen_half(builder, h))
        for j, v in enumerate(_transpose16(builder, rows)):
            row = builder.add(drow_a, ir.Constant(_I64, j))
            builder.store(v, ptr2d(context, builder, sig.args[5], dst_a, row, dcol_a, _V16F32), align=1)
        return context.get_dummy_value()

    return sig, codegen

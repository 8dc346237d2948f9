"""The scalar LLVM intrinsics every numba routine of ggml/ shares: one FMA, one f16 <-> f32 pair, bit casts.

numba has no float16 scalar type and does not contract `a*b + c`, but ggml's arithmetic depends on both (GCC
builds it with `-ffp-contract=fast` and F16C), so these few operations are emitted as LLVM IR directly. They are
callable from compiled code only; the vector types and loads of the fast kernels are in `kernels/simd.py`.

No conversion may become a library call: numba's JIT cannot resolve compiler-rt's `__truncdfhf2` /
`__truncsfhf2` / `__extendhfsf2`, and an unresolved symbol aborts the process. LLVM emits one instruction for
f32 <-> f16 only with F16C, and for f64 -> f16 only with AVX512-FP16, so `widen_half`, `narrow_f32` and
`narrow_f64` (used by every kernel that converts) emit the instruction where the target has it and the same
rounding in integer IR elsewhere (round to nearest, ties to even; overflow to inf; NaN stays a quiet NaN).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from llamactx.ggml.cpu import cpu_features

_F32 = ir.FloatType()
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _has(feature: str) -> bool:
    """Whether the target numba compiles for (not necessarily the host) has `feature`."""
    return bool(cpu_features()[feature])


def _like(v, ty, value):
    """A constant of integer or float type `ty`, splatted when v is a vector."""
    if isinstance(v.type, ir.VectorType):
        return ir.Constant(ir.VectorType(ty, v.type.count), [value] * v.type.count)
    return ir.Constant(ty, value)


def _retype(v, ty):
    return ir.VectorType(ty, v.type.count) if isinstance(v.type, ir.VectorType) else ty


def widen_half(builder, h):
    """IEEE half bits (i16 or <n x i16>) -> float32, exact (`vcvtph2ps` with F16C; integer IR elsewhere)."""
    if _has("f16c"):
        return builder.fpext(builder.bitcast(h, _retype(h, ir.HalfType())), _retype(h, _F32))
    x = builder.zext(h, _retype(h, _I32))
    sign = builder.shl(builder.and_(x, _like(x, _I32, 0x8000)), _like(x, _I32, 16))
    e = builder.and_(x, _like(x, _I32, 0x7C00))
    m = builder.and_(x, _like(x, _I32, 0x3FF))
    normal = builder.add(builder.shl(builder.and_(x, _like(x, _I32, 0x7FFF)), _like(x, _I32, 13)),
                         _like(x, _I32, 112 << 23))
    special = builder.or_(builder.shl(m, _like(x, _I32, 13)), _like(x, _I32, 0x7F800000))
    tiny = builder.fmul(builder.uitofp(m, _retype(x, _F32)), _like(x, _F32, 2.0 ** -24))  # m * 2^-24, exact
    tiny = builder.bitcast(tiny, _retype(x, _I32))
    bits = builder.select(builder.icmp_unsigned("==", e, _like(x, _I32, 0x7C00)), special,
                          builder.select(builder.icmp_unsigned("==", e, _like(x, _I32, 0)), tiny, normal))
    return builder.bitcast(builder.or_(bits, sign), _retype(x, _F32))


def _narrow_bits(builder, x, ity, mant_bits: int, bias: int):
    """The IEEE half bits (i16) nearest to the float whose bits are x (an integer of type ity: mant_bits fraction
    bits, exponent bias `bias`): round to nearest, ties to even, as the hardware conversions do."""
    def c(v):
        return ir.Constant(ity, v)

    sign = builder.trunc(builder.lshr(x, c(ity.width - 16)), _I16)
    sign = builder.and_(sign, ir.Constant(_I16, 0x8000))
    mag = builder.and_(x, c((1 << (ity.width - 1)) - 1))
    e = builder.lshr(mag, c(mant_bits))  # biased exponent
    frac = builder.and_(mag, c((1 << mant_bits) - 1))
    # value = sig * 2^(e - bias - mant_bits) with sig = frac | implicit bit; in units of half's last place:
    # normal halves (e - bias >= -14): ulp 2^(e - bias - 10), subnormal ones: 2^-24; shift = the bits dropped
    unb = builder.sub(e, c(bias))
    normal = builder.icmp_signed(">=", unb, c(-14))
    sig = builder.or_(frac, c(1 << mant_bits))
    shift = builder.select(normal, c(mant_bits - 10), builder.sub(c(mant_bits - 24), unb))
    shift = builder.select(builder.icmp_signed(">", shift, c(mant_bits + 2)), c(mant_bits + 2), shift)
    kept = builder.select(normal, frac, sig)
    q = builder.lshr(kept, shift)
    rem = builder.and_(kept, builder.sub(builder.shl(c(1), shift), c(1)))
    halfway = builder.shl(c(1), builder.sub(shift, c(1)))
    up = builder.or_(builder.icmp_unsigned(">", rem, halfway),
                     builder.and_(builder.icmp_unsigned("==", rem, halfway),
                                  builder.icmp_unsigned("!=", builder.and_(q, c(1)), c(0))))
    q = builder.add(q, builder.zext(up, ity))
    q = builder.select(normal, builder.add(q, builder.shl(builder.add(unb, c(15)), c(10))), q)  # carry may reach inf
    inf = c(0x7C00)
    q = builder.select(builder.icmp_signed(">", unb, c(15)), inf, q)
    q = builder.select(builder.icmp_unsigned("==", e, c(0)), c(0), q)  # zero / subnormal source: far below 2^-24
    nan = builder.or_(c(0x7E00), builder.lshr(frac, c(mant_bits - 10)))
    is_special = builder.icmp_unsigned("==", e, c((1 << (ity.width - 1 - mant_bits)) - 1))
    q = builder.select(is_special, builder.select(builder.icmp_unsigned("==", frac, c(0)), inf, nan), q)
    return builder.or_(builder.trunc(q, _I16), sign)


def narrow_f32(builder, x):
    """float32 -> the bits (i16) of the nearest IEEE half, ties to even (F16C `vcvtps2ph` or integer IR)."""
    if _has("f16c"):
        return builder.bitcast(builder.fptrunc(x, ir.HalfType()), _I16)
    return _narrow_bits(builder, builder.bitcast(x, _I32), _I32, 23, 127)


def narrow_f64(builder, x):
    """float64 -> the bits (i16) of the nearest IEEE half in one rounding (`vcvtsd2sh` with AVX512-FP16, integer
    IR elsewhere: without it LLVM would call `__truncdfhf2`)."""
    if _has("avx512fp16"):
        return builder.bitcast(builder.fptrunc(x, ir.HalfType()), _I16)
    return _narrow_bits(builder, builder.bitcast(x, _I64), _I64, 52, 1023)


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c in float32 with one rounding (`vfmadd`: what GCC makes of ggml's contracted `s += a * b`)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.fma", [_F32], fnty=ir.FunctionType(_F32, [_F32] * 3))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def round_f16(typingctx, x):
    """float32 -> nearest IEEE half (ties to even, overflow to inf, as F16C `_cvtss_sh(x, 0)`) -> float32."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        return widen_half(builder, narrow_f32(builder, args[0]))

    return sig, codegen


@intrinsic
def round_f16_f64(typingctx, x):
    """float64 -> nearest IEEE half in one rounding (ties to even) -> float32: for an f16 result computed exactly
    in double (AVX512-FP16's `vfmadd...ph`: a*b + c of halves, one rounding)."""
    sig = types.float32(types.float64)

    def codegen(context, builder, signature, args):
        return widen_half(builder, narrow_f64(builder, args[0]))

    return sig, codegen


@intrinsic
def f16_bits(typingctx, x):
    """The bits of the IEEE half nearest to float32 x (ties to even, as F16C `_cvtss_sh(x, 0)`) as uint16: an f16
    table index, or an f16 cache element."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return narrow_f32(builder, args[0])

    return sig, codegen


@intrinsic
def f16_to_f32(typingctx, h):
    """The IEEE half with bits `h` (uint16, e.g. an element of an f16 array viewed as uint16) as float32: exact
    (`vcvtph2ps`, GGML_FP16_TO_FP32)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return widen_half(builder, args[0])

    return sig, codegen


@intrinsic
def pow2_f64(typingctx, n):
    """2.0 ** n as float64 for an integer n in [-1022, 1023], built from its bits (exact; no libm pow call)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        biased = builder.add(args[0], ir.Constant(i64, 1023))
        return builder.bitcast(builder.shl(biased, ir.Constant(i64, 52)), ir.DoubleType())

    return sig, codegen

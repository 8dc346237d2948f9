"""The scalar LLVM intrinsics every numba routine of ggml/ shares: one FMA, one f16 <-> f32 pair, bit casts.

numba has no float16 scalar type and does not contract `a*b + c`, but ggml's arithmetic depends on both (GCC
builds it with `-ffp-contract=fast` and F16C), so these few operations are emitted as LLVM IR directly. They are
callable from compiled code only; the vector types and loads of the fast kernels are in `kernels/simd.py`.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_F32 = ir.FloatType()
_I32 = ir.IntType(32)


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
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), _F32)

    return sig, codegen


@intrinsic
def round_f16_f64(typingctx, x):
    """float64 -> nearest IEEE half in one rounding (ties to even) -> float32: for an f16 result computed exactly
    in double (AVX512-FP16's `vfmadd...ph`: a*b + c of halves, one rounding)."""
    sig = types.float32(types.float64)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), _F32)

    return sig, codegen


@intrinsic
def f16_bits(typingctx, x):
    """The bits of the IEEE half nearest to float32 x (ties to even, as F16C `_cvtss_sh(x, 0)`) as uint16: an f16
    table index, or an f16 cache element."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def f16_to_f32(typingctx, h):
    """The IEEE half with bits `h` (uint16, e.g. an element of an f16 array viewed as uint16) as float32: exact
    (`vcvtph2ps`, GGML_FP16_TO_FP32)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), _F32)

    return sig, codegen


@intrinsic
def f32_bits(typingctx, x):
    """The IEEE bits of a float32 as uint32."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _I32)

    return sig, codegen


@intrinsic
def bits_f32(typingctx, u):
    """The float32 whose IEEE bits are `u`."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _F32)

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

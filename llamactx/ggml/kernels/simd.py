"""SIMD vector types for numba kernels and the loads, byte and float operations on them, as llvmlite intrinsics.

numba has no vector types, so the kernels are written against the small vocabulary here: `<32 x i8>` quants,
`<8 x i32>` integer lanes and `<8 x float>` accumulators (`i8x32`, `i32x8`, `f32x8`), which stay in registers
across the kernels' loops. The integer dot product and lane arithmetic are in `vnni.py`. Loads take a 2-D
C-contiguous array and (row, column) and make no array view (numba reference-counts every view atomically).

`Tag` objects are compile-time constants: a helper called with a different tag is a different specialization,
which is how the kernels pick a path (VNNI / portable) or a weight decoder without branching at run time.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.imputils import lower_constant
from numba.extending import intrinsic, models, register_model, typeof_impl

from llamactx.ggml.intrinsics import widen_half

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_F32 = ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V16I8 = ir.VectorType(_I8, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V8F32 = ir.VectorType(_F32, 8)
_V8I16 = ir.VectorType(_I16, 8)


# --- types -------------------------------------------------------------------------------------------------


class VecType(types.Type):
    """A fixed-size LLVM vector held in registers: `count` elements of numba scalar type `elem`."""

    def __init__(self, elem: types.Type, count: int) -> None:
        self.elem = elem
        self.count = count
        super().__init__(name=f"vec<{elem} x {count}>")


@register_model(VecType)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        be_type = ir.VectorType(dmm.lookup(fe_type.elem).get_value_type(), fe_type.count)
        super().__init__(dmm, fe_type, be_type)


i8x32 = VecType(types.int8, 32)
i32x8 = VecType(types.int32, 8)
f32x8 = VecType(types.float32, 8)


class Tag:
    """A compile-time constant for the kernels, used as a module global: numba types each tag by its name, so a
    helper called with a different tag is a different specialization. `VNNI` / `PORTABLE` pick `vdot`'s code."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Tag({self.name})"


class TagType(types.Dummy):
    """numba type of a `Tag`."""

    def __init__(self, name: str) -> None:
        self.tag_name = name
        super().__init__(name=f"Tag({name})")


register_model(TagType)(models.OpaqueModel)

VNNI = Tag("vnni")
PORTABLE = Tag("portable")


@typeof_impl.register(Tag)
def _typeof_tag(val, c):
    return TagType(val.name)


@lower_constant(TagType)
def _constant_tag(context, builder, ty, pyval):
    return context.get_dummy_value()


# --- IR helpers --------------------------------------------------------------------------------------------


def ptr2d(context, builder, arrty, arr, row, col, vecty):
    """Pointer to element [row, col] of a C-contiguous 2-D array, cast to a pointer to `vecty`. No bounds check,
    and no array view is made (views cost an atomic reference count in numba)."""
    ary = context.make_array(arrty)(context, builder, arr)
    ncols = builder.extract_value(ary.shape, 1)
    return builder.bitcast(builder.gep(ary.data, [builder.add(builder.mul(row, ncols), col)]), vecty.as_pointer())


def splat(builder, val, n):
    """A vector of n copies of the scalar `val`."""
    vt = ir.VectorType(val.type, n)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(_I32, n), [0] * n))


def lane_index(values):
    """A constant <n x i32> (shufflevector masks, insert positions)."""
    return ir.Constant(ir.VectorType(_I32, len(values)), list(values))


def _const8(value):
    return ir.Constant(_V32I8, [value] * 32)


# --- loads -------------------------------------------------------------------------------------------------


@intrinsic
def vload(typingctx, arr, row, col):
    """32 bytes of a 2-D uint8/int8 array from [row, col] (unaligned) -> i8x32."""
    sig = i8x32(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], _V32I8), align=1)

    return sig, codegen


@intrinsic
def vload_f32(typingctx, arr, row, col):
    """8 float32 from byte [row, col] of a 2-D uint8 array (or element [row, col] of a float32 array) -> f32x8."""
    sig = f32x8(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], _V8F32), align=1)

    return sig, codegen


@intrinsic
def vload_f16(typingctx, arr, row, col):
    """8 IEEE halves from byte [row, col] of a 2-D uint8 array, widened exactly -> f32x8 (vcvtph2ps with F16C)."""
    sig = f32x8(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        h = builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], _V8I16), align=1)
        return widen_half(builder, h)

    return sig, codegen


@intrinsic
def load_f32(typingctx, arr, row, col):
    """The float32 at byte [row, col] of a 2-D uint8 array."""
    sig = types.float32(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], _F32), align=1)

    return sig, codegen


@intrinsic
def load_f16(typingctx, arr, row, col):
    """The IEEE half at byte [row, col] of a 2-D uint8 array, widened exactly to float32."""
    sig = types.float32(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        h = builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], ir.IntType(16)), align=1)
        return widen_half(builder, h)

    return sig, codegen


@intrinsic
def vload_i32(typingctx, arr, row, col):
    """8 int32 of a 2-D int32 array from [row, col] -> i32x8."""
    sig = i32x8(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        return builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], _V8I32), align=1)

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, row, col):
    """Prefetch the cache line of arr[row, col] into all cache levels (`prefetcht0`); no fault if out of range."""
    sig = types.void(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]), "llvm.prefetch.p0i8"
        )
        ptr = ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], ir.IntType(8))
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return sig, codegen


# --- byte vector ops ---------------------------------------------------------------------------------------


@intrinsic
def vlo(typingctx, v):
    """Low nibbles of each byte."""
    sig = i8x32(v)

    def codegen(context, builder, sig, args):
        return builder.and_(args[0], _const8(0x0F))

    return sig, codegen


@intrinsic
def vhi(typingctx, v):
    """High nibbles of each byte."""
    sig = i8x32(v)

    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], _const8(4))

    return sig, codegen


@intrinsic
def vor(typingctx, a, b):
    sig = i8x32(a, b)

    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])

    return sig, codegen


@intrinsic
def vfield(typingctx, v, shift, mask):
    """((v >> shift) & mask) << 4 per byte: the high bits of Q5_K (mask 1) and Q6_K (mask 3) moved above a nibble."""
    sig = i8x32(v, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        s = splat(builder, builder.trunc(args[1], _I8), 32)
        m = splat(builder, builder.trunc(args[2], _I8), 32)
        return builder.shl(builder.and_(builder.lshr(args[0], s), m), _const8(4))

    return sig, codegen


# --- activation quantization (32 floats -> 32 int8) ------------------------------------------------------------


def _load32f(context, builder, arrty, arr, row, col):
    """Four f32x8 from [row, col] of a 2-D float32 array."""
    v32 = ir.VectorType(_F32, 32)
    return builder.load(ptr2d(context, builder, arrty, arr, row, col, v32), align=1)


@intrinsic
def vabsmax32(typingctx, arr, row, col):
    """max |arr[row, col:col+32]| of a float32 array (exact: the order of a max does not matter)."""
    sig = types.float32(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        v = _load32f(context, builder, sig.args[0], *args)
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type, [v.type]), "llvm.fabs.v32f32")
        fmax = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_F32, [v.type]), "llvm.vector.reduce.fmax.v32f32"
        )
        return builder.call(fmax, [builder.call(fabs, [v])])

    return sig, codegen


@intrinsic
def vquant32(typingctx, arr, row, col, scale):
    """arr[row, col:col+32] * scale rounded half to even and clamped to -128..127 (x86 `_mm256_round_ps` +
    `cvtps_epi32` + `packs`; ggml-quants.c nearest_int for |v| < 2^22) -> i8x32. Finite inputs only."""
    sig = i8x32(arr, types.intp, types.intp, types.float32)

    def codegen(context, builder, sig, args):
        v = _load32f(context, builder, sig.args[0], args[0], args[1], args[2])
        v = builder.fmul(v, splat(builder, args[3], 32))
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type, [v.type]), "llvm.rint.v32f32")
        q = builder.fptosi(builder.call(rint, [v]), ir.VectorType(_I32, 32))
        hi, lo = ir.Constant(q.type, [127] * 32), ir.Constant(q.type, [-128] * 32)
        q = builder.select(builder.icmp_signed(">", q, hi), hi, q)
        q = builder.select(builder.icmp_signed("<", q, lo), lo, q)
        return builder.trunc(q, _V32I8)

    return sig, codegen


@intrinsic
def vstore(typingctx, arr, row, col, v):
    """Store an i8x32 / i32x8 at [row, col] of a 2-D int8 / int32 array."""
    sig = types.void(arr, types.intp, types.intp, v)

    def codegen(context, builder, sig, args):
        val = args[3]
        builder.store(val, ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], val.type), align=1)
        return context.get_dummy_value()

    return sig, codegen


# --- float ops -----------------------------------------------------------------------------------------------


def _fma(builder, a, b, c):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8F32, [_V8F32] * 3), "llvm.fma.v8f32")
    return builder.call(fn, [a, b, c])


@intrinsic
def fzero(typingctx):
    sig = f32x8()

    def codegen(context, builder, sig, args):
        return ir.Constant(_V8F32, None)

    return sig, codegen


@intrinsic
def fmadd_i(typingctx, acc, v, s):
    """acc + float(v) * s: an integer block sum scaled by the float32 `s` (d_w * d_x), one fused rounding per lane."""
    sig = f32x8(f32x8, i32x8, types.float32)

    def codegen(context, builder, sig, args):
        return _fma(builder, builder.sitofp(args[1], _V8F32), splat(builder, args[2], 8), args[0])

    return sig, codegen


@intrinsic
def fmadd(typingctx, acc, a, b):
    """acc + a * b, lane-wise float32 FMA."""
    sig = f32x8(f32x8, f32x8, f32x8)

    def codegen(context, builder, sig, args):
        return _fma(builder, args[1], args[2], args[0])

    return sig, codegen


@intrinsic
def fsum(typingctx, v):
    """Sum of the 8 lanes in ggml's `hsum_float_8` order: (0+4, 1+5, 2+6, 3+7), then (a+c, b+d), then the two."""
    sig = types.float32(f32x8)

    def codegen(context, builder, sig, args):
        v = args[0]
        for width in (4, 2, 1):
            lo = builder.shuffle_vector(v, v, lane_index(range(width)))
            hi = builder.shuffle_vector(v, v, lane_index(range(width, 2 * width)))
            v = builder.fadd(lo, hi)
        return builder.extract_element(v, ir.Constant(_I32, 0))

    return sig, codegen


# --- scalar bit casts ----------------------------------------------------------------------------------------

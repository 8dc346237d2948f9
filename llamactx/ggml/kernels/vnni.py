"""The integer dot product of the matmul kernels and the int32 lane arithmetic around it (llvmlite intrinsics).

LLVM never emits `vpdpbusd` by itself (its autovectorizer was never seen to pick it), so it is called as an
intrinsic. `vdot` is the one operation that differs per path: `llvm.x86.avx512.vpdpbusd.256` (AVX512-VNNI + VL, or
AVX-VNNI) on the VNNI path. On the portable path, where the target has AVX2, ggml's own AVX2 pair `pmaddubsw` +
`pmaddwd` (`mul_sum_us8_pairs_float`): exact because no pair of products leaves int16 while the unsigned operand is
at most 128, as every weight decoder's is but Q8_0's q + 128 (an activation quant is within +-127). Q8_0 takes
ggml's sign trick there (`vdot16_q8`); without AVX2, plain LLVM vector IR (zext/sext, multiply, pairwise adds:
`vpmaddwd` on x86), which LLVM never turns into `pmaddubsw` and which runs about 3x slower. `vdot16` is
the same on 64 bytes (the four weight rows of wide.py): one 512-bit `vpdpbusd` with AVX512-VNNI, two 256-bit ones on
AVX-VNNI. The path is the type of a `simd.Tag` argument, so numba compiles (and caches) one specialization per path
and both can run in one process.

Lane layout, on both paths: lane k of the `<8 x i32>` result sums the products of bytes 4k..4k+3, the lanes of
ggml's `_mm256_dpbusd_epi32` / `maddubs + madd`, so lanes 0-3 cover elements 0-15 and lanes 4-7 elements 16-31.
Keeping ggml's lanes is what makes the float results bit-identical: each lane is converted and scaled on its own.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.kernels.simd import TagType, i8x32, i32x8, lane_index, ptr2d, splat
from llamactx.ggml.kernels.wide import i8x64, i32x16

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_V32I8 = ir.VectorType(_I8, 32)
_V8I32 = ir.VectorType(_I32, 8)


# --- the dot product ---------------------------------------------------------------------------------------------


def _dot_portable(builder, acc, a, b):
    """acc + lane sums of u8(a) * s8(b), 4 bytes per lane, in target-independent IR (any width)."""
    n = a.type.count
    v16 = ir.VectorType(_I16, n)
    vi32 = ir.VectorType(_I32, n // 2)
    a16, b16 = builder.zext(a, v16), builder.sext(b, v16)

    def half(v, odd):  # elements 2i + odd, widened to i32: the operands of vpmaddwd
        return builder.sext(builder.shuffle_vector(v, v, lane_index([2 * i + odd for i in range(n // 2)])), vi32)

    pairs = builder.add(builder.mul(half(a16, 0), half(b16, 0)), builder.mul(half(a16, 1), half(b16, 1)))
    quads = builder.add(
        builder.shuffle_vector(pairs, pairs, lane_index([2 * i for i in range(n // 4)])),
        builder.shuffle_vector(pairs, pairs, lane_index([2 * i + 1 for i in range(n // 4)])),
    )
    return builder.add(acc, quads)


def _halves(builder, dot, acc, a, b):
    """`dot` on each 256-bit half of 512-bit operands, the lanes joined again."""
    def half(v, h):
        m = v.type.count // 2
        return builder.shuffle_vector(v, v, lane_index(range(h * m, (h + 1) * m)))

    halves = [dot(builder, half(acc, h), half(a, h), half(b, h)) for h in (0, 1)]
    return builder.shuffle_vector(halves[0], halves[1], lane_index(range(acc.type.count)))


_PAIRWISE = {  # x86's pairwise multiply-adds: (512-bit with AVX512BW, 256-bit with AVX2)
    "maddubs": ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx2.pmadd.ub.sw"),  # u8 x s8 -> saturating i16 pairs
    "maddwd": ("llvm.x86.avx512.pmaddw.d.512", "llvm.x86.avx2.pmadd.wd"),  # i16 x i16 -> i32 pairs (exact)
}


def _pairwise(builder, name, a, b):
    """`pmaddubsw` / `pmaddwd` of two 256- or 512-bit vectors (each 512-bit one on 256-bit halves without
    AVX512BW): elements in, pairs of products added, half as many elements of twice the width out."""
    bits = a.type.count * a.type.element.width
    if bits == 512 and not cpu_features()["avx512bw"]:
        m = a.type.count // 2
        h = [[builder.shuffle_vector(v, v, lane_index(range(k * m, (k + 1) * m))) for v in (a, b)] for k in (0, 1)]
        lo, hi = _pairwise(builder, name, *h[0]), _pairwise(builder, name, *h[1])
        return builder.shuffle_vector(lo, hi, lane_index(range(2 * lo.type.count)))
    out = ir.VectorType(ir.IntType(2 * a.type.element.width), a.type.count // 2)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(out, [a.type, b.type]),
                                        _PAIRWISE[name][bits != 512])
    return builder.call(fn, [a, b])


def _ones16(n):
    return ir.Constant(ir.VectorType(_I16, n), [1] * n)


def _dot_maddubs(builder, acc, a, b):
    """acc + lane sums of u8(a) * s8(b) with `pmaddubsw` (saturating pairs to int16) and `pmaddwd` by ones.
    Exact only while u8(a) <= 128 (see the module)."""
    pairs = _pairwise(builder, "maddubs", a, b)
    return builder.add(acc, _pairwise(builder, "maddwd", pairs, _ones16(pairs.type.count)))


def _dot_sign_q8(builder, acc, a, b):
    """acc + lane sums of q * s8(b) for Q8_0's stored q + 128 (a), as ggml's AVX2 `mul_sum_i8_pairs_float`:
    `psignb` moves q's sign onto b, then `pmaddubsw(|q|, .)` (|q| <= 128: exact) and `pmaddwd` by ones, on each
    256-bit half. The result lacks the 128 * sum(b) of the unsigned form: the caller's offset term cancels it."""
    n = a.type.count
    if n == 64:
        return _halves(builder, _dot_sign_q8, acc, a, b)
    q = builder.xor(a, ir.Constant(a.type, [0x80] * n))  # (32,) int8: the signed quants
    psign = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type, a.type]),
                                           "llvm.x86.avx2.psign.b")
    return _dot_maddubs(builder, acc, builder.call(psign, [q, q]), builder.call(psign, [b, q]))


def _dot_small(builder, acc, a, b):
    """The portable path's dot product of a weight quant <= 128: `pmaddubsw` where the target has AVX2."""
    return (_dot_maddubs if cpu_features()["avx2"] else _dot_portable)(builder, acc, a, b)


def _dot_vnni(builder, acc, a, b):
    """acc + u8(a) . s8(b) with `vpdpbusd`: one 512-bit instruction where the CPU has AVX512-VNNI, else 256-bit
    ones (AVX512-VNNI + VL or AVX-VNNI) on each half."""
    n = acc.type.count
    if n == 16 and not cpu_features()["avx512vnni"]:
        return _halves(builder, _dot_vnni, acc, a, b)
    vt = ir.VectorType(_I32, n)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * 3),
                                        f"llvm.x86.avx512.vpdpbusd.{32 * n}")
    return builder.call(fn, [acc, builder.bitcast(a, vt), builder.bitcast(b, vt)])


def _vdot_intrinsic(vec_i32, vec_i8, portable, doc):
    """An intrinsic (path, acc, a, b) -> acc + u8(a) . s8(b), 4 bytes per lane: `vpdpbusd` on the VNNI path,
    `portable(builder, acc, a, b)` on the other."""

    def typer(typingctx, path, acc, a, b):
        if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
            return None
        dot = _dot_vnni if path.tag_name == "vnni" else portable

        def codegen(context, builder, sig, args):
            return dot(builder, *args[1:])

        return vec_i32(path, vec_i32, vec_i8, vec_i8), codegen

    typer.__name__ = typer.__qualname__ = doc.split(":")[0]
    typer.__doc__ = doc
    return intrinsic(typer)


vdot = _vdot_intrinsic(i32x8, i8x32, _dot_small, "vdot: 32 bytes -> i32x8; the weight quant u8(a) <= 128")
vdot16 = _vdot_intrinsic(i32x16, i8x64, _dot_small, "vdot16: `vdot` on 64 bytes (wide.py's four weight rows) -> "
                         "i32x16; u8(a) <= 128")
vdot16_u8 = _vdot_intrinsic(i32x16, i8x64, _dot_portable, "vdot16_u8: `vdot16` for any u8(a) (Q8_0's q + 128): "
                            "widened, never saturating, on the portable path")
vdot16_q8 = _vdot_intrinsic(i32x16, i8x64, _dot_sign_q8, "vdot16_q8: the signed dot of Q8_0's q + 128 quants "
                            "(portable path, AVX2): acc + q . s8(b), without the unsigned form's offset")
vdot_u8 = _vdot_intrinsic(i32x8, i8x32, _dot_portable, "vdot_u8: `vdot16_u8` on 32 bytes (legacy_x2.py's two "
                          "weight rows) -> i32x8")
vdot_q8 = _vdot_intrinsic(i32x8, i8x32, _dot_sign_q8, "vdot_q8: `vdot16_q8` on 32 bytes (legacy_x2.py's two weight "
                          "rows) -> i32x8")


def _short_in_int16(path) -> bool:
    """Whether `vdot16_short` sums in int16: the portable path on an AVX2 target."""
    return path.tag_name == "portable" and cpu_features()["avx2"]


@intrinsic
def vdot16_short(typingctx, path, acc, a, b):
    """`vdot16` for short runs of small weight bytes, then `vshort_lanes`: a run of calls into one acc must keep
    calls x 2 x max u8(a) x 128 <= 32767 (8 calls for 4-bit quants, 4 for 5-bit). On the portable path with AVX2
    each call adds `pmaddubsw`'s int16 pairs to acc's int16 halves and `vshort_lanes` does the run's one `pmaddwd`
    by ones: a third of vdot16's instructions per call (ggml's AVX2 K-quant kernels sum their pairs so too).
    Elsewhere it is vdot16 and `vshort_lanes` returns acc. The lanes are vdot16's sums either way: exact."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None

    def codegen(context, builder, sig, args):
        _, acc, a, b = args
        if not _short_in_int16(sig.args[0]):
            return (_dot_vnni if sig.args[0].tag_name == "vnni" else _dot_small)(builder, acc, a, b)
        v16 = ir.VectorType(_I16, 32)
        return builder.bitcast(builder.add(builder.bitcast(acc, v16), _pairwise(builder, "maddubs", a, b)),
                               acc.type)

    return i32x16(path, i32x16, i8x64, i8x64), codegen


@intrinsic
def vshort_lanes(typingctx, path, acc):
    """The int32 lanes of a `vdot16_short` run's accumulator."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None

    def codegen(context, builder, sig, args):
        acc = args[1]
        if not _short_in_int16(sig.args[0]):
            return acc
        return _pairwise(builder, "maddwd", builder.bitcast(acc, ir.VectorType(_I16, 32)), _ones16(32))

    return i32x16(path, i32x16), codegen


@intrinsic
def izero16(typingctx):
    sig = i32x16()

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.VectorType(_I32, 16), None)

    return sig, codegen


@intrinsic
def isub(typingctx, a, b):
    sig = i32x8(i32x8, i32x8)

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], args[1])

    return sig, codegen


@intrinsic
def izero(typingctx):
    sig = i32x8()

    def codegen(context, builder, sig, args):
        return ir.Constant(_V8I32, None)

    return sig, codegen


@intrinsic
def imuladd(typingctx, acc, v, s):
    """acc + v * s, s an int32 broadcast to every lane."""
    sig = i32x8(i32x8, i32x8, types.int32)

    def codegen(context, builder, sig, args):
        return builder.add(args[0], builder.mul(args[1], splat(builder, args[2], 8)))

    return sig, codegen


@intrinsic
def vscales_pair(typingctx, arr, row, col, t):
    """Signed bytes arr[row, col + 2t] and [row, col + 2t + 1] as i32x8 [s0, s0, s0, s0, s1, s1, s1, s1]: the int8
    scales of two 16-element sub-blocks (Q6_K), lined up with `vdot`'s lanes. `t` must be a literal 0..3."""
    if not isinstance(t, types.IntegerLiteral) or not 0 <= t.literal_value <= 3:
        return None
    q = t.literal_value
    sig = i32x8(arr, types.intp, types.intp, t)

    def codegen(context, builder, sig, args):
        v8 = ir.VectorType(_I8, 8)
        raw = builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], v8), align=1)
        wide = builder.sext(raw, _V8I32)
        return builder.shuffle_vector(wide, wide, lane_index([2 * q] * 4 + [2 * q + 1] * 4))

    return sig, codegen


@intrinsic
def vload_s8(typingctx, arr, row, col):
    """8 signed bytes of a 2-D uint8 array from [row, col], sign-extended -> i32x8."""
    sig = i32x8(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        raw = builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], ir.VectorType(_I8, 8)))
        return builder.sext(raw, _V8I32)

    return sig, codegen


@intrinsic
def imul(typingctx, a, b):
    sig = i32x8(i32x8, i32x8)

    def codegen(context, builder, sig, args):
        return builder.mul(args[0], args[1])

    return sig, codegen


@intrinsic
def ipairs(typingctx, a, b):
    """Lane k = c[2k] + c[2k+1] of the 16 lanes c = (a, b): ggml's madd_epi16 pairing."""
    sig = i32x8(i32x8, i32x8)

    def codegen(context, builder, sig, args):
        even = builder.shuffle_vector(args[0], args[1], lane_index([2 * k for k in range(8)]))
        odd = builder.shuffle_vector(args[0], args[1], lane_index([2 * k + 1 for k in range(8)]))
        return builder.add(even, odd)

    return sig, codegen


@intrinsic
def imuladd_v(typingctx, acc, v, s):
    """acc + v * s, lane-wise int32."""
    sig = i32x8(i32x8, i32x8, i32x8)

    def codegen(context, builder, sig, args):
        return builder.add(args[0], builder.mul(args[1], args[2]))

    return sig, codegen


@intrinsic
def ihsum(typingctx, v):
    """The sum of the 8 int32 lanes -> int32 (exact: integer addition, any order)."""
    sig = types.int32(i32x8)

    def codegen(context, builder, sig, args):
        total = builder.extract_element(args[0], ir.Constant(_I32, 0))
        for lane in range(1, 8):
            total = builder.add(total, builder.extract_element(args[0], ir.Constant(_I32, lane)))
        return total

    return sig, codegen


# --- lane sums of the activation quants ------------------------------------------------------------------


@intrinsic
def ilanesum4(typingctx, q):
    """i32x8, lane k = q[4k] + q[4k+1] + q[4k+2] + q[4k+3] (signed): the activation sums of `vdot`'s lanes."""
    sig = i32x8(i8x32)

    def codegen(context, builder, sig, args):
        wide = builder.sext(args[0], ir.VectorType(_I32, 32))
        total = None
        for e in range(4):
            part = builder.shuffle_vector(wide, wide, lane_index([4 * k + e for k in range(8)]))
            total = part if total is None else builder.add(total, part)
        return total

    return sig, codegen


@intrinsic
def ihalves(typingctx, v):
    """(lanes 0-3, lanes 4-7) sums of an i32x8 -> two int32 (for 32 quants' lane sums: the two 16-sums)."""
    sig = types.UniTuple(types.int32, 2)(i32x8)

    def codegen(context, builder, sig, args):
        sums = []
        for base in (0, 4):
            total = builder.extract_element(args[0], ir.Constant(_I32, base))
            for lane in range(base + 1, base + 4):
                total = builder.add(total, builder.extract_element(args[0], ir.Constant(_I32, lane)))
            sums.append(total)
        return context.make_tuple(builder, sig.return_type, sums)

    return sig, codegen

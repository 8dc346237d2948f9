"""The signed codes of one 32-element group of an IQ2 / IQ3 / IQ1 super-block as one `<32 x i8>` vector (an
llvmlite intrinsic), the decode klowbit.py's kernels run per weight row.

ggml-quants.c `dequantize_row_iq2_xxs` ... `dequantize_row_iq1_m` read each group as grid indices (four of 8 codes
or eight of 4), a sign bit per code (IQ2 / IQ3; `ksigns_iq2xs` expands IQ2_XXS / IQ2_XS / IQ3_XXS's 7 stored bits
to 8) and, for IQ1, codes -1 / 0 / 1 straight from the grid. Here the indices are computed in scalar IR, the grid
entries loaded into one vector (the scalar loads and inserts of ggml's AVX2 `_mm256_set_epi64x` / `_epi32`), the 32
sign bits joined into one i32 and turned into a byte mask (`vpmovm2b` with AVX512BW), and the codes negated under
it: about a tenth of the instructions of a byte-by-byte decode. Block layouts: ggml-common.h `block_iq2_xxs` ....
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from llamactx.ggml.kernels.simd import i8x32, ptr2d

_I1 = ir.IntType(1)
_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V32I8 = ir.VectorType(_I8, 32)

IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M = 16, 17, 18, 19, 21, 22, 29  # ggml_type


def _c32(v):
    return ir.Constant(_I32, v)


def _entries(context, builder, tyarr, arr, indices):
    """Grid entries arr[i] (a 1-D uint64 / uint32 array) for the i32 `indices`, as one <32 x i8>."""
    ary = context.make_array(tyarr)(context, builder, arr)
    elem = ir.IntType(64 if tyarr.dtype.bitwidth == 64 else 32)
    vec = ir.Constant(ir.VectorType(elem, len(indices)), ir.Undefined)
    for k, idx in enumerate(indices):
        vec = builder.insert_element(vec, builder.load(builder.gep(ary.data, [builder.zext(idx, _I64)])), _c32(k))
    return builder.bitcast(vec, _V32I8)


def _ksigns(context, builder, tyks, ks, aux):
    """The 32 sign bits of a group from the 4 x 7 bits of `aux` (ksigns_iq2xs adds each eighth, parity) -> i32."""
    ary = context.make_array(tyks)(context, builder, ks)
    bits = _c32(0)
    for g in range(4):
        s7 = builder.and_(builder.lshr(aux, _c32(7 * g)), _c32(127))
        v = builder.zext(builder.load(builder.gep(ary.data, [builder.zext(s7, _I64)])), _I32)
        bits = builder.or_(bits, builder.shl(v, _c32(8 * g)))
    return bits


def _negate(builder, codes, bits):
    """codes with byte j negated where bit j of the i32 `bits` is set."""
    mask = builder.bitcast(bits, ir.VectorType(_I1, 32))
    return builder.select(mask, builder.neg(codes), codes)


class _Reads:
    """Little-endian reads at byte offset off + k of a super-block (`start`: its first byte), zero-extended to i32."""

    def __init__(self, builder, start, off):
        self.b, self.start, self.off = builder, start, off

    def byte(self, k):
        b = self.b
        return b.zext(b.load(b.gep(self.start, [b.sext(b.add(self.off, _c32(k)), _I64)])), _I32)

    def _load(self, k, ty):  # an unaligned little-endian load (x86)
        b = self.b
        p = b.gep(self.start, [b.sext(b.add(self.off, _c32(k)), _I64)])
        return b.load(b.bitcast(p, ty.as_pointer()), align=1)

    def u16(self, k):
        return self.b.zext(self._load(k, ir.IntType(16)), _I32)

    def word(self, k):
        return self._load(k, _I32)


def _group_codes(t, context, builder, sig, args):
    blocks_ty, grid_ty, ks_ty = sig.args[1], sig.args[5], sig.args[6]
    _, blocks, r, o, ib, grid, ks = args
    b = builder
    start = ptr2d(context, builder, blocks_ty, blocks, r, o, _I8)  # the super-block's first byte
    gi = b.trunc(ib, _I32)

    def at(base, scale):  # reads from byte base + scale * ib of the super-block
        return _Reads(b, start, b.add(_c32(base), b.mul(gi, _c32(scale))))

    if t == IQ2_XXS:
        g = at(2, 8)
        idx = [g.byte(k) for k in range(4)]
        return _negate(b, _entries(context, b, grid_ty, grid, idx), _ksigns(context, b, ks_ty, ks, g.word(4)))
    if t == IQ3_XXS:
        g = at(2, 8)
        idx = [g.byte(k) for k in range(8)]
        aux = at(66, 4).word(0)
        return _negate(b, _entries(context, b, grid_ty, grid, idx), _ksigns(context, b, ks_ty, ks, aux))
    if t == IQ2_XS:
        g = at(2, 8)
        qs = [g.u16(2 * k) for k in range(4)]
        idx = [b.and_(q, _c32(511)) for q in qs]
        aux = _c32(0)
        for k, q in enumerate(qs):  # the 7 sign bits of each entry at 7 k, as IQ2_XXS's aux holds them
            aux = b.or_(aux, b.shl(b.lshr(q, _c32(9)), _c32(7 * k)))
        return _negate(b, _entries(context, b, grid_ty, grid, idx), _ksigns(context, b, ks_ty, ks, aux))
    if t == IQ2_S:
        g, qh = at(2, 4), at(66, 1).byte(0)
        idx = [b.or_(g.byte(k), b.and_(b.shl(qh, _c32(8 - 2 * k)), _c32(0x300))) for k in range(4)]
        return _negate(b, _entries(context, b, grid_ty, grid, idx), at(34, 4).word(0))
    if t == IQ3_S:
        g, qh = at(2, 8), at(66, 1).byte(0)
        idx = [b.or_(g.byte(e), b.shl(b.and_(b.lshr(qh, _c32(e)), _c32(1)), _c32(8))) for e in range(8)]
        return _negate(b, _entries(context, b, grid_ty, grid, idx), at(74, 4).word(0))
    if t == IQ1_S:
        g, qh = at(2, 4), at(34, 2).u16(0)
        idx = [b.or_(g.byte(k), b.shl(b.and_(b.lshr(qh, _c32(3 * k)), _c32(7)), _c32(8))) for k in range(4)]
        return _entries(context, b, grid_ty, grid, idx)
    # IQ1_M
    g, h = at(0, 4), at(32, 2)
    idx = []
    for k in range(4):
        qh = b.lshr(h.byte(k // 2), _c32(4 * (k % 2)))
        idx.append(b.or_(g.byte(k), b.shl(b.and_(qh, _c32(7)), _c32(8))))
    return _entries(context, b, grid_ty, grid, idx)


@intrinsic
def iq_codes(typingctx, t, blocks, r, o, ib, grid, ksigns):
    """Signed codes (i8x32) of group ib (0..7) of the super-block at blocks[r, o:] of ggml type t (a literal):
    grid the type's codebook as a 1-D uint64 (8 codes per entry) or uint32 (4) array, ksigns `ksigns_iq2xs`
    (uint8, 128; read by IQ2_XXS, IQ2_XS and IQ3_XXS only)."""
    if not isinstance(t, types.IntegerLiteral):
        return None
    tv = t.literal_value
    sig = i8x32(t, blocks, types.intp, types.intp, types.intp, grid, ksigns)

    def codegen(context, builder, sig, args):
        return _group_codes(tv, context, builder, sig, args)

    return sig, codegen

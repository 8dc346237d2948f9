"""The IQ2 / IQ3 / IQ1 super-blocks as klowbit.py's kernels decode them, per weight row (llvmlite intrinsics): the
grid entries of one 32-element group as one `<32 x i8>` vector, the signs as bit masks, and the transposes of the
tiles.

ggml-quants.c `dequantize_row_iq2_xxs` ... `dequantize_row_iq1_m` read each group as grid indices (four of 8 codes
or eight of 4), a sign bit per code (IQ2 / IQ3; `ksigns_iq2xs` expands IQ2_XXS / IQ2_XS / IQ3_XXS's 7 stored bits
to 8 with their parity) and, for IQ1, codes -1 / 0 / 1 straight from the grid. As ggml's AVX2 `vec_dot`s do, the
grid entries stay unsigned and the signs go onto the activations instead:

- `iq_grid` / `grid_at`: a group's grid entries in one vector (ggml's `_mm256_set_epi64x` / `_epi32` of scalar
  loads), the indices computed in scalar IR or, for IQ3_S and IQ1_M, for the whole super-block in vector IR
  (`iq3s_indices`, `iq1m_fields`, which also unpacks IQ1_M's scales and delta signs);
- `iq_signs`: the 256 sign bits of a whole super-block at once, a u32 per group (bit j: element j negative): the
  stored bytes of IQ2_S / IQ3_S, and for the others the 7-bit fields spread to bytes and completed with their
  parity (`llvm.ctpop` per byte: `vpopcntb` with AVX512-BITALG), which is what ksigns_iq2xs tabulates;
- `vneg_where`: activations negated under such a mask (`vpsubb` under a `k` mask with AVX512BW), ggml's
  `_mm256_sign_epi8(q8, signs)`; a negated activation times the unsigned entry is the signed product, exactly;
- `tile_bytes`, `transpose16`, `scales_row`, `pair_rows`: rows into kxtile's transposed tile layout.

Block layouts: ggml-common.h `block_iq2_xxs` ....
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.kernels.simd import i8x32, lane_index, ptr2d

_I1 = ir.IntType(1)
_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V32I8 = ir.VectorType(_I8, 32)
_V8I32 = ir.VectorType(_I32, 8)

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


class _Reads:
    """Little-endian reads at byte offset off + k of a super-block (`start`: its first byte), zero-extended to i32."""

    def __init__(self, builder, start, off):
        self.b, self.start, self.off = builder, start, off

    def ptr(self, k, ty):
        b = self.b
        return b.bitcast(b.gep(self.start, [b.sext(b.add(self.off, _c32(k)), _I64)]), ty.as_pointer())

    def byte(self, k):
        return self.b.zext(self.b.load(self.ptr(k, _I8)), _I32)

    def u16(self, k):  # an unaligned little-endian load (x86)
        return self.b.zext(self.b.load(self.ptr(k, _I16), align=1), _I32)

    def load(self, k, ty):
        return self.b.load(self.ptr(k, ty), align=1)


def _group_grid(t, context, builder, sig, args):
    blocks_ty, grid_ty = sig.args[1], sig.args[5]
    _, blocks, r, o, ib, grid = args
    b = builder
    start = ptr2d(context, builder, blocks_ty, blocks, r, o, _I8)  # the super-block's first byte
    gi = b.trunc(ib, _I32)

    def at(base, scale):  # reads from byte base + scale * ib of the super-block
        return _Reads(b, start, b.add(_c32(base), b.mul(gi, _c32(scale))))

    if t == IQ2_XXS or t == IQ3_XXS:
        g = at(2, 8)
        idx = [g.byte(k) for k in range(4 if t == IQ2_XXS else 8)]
    elif t == IQ2_XS:
        g = at(2, 8)
        idx = [b.and_(g.u16(2 * k), _c32(511)) for k in range(4)]
    elif t == IQ2_S:
        g, qh = at(2, 4), at(66, 1).byte(0)
        idx = [b.or_(g.byte(k), b.and_(b.shl(qh, _c32(8 - 2 * k)), _c32(0x300))) for k in range(4)]
    else:  # IQ1_S (IQ3_S and IQ1_M: iq3s_indices / iq1m_fields, then grid_at)
        g, qh = at(2, 4), at(34, 2).u16(0)
        idx = [b.or_(g.byte(k), b.shl(b.and_(b.lshr(qh, _c32(3 * k)), _c32(7)), _c32(8))) for k in range(4)]
    return _entries(context, b, grid_ty, grid, idx)


@intrinsic
def iq_grid(typingctx, t, blocks, r, o, ib, grid):
    """The grid entries (i8x32) of group ib (0..7) of the super-block at blocks[r, o:] of ggml type t (a literal;
    IQ3_S / IQ1_M go through `grid_at`): unsigned for the IQ2 / IQ3 types (`iq_signs` has their signs), -1 / 0 / 1
    for IQ1_S. grid: the type's
    codebook as a 1-D uint64 (8 codes per entry) or uint32 (4) array."""
    if not isinstance(t, types.IntegerLiteral) or t.literal_value in (IQ3_S, IQ1_M):
        return None
    tv = t.literal_value
    sig = i8x32(t, blocks, types.intp, types.intp, types.intp, grid)

    def codegen(context, builder, sig, args):
        return _group_grid(tv, context, builder, sig, args)

    return sig, codegen


def _with_parity(builder, v):
    """Bytes of 7 sign bits -> with bit 7 their parity (ksigns_iq2xs[v]: an even count of negative codes)."""
    pop = builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V32I8, [_V32I8]),
                                                      "llvm.ctpop.v32i8"), [v])
    return builder.or_(v, builder.shl(builder.and_(pop, ir.Constant(_V32I8, [1] * 32)), ir.Constant(_V32I8, [7] * 32)))


def _spread7(builder, aux):
    """<8 x i32> words of 4 x 7 sign bits (bits 7k..7k+6: entry k) -> <32 x i8>, byte 4g + k entry k of word g."""
    out = None
    for k in range(4):
        f = builder.and_(builder.lshr(aux, ir.Constant(_V8I32, [7 * k] * 8)), ir.Constant(_V8I32, [127] * 8))
        f = builder.shl(f, ir.Constant(_V8I32, [8 * k] * 8))
        out = f if out is None else builder.or_(out, f)
    return builder.bitcast(out, _V32I8)


def _block_signs(t, builder, start):
    def load(off, ty):
        return builder.load(builder.bitcast(builder.gep(start, [ir.Constant(_I64, off)]), ty.as_pointer()), align=1)

    if t == IQ2_XXS:  # the odd u32 of each group's pair: 4 x 7 sign bits and the scale
        words = load(2, ir.VectorType(_I32, 16))
        return _with_parity(builder, _spread7(builder, builder.shuffle_vector(words, words,
                                                                             lane_index(range(1, 16, 2)))))
    if t == IQ3_XXS:  # scales_and_signs: a u32 per group after the 64 index bytes
        return _with_parity(builder, _spread7(builder, load(66, _V8I32)))
    if t == IQ2_XS:  # 7 sign bits above each 9-bit index
        q = load(2, ir.VectorType(_I16, 32))
        return _with_parity(builder, builder.trunc(builder.lshr(q, ir.Constant(q.type, [9] * 32)), _V32I8))
    return load(34 if t == IQ2_S else 74, _V32I8)  # stored as bits


@intrinsic
def iq_signs(typingctx, t, blocks, r, o, sg, col):
    """The sign masks of the eight groups of the super-block at blocks[r, o:] of ggml type t (a literal, an IQ2 /
    IQ3 type) into sg[0, col:col + 8] (a 2-D uint32 array): bit j of word g set where element j of group g is
    negative."""
    if not isinstance(t, types.IntegerLiteral) or t.literal_value in (IQ1_S, IQ1_M):
        return None
    tv = t.literal_value
    sig = types.void(t, blocks, types.intp, types.intp, sg, types.intp)

    def codegen(context, builder, sig, args):
        start = ptr2d(context, builder, sig.args[1], args[1], args[2], args[3], _I8)
        dst = ptr2d(context, builder, sig.args[4], args[4], ir.Constant(args[5].type, 0), args[5], _V32I8)
        builder.store(_block_signs(tv, builder, start), dst, align=1)
        return context.get_dummy_value()

    return sig, codegen


def _mask(builder, bits):
    return builder.bitcast(builder.trunc(bits, _I32) if bits.type.width > 32 else builder.zext(bits, _I32)
                           if bits.type.width < 32 else bits, ir.VectorType(_I1, 32))


@intrinsic
def vneg_where(typingctx, x, bits):
    """x (i8x32) with byte j negated where bit j of the integer `bits` is set (ggml's `_mm256_sign_epi8`; -128
    stays -128, as there)."""
    if not isinstance(bits, types.Integer):
        return None
    sig = i8x32(i8x32, bits)

    def codegen(context, builder, sig, args):
        x = args[0]
        return builder.select(_mask(builder, args[1]), builder.neg(x), x)

    return sig, codegen


@intrinsic
def vsign_bits(typingctx, codes):
    """The sign bits of 32 signed bytes as a uint32 (`vpmovb2m`): IQ1's grid codes as a sign mask."""
    sig = types.uint32(i8x32)

    def codegen(context, builder, sig, args):
        neg = builder.icmp_signed("<", args[0], ir.Constant(_V32I8, None))
        return builder.bitcast(neg, _I32)

    return sig, codegen


@intrinsic
def vabs1(typingctx, codes):
    """|c| of codes -1 / 0 / 1 (c & 1)."""
    sig = i8x32(i8x32)

    def codegen(context, builder, sig, args):
        return builder.and_(args[0], ir.Constant(_V32I8, [1] * 32))

    return sig, codegen


@intrinsic
def vones(typingctx):
    """32 bytes of 1: IQ1_M's deltas (+-1, their signs on the activations) dotted as unsigned ones."""
    sig = i8x32()

    def codegen(context, builder, sig, args):
        return ir.Constant(_V32I8, [1] * 32)

    return sig, codegen


@intrinsic
def tile_bytes(typingctx, iq1, grid, bits, dbits):
    """A group's codes as kxtile's IQ4_XS tile holds them: c + 128 with c the unsigned entries `grid` negated
    under `bits`; IQ1 (`iq1` a literal 1) 8 c + delta + 128, delta -1 where bit j of `dbits` is set, else 1."""
    if not isinstance(iq1, types.Literal):
        return None
    one = bool(iq1.literal_value)
    sig = i8x32(iq1, i8x32, bits, dbits)

    def codegen(context, builder, sig, args):
        c = builder.select(_mask(builder, args[2]), builder.neg(args[1]), args[1])
        if one:
            ones = ir.Constant(_V32I8, [1] * 32)
            delta = builder.select(_mask(builder, args[3]), builder.neg(ones), ones)
            c = builder.add(builder.shl(c, ir.Constant(_V32I8, [3] * 32)), delta)
        return builder.xor(c, ir.Constant(_V32I8, [0x80] * 32))

    return sig, codegen


def _dup_bytes(builder, v16):
    """<16 x i8> -> <32 x i8> with each byte twice."""
    return builder.shuffle_vector(v16, v16, lane_index([e // 2 for e in range(32)]))


@intrinsic
def iq1m_fields(typingctx, blocks, r, o, idx, sc8, dsg, b):
    """IQ1_M super-block b at blocks[r, o:], vectorised: its 32 grid indices into idx[0, 64 b:] (uint16: qs byte
    | 3 bits of qh << 8), its 16 scales 2 s + 1 into sc8[0, 16 b:] and its delta masks (a bit per element, set
    where the delta is -1: bit 3 / 7 of each qh nibble) into dsg[0, 8 b:]."""
    sig = types.void(blocks, types.intp, types.intp, idx, sc8, dsg, types.intp)

    def codegen(context, builder, sig, args):
        bl, r, o, idx_a, sc_a, dsg_a, b = args
        start = ptr2d(context, builder, sig.args[0], bl, r, o, _I8)

        def load(off, ty):
            return builder.load(builder.bitcast(builder.gep(start, [ir.Constant(_I64, off)]), ty.as_pointer()),
                                align=1)

        zero = ir.Constant(b.type, 0)
        v32i16 = ir.VectorType(_I16, 32)
        qs = builder.zext(load(0, _V32I8), v32i16)
        qh = _dup_bytes(builder, load(32, ir.VectorType(_I8, 16)))  # entry e's byte qh[e // 2]
        hi = builder.lshr(builder.zext(qh, v32i16), ir.Constant(v32i16, [4 * (e % 2) for e in range(32)]))
        ids = builder.or_(qs, builder.shl(builder.and_(hi, ir.Constant(v32i16, [7] * 32)),
                                          ir.Constant(v32i16, [8] * 32)))
        col = builder.mul(b, ir.Constant(b.type, 64))
        builder.store(ids, ptr2d(context, builder, sig.args[3], idx_a, zero, col, v32i16), align=1)
        neg = builder.icmp_unsigned("!=", builder.and_(qh, ir.Constant(_V32I8, [8 if e % 2 == 0 else 0x80
                                                                            for e in range(32)])),
                                    ir.Constant(_V32I8, None))  # entry e's delta sign
        # word g: bits 8k..8k+7 all set where entry 4g + k's delta is -1: the entries' bytes sign-extended
        masks = builder.bitcast(builder.sext(neg, _V32I8), _V8I32)
        builder.store(masks, ptr2d(context, builder, sig.args[5], dsg_a, zero, builder.mul(b, ir.Constant(b.type, 8)),
                                   _V8I32), align=1)
        v16i16 = ir.VectorType(_I16, 16)
        w = load(48, ir.VectorType(_I16, 4))
        ws = builder.shuffle_vector(w, w, lane_index([s // 4 for s in range(16)]))
        sc = builder.and_(builder.lshr(ws, ir.Constant(v16i16, [3 * (s % 4) for s in range(16)])),
                          ir.Constant(v16i16, [7] * 16))
        sc = builder.add(builder.shl(sc, ir.Constant(v16i16, [1] * 16)), ir.Constant(v16i16, [1] * 16))
        builder.store(builder.trunc(sc, ir.VectorType(_I8, 16)),
                      ptr2d(context, builder, sig.args[4], sc_a, zero, builder.mul(b, ir.Constant(b.type, 16)),
                            ir.VectorType(_I8, 16)), align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def grid_at(typingctx, idx, col, grid):
    """The grid entries of the uint16 indices idx[0, col:col + n] as one i8x32: n = 4 of a uint64 grid (eight
    codes each), 8 of a uint32 one."""
    sig = i8x32(idx, types.intp, grid)
    n = 4 if grid.dtype.bitwidth == 64 else 8

    def codegen(context, builder, sig, args):
        idx_a, col, grid_a = args
        p = ptr2d(context, builder, sig.args[0], idx_a, ir.Constant(col.type, 0), col, _I16)
        ids = [builder.zext(builder.load(builder.gep(p, [ir.Constant(_I64, k)])), _I32) for k in range(n)]
        return _entries(context, builder, sig.args[2], grid_a, ids)

    return sig, codegen


@intrinsic
def iq3s_indices(typingctx, blocks, r, o, idx, b):
    """IQ3_S super-block b at blocks[r, o:], vectorised: its 64 grid indices (qs byte | bit e % 8 of the group's
    qh byte << 8) into idx[0, 64 b:] (uint16)."""
    sig = types.void(blocks, types.intp, types.intp, idx, types.intp)

    def codegen(context, builder, sig, args):
        bl, r, o, idx_a, b = args
        start = ptr2d(context, builder, sig.args[0], bl, r, o, _I8)

        def load(off, ty):
            return builder.load(builder.bitcast(builder.gep(start, [ir.Constant(_I64, off)]), ty.as_pointer()),
                                align=1)

        v64i8, v64i16 = ir.VectorType(_I8, 64), ir.VectorType(_I16, 64)
        qs = builder.zext(load(2, v64i8), v64i16)
        qh = load(66, ir.VectorType(_I8, 8))
        qh = builder.shuffle_vector(qh, qh, lane_index([e // 8 for e in range(64)]))
        bit = builder.icmp_unsigned("!=", builder.and_(qh, ir.Constant(v64i8, [1 << (e % 8) for e in range(64)])),
                                    ir.Constant(v64i8, None))
        ids = builder.or_(qs, builder.shl(builder.zext(bit, v64i16), ir.Constant(v64i16, [8] * 64)))
        col = builder.mul(b, ir.Constant(b.type, 64))
        builder.store(ids, ptr2d(context, builder, sig.args[3], idx_a, ir.Constant(b.type, 0), col, v64i16),
                      align=1)
        return context.get_dummy_value()

    return sig, codegen


_V16I32 = ir.VectorType(_I32, 16)


@intrinsic
def transpose16(typingctx, src, col, dst, row):
    """dst[row + q, 0:16] = src[0:16, col + q] for q < 16 (2-D uint32 / int32 arrays, dst 16 wide): a 16 x 16 block
    of words transposed in registers, four stages of block swaps (`vpermt2d`), so that a tile's 16 rows are
    written whole instead of a word at a time down the columns."""
    sig = types.void(src, types.intp, dst, types.intp)

    def codegen(context, builder, sig, args):
        s, col, d, row = args
        rows = [builder.load(ptr2d(context, builder, sig.args[0], s, ir.Constant(col.type, k), col, _V16I32),
                             align=4) for k in range(16)]
        for m in (8, 4, 2, 1):  # swap the off-diagonal m x m blocks of every 2m x 2m block
            new = list(rows)
            for i in range(16):
                if i & m:
                    continue
                j = i | m
                new[i] = builder.shuffle_vector(rows[i], rows[j], lane_index(
                    [c if c & m == 0 else 16 + c - m for c in range(16)]))
                new[j] = builder.shuffle_vector(rows[i], rows[j], lane_index(
                    [c + m if c & m == 0 else 16 + c for c in range(16)]))
            rows = new
        for q in range(16):
            builder.store(rows[q], ptr2d(context, builder, sig.args[2], d,
                                         builder.add(row, ir.Constant(row.type, q)), ir.Constant(row.type, 0),
                                         _V16I32), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def scales_row(typingctx, sc8, col, dst, row, dcol):
    """The 16 scales sc8[0, col:col + 16] (u8) as int32 into dst[row, dcol:dcol + 16]."""
    sig = types.void(sc8, types.intp, dst, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        sc, col, d, row, dcol = args
        raw = builder.load(ptr2d(context, builder, sig.args[0], sc, ir.Constant(col.type, 0), col,
                                 ir.VectorType(_I8, 16)), align=1)
        builder.store(builder.zext(raw, _V16I32), ptr2d(context, builder, sig.args[2], d, row, dcol, _V16I32),
                      align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def pair_rows(typingctx, tsc, tsc2w, row):
    """tsc2w[row // 2, :] = tsc[row, :] as the low int16 | tsc[row + 1, :] as the high one (16 lanes): the scale
    pairs of kxtile's `imaddwd`."""
    sig = types.void(tsc, tsc2w, types.intp)

    def codegen(context, builder, sig, args):
        a, d, row = args
        zero = ir.Constant(row.type, 0)
        lo = builder.load(ptr2d(context, builder, sig.args[0], a, row, zero, _V16I32), align=4)
        hi = builder.load(ptr2d(context, builder, sig.args[0], a, builder.add(row, ir.Constant(row.type, 1)), zero,
                                _V16I32), align=4)
        v = builder.or_(builder.and_(lo, ir.Constant(_V16I32, [0xFFFF] * 16)),
                        builder.shl(hi, ir.Constant(_V16I32, [16] * 16)))
        builder.store(v, ptr2d(context, builder, sig.args[1], d, builder.sdiv(row, ir.Constant(row.type, 2)), zero,
                               _V16I32), align=4)
        return context.get_dummy_value()

    return sig, codegen

"""IQ2_XXS super-blocks straight into the rows of klowbit.py's tile (llvmlite intrinsics): ggml-quants.c
`dequantize_row_iq2_xxs`'s grid entries, signs and scales, a whole super-block of one weight row per call.

klowbit's generic decode (kiqcodes.py) builds one 32-element group at a time: its four grid entries, then its signs
from a mask, then the tile's bytes, then the scales, each through a row buffer. For IQ2_XXS, the MoE experts' type
whose prompt matmuls spend ~30% of their time in that decode (issue #46), `iq2xxs_tile_row` does the super-block in
four 64-byte steps instead: the eight grid entries of two groups (`iq2xxs_grid`'s uint64 codebook, eight codes
each) in one <8 x i64> vector, the 64 sign bits of those groups (kiqcodes' `_block_signs`: the stored 7 bits and
their parity, which is `ksigns_iq2xs`) as one mask, c + 128 of the signed codes written to the tile row in one store
(kxtile's IQ4_XS tile: the codes + 128), and the eight 4-bit scales as 2 s + 1 per 16 elements in one more.
Integers only: the tile holds exactly the bytes kiqcodes.tile_bytes gives.

Block layout: ggml-common.h `block_iq2_xxs`: d (f16), qs (u16 x 32): per group of 32, four index bytes then a u32
of 4 x 7 sign bits and the scale in its top nibble.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from llamactx.ggml.kernels.kiqcodes import IQ2_XXS, _block_signs
from llamactx.ggml.kernels.simd import lane_index, ptr2d

_I1 = ir.IntType(1)
_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V64I8 = ir.VectorType(_I8, 64)
_V8I64 = ir.VectorType(_I64, 8)
_V4I64 = ir.VectorType(_I64, 4)
_V16I32 = ir.VectorType(_I32, 16)


def _pair_entries(context, builder, grid_ty, grid, start, p):
    """The grid entries of groups 2p and 2p + 1 (index bytes 2 + 16 p + 0..3 and + 8..11) as one <64 x i8>: eight
    scalar loads (`vpgatherdq` measured slower on Zen 4)."""
    ary = context.make_array(grid_ty)(context, builder, grid)
    vec = ir.Constant(_V8I64, ir.Undefined)
    for m in range(8):
        off = 2 + 16 * p + 8 * (m // 4) + m % 4
        idx = builder.zext(builder.load(builder.gep(start, [ir.Constant(_I64, off)])), _I64)
        vec = builder.insert_element(vec, builder.load(builder.gep(ary.data, [idx])), ir.Constant(_I32, m))
    return builder.bitcast(vec, _V64I8)


def _scales(builder, start):
    """The super-block's 16 scales 2 s + 1 per 16 elements as <16 x i32>: s the top nibble of group g's sign word
    (the u32 at byte 6 + 8 g), for sub-blocks 2 g and 2 g + 1."""
    words = builder.load(builder.bitcast(builder.gep(start, [ir.Constant(_I64, 2)]), _V16I32.as_pointer()), align=1)
    aux = builder.shuffle_vector(words, words, lane_index([2 * (e // 2) + 1 for e in range(16)]))
    s = builder.lshr(aux, ir.Constant(_V16I32, [28] * 16))
    return builder.or_(builder.shl(s, ir.Constant(_V16I32, [1] * 16)), ir.Constant(_V16I32, [1] * 16))


@intrinsic
def iq2xxs_tile_row(typingctx, blocks, r, o, grid, rows8, lane, col, scs, scol):
    """The IQ2_XXS super-block at blocks[r, o:] (a 2-D uint8 array) into tile row `lane`: its 256 codes as c + 128
    (c the signed grid codes) at rows8[lane, col:col + 256] (uint8) and its 16 scales (2 s + 1 per 16 elements) as
    int32 at scs[lane, scol:scol + 16]. grid: iq2xxs_grid as a 1-D uint64 array."""
    sig = types.void(blocks, types.intp, types.intp, grid, rows8, types.intp, types.intp, scs, types.intp)

    def codegen(context, builder, sig, args):
        bl, r, o, grid, rows, lane, col, sc, scol = args
        start = ptr2d(context, builder, sig.args[0], bl, r, o, _I8)
        signs = builder.bitcast(_block_signs(IQ2_XXS, builder, start), _V4I64)  # 64 sign bits per pair of groups
        for p in range(4):
            g = _pair_entries(context, builder, sig.args[3], grid, start, p)
            neg = builder.bitcast(builder.extract_element(signs, ir.Constant(_I32, p)), ir.VectorType(_I1, 64))
            c = builder.xor(builder.select(neg, builder.neg(g), g), ir.Constant(_V64I8, [0x80] * 64))
            dst = ptr2d(context, builder, sig.args[4], rows, lane, builder.add(col, ir.Constant(col.type, 64 * p)),
                        _V64I8)
            builder.store(c, dst, align=1)
        builder.store(_scales(builder, start), ptr2d(context, builder, sig.args[7], sc, lane, scol, _V16I32), align=4)
        return context.get_dummy_value()

    return sig, codegen

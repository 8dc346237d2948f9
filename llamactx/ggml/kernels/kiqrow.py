"""IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and IQ1_M matmuls of one activation row (a decoded token), compiled:
ggml-cpu's x86 `ggml_vec_dot_iq*_q8_K` (arch/x86/quants.c), each super-block decoded straight into registers.

klowbit.vec_rows decodes a whole weight row into buffers first so that up to seven activation rows reuse it; with
one activation row that round trip through memory (and its per-group type tests) was most of the cost. Here the
type is a compile-time constant (`row1_rows` inlines `_rows` once per type) and each 32-element group goes from
the block's bytes to its eight int32 lanes without a store:

- the grid entries: kiqcodes.iq_grid, or for IQ3_S grid_at on the super-block's indices unpacked as
  vectors (iq3s_indices: cheaper here than scalar index arithmetic per entry);
- the signs onto the activations (`vneg_where`: ggml's `_mm256_sign_epi8`), a u32 of the block's stored sign bits
  (IQ3_S, IQ2_S) or of kiqcodes.iq_signs' words (their 7-bit fields completed with the parity);
- `vdot` of the unsigned entries and the signed activations, times the two 16-element sub-block scales (`vpair`),
  summed over the super-block's groups; acc = fma(float(lane), d_w * d_x, acc); out = post * hsum_float_8(acc).
- IQ2_XS (`iq2xs_sums`): ggml's AVX2 order too, two groups per 512-bit step, the int16 pairs of pmaddubsw times the
  16-element scales by pmaddwd (`vpdpwssd`), where the generic group above multiplies int32 lanes (`vpmulld`);
- IQ1_M (`iq1m_sums`), two groups per 512-bit step, the int16 pairs of ggml's AVX2 kernel: codes c in -1 / 0 / 1
  as pmaddubsw(c + 1, x) - (x_2i + x_2i+1) (`_G1P` holds the grid + 1: unsigned, no sign step; the pair sums of
  the activation row, `x_pairs`, are made once per call), times the 16-element scales by pmaddwd (`vpdpwssd` with
  AVX512-VNNI): ggml's p1 + p2 with no int32 multiply. Its deltas (+-1 per 8 elements) are the pair sums of x
  times the scales negated where the delta is -1. The grid indices, scales and delta masks of a whole row come
  first (kiqcodes.iq1m_fields into buffers), so the scalar index reads never wait on the vector stores; the row's
  sums then read them back. acc2 holds the deltas' lanes, as ggml's accum2: out = fma(post, hsum(acc2), hsum(acc)).

Integer lane sums are exact in any order, the float steps are ggml's: bit-identical to klowbit.vec_rows
(tests/ggml/test_klowbit.py) and to libggml (tests/models/test_tiny_quant_types.py). IQ1_S stays in klowbit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.intrinsics import f16_to_f32, fma32
from llamactx.ggml.kernels.kiqcodes import (
    IQ1_M,
    IQ2_S,
    IQ2_XS,
    IQ2_XXS,
    IQ3_S,
    IQ3_XXS,
    grid_at,
    iq1m_fields,
    iq3s_indices,
    iq_grid,
    iq_signs,
    vneg_where,
)
from llamactx.ggml.kernels.simd import TagType, fmadd_i, fsum, fzero, i32x8, lane_index, ptr2d, splat, vload
from llamactx.ggml.kernels.vnni import _pairwise, imuladd_v, izero, vdot
from llamactx.gguf.iq_grids import IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID

ROW1_TYPES = (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_M)

_G2XXS = np.ascontiguousarray(IQ2XXS_GRID).view(np.uint64).ravel()  # (256,) eight codes per entry
_G2XS = np.ascontiguousarray(IQ2XS_GRID).view(np.uint64).ravel()  # (512,)
_G2S = np.ascontiguousarray(IQ2S_GRID).view(np.uint64).ravel()  # (1024,)
_G3XXS = np.ascontiguousarray(IQ3XXS_GRID).view(np.uint32).ravel()  # (256,) four codes
_G3S = np.ascontiguousarray(IQ3S_GRID).view(np.uint32).ravel()  # (512,)
_G1S = np.ascontiguousarray(IQ1S_GRID).view(np.uint64).ravel()  # (2048,) -1 / 0 / 1 bytes
_G1P = (np.ascontiguousarray(IQ1S_GRID).astype(np.int8) + 1).astype(np.uint8).view(np.uint64).ravel()  # 0 / 1 / 2
_I1 = ir.IntType(1)
_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V8I32 = ir.VectorType(_I32, 8)
_V16I32 = ir.VectorType(_I32, 16)
_V32I16 = ir.VectorType(_I16, 32)
_V64I8 = ir.VectorType(_I8, 64)


def _block_read(width):
    """An intrinsic (arr, row, col) -> the little-endian u<width> at byte [row, col] of a 2-D uint8 array (or
    element [row, col] of a uint32 one) as uint32: numba's indexing would test each index for wraparound."""

    def typer(typingctx, arr, row, col):
        def codegen(context, builder, sig, args):
            ty = ir.IntType(width)
            v = builder.load(ptr2d(context, builder, sig.args[0], args[0], args[1], args[2], ty), align=1)
            return builder.zext(v, _I32) if width < 32 else v

        return types.uint32(arr, types.intp, types.intp), codegen

    typer.__name__ = typer.__qualname__ = f"u{width}_at"
    return intrinsic(typer)


u8_at, u16_at, u32_at = _block_read(8), _block_read(16), _block_read(32)


@intrinsic
def vpair(typingctx, s0, s1):
    """i32x8 [s0, s0, s0, s0, s1, s1, s1, s1]: the scales of a group's two 16-element halves on `vdot`'s lanes."""
    sig = i32x8(types.int32, types.int32)

    def codegen(context, builder, sig, args):
        a, b = splat(builder, args[0], 8), splat(builder, args[1], 8)
        return builder.shuffle_vector(a, b, ir.Constant(_V8I32, [0, 0, 0, 0, 8, 8, 8, 8]))

    return sig, codegen


def _maddubs(builder, u, s):
    """pmaddubsw of 64 bytes: u8(u) * s8(s), adjacent products added, <32 x i16> (exact: u <= 2 here)."""
    if cpu_features()["avx2"]:
        return _pairwise(builder, "maddubs", u, s)
    w = ir.VectorType(_I16, 64)
    p = builder.mul(builder.zext(u, w), builder.sext(s, w))
    return builder.add(builder.shuffle_vector(p, p, lane_index(range(0, 64, 2))),
                       builder.shuffle_vector(p, p, lane_index(range(1, 64, 2))))


def _madd_wd(builder, vnni, acc, a, b):
    """acc + pmaddwd(a, b) (<32 x i16> each -> <16 x i32>): one `vpdpwssd` with AVX512-VNNI."""
    if vnni:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16I32, [_V16I32] * 3),
                                            "llvm.x86.avx512.vpdpwssd.512")
        return builder.call(fn, [acc, builder.bitcast(a, _V16I32), builder.bitcast(b, _V16I32)])
    if cpu_features()["avx2"]:
        return builder.add(acc, _pairwise(builder, "maddwd", a, b))
    v32 = ir.VectorType(_I32, 32)
    p = builder.mul(builder.sext(a, v32), builder.sext(b, v32))
    return builder.add(acc, builder.add(builder.shuffle_vector(p, p, lane_index(range(0, 32, 2))),
                                        builder.shuffle_vector(p, p, lane_index(range(1, 32, 2)))))


@intrinsic
def x_pairs(typingctx, xq, c, x2):
    """x2[0, c/2:c/2 + 32] = the sums of adjacent pairs of xq[0, c:c + 64] (int8 -> int16): what IQ1_M's unsigned
    codes c + 1 add over the signed c."""
    sig = types.void(xq, types.intp, x2)

    def codegen(context, builder, sig, args):
        xq, c, x2 = args
        zero = ir.Constant(c.type, 0)
        x = builder.load(ptr2d(context, builder, sig.args[0], xq, zero, c, _V64I8), align=1)
        pairs = _maddubs(builder, ir.Constant(_V64I8, [1] * 64), x)
        builder.store(pairs, ptr2d(context, builder, sig.args[2], x2, zero, builder.sdiv(c, ir.Constant(c.type, 2)),
                                   _V32I16), align=1)
        return context.get_dummy_value()

    return sig, codegen


def _iq1m_sums(context, builder, sig, args):
    path_ty, xq_ty, x2_ty, idx_ty, sc8_ty, dsg_ty, _, grid_ty = sig.args
    _, xq, x2, idx, sc8, dsg, b, grid = args
    bld = builder
    vnni = path_ty.tag_name == "vnni" and cpu_features()["avx512vnni"]
    zero = ir.Constant(b.type, 0)

    def at(arr_ty, arr, col, ty):
        return ptr2d(context, bld, arr_ty, arr, zero, col, ty)

    def col(scale, add=0):
        return bld.add(bld.mul(b, ir.Constant(b.type, scale)), ir.Constant(b.type, add))

    v16i16 = ir.VectorType(_I16, 16)
    sc = bld.zext(bld.load(at(sc8_ty, sc8, col(16), ir.VectorType(_I8, 16)), align=1), v16i16)  # 2 s + 1
    neg = bld.icmp_unsigned("!=", bld.load(at(dsg_ty, dsg, col(8), ir.VectorType(_I8, 32)), align=1),
                            ir.Constant(ir.VectorType(_I8, 32), None))  # entry e's delta is -1
    ids = at(idx_ty, idx, col(64), _I16)
    table = context.make_array(grid_ty)(context, bld, grid).data
    sum1 = sum2 = ir.Constant(_V16I32, None)
    for p in range(4):  # groups 2p, 2p + 1: entries 8p .. 8p + 7, elements 64p .. 64p + 63
        g = ir.Constant(ir.VectorType(_I64, 8), ir.Undefined)
        for k in range(8):
            i = bld.zext(bld.load(bld.gep(ids, [ir.Constant(_I64, 8 * p + k)])), _I64)
            g = bld.insert_element(g, bld.load(bld.gep(table, [i])), ir.Constant(_I32, k))
        x = bld.load(at(xq_ty, xq, col(256, 64 * p), _V64I8), align=1)
        xp = bld.load(at(x2_ty, x2, col(128, 32 * p), _V32I16), align=1)
        pairs = bld.sub(_maddubs(bld, bld.bitcast(g, _V64I8), x), xp)  # int16 k: c . x over elements 2k, 2k + 1
        s16 = bld.shuffle_vector(sc, sc, lane_index([4 * p + k // 8 for k in range(32)]))  # its 16-element scale
        ds = bld.select(bld.shuffle_vector(neg, neg, lane_index([8 * p + k // 4 for k in range(32)])),
                        bld.sub(ir.Constant(_V32I16, None), s16), s16)
        sum1 = _madd_wd(bld, vnni, sum1, pairs, s16)
        sum2 = _madd_wd(bld, vnni, sum2, xp, ds)

    def lanes(v):  # both groups' lanes onto ggml's eight: p1 + p2
        return bld.add(bld.shuffle_vector(v, v, lane_index(range(8))),
                       bld.shuffle_vector(v, v, lane_index(range(8, 16))))

    return context.make_tuple(bld, sig.return_type, [lanes(sum1), lanes(sum2)])


@intrinsic
def iq1m_sums(typingctx, path, xq, x2, idx, sc8, dsg, b, grid):
    """ggml_vec_dot_iq1_m_q8_K's (sumi1, sumi2) (two i32x8) of IQ1_M super-block b of a row whose fields
    kiqcodes.iq1m_fields wrote into idx, sc8 and dsg, against xq[0, 256 b:] (x2: `x_pairs` of xq; grid: `_G1P`)."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None
    sig = types.UniTuple(i32x8, 2)(path, xq, x2, idx, sc8, dsg, types.intp, grid)
    return sig, _iq1m_sums


@intrinsic
def iq2xs_sums(typingctx, path, blocks, r, o, xq, c, sg, grid):
    """ggml_vec_dot_iq2_xs_q8_K's sumi1 + sumi2 (i32x8) of the IQ2_XS super-block at blocks[r, o:] against
    xq[0, c:c + 256], two groups per 512-bit step as in `iq1m_sums`: the grid entries (`_G2XS`) by pmaddubsw
    against x negated under the super-block's sign words sg (kiqcodes.iq_signs), by pmaddwd (`vpdpwssd`) times the
    16-element scales 2 s + 1 of its nibbles."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None
    sig = i32x8(path, blocks, types.intp, types.intp, xq, types.intp, sg, grid)

    def codegen(context, builder, sig, args):
        path_ty, blocks_ty, _, _, xq_ty, _, sg_ty, grid_ty = sig.args
        _, blocks, r, o, xq, c, sg, grid = args
        bld = builder
        vnni = path_ty.tag_name == "vnni" and cpu_features()["avx512vnni"]
        start = ptr2d(context, bld, blocks_ty, blocks, r, o, _I8)

        def load(off, ty):
            return bld.load(bld.bitcast(bld.gep(start, [ir.Constant(_I64, off)]), ty.as_pointer()), align=1)

        v16i16 = ir.VectorType(_I16, 16)
        raw = load(66, ir.VectorType(_I8, 8))  # a nibble per 16 elements
        sc = bld.zext(bld.shuffle_vector(raw, raw, lane_index([j // 2 for j in range(16)])), v16i16)
        sc = bld.and_(bld.lshr(sc, ir.Constant(v16i16, [4 * (j % 2) for j in range(16)])),
                      ir.Constant(v16i16, [15] * 16))
        sc = bld.add(bld.shl(sc, ir.Constant(v16i16, [1] * 16)), ir.Constant(v16i16, [1] * 16))
        table = context.make_array(grid_ty)(context, bld, grid).data
        zero = ir.Constant(c.type, 0)
        signs = ptr2d(context, bld, sg_ty, sg, zero, zero, _I64)  # two groups' sign words as one u64
        acc = ir.Constant(_V16I32, None)
        for p in range(4):  # groups 2p, 2p + 1
            g = ir.Constant(ir.VectorType(_I64, 8), ir.Undefined)
            for k in range(8):  # 9-bit grid index, 7 sign bits
                i = bld.zext(bld.and_(load(2 + 2 * (8 * p + k), _I16), ir.Constant(_I16, 511)), _I64)
                g = bld.insert_element(g, bld.load(bld.gep(table, [i])), ir.Constant(_I32, k))
            x = bld.load(ptr2d(context, bld, xq_ty, xq, zero, bld.add(c, ir.Constant(c.type, 64 * p)), _V64I8),
                         align=1)
            neg = bld.bitcast(bld.load(bld.gep(signs, [ir.Constant(_I64, p)]), align=4), ir.VectorType(_I1, 64))
            pairs = _maddubs(bld, bld.bitcast(g, _V64I8), bld.select(neg, bld.sub(ir.Constant(_V64I8, None), x), x))
            s16 = bld.shuffle_vector(sc, sc, lane_index([4 * p + k // 8 for k in range(32)]))
            acc = _madd_wd(bld, vnni, acc, pairs, s16)
        return bld.add(bld.shuffle_vector(acc, acc, lane_index(range(8))),
                       bld.shuffle_vector(acc, acc, lane_index(range(8, 16))))

    return sig, codegen


@njit(cache=True, inline="always")
def _nibbles(byte):  # pragma: no cover - compiled
    """The scales 2 ls + 1 of a byte's two 4-bit fields, on `vdot`'s lanes."""
    return vpair(np.int32(2 * (byte & 15) + 1), np.int32(2 * (byte >> 4) + 1))


@njit(cache=True, inline="always")
def _scales(t, blocks, r, o, ib):  # pragma: no cover - compiled
    """Group ib's scales (ggml-common.h's fields of each block type)."""
    if t == IQ2_XXS or t == IQ3_XXS:  # the top nibble of the group's u32 of signs and scale
        s = np.int32(2 * (u8_at(blocks, r, o + (9 + 8 * ib if t == IQ2_XXS else 69 + 4 * ib)) >> 4) + 1)
        return vpair(s, s)
    if t == IQ2_S:
        return _nibbles(u8_at(blocks, r, o + 74 + ib))
    s = np.int32(2 * ((u8_at(blocks, r, o + 106 + ib // 2) >> (4 * (ib % 2))) & 15) + 1)  # IQ3_S: a nibble per 32
    return vpair(s, s)


@njit(cache=True, inline="always")
def _group(path, t, lanes, blocks, r, o, ib, x, sg, idx):  # pragma: no cover - compiled
    """lanes + group ib's eight int32 lanes (its entries . x under its signs) times its scales."""
    sv = _scales(t, blocks, r, o, ib)
    if t == IQ2_XXS:
        g, bits = iq_grid(16, blocks, r, o, ib, _G2XXS), u32_at(sg, 0, ib)
    elif t == IQ2_S:
        g, bits = iq_grid(22, blocks, r, o, ib, _G2S), u32_at(blocks, r, o + 34 + 4 * ib)
    elif t == IQ3_XXS:
        g, bits = iq_grid(18, blocks, r, o, ib, _G3XXS), u32_at(sg, 0, ib)
    else:  # IQ3_S
        g, bits = grid_at(idx, 8 * ib, _G3S), u32_at(blocks, r, o + 74 + 4 * ib)
    return imuladd_v(lanes, vdot(path, izero(), g, vneg_where(x, bits)), sv)


@njit(cache=True, inline="always")
def _block_setup(t, blocks, r, o, sg, idx):  # pragma: no cover - compiled
    """The super-block's f16 d as float32, and what its groups read from buffers: the sign words sg (IQ2_XXS,
    IQ2_XS, IQ3_XXS) or the grid indices idx (IQ3_S)."""
    if t == IQ2_XXS:
        iq_signs(16, blocks, r, o, sg, 0)
    elif t == IQ2_XS:
        iq_signs(17, blocks, r, o, sg, 0)
    elif t == IQ3_XXS:
        iq_signs(18, blocks, r, o, sg, 0)
    elif t == IQ3_S:
        iq3s_indices(blocks, r, o, idx, 0)
    return f16_to_f32(np.uint16(u16_at(blocks, r, o)))


@njit(cache=True, inline="always")
def _row(path, t, post, blocks, r, xq, xd, sg, idx, out):  # pragma: no cover - compiled
    """out[0, r] = weight row r . the activation row, in ggml_vec_dot_iq*_q8_K's order (module docstring)."""
    nb = xd.shape[1]
    size = blocks.shape[1] // nb
    acc = fzero()
    for b in range(nb):
        o = b * size
        dw = _block_setup(t, blocks, r, o, sg, idx)
        if t == IQ2_XS:
            lanes = iq2xs_sums(path, blocks, r, o, xq, b * 256, sg, _G2XS)
        else:
            lanes = izero()
            for ib in range(8):
                lanes = _group(path, t, lanes, blocks, r, o, ib, vload(xq, 0, b * 256 + 32 * ib), sg, idx)
        acc = fmadd_i(acc, lanes, xd[0, b] * dw)
    out[0, r] = post * fsum(acc)


@njit(cache=True, inline="always")
def _row_iq1m(path, post, blocks, r, xq, xd, x2, idx, sc8, dsg, out):  # pragma: no cover - compiled
    """out[0, r] for IQ1_M weights: the row's fields first, then its super-blocks' sums (module docstring)."""
    nb = xd.shape[1]
    size = blocks.shape[1] // nb
    for b in range(nb):
        iq1m_fields(blocks, r, b * size, idx, sc8, dsg, b)
    acc, acc2 = fzero(), fzero()
    for b in range(nb):
        o = b * size
        sumi1, sumi2 = iq1m_sums(path, xq, x2, idx, sc8, dsg, b, _G1P)
        h = (u8_at(blocks, r, o + 49) >> 4) | (u8_at(blocks, r, o + 51) & 0xF0)  # iq1m_scale_t: d in the top
        dw = f16_to_f32(np.uint16(h | ((u8_at(blocks, r, o + 53) & 0xF0) << 4)  # nibbles of the scale words
                                  | ((u8_at(blocks, r, o + 55) & 0xF0) << 8)))
        d = xd[0, b] * dw
        acc = fmadd_i(acc, sumi1, d)
        acc2 = fmadd_i(acc2, sumi2, d)
    out[0, r] = fma32(post, fsum(acc2), fsum(acc))


@njit(cache=True, inline="always")
def _rows(path, t, post, blocks, a, r0, r1, out):  # pragma: no cover - compiled
    xq, xd = a[0], a[1]
    if t == IQ1_M:
        nb = xd.shape[1]
        idx = np.empty((1, 64 * nb), np.uint16)  # a row's grid indices, scales and delta masks (iq1m_fields)
        sc8 = np.empty((1, 16 * nb), np.uint8)
        dsg = np.empty((1, 8 * nb), np.uint32)
        x2 = np.empty((1, xq.shape[1] // 2), np.int16)  # (1, k / 2) the activation pairs' sums
        for c in range(0, xq.shape[1], 64):
            x_pairs(xq, c, x2)
        for r in range(r0, r1):
            _row_iq1m(path, post, blocks, r, xq, xd, x2, idx, sc8, dsg, out)
        return
    sg = np.zeros((1, 8), np.uint32)  # a super-block's sign words
    idx = np.empty((1, 64), np.uint16)  # its grid indices
    for r in range(r0, r1):
        _row(path, t, post, blocks, r, xq, xd, sg, idx, out)


@njit(cache=True)
def row1_rows(path, t, post, blocks, a, r0, r1, out):  # pragma: no cover - compiled
    """out[0, r0:r1] for the one activation row of a (klowbit's Q8_K activations: xq (1, k), xd (1, k/256), ...)
    and IQ weights `blocks` (rows, row bytes) of ggml type t in ROW1_TYPES, `post` its POST factor."""
    if t == IQ3_S:
        _rows(path, IQ3_S, post, blocks, a, r0, r1, out)
    elif t == IQ1_M:
        _rows(path, IQ1_M, post, blocks, a, r0, r1, out)
    elif t == IQ2_XXS:
        _rows(path, IQ2_XXS, post, blocks, a, r0, r1, out)
    elif t == IQ2_XS:
        _rows(path, IQ2_XS, post, blocks, a, r0, r1, out)
    elif t == IQ2_S:
        _rows(path, IQ2_S, post, blocks, a, r0, r1, out)
    else:
        _rows(path, IQ3_XXS, post, blocks, a, r0, r1, out)


@njit(cache=True)
def has_row1(t):  # pragma: no cover - compiled
    """Whether row1_rows computes ggml type t."""
    return t == IQ2_XXS or t == IQ2_XS or t == IQ2_S or t == IQ3_XXS or t == IQ3_S or t == IQ1_M

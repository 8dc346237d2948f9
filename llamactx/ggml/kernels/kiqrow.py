"""IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and IQ1_M matmuls of one activation row (a decoded token), compiled:
ggml-cpu's x86 `ggml_vec_dot_iq*_q8_K` (arch/x86/quants.c), each super-block decoded straight into registers.

klowbit.vec_rows decodes a whole weight row into buffers first so that up to seven activation rows reuse it; with
one activation row that round trip through memory (and its per-group type tests) was most of the cost. Here the
type is a compile-time constant (`row1_rows` inlines `_rows` once per type) and each 32-element group goes from
the block's bytes to its eight int32 lanes without a store:

- the grid entries: kiqcodes.iq_grid, or for IQ3_S / IQ1_M grid_at on the super-block's indices unpacked as
  vectors (iq3s_indices / iq1m_fields: cheaper here than scalar index arithmetic per entry);
- the signs onto the activations (`vneg_where`: ggml's `_mm256_sign_epi8`), a u32 of the block's stored sign bits
  (IQ3_S, IQ2_S) or of kiqcodes.iq_signs' words (their 7-bit fields completed with the parity);
- `vdot` of the unsigned entries and the signed activations, times the two 16-element sub-block scales (`vpair`),
  summed over the super-block's groups; acc = fma(float(lane), d_w * d_x, acc); out = post * hsum_float_8(acc).
- IQ1_M: codes c in -1 / 0 / 1 as (c + 1) . x - sum(x) per lane (`vplus1`: unsigned, no sign step), its deltas
  (+-1 per 8 elements, so per lane) as the lane sums of x negated where the delta is -1 (`ineg_lanes`); the lane
  sums of the activation row (`lane_sums`) are computed once per call. acc2 holds the deltas' lanes, as ggml's
  accum2: out = fma(post, hsum(acc2), hsum(acc)).

Integer lane sums are exact in any order, the float steps are ggml's: bit-identical to klowbit.vec_rows
(tests/ggml/test_klowbit.py) and to libggml (tests/models/test_tiny_quant_types.py). IQ1_S stays in klowbit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

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
from llamactx.ggml.kernels.simd import fmadd_i, fsum, fzero, i8x32, i32x8, ptr2d, splat, vload, vload_i32, vstore
from llamactx.ggml.kernels.vnni import ilanesum4, imuladd_v, isub, izero, vdot
from llamactx.gguf.iq_grids import IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID

ROW1_TYPES = (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_M)

_G2XXS = np.ascontiguousarray(IQ2XXS_GRID).view(np.uint64).ravel()  # (256,) eight codes per entry
_G2XS = np.ascontiguousarray(IQ2XS_GRID).view(np.uint64).ravel()  # (512,)
_G2S = np.ascontiguousarray(IQ2S_GRID).view(np.uint64).ravel()  # (1024,)
_G3XXS = np.ascontiguousarray(IQ3XXS_GRID).view(np.uint32).ravel()  # (256,) four codes
_G3S = np.ascontiguousarray(IQ3S_GRID).view(np.uint32).ravel()  # (512,)
_G1S = np.ascontiguousarray(IQ1S_GRID).view(np.uint64).ravel()  # (2048,) -1 / 0 / 1 bytes
_I32 = ir.IntType(32)
_V8I32 = ir.VectorType(_I32, 8)


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


@intrinsic
def vplus1(typingctx, codes):
    """codes + 1 per byte: IQ1's -1 / 0 / 1 as unsigned 0 / 1 / 2."""
    sig = i8x32(i8x32)

    def codegen(context, builder, sig, args):
        return builder.add(args[0], ir.Constant(args[0].type, [1] * 32))

    return sig, codegen


@intrinsic
def ineg_lanes(typingctx, v, qh):
    """v (i32x8) with lane j negated where IQ1_M's delta of entry j // 2 is -1: bit 4 (j // 2) + 3 of the group's
    u16 of qh nibbles."""
    if not isinstance(qh, types.Integer):
        return None
    sig = i32x8(i32x8, qh)

    def codegen(context, builder, sig, args):
        bits = splat(builder, builder.zext(args[1], _I32) if args[1].type.width < 32 else builder.trunc(args[1], _I32)
                     if args[1].type.width > 32 else args[1], 8)
        neg = builder.icmp_unsigned("!=", builder.and_(bits, ir.Constant(_V8I32, [1 << (4 * (j // 2) + 3)
                                                                                for j in range(8)])),
                                    ir.Constant(_V8I32, None))
        return builder.select(neg, builder.neg(args[0]), args[0])

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
    if t == IQ2_XS:
        return _nibbles(u8_at(blocks, r, o + 66 + ib))
    if t == IQ2_S:
        return _nibbles(u8_at(blocks, r, o + 74 + ib))
    if t == IQ3_S:  # a nibble per 32
        s = np.int32(2 * ((u8_at(blocks, r, o + 106 + ib // 2) >> (4 * (ib % 2))) & 15) + 1)
        return vpair(s, s)
    w = np.int32(u16_at(blocks, r, o + 48 + 2 * (ib // 2)))  # IQ1_M: 3 bits per 16, four to a u16
    sh = 6 * (ib % 2)
    return vpair(np.int32(2 * ((w >> sh) & 7) + 1), np.int32(2 * ((w >> (sh + 3)) & 7) + 1))


@njit(cache=True, inline="always")
def _group(path, t, lanes, blocks, r, o, ib, x, sg, idx, lsum, c):  # pragma: no cover - compiled
    """lanes + group ib's eight int32 lanes (its entries . x[c:c+32] under its signs) times its scales."""
    sv = _scales(t, blocks, r, o, ib)
    if t == IQ1_M:  # (codes + 1) . x - sum(x), per lane
        dot = vdot(path, izero(), vplus1(grid_at(idx, 4 * ib, _G1S)), x)
        return imuladd_v(lanes, isub(dot, vload_i32(lsum, 0, c // 4)), sv)
    if t == IQ2_XXS:
        g, bits = iq_grid(16, blocks, r, o, ib, _G2XXS), u32_at(sg, 0, ib)
    elif t == IQ2_XS:
        g, bits = iq_grid(17, blocks, r, o, ib, _G2XS), u32_at(sg, 0, ib)
    elif t == IQ2_S:
        g, bits = iq_grid(22, blocks, r, o, ib, _G2S), u32_at(blocks, r, o + 34 + 4 * ib)
    elif t == IQ3_XXS:
        g, bits = iq_grid(18, blocks, r, o, ib, _G3XXS), u32_at(sg, 0, ib)
    else:  # IQ3_S
        g, bits = grid_at(idx, 8 * ib, _G3S), u32_at(blocks, r, o + 74 + 4 * ib)
    return imuladd_v(lanes, vdot(path, izero(), g, vneg_where(x, bits)), sv)


@njit(cache=True, inline="always")
def _block_setup(t, blocks, r, o, sg, idx, sc8, dsg):  # pragma: no cover - compiled
    """The super-block's f16 d as float32, and what its groups read from buffers: the sign words sg (IQ2_XXS,
    IQ2_XS, IQ3_XXS) or the grid indices idx (IQ3_S, IQ1_M)."""
    if t == IQ1_M:  # iq1m_scale_t: d in the top nibbles of the four scale words
        iq1m_fields(blocks, r, o, idx, sc8, dsg, 0)
        h = (u8_at(blocks, r, o + 49) >> 4) | (u8_at(blocks, r, o + 51) & 0xF0)
        return f16_to_f32(np.uint16(h | ((u8_at(blocks, r, o + 53) & 0xF0) << 4)
                                    | ((u8_at(blocks, r, o + 55) & 0xF0) << 8)))
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
def _row(path, t, post, blocks, r, xq, xd, sg, idx, sc8, dsg, lsum, out):  # pragma: no cover - compiled
    """out[0, r] = weight row r . the activation row, in ggml_vec_dot_iq*_q8_K's order (module docstring)."""
    nb = xd.shape[1]
    size = blocks.shape[1] // nb
    acc, acc2 = fzero(), fzero()
    for b in range(nb):
        o = b * size
        dw = _block_setup(t, blocks, r, o, sg, idx, sc8, dsg)
        lanes, l2 = izero(), izero()
        for ib in range(8):
            c = b * 256 + 32 * ib
            lanes = _group(path, t, lanes, blocks, r, o, ib, vload(xq, 0, c), sg, idx, lsum, c)
            if t == IQ1_M:  # the deltas: the lane sums of x, signed, under the same scales
                l2 = imuladd_v(l2, ineg_lanes(vload_i32(lsum, 0, c // 4), u16_at(blocks, r, o + 32 + 2 * ib)),
                               _scales(t, blocks, r, o, ib))
        d = xd[0, b] * dw
        acc = fmadd_i(acc, lanes, d)
        if t == IQ1_M:
            acc2 = fmadd_i(acc2, l2, d)
    if t == IQ1_M:
        out[0, r] = fma32(post, fsum(acc2), fsum(acc))
    else:
        out[0, r] = post * fsum(acc)


@njit(cache=True, inline="always")
def _rows(path, t, post, blocks, a, r0, r1, out):  # pragma: no cover - compiled
    xq, xd = a[0], a[1]
    sg = np.zeros((1, 8), np.uint32)  # a super-block's sign words
    idx = np.empty((1, 64), np.uint16)  # its grid indices
    sc8 = np.empty((1, 16), np.uint8)  # IQ1_M's scales and delta masks, as iq1m_fields writes them
    dsg = np.zeros((1, 8), np.uint32)
    lsum = np.zeros((1, xq.shape[1] // 4), np.int32)  # (1, k / 4) the activation sums of vdot's lanes
    if t == IQ1_M:
        for c in range(0, xq.shape[1], 32):
            vstore(lsum, 0, c // 4, ilanesum4(vload(xq, 0, c)))
    for r in range(r0, r1):
        _row(path, t, post, blocks, r, xq, xd, sg, idx, sc8, dsg, lsum, out)


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

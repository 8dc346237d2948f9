"""IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M matmuls from the packed super-blocks, compiled: the
integers and the float order of llamactx.ggml.vecdot_lowbit (ggml-cpu's x86 `ggml_vec_dot_iq*_q8_K` below 8
activation rows, tiled.cpp's tiled kernel from 8), without unpacking the whole weight first.

One weight row at a time is decoded into a few hundred bytes that stay in L1 (`_decode_row`: ggml-quants.c
`dequantize_row_iq*`'s scales; the unsigned grid entries of each 32-element group as one vector and the sign bits
of a whole super-block as masks, kiqcodes.py), then used by every activation row:

- vec_dot order (n < 8, `_vec_row`): per 32-element group g, the activations negated under g's sign mask and
  dotted with the unsigned entries (ggml's AVX2 `_mm256_sign_epi8` on q8, then `maddubs`: the eight int32 lanes of
  signed codes . Q8_K quants, exactly), times the two 16-element sub-block scales (`vscales_pair`), summed over
  the super-block's groups; acc = fma(float(lane), d_w * d_x, acc) per lane, `post * hsum_float_8(acc)` (fsum);
  IQ1_S's delta term apart (accum1), IQ1_M's in lanes of its own (its +-1 deltas . the quants, under the same
  scales), as vecdot_lowbit's `_vec_dot_lowbit`;
- tiled order (n >= 8, `tile_rows`): 16 rows decoded (IQ2_XXS: a super-block per call, kiqtile.py), then
  transposed 16 x 16 words at a time into kxtile.py's IQ4_XS tile (codes + 128, IQ1's 8 * code + delta + 128, the
  16-element scales, the tile's d = f16(d) * post),
  whose `_kx_rows` gives per super-block s1 = sum sc * dot and out = fma(float(s1) * d_w, d_x, out):
  tiled.cpp's order.

Integer sums are exact in any order, so the results are bit-identical to vecdot_lowbit's (tests/ggml/
test_klowbit.py) and to llama.cpp's (tests/models/test_tiny_quant_types.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from llamactx.ggml.intrinsics import f16_to_f32, fma32
from llamactx.ggml.kernels.kiqcodes import (
    grid_at,
    iq1m_fields,
    iq3s_indices,
    iq_grid,
    iq_signs,
    pair_rows,
    scales_row,
    tile_bytes,
    transpose16,
    vabs1,
    vneg_where,
    vones,
    vsign_bits,
)
from llamactx.ggml.kernels.kiqrow import _G1S, _G2S, _G2XS, _G2XXS, _G3S, _G3XXS, has_row1, row1_rows
from llamactx.ggml.kernels.kiqtile import iq2xxs_tile_row
from llamactx.ggml.kernels.ktile import TILE, _packed_pairs
from llamactx.ggml.kernels.kxtile import IQ4XS_SHIFT, kx_tile_dot
from llamactx.ggml.kernels.q8 import quantize_q8_K
from llamactx.ggml.kernels.simd import PORTABLE, VNNI, fmadd_i, fsum, fzero, vload, vstore
from llamactx.ggml.kernels.vnni import imuladd_v, izero, vdot, vscales_pair

IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M = (int(t) for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS,
                                                                       T.IQ3_S, T.IQ1_S, T.IQ1_M))
KERNEL_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)
TILED_MIN_ROWS = 8  # tiled.cpp `ggml_tiled_min_batch`

_F0 = np.float32(0.0)
_ALL, _NONE = np.uint32(0xFFFFFFFF), np.uint32(0)  # a group's 32 sign bits all set / clear


@njit(cache=True, inline="always")
def _w16(lo, hi):  # pragma: no cover - compiled
    """A little-endian u16 from its two bytes (helpers take scalars: numba reference-counts an array argument)."""
    return np.uint32(lo) | (np.uint32(hi) << 8)


@njit(cache=True, inline="always")
def _decode_row(t, blocks, r, wq, sg, dsg, sc8, dw, idx):  # pragma: no cover - compiled
    """Row r of `blocks` (rows, nb * type_size) -> its unsigned grid entries wq (1, nb * 256) (kiqcodes.iq_grid, a
    group per call; IQ1: |code|), the sign masks of its groups sg (1, nb * 8) uint32 (kiqcodes.iq_signs; IQ1: the
    codes' signs), IQ1's delta signs dsg (1, nb * 8) (a bit per element, set where the delta is -1), the scales
    sc8 (1, nb * 16) (2 ls + 1 per 16 elements) and the f16 d as float32 dw (nb,); idx (1, nb * 64) uint16: IQ3_S /
    IQ1_M's grid indices."""
    size = blocks.shape[1] // dw.shape[0]
    for b in range(dw.shape[0]):
        o = b * size
        if t == IQ1_M:  # iq1m_scale_t: d in the top nibbles of the four scale words
            h = (np.uint32(blocks[r, o + 49]) >> 4) | (np.uint32(blocks[r, o + 51]) & 0xF0) | (
                (np.uint32(blocks[r, o + 53]) & 0xF0) << 4) | ((np.uint32(blocks[r, o + 55]) & 0xF0) << 8)
            dw[b] = f16_to_f32(np.uint16(h))
        else:
            dw[b] = f16_to_f32(np.uint16(_w16(blocks[r, o], blocks[r, o + 1])))
        if t == IQ2_XXS:
            iq_signs(16, blocks, r, o, sg, b * 8)
        elif t == IQ2_XS:
            iq_signs(17, blocks, r, o, sg, b * 8)
        elif t == IQ3_XXS:
            iq_signs(18, blocks, r, o, sg, b * 8)
        elif t == IQ3_S:
            iq_signs(21, blocks, r, o, sg, b * 8)
            iq3s_indices(blocks, r, o, idx, b)
        elif t == IQ2_S:
            iq_signs(22, blocks, r, o, sg, b * 8)
        elif t == IQ1_M:  # two qh bytes per 32 (3 index bits and a delta sign per 8), 3-bit scales per 16
            iq1m_fields(blocks, r, o, idx, sc8, dsg, b)
        for ib in range(8):
            c = b * 256 + 32 * ib  # the group's first code
            s = b * 16 + 2 * ib  # its first sub-block
            if t == IQ2_XXS or t == IQ3_XXS:  # a u32 of 4 x 7 sign bits and a 4-bit scale per 32
                p = o + 9 + 8 * ib if t == IQ2_XXS else o + 69 + 4 * ib  # its top byte
                sc8[0, s] = sc8[0, s + 1] = 2 * (blocks[r, p] >> 4) + 1
                if t == IQ2_XXS:
                    vstore(wq, 0, c, iq_grid(16, blocks, r, o, ib, _G2XXS))
                else:
                    vstore(wq, 0, c, iq_grid(18, blocks, r, o, ib, _G3XXS))
            elif t == IQ2_XS or t == IQ2_S:  # 4-bit scales per 16
                sb = blocks[r, o + 66 + ib] if t == IQ2_XS else blocks[r, o + 74 + ib]
                sc8[0, s] = 2 * (sb & 15) + 1
                sc8[0, s + 1] = 2 * (sb >> 4) + 1
                if t == IQ2_XS:
                    vstore(wq, 0, c, iq_grid(17, blocks, r, o, ib, _G2XS))
                else:
                    vstore(wq, 0, c, iq_grid(22, blocks, r, o, ib, _G2S))
            elif t == IQ3_S:  # 4-bit scales per 32
                sc8[0, s] = sc8[0, s + 1] = 2 * ((blocks[r, o + 106 + ib // 2] >> (4 * (ib % 2))) & 15) + 1
                vstore(wq, 0, c, grid_at(idx, b * 64 + 8 * ib, _G3S))
            elif t == IQ1_S:  # a u16 per 32: 3 x 4 high index bits, a 3-bit scale, the delta's sign
                qh = _w16(blocks[r, o + 34 + 2 * ib], blocks[r, o + 35 + 2 * ib])
                sc8[0, s] = sc8[0, s + 1] = 2 * ((qh >> 12) & 7) + 1
                dsg[0, b * 8 + ib] = _ALL if qh & 0x8000 else _NONE
                g = iq_grid(19, blocks, r, o, ib, _G1S)
                sg[0, b * 8 + ib] = vsign_bits(g)
                vstore(wq, 0, c, vabs1(g))
            else:  # IQ1_M: indices, scales and deltas of the super-block from iq1m_fields
                g = grid_at(idx, b * 64 + 4 * ib, _G1S)
                sg[0, b * 8 + ib] = vsign_bits(g)
                vstore(wq, 0, c, vabs1(g))


@njit(cache=True, inline="always")
def _gdot(path, wq, sg, xq, i, c, j):  # pragma: no cover - compiled
    """Group j (elements c..c+31) of the decoded row . x[i]: the signs onto the activations, the unsigned entries
    dotted with them (ggml's `_mm256_sign_epi8` + `maddubs`), eight int32 lanes of four elements."""
    return vdot(path, izero(), vload(wq, 0, c), vneg_where(vload(xq, i, c), sg[0, j]))


@njit(cache=True, inline="always")
def _ddot(path, dsg, xq, i, c, j):  # pragma: no cover - compiled
    """IQ1_M's deltas (+-1 per element) of group j . x[i], the same lanes."""
    return vdot(path, izero(), vones(), vneg_where(vload(xq, i, c), dsg[0, j]))


@njit(cache=True, inline="always")
def _vec_row(path, t, post, wq, sg, dsg, sc8, dw, xq, xd, bsums, r, out):  # pragma: no cover - compiled
    """out[:, r] in ggml_vec_dot_iq*_q8_K's order (module docstring), row r decoded in wq / sg / dsg / sc8 / dw.
    The groups are written out: `vscales_pair` takes a literal."""
    iq1m = t == IQ1_M
    for i in range(xq.shape[0]):
        acc, acc2, accum1 = fzero(), fzero(), _F0
        for b in range(dw.shape[0]):
            c, s, j = b * 256, b * 16, b * 8
            lanes = imuladd_v(izero(), _gdot(path, wq, sg, xq, i, c + 0, j + 0), vscales_pair(sc8, 0, s + 0, 0))
            lanes = imuladd_v(lanes, _gdot(path, wq, sg, xq, i, c + 32, j + 1), vscales_pair(sc8, 0, s + 0, 1))
            lanes = imuladd_v(lanes, _gdot(path, wq, sg, xq, i, c + 64, j + 2), vscales_pair(sc8, 0, s + 0, 2))
            lanes = imuladd_v(lanes, _gdot(path, wq, sg, xq, i, c + 96, j + 3), vscales_pair(sc8, 0, s + 0, 3))
            lanes = imuladd_v(lanes, _gdot(path, wq, sg, xq, i, c + 128, j + 4), vscales_pair(sc8, 0, s + 8, 0))
            lanes = imuladd_v(lanes, _gdot(path, wq, sg, xq, i, c + 160, j + 5), vscales_pair(sc8, 0, s + 8, 1))
            lanes = imuladd_v(lanes, _gdot(path, wq, sg, xq, i, c + 192, j + 6), vscales_pair(sc8, 0, s + 8, 2))
            lanes = imuladd_v(lanes, _gdot(path, wq, sg, xq, i, c + 224, j + 7), vscales_pair(sc8, 0, s + 8, 3))
            d = xd[i, b] * dw[b]
            acc = fmadd_i(acc, lanes, d)
            if iq1m:  # the deltas (+-1 per element) . the quants, under the same scales
                l2 = imuladd_v(izero(), _ddot(path, dsg, xq, i, c + 0, j + 0), vscales_pair(sc8, 0, s + 0, 0))
                l2 = imuladd_v(l2, _ddot(path, dsg, xq, i, c + 32, j + 1), vscales_pair(sc8, 0, s + 0, 1))
                l2 = imuladd_v(l2, _ddot(path, dsg, xq, i, c + 64, j + 2), vscales_pair(sc8, 0, s + 0, 2))
                l2 = imuladd_v(l2, _ddot(path, dsg, xq, i, c + 96, j + 3), vscales_pair(sc8, 0, s + 0, 3))
                l2 = imuladd_v(l2, _ddot(path, dsg, xq, i, c + 128, j + 4), vscales_pair(sc8, 0, s + 8, 0))
                l2 = imuladd_v(l2, _ddot(path, dsg, xq, i, c + 160, j + 5), vscales_pair(sc8, 0, s + 8, 1))
                l2 = imuladd_v(l2, _ddot(path, dsg, xq, i, c + 192, j + 6), vscales_pair(sc8, 0, s + 8, 2))
                l2 = imuladd_v(l2, _ddot(path, dsg, xq, i, c + 224, j + 7), vscales_pair(sc8, 0, s + 8, 3))
                acc2 = fmadd_i(acc2, l2, d)
            elif t == IQ1_S:  # sumi1: each 32's bsum pair times its signed scale
                s1 = 0
                for g in range(8):
                    pair = bsums[i, s + 2 * g] + bsums[i, s + 2 * g + 1]
                    delta = -1 if dsg[0, j + g] else 1
                    s1 += delta * np.int32(sc8[0, s + 2 * g]) * pair
                accum1 = fma32(d, np.float32(s1), accum1)
        h = fsum(acc)
        if t == IQ1_S:
            out[i, r] = fma32(post, accum1, h)
        elif iq1m:
            out[i, r] = fma32(post, fsum(acc2), h)
        else:
            out[i, r] = post * h


@njit(cache=True)
def vec_rows(path, t, post, blocks, a, r0, r1, out):  # pragma: no cover - compiled
    """out[:, r0:r1] in the vec_dot order, one weight row decoded at a time and used for every activation row."""
    xq, xd, bsums = a[0], a[1], a[2]
    nb = xd.shape[1]
    wq = np.empty((1, nb * 256), np.uint8)  # the unsigned grid entries
    sg = np.zeros((1, nb * 8), np.uint32)  # their signs, a bit per element
    dsg = np.zeros((1, nb * 8), np.uint32)  # IQ1's delta signs
    sc8 = np.empty((1, nb * 16), np.uint8)
    dw = np.empty(nb, np.float32)
    idx = np.empty((1, nb * 64), np.uint16)  # IQ3_S / IQ1_M's grid indices
    for r in range(r0, r1):
        _decode_row(t, blocks, r, wq, sg, dsg, sc8, dw, idx)
        _vec_row(path, t, post, wq, sg, dsg, sc8, dw, xq, xd, bsums, r, out)


@njit(cache=True)
def _tile(t, post, blocks, r0, r1, tile, wq8, sg, dsg, sc8, dw, idx, rows32, scs):  # pragma: no cover - compiled
    """Rows r0..r0+15 (past r1 - 1 repeating it) into kxtile's IQ4_XS tile: wq (nb*64, 64) u8, register
    64 b + j = elements 4j..4j+3 of super-block b for the 16 rows, as code + 128 (IQ1's 8 * code + delta + 128:
    kiqcodes.tile_bytes); the scales as int32 per lane and int16 pairs; td = d * post (exact: a power of two).
    Each row is decoded into rows32 (16, nb*64) / scs (16, nb*16) and the blocks transposed 16 x 16 at once."""
    wq, tsc, tsc2, td = tile
    w32 = wq.view(np.uint32)  # (nb*64, 16)
    tsc2w = tsc2.view(np.uint32)  # (nb*8, 16): a lane's two int16 scales as one word
    r8 = rows32.view(np.uint8)  # (16, nb*256)
    iq1 = t == IQ1_S or t == IQ1_M
    nb = dw.shape[0]
    size = blocks.shape[1] // nb
    for lane in range(TILE):
        r = min(r0 + lane, r1 - 1)
        if t == IQ2_XXS:  # a super-block per call, straight into the tile row (kiqtile.py)
            for b in range(nb):
                td[b, lane] = f16_to_f32(np.uint16(_w16(blocks[r, b * size], blocks[r, b * size + 1]))) * post
                iq2xxs_tile_row(blocks, r, b * size, _G2XXS, r8, lane, b * 256, scs, b * 16)
            continue
        _decode_row(t, blocks, r, wq8, sg, dsg, sc8, dw, idx)
        for j in range(sg.shape[1]):  # group j: registers 8 j .. 8 j + 7
            if iq1:
                vstore(r8, lane, 32 * j, tile_bytes(1, vload(wq8, 0, 32 * j), sg[0, j], dsg[0, j]))
            else:
                vstore(r8, lane, 32 * j, tile_bytes(0, vload(wq8, 0, 32 * j), sg[0, j], dsg[0, j]))
        for b in range(nb):
            td[b, lane] = dw[b] * post
            scales_row(sc8, b * 16, scs, lane, b * 16)
    for j0 in range(0, nb * 64, 16):
        transpose16(rows32, j0, w32, j0)
    for b in range(nb):
        transpose16(scs, b * 16, tsc, b * 16)
        for p in range(8):
            pair_rows(tsc, tsc2w, b * 16 + 2 * p)


@njit(cache=True)
def tile_rows(path, t, post, blocks, a, r0, r1, out):  # pragma: no cover - compiled
    """out[:, r0:r1] in tiled.cpp's order, 16 weight rows per tile (kxtile.kx_tile_rows' loop on IQ tiles)."""
    xq, xd, bsums = a[0], a[1], a[2]
    nb = xd.shape[1]
    n = xq.shape[0]
    pairs = np.empty((n, nb * 8), np.int32)  # the activation sums of 16, in int16 pairs
    _packed_pairs(bsums, 1, pairs)
    tile = (np.empty((nb * 64, 64), np.uint8), np.empty((nb * 16, TILE), np.int32),
            np.empty((nb * 8, 2 * TILE), np.int16), np.empty((nb, TILE), np.float32))
    wq8 = np.empty((1, nb * 256), np.uint8)
    sg = np.zeros((1, nb * 8), np.uint32)
    dsg = np.zeros((1, nb * 8), np.uint32)
    sc8 = np.empty((1, nb * 16), np.uint8)
    dw = np.empty(nb, np.float32)
    idx = np.empty((1, nb * 64), np.uint16)  # IQ3_S / IQ1_M's grid indices
    rows32 = np.empty((TILE, nb * 64), np.uint32)  # the tile's rows before the transpose
    scs = np.empty((TILE, nb * 16), np.int32)
    buf = np.empty((1, TILE), np.float32)
    for t0 in range(r0, r1, TILE):
        t1 = min(t0 + TILE, r1)
        _tile(t, post, blocks, t0, t1, tile, wq8, sg, dsg, sc8, dw, idx, rows32, scs)
        kx_tile_dot(path, True, tile, xq, xd, pairs, IQ4XS_SHIFT, t0, t1, out, buf)


@njit(cache=True)
def is_iq(t):  # pragma: no cover - compiled
    """Whether ggml type t is one of KERNEL_TYPES."""
    return t == IQ2_XXS or t == IQ2_XS or t == IQ2_S or t == IQ3_XXS or t == IQ3_S or t == IQ1_S or t == IQ1_M


@njit(cache=True)
def post_of(t):  # pragma: no cover - compiled
    """The power-of-two factor of type t's scale (quants_lowbit.POST) as float32."""
    if t == IQ3_S:
        return np.float32(1.0)
    return np.float32(0.25) if t == IQ3_XXS else np.float32(0.125)


@njit(cache=True)
def lowbit_rows(path, t, post, blocks, a, r0, r1, out):  # pragma: no cover - compiled
    """out[:, r0:r1] with the kernel llama.cpp picks from the activation row count (module docstring); one
    activation row decodes in registers (kiqrow.py). a: the Q8_K activations (xq, xd, bsums, ...) (kernels.matmul's
    `_activations`)."""
    if a[0].shape[0] >= TILED_MIN_ROWS:
        tile_rows(path, t, post, blocks, a, r0, r1, out)
    elif a[0].shape[0] == 1 and has_row1(t):
        row1_rows(path, t, post, blocks, a, r0, r1, out)
    else:
        vec_rows(path, t, post, blocks, a, r0, r1, out)


@njit(cache=True)
def activations_k(x):  # pragma: no cover - compiled
    """x (n, k) float32 -> Q8_K (xq int8 (n, k), xd float32 (n, k/256), bsums int32 (n, k/16))."""
    n, k = x.shape
    xq = np.empty((n, k), np.int8)
    xd = np.empty((n, k // 256), np.float32)
    bsums = np.empty((n, k // 16), np.int32)
    quantize_q8_K(x, xq, xd, bsums)
    return xq, xd, bsums


@njit(cache=True)
def _share(path, n_tasks, task, t, post, blocks, a, out):  # pragma: no cover - compiled
    """Task `task` of n_tasks: its share of the weight rows (units of 16 when tiled, so tiles never split)."""
    rows = blocks.shape[0]
    unit = TILE if a[0].shape[0] >= TILED_MIN_ROWS else 1
    n_units = (rows + unit - 1) // unit
    u0, u1 = task * n_units // n_tasks, (task + 1) * n_units // n_tasks
    lowbit_rows(path, t, post, blocks, a, u0 * unit, min(u1 * unit, rows), out)


@njit(parallel=True, cache=True)
def matmul_lowbit_vnni(n_tasks, t, post, blocks, x, out):  # pragma: no cover - compiled
    """out (n, rows) = x (n, k) @ W^T for IQ weights `blocks` (rows, row bytes) of ggml type t, `post` its
    POST factor as float32, in n_tasks shares of the weight rows, with `vpdpbusd`."""
    a = activations_k(x)
    for task in prange(n_tasks):
        _share(VNNI, n_tasks, task, t, post, blocks, a, out)


@njit(parallel=True, cache=True)
def matmul_lowbit_portable(n_tasks, t, post, blocks, x, out):  # pragma: no cover - compiled
    """`matmul_lowbit_vnni` with the portable integer dot product."""
    a = activations_k(x)
    for task in prange(n_tasks):
        _share(PORTABLE, n_tasks, task, t, post, blocks, a, out)

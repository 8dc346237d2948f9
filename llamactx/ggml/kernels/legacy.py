"""Rows of y = x @ W^T for ggml's legacy 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).

Each output is computed as x86 ggml-cpu's AVX2/VNNI `ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0` and
`ggml_vec_dot_{q4_1,q5_1}_q8_1` compute it, operation for operation (the same as llamactx.ggml.vecdot, which
ReferenceOps uses): per block, 8 int32 lanes of 4 products, d = d_w * d_x, acc = fma(d, float(lane), acc) per
lane; then ggml's hsum_float_8, plus for Q4_1/Q5_1 the chain summs = fma(m, s, summs). The weights arrive as
unsigned quants in groups of four rows (repack.py; Q8_0 stored as q + 128), and the offset o (8 / 16 / 128) enters
each lane's integer dot as its start value -o * (its 4 activation quants), so every lane holds exactly ggml's
signed (q - o) . x.

Four weight rows are one group, held in two 512-bit registers (wide.py), so each instruction serves four rows
and a group's bytes are read once for every activation row: rows of activations eight (Q4_1/Q5_1) or four at a
time (prompts, batched decode), then one at a time. Four activation rows' Q4_1/Q5_1 min chains share one register
(lane 4j + r: weight row j, activation row r; the activations' s are stored block-major for it), so eight rows'
accumulators fit the 32 registers without spilling. With AVX2's 16 registers (`decoded_first`) Q4_0/Q5_0/Q5_1 decode
each group once into an L1 buffer and take the activation rows one at a time instead, and Q8_0 runs two weight rows
to a ymm register (legacy_x2.py, `halves_first`). Every activation row of a group is done while the group is in L1,
so a matrix larger than the caches (an output matrix) is read from memory once for any number of rows.

`x4_rows_repacked` is the other order of Q4_0, the one llama.cpp runs for the Q4_0 weights it repacks into
`block_q4_0x8` (ne1 % 8 == 0; arch/x86/repack.cpp `gemm_q4_b32_8x8_q8_0_lut_avx` / `gemv_...`, the same per-output
arithmetic in both): the block's whole integer dot product (the sum of the eight lanes, exact) and ONE FMA per
block, acc = fma(float(dot), d_w * d_x, acc), and no horizontal sum (llamactx.ggml.vecdot.matmul_repacked_blocks).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from llamactx.ggml.cpu import DECODE_PREFETCH, F32_EPR, cpu_features
from llamactx.ggml.kernels.legacy_x2 import x2_rows
from llamactx.ggml.kernels.simd import Tag, TagType, prefetch
from llamactx.ggml.kernels.vnni import izero16, vdot16, vdot16_q8, vdot16_u8
from llamactx.ggml.kernels.wide import (
    bfma4,
    bfma16,
    fbcast4,
    ffma16,
    fload16,
    fstore16,
    hsum_rows,
    rsum4,
    rsum4x4,
    wadd4,
    wbits,
    wfma4,
    wfmadd,
    whi,
    wlanes4,
    wlo,
    wload,
    wmins,
    wquarter,
    wsave,
    wscale,
    wscales,
    wscales4,
    wstore4,
    wzero,
    wzero4,
    xbcast16,
    xbcast_i4,
)

# Weight decoders, compile-time constants: the kernel is specialized (and inlined) per decoder.
DEC_Q4_0 = Tag("dec_q4_0")
DEC_Q4_1 = Tag("dec_q4_1")
DEC_Q5_0 = Tag("dec_q5_0")
DEC_Q5_1 = Tag("dec_q5_1")
DEC_Q8_0 = Tag("dec_q8_0")

ROWS_PER_GROUP = 4
# Single activation rows stream the weights: software prefetch this far ahead, where the host gains from it (0: none).
PREFETCH_BYTES = 8192 if DECODE_PREFETCH else 0


def decode_x4(dec, qs, qh, g, b):
    """Block b of row group g as two i8x64 of unsigned quants: (elements 0-15, elements 16-31) of the four rows."""


@overload(decode_x4, jit_options={"cache": True})
def _decode_x4(dec, qs, qh, g, b):
    if not isinstance(dec, TagType):
        return None
    if dec.tag_name in ("dec_q4_0", "dec_q4_1"):

        def q4(dec, qs, qh, g, b):
            v = wload(qs, g, b * 64)
            return wlo(v), whi(v)

        return q4
    if dec.tag_name in ("dec_q5_0", "dec_q5_1"):

        def q5(dec, qs, qh, g, b):
            v = wload(qs, g, b * 64)
            return wbits(qh, g, b * 16, wlo(v)), wbits(qh, g, b * 16 + 8, whi(v))

        return q5
    if dec.tag_name == "dec_q8_0":
        return lambda dec, qs, qh, g, b: (wload(qs, g, b * 128), wload(qs, g, b * 128 + 64))
    return None


def decoded_first(dec):
    """True where a 16-register target (AVX2) decodes a group's blocks once before its activation rows (a
    compile-time constant): Q4_0 / Q5_0 / Q5_1, whose decode costs more than reading it back (Q5's fifth bits) or
    whose four-row accumulators spill (measured; Q4_1's eight-row path and Q8_0's plain loads are faster as they
    are)."""


@overload(decoded_first, jit_options={"cache": True})
def _decoded_first(dec):
    value = F32_EPR == 8 and isinstance(dec, TagType) and dec.tag_name in ("dec_q4_0", "dec_q5_0", "dec_q5_1")
    return lambda dec: value


def halves_first(dec):
    """True where a 16-register target (AVX2) runs two or more activation rows of Q8_0 two weight rows at a time
    (legacy_x2.py, a compile-time constant) except three: measured as fast as four rows to a register on an output
    matrix, and faster on small matrices at eight rows; with its two-row tile, 6 / 7 rows of the output matrix take
    0.93 / 0.94 of the time of 4 + 2 / 4 + 3 single rows and 2 rows 0.95-0.99 (Q4_1's eight-row pass and the decoded
    types are faster as they are, and Q4_1's single rows than its two-row tiles here or in legacy.py's layout)."""


@overload(halves_first, jit_options={"cache": True})
def _halves_first(dec):
    value = F32_EPR == 8 and isinstance(dec, TagType) and dec.tag_name == "dec_q8_0"
    return lambda dec: value


def has_min(dec):
    """True for Q4_1 / Q5_1 (a compile-time constant): a min per block instead of a fixed offset."""


@overload(has_min, jit_options={"cache": True})
def _has_min(dec):
    value = isinstance(dec, TagType) and dec.tag_name in ("dec_q4_1", "dec_q5_1")
    return lambda dec: value


def wdot(path, dec, acc, w, x):
    """acc + `vdot16` of a decoded block. Q8_0's unsigned quants (q + 128), where `pmaddubsw` could saturate, take
    `vdot16_u8`, or on the portable path with AVX2 ggml's sign trick (`vdot16_q8`: q . x, the acc it replaces being
    exactly the offset term -128 * sum(x) that the unsigned form needs)."""


@overload(wdot, jit_options={"cache": True})
def _wdot(path, dec, acc, w, x):
    if not isinstance(dec, TagType) or not isinstance(path, TagType):
        return None
    if dec.tag_name == "dec_q8_0":
        if path.tag_name == "portable" and cpu_features()["avx2"]:
            return lambda path, dec, acc, w, x: vdot16_q8(path, izero16(), w, x)
        return lambda path, dec, acc, w, x: vdot16_u8(path, acc, w, x)
    return lambda path, dec, acc, w, x: vdot16(path, acc, w, x)


@njit(cache=True)
def _x4_row(path, dec, wA, wB, d16, a, i, b, accA, accB):
    """Block b of the group against activation row i: ggml's lanes of the four rows, each scaled by d_w * d_x and
    accumulated (fmadd)."""
    xq, xd, xoff, _ = a
    if has_min(dec):
        la = wdot(path, dec, izero16(), wA, xbcast16(xq, i, b * 32))
        lb = wdot(path, dec, izero16(), wB, xbcast16(xq, i, b * 32 + 16))
    else:
        la = wdot(path, dec, xbcast_i4(xoff, i, b * 8), wA, xbcast16(xq, i, b * 32))
        lb = wdot(path, dec, xbcast_i4(xoff, i, b * 8 + 4), wB, xbcast16(xq, i, b * 32 + 16))
    s = wscale(d16, xd[i, b])
    return wfmadd(accA, la, s), wfmadd(accB, lb, s)


@njit(cache=True)
def _x4_min1(dec, m4, a, i, b, macc):
    """Q4_1/Q5_1: the four rows' min chains fma(m_w, s_x, summs) of activation row i (f32x4)."""
    if has_min(dec):
        return wfma4(macc, m4, a[3][b, i])
    return macc


@njit(cache=True)
def _x4_min4(dec, m16, a, i, b, macc):
    """Q4_1/Q5_1: the min chains of activation rows i..i+3 in one register, lane 4j + r = fma(m_j, s_{i+r}, .):
    m16 spreads the four rows' mins (lane 4j + r = m_j), the block-major s puts rows i..i+3 side by side."""
    if has_min(dec):
        return ffma16(macc, m16, fbcast4(a[3], b, i))
    return macc


@njit(cache=True)
def _x4_store(dec, out, i, c, accA, accB, macc):
    """out[i, c:c+4] = hsum_float_8 of each row's lanes (+ summs for Q4_1/Q5_1); fewer at the matrix's end."""
    y = hsum_rows(accA, accB)
    if has_min(dec):
        y = wadd4(y, macc)
    wstore4(out, i, c, y, out.shape[1] - c)


@njit(cache=True)
def _x4_zero4():
    """Zeroed accumulators of four activation rows, flat: (accA, accB) per row, then their min chains."""
    z = wzero()
    return z, z, z, z, z, z, z, z, z


@njit(cache=True)
def _x4_rows4(path, dec, wA, wB, d16, m16, a, i, b, acc):
    """`_x4_row` and the min chains for activation rows i..i+3 against one decoded block; acc: `_x4_zero4`."""
    a0, b0, a1, b1, a2, b2, a3, b3, m = acc
    a0, b0 = _x4_row(path, dec, wA, wB, d16, a, i, b, a0, b0)
    a1, b1 = _x4_row(path, dec, wA, wB, d16, a, i + 1, b, a1, b1)
    a2, b2 = _x4_row(path, dec, wA, wB, d16, a, i + 2, b, a2, b2)
    a3, b3 = _x4_row(path, dec, wA, wB, d16, a, i + 3, b, a3, b3)
    return a0, b0, a1, b1, a2, b2, a3, b3, _x4_min4(dec, m16, a, i, b, m)


@njit(cache=True)
def _x4_store4(dec, out, i, c, acc):
    """`_x4_store` of activation rows i..i+3."""
    a0, b0, a1, b1, a2, b2, a3, b3, m = acc
    _x4_store(dec, out, i, c, a0, b0, wlanes4(m, 0))
    _x4_store(dec, out, i + 1, c, a1, b1, wlanes4(m, 1))
    _x4_store(dec, out, i + 2, c, a2, b2, wlanes4(m, 2))
    _x4_store(dec, out, i + 3, c, a3, b3, wlanes4(m, 3))


@njit(cache=True)
def _x4_block_scales(dec, sc, g, b):
    """(d of the four rows spread over their lanes, their mins) of block b."""
    if has_min(dec):
        return wscales(sc, g, b * 16), wmins(sc, g, b * 16 + 8)
    return wscales(sc, g, b * 8), wzero4()


@njit(cache=True)
def _x4_block_scales16(dec, sc, g, b):
    """(d, mins) of block b, both spread over the rows' lanes (lane 4j + l = row j's), for `_x4_rows4`."""
    if has_min(dec):
        return wscales(sc, g, b * 16), wscales(sc, g, b * 16 + 8)
    return wscales(sc, g, b * 8), wzero()


@njit(cache=True)
def prefetch_distance(qs, qh, sc):
    """Rows (or row groups) of these slots in PREFETCH_BYTES, at least 2: how far ahead decode prefetches."""
    return max(2, PREFETCH_BYTES // max(1, qs.shape[1] + qh.shape[1] + sc.shape[1]))


@njit(cache=True)
def prefetch_rows(qs, qh, sc, g, count):
    """Prefetch every line of rows (row groups) g..g+count-1 of the quants, high bits and scales."""
    for h in range(g, g + count):
        for col in range(0, qs.shape[1], 64):
            prefetch(qs, h, col)
        for col in range(0, qh.shape[1], 64):
            prefetch(qh, h, col)
        for col in range(0, sc.shape[1], 64):
            prefetch(sc, h, col)


@njit(cache=True)
def prefetch_ahead(qs, qh, sc, g, g0, g1, ahead, count):
    """Before rows (row groups) g..g+count-1 of [g0, g1) are read: prefetch rows g+ahead..g+ahead+count-1, and
    at g0 every row up to there, clipped to g1. Nothing where PREFETCH_BYTES is 0 (cpu.DECODE_PREFETCH)."""
    if PREFETCH_BYTES == 0:
        return
    lo = g0 if g == g0 else g + ahead
    hi = min(g + ahead + count, g1)
    if hi > lo:
        prefetch_rows(qs, qh, sc, lo, hi - lo)


@njit(cache=True)
def _x4_rows_decoded(path, dec, W, a, g0, g1, out):
    """`x4_rows` on a 16-register target (AVX2): four activation rows' accumulators would take all sixteen ymm
    registers and spill, so each group's blocks and scales are decoded once into buffers that stay in L1 (128 + 64
    bytes a block) and the activation rows read them back one row at a time, each with the single-row arithmetic
    (the same per output as every other row count)."""
    qs, qh, sc, _, _, _ = W
    n, nb = a[1].shape
    wbuf = np.empty((1, nb * 128), np.uint8)  # block b: its (A, B) halves of the four rows
    dbuf = np.empty((1, nb * 16), np.float32)  # block b: the four rows' d spread over their lanes
    for g in range(g0, g1):
        for b in range(nb):
            wA, wB = decode_x4(dec, qs, qh, g, b)
            wsave(wbuf, 0, b * 128, wA)
            wsave(wbuf, 0, b * 128 + 64, wB)
            fstore16(dbuf, 0, b * 16, _x4_block_scales(dec, sc, g, b)[0])
        for i in range(n):
            a0, b0, m0 = wzero(), wzero(), wzero4()
            for b in range(nb):
                wA, wB = wload(wbuf, 0, b * 128), wload(wbuf, 0, b * 128 + 64)
                a0, b0 = _x4_row(path, dec, wA, wB, fload16(dbuf, 0, b * 16), a, i, b, a0, b0)
                m0 = _x4_min1(dec, _x4_block_scales(dec, sc, g, b)[1], a, i, b, m0)
            _x4_store(dec, out, i, g * ROWS_PER_GROUP, a0, b0, m0)


@njit(cache=True)
def x4_rows(path, dec, W, a, g0, g1, out):
    """out[:, 4*g0 : 4*g1] (clipped to the matrix) for row groups g0..g1-1 of a 32-element block type. Each group's
    activation rows are done while its bytes are in L1: the weights are read from memory once for any number of
    rows (the first pass over them prefetched where the host gains from it)."""
    qs, qh, sc, _, _, _ = W
    xd = a[1]
    n, nb = xd.shape
    if halves_first(dec) and (n >= 4 or n == 2):  # three rows: single rows here cost the same as 2 + 1 there
        x2_rows(path, dec, W, a, g0, g1, out)
        return
    if decoded_first(dec) and n >= 4:
        _x4_rows_decoded(path, dec, W, a, g0, g1, out)
        return
    n8 = n - n % 8 if has_min(dec) else 0  # eight rows at a time where registers allow (Q8_0 spills)
    n4 = n - n % 4
    ahead = prefetch_distance(qs, qh, sc)
    for g in range(g0, g1):
        c = g * ROWS_PER_GROUP
        if n4 == 0:  # single activation rows only: the weights are one stream
            prefetch_ahead(qs, qh, sc, g, g0, g1, ahead, 1)
        for i in range(0, n8, 8):
            lo, hi = _x4_zero4(), _x4_zero4()
            for b in range(nb):
                wA, wB = decode_x4(dec, qs, qh, g, b)
                d16, m16 = _x4_block_scales16(dec, sc, g, b)
                lo = _x4_rows4(path, dec, wA, wB, d16, m16, a, i, b, lo)
                hi = _x4_rows4(path, dec, wA, wB, d16, m16, a, i + 4, b, hi)
            _x4_store4(dec, out, i, c, lo)
            _x4_store4(dec, out, i + 4, c, hi)
        for i in range(n8, n4, 4):
            acc = _x4_zero4()
            for b in range(nb):
                wA, wB = decode_x4(dec, qs, qh, g, b)
                d16, m16 = _x4_block_scales16(dec, sc, g, b)
                acc = _x4_rows4(path, dec, wA, wB, d16, m16, a, i, b, acc)
            _x4_store4(dec, out, i, c, acc)
        for i in range(n4, n):
            a0, b0, m0 = wzero(), wzero(), wzero4()
            for b in range(nb):
                wA, wB = decode_x4(dec, qs, qh, g, b)
                d16, m4 = _x4_block_scales(dec, sc, g, b)
                a0, b0 = _x4_row(path, dec, wA, wB, d16, a, i, b, a0, b0)
                m0 = _x4_min1(dec, m4, a, i, b, m0)
            _x4_store(dec, out, i, c, a0, b0, m0)


# --- the repacked order (Q4_0 weights llama.cpp repacks) -----------------------------------------------------------


@njit(cache=True)
def _block_terms(a):
    """Block-major (nb, n) copies of what the repacked order adds per block: the offset term -8 * (sum of the block's
    activation quants), int32 (the sum of its eight `xoff` lanes), and d_x, float32."""
    xoff, xd = a[2], a[1]
    n, nb = xd.shape
    off = np.empty((nb, n), np.int32)
    dx = np.empty((nb, n), np.float32)
    for i in range(n):
        for b in range(nb):
            s = 0
            for lane in range(b * 8, b * 8 + 8):
                s += xoff[i, lane]
            off[b, i] = s
            dx[b, i] = xd[i, b]
    return off, dx


@njit(cache=True)
def _block_dot(path, wA, wB, xq, i, b):
    """The unsigned quants' dot products of block b with activation row i, both halves into one register: lanes
    4j..4j+3 of the result sum to weight row j's u8 . s8 block dot (i32x16)."""
    return vdot16(path, vdot16(path, izero16(), wA, xbcast16(xq, i, b * 32)), wB, xbcast16(xq, i, b * 32 + 16))


@njit(cache=True)
def _repacked_rows4(path, wA, wB, d4, xq, off, dx, i, b, acc):
    """One block of the group against activation rows i..i+3: acc (lane 4r + j: activation row i + r, weight row j)
    + float(dot) * (d_w * d_x), one FMA per output."""
    dots = rsum4x4(_block_dot(path, wA, wB, xq, i, b), _block_dot(path, wA, wB, xq, i + 1, b),
                   _block_dot(path, wA, wB, xq, i + 2, b), _block_dot(path, wA, wB, xq, i + 3, b))
    return bfma16(acc, dots, off, dx, b, i, d4)


@njit(cache=True)
def _repacked_store4(out, i, c, acc):
    """out[i + r, c:c+4] = lanes 4r..4r+3 of a `_repacked_rows4` accumulator; fewer at the matrix's end."""
    n = out.shape[1] - c
    wstore4(out, i, c, wquarter(acc, 0), n)
    wstore4(out, i + 1, c, wquarter(acc, 1), n)
    wstore4(out, i + 2, c, wquarter(acc, 2), n)
    wstore4(out, i + 3, c, wquarter(acc, 3), n)


@njit(cache=True)
def _repacked_row(path, W, xq, off, dx, g, i, b, acc):
    """Block b of row group g against the single activation row i (llama.cpp's gemv order): acc (f32x4, one chain
    per weight row) + float(dot) * (d_w * d_x)."""
    qs, qh, sc, _, _, _ = W
    wA, wB = decode_x4(DEC_Q4_0, qs, qh, g, b)
    return bfma4(acc, rsum4(_block_dot(path, wA, wB, xq, i, b)), off[b, i], wscales4(sc, g, b * 8), dx[b, i])


@njit(cache=True)
def x4_rows_repacked(path, W, a, g0, g1, out):
    """out[:, 4*g0 : 4*g1] (clipped to the matrix) for row groups g0..g1-1 of a Q4_0 weight in the repacked order:
    activation rows eight, then four at a time (one f32x16 accumulator holds 4 x 4 outputs), then one at a time.
    Every output is the same whatever the number of rows (llama.cpp's gemm and gemv agree)."""
    qs, qh, sc, _, _, _ = W
    xq = a[0]
    off, dx = _block_terms(a)
    n, nb = a[1].shape
    n4 = n - n % 4
    n8 = n - n % 8
    for g in range(g0, g1):
        c = g * ROWS_PER_GROUP
        for i in range(0, n8, 8):
            lo, hi = wzero(), wzero()
            for b in range(nb):
                wA, wB = decode_x4(DEC_Q4_0, qs, qh, g, b)
                d4 = wscales4(sc, g, b * 8)
                lo = _repacked_rows4(path, wA, wB, d4, xq, off, dx, i, b, lo)
                hi = _repacked_rows4(path, wA, wB, d4, xq, off, dx, i + 4, b, hi)
            _repacked_store4(out, i, c, lo)
            _repacked_store4(out, i + 4, c, hi)
        for i in range(n8, n4, 4):
            acc = wzero()
            for b in range(nb):
                wA, wB = decode_x4(DEC_Q4_0, qs, qh, g, b)
                acc = _repacked_rows4(path, wA, wB, wscales4(sc, g, b * 8), xq, off, dx, i, b, acc)
            _repacked_store4(out, i, c, acc)
    ahead = prefetch_distance(qs, qh, sc)
    for g in range(g0, g1):  # single activation rows, all of them while the group is in L1
        if n4 == 0:  # single activation rows only: the weights are one stream
            prefetch_ahead(qs, qh, sc, g, g0, g1, ahead, 1)
        for i in range(n4, n):
            y = wzero4()
            for b in range(nb):
                y = _repacked_row(path, W, xq, off, dx, g, i, b, y)
            wstore4(out, i, g * ROWS_PER_GROUP, y, out.shape[1] - g * ROWS_PER_GROUP)

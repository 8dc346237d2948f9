"""Rows of y = x @ W^T for ggml's K-quants Q4_K, Q5_K and Q6_K (256-element super-blocks, Q8_K activations).

Each output follows x86 ggml-cpu's AVX2 `ggml_vec_dot_q{4,5,6}_K_q8_K` (arch/x86/quants.c): 8 int32 lanes of
4 products, each times its sub-block's scale, summed over the super-block in integers; then one
acc = fma(d, float(lane), acc) per lane and super-block, and ggml's hsum_float_8. The min terms follow ggml too:
Q4_K keeps four float lanes (acc_m), Q5_K one float (summs); Q6_K subtracts its -32 offset per lane at the end of
the super-block (q8sclsub). ReferenceOps rounds a float64 product instead, so the kernels match it to float32
summation noise (and ggml's own vec_dot bit for bit, by construction).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.kernels.kblocks import (
    Q6K_BYTES,
    Q6K_D,
    Q6K_QH,
    Q6K_QL,
    Q6K_SCALES,
    byte_of,
    load_u32,
    q4k_blocks,
    q4k_d,
    q4k_dmin,
    q4k_load32,
    q4k_scales,
    q6k_blocks,
)
from llamactx.ggml.kernels.kgemv import q4k_gemv_rows
from llamactx.ggml.kernels.legacy import prefetch_ahead, prefetch_distance
from llamactx.ggml.kernels.q6k_gemv import bsums16, q6k_gemv_row
from llamactx.ggml.kernels.simd import (
    Tag,
    TagType,
    fmadd_i,
    fsum,
    fzero,
    load_f16,
    vfield,
    vhi,
    vlo,
    vload,
    vload_i32,
    vor,
)
from llamactx.ggml.kernels.vnni import (
    ihsum,
    imul,
    imuladd,
    imuladd_v,
    ipairs,
    isub,
    izero,
    vdot,
    vload_s8,
    vscales_pair,
)

_F0 = np.float32(0.0)
_S32 = np.uint64(32)

DEC_Q4K = Tag("dec_q4k")  # Q4_K: 128 bytes of nibbles per super-block
DEC_Q5K = Tag("dec_q5k")  # Q5_K: nibbles + 32 bytes of fifth bits


# --- Q4_K / Q5_K ---------------------------------------------------------------------------------------------


def decode_k(dec, qs, qh, r, b, c):
    """64-element chunk c of super-block b of Q4_K / Q5_K row r -> (sub-block 2c, sub-block 2c+1) as i8x32."""


@overload(decode_k, jit_options={"cache": True})
def _decode_k(dec, qs, qh, r, b, c):
    if not isinstance(dec, TagType):
        return None
    if dec.tag_name == "dec_q4k":

        def q4k(dec, qs, qh, r, b, c):  # ggml's block_q4_K bytes, eight rows interleaved (kblocks.py)
            v = q4k_load32(qs, r, b, c)
            return vlo(v), vhi(v)

        return q4k
    if dec.tag_name == "dec_q5k":

        def q5k(dec, qs, qh, r, b, c):  # sub-block s takes bit s of qh[l] as its element l's fifth bit
            v = vload(qs, r, b * 128 + c * 32)
            h = vload(qh, r, b * 32)
            return vor(vlo(v), vfield(h, 2 * c, 1)), vor(vhi(v), vfield(h, 2 * c + 1, 1))

        return q5k
    return None


def k_superblock(dec, W, r, b):
    """Super-block b of Q4_K / Q5_K row r -> (scales, mins, d, dmin): the 6-bit scales and mins as uint64 words,
    byte s for sub-block s (kblocks.byte_of), d and dmin as float32."""


@overload(k_superblock, jit_options={"cache": True})
def _k_superblock(dec, W, r, b):
    if not isinstance(dec, TagType):
        return None
    if dec.tag_name == "dec_q4k":

        def q4k(dec, W, r, b):  # ggml's block_q4_K bytes, eight rows interleaved (kblocks.py)
            qs = W[0]
            sc, mn = q4k_scales(qs, r, b)
            return sc, mn, q4k_d(qs, r, b), q4k_dmin(qs, r, b)

        return q4k

    def q5k(dec, W, r, b):  # repack.py's separate arrays
        sc, mn = W[2], W[3]
        o = b * 8
        scw = load_u32(sc, r, o) | (load_u32(sc, r, o + 4) << _S32)
        return scw, load_u32(mn, r, o) | (load_u32(mn, r, o + 4) << _S32), W[4][r, b], W[5][r, b]

    return q5k


def k_blocks(dec, W):
    """Super-blocks per row of Q4_K (groups of eight rows) / Q5_K (separate arrays) weights."""


@overload(k_blocks, jit_options={"cache": True})
def _k_blocks(dec, W):
    if isinstance(dec, TagType) and dec.tag_name == "dec_q4k":
        return lambda dec, W: q4k_blocks(W[0])
    return lambda dec, W: W[4].shape[1]


def _is_q5(dec):
    """True in the Q5_K specialization (a compile-time constant)."""


@overload(_is_q5, jit_options={"cache": True})
def _is_q5_impl(dec):
    q5 = isinstance(dec, TagType) and dec.tag_name == "dec_q5k"
    return lambda dec: q5


@njit(cache=True)
def _k_step(path, isum, lo, hi, s0, s1, xq, i, j):
    """isum + s0 * lanes(lo . xq[i, j:j+32]) + s1 * lanes(hi . xq[i, j+32:j+64]): two sub-blocks, 6-bit scales."""
    isum = imuladd(isum, vdot(path, izero(), lo, vload(xq, i, j)), s0)
    return imuladd(isum, vdot(path, izero(), hi, vload(xq, i, j + 32)), s1)


@njit(cache=True)
def _k_min_lane(mn, r, bsums, i, b, j):
    """mn_2j S_2j + mn_2j+1 S_2j+1, S = activation sums of the 32-element sub-blocks: lane j of ggml's
    madd(mins, hadd(bsums)) in ggml_vec_dot_q4_K_q8_K (mn: (rows, nb*8) u8, Q5_K's separate mins)."""
    g = b * 16 + 4 * j
    s0 = bsums[i, g] + bsums[i, g + 1]
    s1 = bsums[i, g + 2] + bsums[i, g + 3]
    return np.int32(mn[r, b * 8 + 2 * j]) * s0 + np.int32(mn[r, b * 8 + 2 * j + 1]) * s1


@njit(cache=True)
def _k_min_word(mn, bsums, i, b, j):
    """`_k_min_lane` with super-block b's mins as one uint64 word (`k_superblock`)."""
    g = b * 16 + 4 * j
    s0 = bsums[i, g] + bsums[i, g + 1]
    s1 = bsums[i, g + 2] + bsums[i, g + 3]
    return byte_of(mn, 2 * j) * s0 + byte_of(mn, 2 * j + 1) * s1


@njit(cache=True)
def _k_mins(is_q5, mn, bsums, i, b, dmin, m):
    """Add super-block b's min term as ggml does: Q4_K keeps four float lanes (acc_m), Q5_K one float (summs) of
    the integer total. dmin = -dx * dmin_w; m = the (m0, m1, m2, m3) lanes so far."""
    l0, l1 = _k_min_word(mn, bsums, i, b, 0), _k_min_word(mn, bsums, i, b, 1)
    l2, l3 = _k_min_word(mn, bsums, i, b, 2), _k_min_word(mn, bsums, i, b, 3)
    if is_q5:
        return fma32(dmin, np.float32((l0 + l1) + (l2 + l3)), m[0]), m[1], m[2], m[3]
    f = np.float32
    return fma32(dmin, f(l0), m[0]), fma32(dmin, f(l1), m[1]), fma32(dmin, f(l2), m[2]), fma32(dmin, f(l3), m[3])


@njit(cache=True)
def _k_total(acc, m):
    """hsum_float_8(acc) + the min lanes reduced as ggml's acc_m: (m0 + m2) + (m1 + m3) (Q5_K: m1..m3 = 0)."""
    return fsum(acc) + ((m[0] + m[2]) + (m[1] + m[3]))


@njit(cache=True)
def k45_rows(path, dec, W, a, r0, r1, out, base=0):
    """Q4_K / Q5_K (x86 ggml_vec_dot_q4_K_q8_K / q5_K, AVX2): int lanes summed over a super-block, then one
    fmadd(d, cvt(lanes), acc) per super-block; the mins separately (`_k_mins`). out[:, r] from weight row base + r
    (an expert's rows in a stacked Q4_K matrix, whose groups of eight may straddle experts)."""
    qs, qh = W[0], W[1]
    xq, xd, bsums, _ = a
    q5 = _is_q5(dec)
    z = (_F0, _F0, _F0, _F0)
    n, nb = xq.shape[0], k_blocks(dec, W)
    # decode streams the weights (legacy.x4_rows); Q4_K's slot rows hold eight rows each (kblocks.py): not here
    ahead = prefetch_distance(W[0], W[1], W[2]) if n < 4 and q5 else 0
    for r in range(r0, r1):
        if ahead:
            prefetch_ahead(W[0], W[1], W[2], r, r0, r1, ahead, 1)
        rw = base + r
        for i in range(0, n - n % 4, 4):
            a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
            m0, m1, m2, m3 = z, z, z, z
            for b in range(nb):
                sc, mn, dw, mw = k_superblock(dec, W, rw, b)
                i0, i1, i2, i3 = izero(), izero(), izero(), izero()
                for c in range(4):
                    lo, hi = decode_k(dec, qs, qh, rw, b, c)
                    s0, s1, j = byte_of(sc, 2 * c), byte_of(sc, 2 * c + 1), b * 256 + c * 64
                    i0 = _k_step(path, i0, lo, hi, s0, s1, xq, i, j)
                    i1 = _k_step(path, i1, lo, hi, s0, s1, xq, i + 1, j)
                    i2 = _k_step(path, i2, lo, hi, s0, s1, xq, i + 2, j)
                    i3 = _k_step(path, i3, lo, hi, s0, s1, xq, i + 3, j)
                a0 = fmadd_i(a0, i0, xd[i, b] * dw)
                a1 = fmadd_i(a1, i1, xd[i + 1, b] * dw)
                a2 = fmadd_i(a2, i2, xd[i + 2, b] * dw)
                a3 = fmadd_i(a3, i3, xd[i + 3, b] * dw)
                m0 = _k_mins(q5, mn, bsums, i, b, -xd[i, b] * mw, m0)
                m1 = _k_mins(q5, mn, bsums, i + 1, b, -xd[i + 1, b] * mw, m1)
                m2 = _k_mins(q5, mn, bsums, i + 2, b, -xd[i + 2, b] * mw, m2)
                m3 = _k_mins(q5, mn, bsums, i + 3, b, -xd[i + 3, b] * mw, m3)
            out[i, r], out[i + 1, r] = _k_total(a0, m0), _k_total(a1, m1)
            out[i + 2, r], out[i + 3, r] = _k_total(a2, m2), _k_total(a3, m3)
        for i in range(n - n % 4, n):
            acc = fzero()
            mins = z
            for b in range(nb):
                sc, mn, dw, mw = k_superblock(dec, W, rw, b)
                isum = izero()
                for c in range(4):
                    lo, hi = decode_k(dec, qs, qh, rw, b, c)
                    isum = _k_step(path, isum, lo, hi, byte_of(sc, 2 * c), byte_of(sc, 2 * c + 1), xq, i,
                                   b * 256 + c * 64)
                acc = fmadd_i(acc, isum, xd[i, b] * dw)
                mins = _k_mins(q5, mn, bsums, i, b, -xd[i, b] * mw, mins)
            out[i, r] = _k_total(acc, mins)


# --- Q6_K ----------------------------------------------------------------------------------------------------


@njit(cache=True)
def _q6k_quants(qs, r, b, h):
    """The four 32-element quarters of half h of super-block b of row r (elements 128h + 32t): 4 low bits from
    ql, 2 high bits from qh (ggml-quants.c dequantize_row_q6_K; qs: ggml's block_q6_K rows, kblocks.py) -> four
    i8x32 in 0..63."""
    o = b * Q6K_BYTES
    l0 = vload(qs, r, o + Q6K_QL + h * 64)
    l1 = vload(qs, r, o + Q6K_QL + h * 64 + 32)
    hb = vload(qs, r, o + Q6K_QH + h * 32)
    return (
        vor(vlo(l0), vfield(hb, 0, 3)),
        vor(vlo(l1), vfield(hb, 2, 3)),
        vor(vhi(l0), vfield(hb, 4, 3)),
        vor(vhi(l1), vfield(hb, 6, 3)),
    )


@njit(cache=True)
def _q6k_scales(qs, r, b, h):
    """The int8 scales of the four quarters of half h, each as i32x8 [s_2t x 4, s_2t+1 x 4] (vdot's lanes)."""
    g = b * Q6K_BYTES + Q6K_SCALES + h * 8
    return vscales_pair(qs, r, g, 0), vscales_pair(qs, r, g, 1), vscales_pair(qs, r, g, 2), vscales_pair(qs, r, g, 3)


@njit(cache=True)
def _q6k_half(path, isum, w, s, xq, i, b, h):
    """isum + lanes(quarter . x) * scales over the four quarters w of half h, for activation row i."""
    j = b * 256 + h * 128
    isum = imuladd_v(isum, vdot(path, izero(), w[0], vload(xq, i, j)), s[0])
    isum = imuladd_v(isum, vdot(path, izero(), w[1], vload(xq, i, j + 32)), s[1])
    isum = imuladd_v(isum, vdot(path, izero(), w[2], vload(xq, i, j + 64)), s[2])
    return imuladd_v(isum, vdot(path, izero(), w[3], vload(xq, i, j + 96)), s[3])


@njit(cache=True, inline="always")  # a call per super-block would pass (and reference-count) every array
def _q6k_offset(isum, qs, r, bsums, i, b):
    """Super-block b's lanes for activation row i less ggml's q8sclsub (lane j = 32 * (sc_2j bsum_2j +
    sc_2j+1 bsum_2j+1): how ggml_vec_dot_q6_K_q8_K spreads the -32 offset over its lanes)."""
    g, o = b * 16, b * Q6K_BYTES + Q6K_SCALES
    lo = imul(vload_i32(bsums, i, g), vload_s8(qs, r, o))
    hi = imul(vload_i32(bsums, i, g + 8), vload_s8(qs, r, o + 8))
    return isub(isum, imuladd(izero(), ipairs(lo, hi), 32))  # (x 32: a shift)


@njit(cache=True, inline="always")
def _q6k_close(acc, isum, qs, r, bsums, xd, i, b, db):
    """End of super-block b for activation row i: the offset lanes (`_q6k_offset`), then fmadd(d, cvt(lanes), acc)."""
    return fmadd_i(acc, _q6k_offset(isum, qs, r, bsums, i, b), xd[i, b] * db)


@njit(cache=True)
def _q6k_lanes4(path, qs, xq, r, b, i):
    """Integer lanes of super-block b of weight row r against activation rows i..i+3 (each weight half decoded
    once for the four rows)."""
    i0, i1, i2, i3 = izero(), izero(), izero(), izero()
    for h in range(2):
        w, s = _q6k_quants(qs, r, b, h), _q6k_scales(qs, r, b, h)
        i0 = _q6k_half(path, i0, w, s, xq, i, b, h)
        i1 = _q6k_half(path, i1, w, s, xq, i + 1, b, h)
        i2 = _q6k_half(path, i2, w, s, xq, i + 2, b, h)
        i3 = _q6k_half(path, i3, w, s, xq, i + 3, b, h)
    return i0, i1, i2, i3


@njit(cache=True)
def _q6k_lanes1(path, qs, xq, r, b, i):
    """Integer lanes of super-block b of weight row r against activation row i."""
    isum = izero()
    for h in range(2):
        w, s = _q6k_quants(qs, r, b, h), _q6k_scales(qs, r, b, h)
        isum = _q6k_half(path, isum, w, s, xq, i, b, h)
    return isum


@njit(cache=True)
def q6k_rows(path, W, a, r0, r1, out):
    """Q6_K (x86 ggml_vec_dot_q6_K_q8_K, AVX2): int lanes over a super-block, offsets subtracted per lane.
    Activation rows in groups of four share each weight half's decode; the last n % 4 (decode's one row) run
    q6k_gemv.q6k_gemv_row, the same floats with fewer instructions."""
    qs = W[0]  # ggml's block_q6_K rows (kblocks.py)
    xq, xd, bsums, _ = a
    n, nb = xq.shape[0], q6k_blocks(qs)
    n4 = n - n % 4
    s16 = bsums16(bsums, n4)
    ahead = prefetch_distance(W[0], W[1], W[2]) if n < 4 else 0  # decode streams the weights (legacy.x4_rows)
    for r in range(r0, r1):
        if ahead:
            prefetch_ahead(W[0], W[1], W[2], r, r0, r1, ahead, 1)
        for i in range(0, n4, 4):
            a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
            for b in range(nb):
                i0, i1, i2, i3 = _q6k_lanes4(path, qs, xq, r, b, i)
                dw = load_f16(qs, r, b * Q6K_BYTES + Q6K_D)
                a0 = _q6k_close(a0, i0, qs, r, bsums, xd, i, b, dw)
                a1 = _q6k_close(a1, i1, qs, r, bsums, xd, i + 1, b, dw)
                a2 = _q6k_close(a2, i2, qs, r, bsums, xd, i + 2, b, dw)
                a3 = _q6k_close(a3, i3, qs, r, bsums, xd, i + 3, b, dw)
            out[i, r], out[i + 1, r], out[i + 2, r], out[i + 3, r] = fsum(a0), fsum(a1), fsum(a2), fsum(a3)
        q6k_gemv_row(path, qs, r, xq, xd, s16, n4, out)


# --- llama.cpp's repacked Q4_K and tiled Q6_K orders (llamactx/vecdot_k.py) ---------------------------------------
# The integer sums are the same as above; only where they become floats differs, so these reuse the lane helpers
# and reduce the lanes exactly (`ihsum`) before converting.


@njit(cache=True)
def _k4_chunk(path, lo, hi, s0, s1, xq, i, j):
    """s0 * (sub-block 2c . x) + s1 * (sub-block 2c+1 . x) as one int32: a 64-element chunk's integer sum."""
    return ihsum(_k_step(path, izero(), lo, hi, s0, s1, xq, i, j))


@njit(cache=True)
def q4k_x8_rows(path, W, a, r0, r1, out):
    """Q4_K as llama.cpp runs it repacked to block_q4_Kx8 (vecdot_k `_q4_k_repacked`): activation rows in groups
    of four (ggml_gemm_q4_K_8x8_q8_K) convert every 64-element chunk, acc = fma(float(isum), d_w*d_x, acc) and
    the mins likewise with dmin_w*d_x; the last n % 4 rows (ggml_gemv_q4_K_8x8_q8_K) once per super-block
    (kgemv.q4k_gemv_rows). The result is acc - acc_min."""
    qs, qh = W[0], W[1]
    xq, xd, bsums, _ = a
    n = xq.shape[0]
    n_gemm = n - n % 4
    for r in range(r0, r1):
        for i in range(0, n_gemm, 4):
            a0, a1, a2, a3 = _F0, _F0, _F0, _F0
            m0, m1, m2, m3 = _F0, _F0, _F0, _F0
            for b in range(q4k_blocks(qs)):
                sc, mn, dw, mw = k_superblock(DEC_Q4K, W, r, b)
                for c in range(4):
                    lo, hi = decode_k(DEC_Q4K, qs, qh, r, b, c)
                    s0, s1, j = byte_of(sc, 2 * c), byte_of(sc, 2 * c + 1), b * 256 + c * 64
                    a0 = fma32(np.float32(_k4_chunk(path, lo, hi, s0, s1, xq, i, j)), dw * xd[i, b], a0)
                    a1 = fma32(np.float32(_k4_chunk(path, lo, hi, s0, s1, xq, i + 1, j)), dw * xd[i + 1, b], a1)
                    a2 = fma32(np.float32(_k4_chunk(path, lo, hi, s0, s1, xq, i + 2, j)), dw * xd[i + 2, b], a2)
                    a3 = fma32(np.float32(_k4_chunk(path, lo, hi, s0, s1, xq, i + 3, j)), dw * xd[i + 3, b], a3)
                    m0 = fma32(np.float32(_k_min_word(mn, bsums, i, b, c)), mw * xd[i, b], m0)
                    m1 = fma32(np.float32(_k_min_word(mn, bsums, i + 1, b, c)), mw * xd[i + 1, b], m1)
                    m2 = fma32(np.float32(_k_min_word(mn, bsums, i + 2, b, c)), mw * xd[i + 2, b], m2)
                    m3 = fma32(np.float32(_k_min_word(mn, bsums, i + 3, b, c)), mw * xd[i + 3, b], m3)
            out[i, r], out[i + 1, r], out[i + 2, r], out[i + 3, r] = a0 - m0, a1 - m1, a2 - m2, a3 - m3
    q4k_gemv_rows(path, W, a, n_gemm, r0, r1, out)


@njit(cache=True, inline="always")
def _q6k_tile_step(acc, isum, qs, r, bsums, xd, i, b, db):
    """tiled_run_micro_vnni_8x16: s1 = the super-block's integer sum, out += (float(s1) * d_w) * d_x (contracted)."""
    return fma32(np.float32(ihsum(_q6k_offset(isum, qs, r, bsums, i, b))) * db, xd[i, b], acc)


@njit(cache=True)
def q6k_tiled_rows(path, W, a, r0, r1, out):
    """Q6_K as llama.cpp's tiled kernel computes it for n >= 8 rows (vecdot_k `_q6_k_tiled`)."""
    qs = W[0]  # ggml's block_q6_K rows (kblocks.py)
    xq, xd, bsums, _ = a
    n, nb = xq.shape[0], q6k_blocks(qs)
    for r in range(r0, r1):
        for i in range(0, n - n % 4, 4):
            a0, a1, a2, a3 = _F0, _F0, _F0, _F0
            for b in range(nb):
                i0, i1, i2, i3 = _q6k_lanes4(path, qs, xq, r, b, i)
                dw = load_f16(qs, r, b * Q6K_BYTES + Q6K_D)
                a0 = _q6k_tile_step(a0, i0, qs, r, bsums, xd, i, b, dw)
                a1 = _q6k_tile_step(a1, i1, qs, r, bsums, xd, i + 1, b, dw)
                a2 = _q6k_tile_step(a2, i2, qs, r, bsums, xd, i + 2, b, dw)
                a3 = _q6k_tile_step(a3, i3, qs, r, bsums, xd, i + 3, b, dw)
            out[i, r], out[i + 1, r], out[i + 2, r], out[i + 3, r] = a0, a1, a2, a3
        for i in range(n - n % 4, n):
            acc = _F0
            for b in range(nb):
                isum = _q6k_lanes1(path, qs, xq, r, b, i)
                acc = _q6k_tile_step(acc, isum, qs, r, bsums, xd, i, b, load_f16(qs, r, b * Q6K_BYTES + Q6K_D))
            out[i, r] = acc

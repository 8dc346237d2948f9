"""Rows of y = x @ W^T for ggml's legacy 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).

Each output is computed as x86 ggml-cpu's AVX2/VNNI `ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0` and
`ggml_vec_dot_{q4_1,q5_1}_q8_1` compute it, operation for operation (the same as llamactx.ggml.vecdot, which
ReferenceOps uses): per block, 8 int32 lanes of 4 products, d = d_w * d_x, acc = fma(d, float(lane), acc) per
lane; then ggml's hsum_float_8, plus for Q4_1/Q5_1 the chain summs = fma(m, s, summs). The weights arrive as
unsigned quants (repack.py: Q8_0 stored as q + 128); the offset o (8 / 16 / 128) enters each lane's integer
dot as its start value -o * (its 4 activation quants), so every lane holds exactly ggml's signed (q - o) . x.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.kernels.simd import Tag, TagType, fmadd_i, fsum, fzero, vbits16, vload, vload_i32, vload_nib, vor
from llamactx.ggml.kernels.vnni import izero, vdot

_F0 = np.float32(0.0)

# Weight decoders, compile-time constants: each family function is specialized (and inlined) per decoder.
DEC_Q4 = Tag("dec_q4")  # 16 bytes of nibbles per 32-element block
DEC_Q5 = Tag("dec_q5")  # nibbles + a u32 of fifth bits
DEC_Q8 = Tag("dec_q8")  # 32 bytes (q + 128)


# Each family function (offset_rows, min_rows) computes out[:, r0:r1] for weight rows r0..r1-1. Every weight
# block is decoded once and used for four activation rows (prompt processing, batched decode). The remaining
# activation rows (decode: the only one) take two weight rows at a time, so that two independent FMA chains hide
# the FMA latency: rows r and r + h, half a share apart, two sequential streams the hardware prefetcher follows
# (neighbouring rows r, r + 1 halve the DRAM throughput). Each output keeps ggml's order of operations either way.
# Weight arrays W = (qs, qh, sc, mn, d, m) are 2-D and indexed by (row r, column): no per-row array views, which
# would each cost numba an atomic reference count.


def decode32(dec, qs, qh, r, b):
    """Block b of row r of Q4_x / Q5_x / Q8_0 weights as 32 unsigned quants in element order (i8x32)."""


@overload(decode32, jit_options={"cache": True})
def _decode32(dec, qs, qh, r, b):
    if not isinstance(dec, TagType):
        return None
    if dec.tag_name == "dec_q4":
        return lambda dec, qs, qh, r, b: vload_nib(qs, r, b * 16)
    if dec.tag_name == "dec_q5":
        return lambda dec, qs, qh, r, b: vor(vload_nib(qs, r, b * 16), vbits16(qh, r, b * 4))
    if dec.tag_name == "dec_q8":
        return lambda dec, qs, qh, r, b: vload(qs, r, b * 32)
    return None


@njit(cache=True)
def _offset_step(path, acc, wb, db, a, i, b):
    """acc + d dx lanes(W.x - o x): ggml's fmadd(d, cvt(dpbusd lanes), acc) of one block and activation row i."""
    xq, xd, xoff, _ = a
    return fmadd_i(acc, vdot(path, vload_i32(xoff, i, b * 8), wb, vload(xq, i, b * 32)), db * xd[i, b])


@njit(cache=True)
def offset_rows(path, dec, W, a, r0, r1, out):
    """Q4_0 / Q5_0 / Q8_0 (x86 ggml_vec_dot_q4_0_q8_0 etc.): sum_b d dx (W.x - o x)."""
    qs, qh, _, _, d, _ = W
    n = a[0].shape[0]
    for r in range(r0, r1):
        for i in range(0, n - n % 4, 4):
            a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
            for b in range(d.shape[1]):
                wb = decode32(dec, qs, qh, r, b)
                a0 = _offset_step(path, a0, wb, d[r, b], a, i, b)
                a1 = _offset_step(path, a1, wb, d[r, b], a, i + 1, b)
                a2 = _offset_step(path, a2, wb, d[r, b], a, i + 2, b)
                a3 = _offset_step(path, a3, wb, d[r, b], a, i + 3, b)
            out[i, r], out[i + 1, r], out[i + 2, r], out[i + 3, r] = fsum(a0), fsum(a1), fsum(a2), fsum(a3)
    h = (r1 - r0) // 2
    for i in range(n - n % 4, n):  # single activation rows: weight rows r and r + h together, two FMA chains
        for r in range(r0, r0 + h):
            acc0, acc1 = fzero(), fzero()
            for b in range(d.shape[1]):
                acc0 = _offset_step(path, acc0, decode32(dec, qs, qh, r, b), d[r, b], a, i, b)
                acc1 = _offset_step(path, acc1, decode32(dec, qs, qh, r + h, b), d[r + h, b], a, i, b)
            out[i, r], out[i, r + h] = fsum(acc0), fsum(acc1)
        if (r1 - r0) % 2:
            acc = fzero()
            for b in range(d.shape[1]):
                acc = _offset_step(path, acc, decode32(dec, qs, qh, r1 - 1, b), d[r1 - 1, b], a, i, b)
            out[i, r1 - 1] = fsum(acc)


@njit(cache=True)
def _min_step(path, acc, wb, db, a, i, b):
    xq, xd, _, _ = a
    return fmadd_i(acc, vdot(path, izero(), wb, vload(xq, i, b * 32)), db * xd[i, b])


@njit(cache=True)
def min_rows(path, dec, W, a, r0, r1, out):
    """Q4_1 / Q5_1 (x86 ggml_vec_dot_q4_1_q8_1 etc.): sum_b d dx W.x, plus the chain of fma(m, s, summs)."""
    qs, qh, _, _, d, m = W
    xs = a[3]
    n = a[0].shape[0]
    for r in range(r0, r1):
        for i in range(0, n - n % 4, 4):
            a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
            m0 = m1 = m2 = m3 = _F0
            for b in range(d.shape[1]):
                wb = decode32(dec, qs, qh, r, b)
                a0 = _min_step(path, a0, wb, d[r, b], a, i, b)
                a1 = _min_step(path, a1, wb, d[r, b], a, i + 1, b)
                a2 = _min_step(path, a2, wb, d[r, b], a, i + 2, b)
                a3 = _min_step(path, a3, wb, d[r, b], a, i + 3, b)
                m0 = fma32(m[r, b], xs[i, b], m0)
                m1 = fma32(m[r, b], xs[i + 1, b], m1)
                m2 = fma32(m[r, b], xs[i + 2, b], m2)
                m3 = fma32(m[r, b], xs[i + 3, b], m3)
            out[i, r], out[i + 1, r] = fsum(a0) + m0, fsum(a1) + m1
            out[i + 2, r], out[i + 3, r] = fsum(a2) + m2, fsum(a3) + m3
    h = (r1 - r0) // 2
    for i in range(n - n % 4, n):  # single activation rows: weight rows r and r + h together, two FMA chains
        for r in range(r0, r0 + h):
            acc0, acc1 = fzero(), fzero()
            mins0 = mins1 = _F0
            for b in range(d.shape[1]):
                acc0 = _min_step(path, acc0, decode32(dec, qs, qh, r, b), d[r, b], a, i, b)
                acc1 = _min_step(path, acc1, decode32(dec, qs, qh, r + h, b), d[r + h, b], a, i, b)
                mins0 = fma32(m[r, b], xs[i, b], mins0)
                mins1 = fma32(m[r + h, b], xs[i, b], mins1)
            out[i, r], out[i, r + h] = fsum(acc0) + mins0, fsum(acc1) + mins1
        if (r1 - r0) % 2:
            acc = fzero()
            mins = _F0
            for b in range(d.shape[1]):
                acc = _min_step(path, acc, decode32(dec, qs, qh, r1 - 1, b), d[r1 - 1, b], a, i, b)
                mins = fma32(m[r1 - 1, b], xs[i, b], mins)
            out[i, r1 - 1] = fsum(acc) + mins

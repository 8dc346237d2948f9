"""Attention over the f16 KV cache without flash attention for a target with 8-lane float vectors (AVX2), fast.

The arithmetic is llamactx.ggml.attention's (ReferenceOps) for F32_EPR = 8, which follows the AVX2 build of
llama.cpp bit for bit (ggml-cpu.c `ggml_compute_forward_mul_mat` with llamafile's `tinyBLAS<8, __m256, ...>`,
`ggml_vec_soft_max_f32`): q rounded to f16; kq of a cell = 8 FMA lanes over the head dimension (lane l takes
elements l, l + 8, ...) reduced as `hsum_float_8`; scale, mask, softmax; probabilities rounded to f16; kqv = 8 FMA
lanes over the token's visible cells by rank (lane = rank mod 8), each output column reduced the same way.

So one `<8 x float>` register is one tinyBLAS accumulator: kq of eight cells is eight registers of FMAs over the
head dimension, their eight horizontal sums done together (`fsum8x8`); kqv keeps the eight lanes of an 8-column
block in eight registers while V rows pass. The query heads of one KV head are computed together: K rows are
widened by `vcvtph2ps` as the FMAs load them (a block of 8 rows is in L1 for the group's other heads), V rows once
per chunk for all of them. Parallel over (token, KV head) groups; a few tokens over many
cells (decode at depth) split instead: scores by cell blocks, kqv by lane, then the lanes reduced, as
kernels/attention.py does with 16-lane registers for the AVX-512 build's order.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from llamactx.ggml.attention import _soft_max
from llamactx.ggml.intrinsics import round_f16
from llamactx.ggml.kernels.simd import (
    f32x8,
    fmadd,
    fzero,
    lane_index,
    prefetch,
    ptr2d,
    splat,
    vload_f16,
    vload_f32,
    vstore,
)

_F32 = np.float32

SPLIT_MIN_CELLS = 512  # few tokens over at least this many cells: attention in three passes split over cells
PREFETCH_ROWS = 16  # K / V rows are prefetched this many slots ahead (a KV cache at depth is not in cache)
V_CHUNK_BYTES = 16384  # kqv widens a KV head's V rows in chunks of about this size (as f16), each used from L1


# --- 8-lane float ops --------------------------------------------------------------------------------------------


@intrinsic
def fadd8(typingctx, a, b):
    """a + b lane by lane."""
    sig = f32x8(f32x8, f32x8)

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return sig, codegen


@intrinsic
def fscale8(typingctx, v, s):
    """v * s lane by lane, s a float32 broadcast."""
    sig = f32x8(f32x8, types.float32)

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], splat(builder, args[1], 8))

    return sig, codegen


@intrinsic
def fsplat8(typingctx, s):
    """Eight copies of the float32 s."""
    sig = f32x8(types.float32)

    def codegen(context, builder, sig, args):
        return splat(builder, args[0], 8)

    return sig, codegen


@intrinsic
def fbcast8(typingctx, arr, row, col):
    """Eight copies of arr[row, col] of a 2-D float32 array (`vbroadcastss`; no index checks)."""
    sig = f32x8(arr, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        x = builder.load(ptr2d(context, builder, sig.args[0], *args, ir.FloatType()))
        return splat(builder, x, 8)

    return sig, codegen


@intrinsic
def fsum8x8(typingctx, vs):
    """Lane c = `hsum_float_8(vs[c])` for 8 vectors at once: ((0+4) + (2+6)) + ((1+5) + (3+7)) per vector, the
    same sums (so the same bits), done on pairs of vectors with shuffles instead of one horizontal sum each."""
    if not (isinstance(vs, types.UniTuple) and vs.count == 8 and vs.dtype == f32x8):
        return None
    sig = f32x8(vs)

    def codegen(context, builder, sig, args):
        v = [builder.extract_value(args[0], c) for c in range(8)]

        def combine(a, b, hi, lo):
            return builder.fadd(builder.shuffle_vector(a, b, lane_index(hi)),
                                builder.shuffle_vector(a, b, lane_index(lo)))

        # (i + 4, i) for i < 4: two cells' 4 partial sums per vector (cells 2p, 2p + 1)
        s1 = [combine(v[2 * p], v[2 * p + 1], [4, 5, 6, 7, 12, 13, 14, 15], [0, 1, 2, 3, 8, 9, 10, 11])
              for p in range(4)]
        # (s0 + s2, s1 + s3) of each cell: four cells' 2 partial sums per vector (cells 4q..4q+3)
        s2 = [combine(s1[2 * q], s1[2 * q + 1], [2, 3, 6, 7, 10, 11, 14, 15], [0, 1, 4, 5, 8, 9, 12, 13])
              for q in range(2)]
        # (s0 + s2) + (s1 + s3) per cell
        return combine(s2[0], s2[1], [2 * c + 1 for c in range(8)], [2 * c for c in range(8)])

    return sig, codegen


@numba.njit(cache=True, inline="always")
def _lane_tree8(a0, a1, a2, a3, a4, a5, a6, a7):
    """kqv's 8 lanes of 8 columns reduced as `hsum_float_8` per column: ((0+4) + (2+6)) + ((1+5) + (3+7))."""
    return fadd8(fadd8(fadd8(a4, a0), fadd8(a6, a2)), fadd8(fadd8(a5, a1), fadd8(a7, a3)))


# --- scores -------------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _slot_cells8(cells, t, m, cl):
    """cl[r] = token t's r-th visible cell for r < m, its last one (cell 0 if none) for m <= r < len(cl): whole
    8-slot blocks read valid rows (the extra slots' scores are dropped, their probabilities are 0)."""
    for r in range(cl.shape[0]):
        cl[r] = cells[t, min(r, m - 1)] if m > 0 else 0


@numba.njit(cache=True)
def _round_queries8(q, t, hk, qv):
    """qv[g] = query head g of KV head hk of token t rounded to f16 (from_float of the f16 vec_dot_type)."""
    gqa, d_k = qv.shape
    for g in range(gqa):
        for i in range(d_k):
            qv[g, i] = round_f16(q[t, (hk * gqa + g) * d_k + i])


@numba.njit(cache=True)
def _widen8(src, cl, r0, count, col0, width, dst):
    """dst[i, :width] = the f16 row cl[r0 + i] of src (uint16 bits), columns col0.., widened exactly to f32, for
    i < count: a block of K or V rows converted once for every query head of the group."""
    last = cl.shape[0] - 1
    for i in range(count):
        c = cl[r0 + i]
        ahead = cl[min(r0 + i + PREFETCH_ROWS, last)]
        for j in range(0, width, 32):  # a 64-byte line of halves
            prefetch(src, ahead, col0 + j)
        for j in range(0, width, 8):
            vstore(dst, i, j, vload_f16(src, c, col0 + j))


@numba.njit(cache=True)
def _scores8(k, cl, r, col, qv, g, d_k):
    """kq of the 8 key rows of slots r..r+7 (cells cl[r..], f16 columns col..col+d_k-1 of k) for query head g ->
    f32x8: per row 8 FMA lanes over the head dimension from zero (tinyBLAS<8, __m256>; the 8 rows' chains
    interleaved, each K vector widened by `vcvtph2ps` as it is loaded), reduced as `hsum_float_8`."""
    c0, c1, c2, c3 = cl[r], cl[r + 1], cl[r + 2], cl[r + 3]
    c4, c5, c6, c7 = cl[r + 4], cl[r + 5], cl[r + 6], cl[r + 7]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = fzero()
    for i in range(0, d_k, 8):
        x = vload_f32(qv, g, i)
        a0, a1 = fmadd(a0, vload_f16(k, c0, col + i), x), fmadd(a1, vload_f16(k, c1, col + i), x)
        a2, a3 = fmadd(a2, vload_f16(k, c2, col + i), x), fmadd(a3, vload_f16(k, c3, col + i), x)
        a4, a5 = fmadd(a4, vload_f16(k, c4, col + i), x), fmadd(a5, vload_f16(k, c5, col + i), x)
        a6, a7 = fmadd(a6, vload_f16(k, c6, col + i), x), fmadd(a7, vload_f16(k, c7, col + i), x)
    return fsum8x8((a0, a1, a2, a3, a4, a5, a6, a7))


@numba.njit(cache=True)
def _group_scores8(k, cl, mask_add, scale, t, hk, r0, r1, qv, w, tmp):
    """w[g, r] = scaled, masked kq of visible slots r0..r1-1 (cells cl[r], r0 a multiple of 8, cl valid up to
    r1 rounded up to 8) for the query heads g of KV head hk (qv: `_round_queries8`), 8 slots at a time (a
    block's K rows from L1 for the group's other heads); tmp (1, 8) scratch."""
    gqa, d_k = qv.shape
    last = cl.shape[0] - 1
    for r in range(r0, r1, 8):
        for i in range(8):
            ahead = cl[min(r + i + PREFETCH_ROWS, last)]
            for j in range(0, d_k, 32):  # a 64-byte line of halves
                prefetch(k, ahead, hk * d_k + j)
        for g in range(gqa):
            s = fscale8(_scores8(k, cl, r, hk * d_k, qv, g, d_k), scale)  # ggml_vec_scale_f32, then += 1.0f * mask
            if r + 8 <= r1:
                vstore(w, g, r, fadd8(s, vload_f32(mask_add, t, r)))
            else:
                vstore(tmp, 0, 0, s)
                for j in range(r1 - r):
                    w[g, r + j] = tmp[0, j] + mask_add[t, r + j]


# --- kqv ----------------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def v_chunk8(d_v):
    """Slots per chunk of V rows (a multiple of 8)."""
    return max(8, V_CHUNK_BYTES // (2 * d_v) // 8 * 8)


@numba.njit(cache=True, inline="always")
def _value_lane8(acc, vf, p, g, r, c0, j):
    """acc + f16(probability) * V row of slot r (row r - c0 of the widened chunk vf), columns j..j+7 (one of
    tinyBLAS's kqv lanes)."""
    return fmadd(acc, vload_f32(vf, r - c0, j), fbcast8(p, g, r))


@numba.njit(cache=True)
def _group_values8(v, cl, hk, d_v, m, e, p, lanes, vf, out, t):
    """out[t, columns of each query head g of KV head hk] = kqv over visible slots 0..m-1 (cells cl[r]) from the
    probabilities e (gqa, >= m rounded up to 8, zero past m); p (like e) scratch for them rounded to f16; lanes
    (gqa * d_v, 8) and vf (v_chunk8(d_v), d_v) scratch. The V rows are widened a chunk at a time (once for every
    head and column block); the 8 lanes of an 8-column block (lane = rank mod 8) are 8 registers while a chunk
    passes, saved between chunks (a slot past m adds 0 * a valid row: exactly nothing)."""
    gqa = e.shape[0]
    m8 = (m + 7) // 8 * 8
    for g in range(gqa):
        for r in range(m8):
            p[g, r] = round_f16(e[g, r])
    chunk = v_chunk8(d_v)
    for c0 in range(0, max(m8, 1), chunk):  # (no visible slot: one pass that stores zeros)
        c1 = min(c0 + chunk, m8)
        _widen8(v, cl, c0, c1 - c0, hk * d_v, d_v, vf)
        for g in range(gqa):
            for j in range(0, d_v, 8):
                x = g * d_v + j  # lanes row of this head and column block's lane 0
                if c0 == 0:
                    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = fzero()
                else:
                    a0, a1 = vload_f32(lanes, x, 0), vload_f32(lanes, x + 1, 0)
                    a2, a3 = vload_f32(lanes, x + 2, 0), vload_f32(lanes, x + 3, 0)
                    a4, a5 = vload_f32(lanes, x + 4, 0), vload_f32(lanes, x + 5, 0)
                    a6, a7 = vload_f32(lanes, x + 6, 0), vload_f32(lanes, x + 7, 0)
                for r in range(c0, c1, 8):
                    a0 = _value_lane8(a0, vf, p, g, r, c0, j)
                    a1 = _value_lane8(a1, vf, p, g, r + 1, c0, j)
                    a2 = _value_lane8(a2, vf, p, g, r + 2, c0, j)
                    a3 = _value_lane8(a3, vf, p, g, r + 3, c0, j)
                    a4 = _value_lane8(a4, vf, p, g, r + 4, c0, j)
                    a5 = _value_lane8(a5, vf, p, g, r + 5, c0, j)
                    a6 = _value_lane8(a6, vf, p, g, r + 6, c0, j)
                    a7 = _value_lane8(a7, vf, p, g, r + 7, c0, j)
                if c1 < m8:
                    vstore(lanes, x, 0, a0)
                    vstore(lanes, x + 1, 0, a1)
                    vstore(lanes, x + 2, 0, a2)
                    vstore(lanes, x + 3, 0, a3)
                    vstore(lanes, x + 4, 0, a4)
                    vstore(lanes, x + 5, 0, a5)
                    vstore(lanes, x + 6, 0, a6)
                    vstore(lanes, x + 7, 0, a7)
                else:
                    vstore(out, t, (hk * gqa + g) * d_v + j, _lane_tree8(a0, a1, a2, a3, a4, a5, a6, a7))


# --- drivers ------------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def attend8(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads, sinks):  # pragma: no cover
    """kernels.attention `attend` for an 8-lane target (its arguments; sinks (n_head,) as ggml.attention's
    `sink_values`). Few tokens over many cells run in three passes split evenly over `n_threads`
    (`_attend_split8`), with one thread too: its passes read each K and V row whole (K prefetched ahead), which
    beats the groups' strided passes over a cache at depth that is in no cache (decode at 4096 cells: 17 vs
    20 ms for 30 layers, haswell compile); else each thread takes (token, KV head) groups round robin
    (`_attend_groups8`)."""
    n = q.shape[0]
    if n < 2 * n_threads and n_cells.max() >= SPLIT_MIN_CELLS:
        _attend_split8(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads, sinks)
    else:
        _attend_groups8(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads, sinks)


@numba.njit(parallel=True, cache=True)
def _attend_groups8(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads,
                    sinks):  # pragma: no cover
    """`attend8` with (token, KV head) groups dealt round robin to the threads (rows of a causal prefill see more
    cells the later they come), each with its own scratch."""
    n = q.shape[0]
    d_k = q.shape[1] // n_head
    d_v = v.shape[1] // n_head_kv
    gqa = n_head // n_head_kv
    n_g = n * n_head_kv
    n_tasks = max(min(n_threads, n_g), 1)
    m_max = (n_cells.max() + 63) // 64 * 64
    for task in numba.prange(n_tasks):
        qv = np.empty((gqa, d_k), np.float32)
        w_buf = np.zeros((gqa, m_max), np.float32)
        e_buf = np.zeros((gqa, m_max), np.float32)
        p_buf = np.empty((gqa, m_max), np.float32)
        lanes = np.empty((gqa * d_v, 8), np.float32)
        vf = np.empty((v_chunk8(d_v), d_v), np.float32)
        cl = np.empty(m_max, np.int64)
        tmp = np.empty((1, 8), np.float32)
        for p in range(task, n_g, n_tasks):
            t = p // n_head_kv
            hk = p - t * n_head_kv
            m = n_cells[t]
            m_pad = (m + 63) // 64 * 64
            _slot_cells8(cells, t, m, cl[: (m + 7) // 8 * 8])
            _round_queries8(q, t, hk, qv)
            _group_scores8(k, cl, mask_add, scale, t, hk, 0, m, qv, w_buf, tmp)
            for g in range(gqa):
                _soft_max(w_buf[g, :m_pad], m, e_buf[g, :m_pad], sinks[hk * gqa + g])
            _group_values8(v, cl, hk, d_v, m, e_buf, p_buf, lanes, vf, out, t)


@numba.njit(parallel=True, cache=True)
def _split_scores8(q, k, n_head, n_head_kv, cl, n_cells, mask_add, scale, w, n_blocks):  # pragma: no cover
    """w[t, h, r] = scaled, masked kq of every visible slot, in (token, cell block) tasks over all heads: each
    thread reads its own contiguous share of the K rows, once (every KV head's columns of a row together)."""
    n = q.shape[0]
    d_k = q.shape[1] // n_head
    gqa = n_head // n_head_kv
    for task in numba.prange(n * n_blocks):
        t, b = task // n_blocks, task % n_blocks
        m = n_cells[t]
        r0, r1 = b * m // n_blocks // 8 * 8, (b + 1) * m // n_blocks // 8 * 8
        if b == n_blocks - 1:
            r1 = m
        qv = np.empty((n_head_kv, gqa, d_k), np.float32)
        for hk in range(n_head_kv):
            _round_queries8(q, t, hk, qv[hk])
        tmp = np.empty((1, 8), np.float32)
        for r in range(r0, r1, 8):
            for hk in range(n_head_kv):
                rows = w[t, hk * gqa : (hk + 1) * gqa]
                _group_scores8(k, cl[t], mask_add, scale, t, hk, r, min(r + 8, r1), qv[hk], rows, tmp)


@numba.njit(parallel=True, cache=True)
def _split_soft_max8(w, n_cells, e, sinks):  # pragma: no cover
    """e[t, h] = ggml_vec_soft_max_f32 of w[t, h, :n_cells[t]] with head h's sink, rounded to f16 (kqv's
    probabilities), one task per (token, head)."""
    n, n_head = w.shape[0], w.shape[1]
    for task in numba.prange(n * n_head):
        t, h = task // n_head, task % n_head
        m = n_cells[t]
        m_pad = (m + 63) // 64 * 64
        _soft_max(w[t, h, :m_pad], m, e[t, h, :m_pad], sinks[h])
        for r in range(m):
            e[t, h, r] = round_f16(e[t, h, r])


@numba.njit(cache=True)
def _lane_heads8(v, cl, t, ln, m, h, nh, col, j, d_v, et, row):
    """Lane ln of kqv (slots ln, ln + 8, ... < m in order) for nh (1 or 3) query heads h.. of one KV head (V
    columns from col), columns j..j+15: each V row's two 8-column pieces loaded and widened once for the heads
    (six chains in registers), the row PREFETCH_ROWS lane slots ahead prefetched. Past d_v the second piece
    repeats the first (computed, not stored)."""
    j1 = min(j + 8, d_v - 8)
    a0 = a1 = b0 = b1 = c0 = c1 = fzero()
    last = cl.shape[1] - 1
    for r in range(ln, m, 8):
        prefetch(v, cl[t, min(r + 8 * PREFETCH_ROWS, last)], col + j)
        c = cl[t, r]
        x0, x1 = vload_f16(v, c, col + j), vload_f16(v, c, col + j1)
        pa = fbcast8(et, h, r)
        a0, a1 = fmadd(a0, x0, pa), fmadd(a1, x1, pa)
        if nh == 3:
            pb, pc = fbcast8(et, h + 1, r), fbcast8(et, h + 2, r)
            b0, b1 = fmadd(b0, x0, pb), fmadd(b1, x1, pb)
            c0, c1 = fmadd(c0, x0, pc), fmadd(c1, x1, pc)
    vstore(row, h * 8 + ln, j, a0)
    if j + 8 < d_v:
        vstore(row, h * 8 + ln, j + 8, a1)
    if nh == 3:
        vstore(row, (h + 1) * 8 + ln, j, b0)
        vstore(row, (h + 2) * 8 + ln, j, c0)
        if j + 8 < d_v:
            vstore(row, (h + 1) * 8 + ln, j + 8, b1)
            vstore(row, (h + 2) * 8 + ln, j + 8, c1)


@numba.njit(parallel=True, cache=True)
def _split_values8(v, n_head, n_head_kv, cl, n_cells, e, lanes):  # pragma: no cover
    """lanes[t, h * 8 + l] = tinyBLAS's kqv lane l (slots r = l, l + 8, ... in order) of every head from the f16
    probabilities e, in (token, lane) tasks: lane l reads only its own slots' V rows, so each thread streams its
    own rows of V, once per 16-column block, for the query heads of a KV head three at a time (`_lane_heads8`)."""
    n = e.shape[0]
    d_v = v.shape[1] // n_head_kv
    gqa = n_head // n_head_kv
    n3 = gqa - gqa % 3
    for task in numba.prange(n * 8):
        t, ln = task // 8, task % 8
        m = n_cells[t]
        for hk in range(n_head_kv):
            for j in range(0, d_v, 16):
                g = 0
                while g < gqa:
                    nh = 3 if g < n3 else 1
                    _lane_heads8(v, cl, t, ln, m, hk * gqa + g, nh, hk * d_v, j, d_v, e[t], lanes[t])
                    g += nh


@numba.njit(parallel=True, cache=True)
def _split_reduce8(lanes, out):  # pragma: no cover
    """out[t, h * d_v + j] = `hsum_float_8` of head h's 8 lanes (rows h * 8 .. h * 8 + 7 of lanes[t]) at
    column j, 8 columns at a time."""
    n, d_v = lanes.shape[0], lanes.shape[2]
    n_head = lanes.shape[1] // 8
    for task in numba.prange(n * n_head):
        t, h = task // n_head, task % n_head
        x, y = lanes[t], h * 8
        for j in range(0, d_v, 8):
            s = _lane_tree8(vload_f32(x, y, j), vload_f32(x, y + 1, j), vload_f32(x, y + 2, j), vload_f32(x, y + 3, j),
                            vload_f32(x, y + 4, j), vload_f32(x, y + 5, j), vload_f32(x, y + 6, j),
                            vload_f32(x, y + 7, j))
            vstore(out, t, h * d_v + j, s)


@numba.njit(cache=True)
def _attend_split8(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads,
                   sinks):  # pragma: no cover
    """`attend8` for few tokens over many cells: scores split over cell blocks, softmax per head, kqv split over
    its 8 lanes, then the lanes reduced; the same sums in the same order as `_attend_groups8`."""
    n = q.shape[0]
    d_v = v.shape[1] // n_head_kv
    m_pad = (n_cells.max() + 63) // 64 * 64
    w = np.empty((n, n_head, m_pad), np.float32)
    e = np.empty((n, n_head, m_pad), np.float32)
    cl = np.empty((n, m_pad), np.int64)
    for t in range(n):
        _slot_cells8(cells, t, n_cells[t], cl[t])
    _split_scores8(q, k, n_head, n_head_kv, cl, n_cells, mask_add, scale, w, 4 * n_threads)
    _split_soft_max8(w, n_cells, e, sinks)
    lanes = np.empty((n, n_head * 8, d_v), np.float32)
    _split_values8(v, n_head, n_head_kv, cl, n_cells, e, lanes)
    _split_reduce8(lanes, out)

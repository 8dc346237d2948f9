"""Attention over the f16 KV cache without flash attention (ggml-cpu's kq mul_mat, soft_max, kqv mul_mat), fast.

The arithmetic is llamactx.ggml.attention's (ReferenceOps), which follows llama.cpp bit for bit: q rounded to f16,
kq in tinyBLAS order (16 FMA lanes over the head dimension, `_mm512_reduce_add_ps`), `ggml_vec_soft_max_f32`,
probabilities rounded to f16, kqv in tinyBLAS order over the token's visible cells by rank (lane = rank mod 16).
Here the lanes are 512-bit registers (wide.py) and only the cells a token sees are read, wherever they sit in the
cache, so attention over many sequences costs what their own cells cost. The query heads of one KV head are
computed together: a block of 16 cells' K rows is widened to f32 once for the group, their 16 scores are reduced
together (`reduce_add16x16`, each score's own tree), and V rows are widened a chunk at a time while each 16-column
block's 16 lanes stay in registers. Parallel over (token, KV head) groups dealt round robin (rows of a causal
prefill see more cells the later they come); a few tokens over many cells (decode at depth) split instead: scores
by cell blocks (each thread its own K rows), kqv by lane (each thread its own V rows), then the lanes reduced.
That is the AVX-512 build's order; for an AVX2 target (8-lane tinyBLAS) `attend` runs attention8.py, the same
design on 8-lane registers.
"""

from __future__ import annotations

import numba
import numpy as np

from llamactx.ggml.attention import NO_SINK, _soft_max
from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.intrinsics import round_f16
from llamactx.ggml.kernels.attention8 import attend8
from llamactx.ggml.kernels.simd import prefetch
from llamactx.ggml.kernels.wide import (
    fadd16,
    ffma16,
    ffma16s,
    fload16,
    fstore16,
    hload16,
    reduce_add16x16,
    wscale,
    wzero,
)

_F32 = np.float32


SPLIT_MIN_CELLS = 512  # few tokens over at least this many cells: attention in three passes split over cells


@numba.njit(cache=True)
def attend(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads,
           sinks=None):  # pragma: no cover
    """out (n, n_head * d_v) = attention of q (n, n_head * d_k) float32 over the cells each token sees: k (n_kv,
    n_head_kv * d_k) and v (n_kv, n_head_kv * d_v) are an f16 cache's rows as uint16 bits; cells (n, max
    visible) lists token t's n_cells[t] visible cells in cell order, mask_add their mask values; sinks (n_head,)
    each head's attention sink (gpt-oss; ggml.attention.sink_values), None (the graph's attention): none. d_k, d_v
    multiples of 16 (checked by the callers). The query heads of one KV head are computed together, so each
    cell's K and V rows are read once for the group (from L1 for its other heads). Few tokens over many cells
    (decode at depth) run in three passes whose work splits evenly over `n_threads` (`_attend_split`), with one
    thread too (SmolLM2's shape at 4096 cells, one thread: 0.59 instead of 0.65 ms per layer from DRAM, 0.29
    instead of 0.37 in cache); else each thread takes (token, KV head) groups round robin (`_attend_groups`)."""
    n = q.shape[0]
    if n == 0:
        return
    if sinks is None:
        sk = np.full(n_head, NO_SINK, np.float32)
    else:
        sk = sinks
    if F32_EPR != 16:
        attend8(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads, sk)
        return
    if n < 2 * n_threads and n_cells.max() >= SPLIT_MIN_CELLS:  # with one thread too (reads rows whole)
        _attend_split(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads, sk)
    else:
        _attend_groups(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads, sk)


@numba.njit(cache=True)
def _widen_rows(src, cl, r0, count, col0, width, dst):
    """dst[i, :width] = the f16 row cl[r0 + i] of src (uint16 bits), columns col0.., widened exactly to f32, for
    i < count: a block of K or V rows converted once for every query head of the group."""
    for i in range(count):
        c = cl[r0 + i]
        for j in range(0, width, 16):
            fstore16(dst, i, j, hload16(src, c, col0 + j))


@numba.njit(cache=True)
def _scores16(qv, g, kf, d_k):
    """kq of the 16 key rows of kf (a block of slots) for query head g -> f32x16: per slot 16 FMA lanes over the
    head dimension from zero (tinyBLAS<16, __m512>; the 16 slots' chains interleaved), reduced as
    `_mm512_reduce_add_ps`, the 16 horizontal sums done together."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = wzero()
    a8 = a9 = a10 = a11 = a12 = a13 = a14 = a15 = wzero()
    for i in range(0, d_k, 16):
        x = fload16(qv, g, i)
        a0, a1 = ffma16(a0, fload16(kf, 0, i), x), ffma16(a1, fload16(kf, 1, i), x)
        a2, a3 = ffma16(a2, fload16(kf, 2, i), x), ffma16(a3, fload16(kf, 3, i), x)
        a4, a5 = ffma16(a4, fload16(kf, 4, i), x), ffma16(a5, fload16(kf, 5, i), x)
        a6, a7 = ffma16(a6, fload16(kf, 6, i), x), ffma16(a7, fload16(kf, 7, i), x)
        a8, a9 = ffma16(a8, fload16(kf, 8, i), x), ffma16(a9, fload16(kf, 9, i), x)
        a10, a11 = ffma16(a10, fload16(kf, 10, i), x), ffma16(a11, fload16(kf, 11, i), x)
        a12, a13 = ffma16(a12, fload16(kf, 12, i), x), ffma16(a13, fload16(kf, 13, i), x)
        a14, a15 = ffma16(a14, fload16(kf, 14, i), x), ffma16(a15, fload16(kf, 15, i), x)
    return reduce_add16x16((a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15))


@numba.njit(cache=True)
def _slot_cells(cells, t, m, cl):
    """cl[r] = token t's r-th visible cell for r < m, its last one (cell 0 if none) for m <= r < len(cl): whole
    16-slot blocks (64-slot tiles in kernels.flash) read valid rows (the extra slots' scores are dropped, their
    probabilities are 0)."""
    for r in range(cl.shape[0]):
        cl[r] = cells[t, min(r, m - 1)] if m > 0 else 0


@numba.njit(cache=True)
def _round_queries(q, t, hk, qv):
    """qv[g] = query head g of KV head hk of token t rounded to f16 (from_float of the f16 vec_dot_type)."""
    gqa, d_k = qv.shape
    for g in range(gqa):
        for i in range(d_k):
            qv[g, i] = round_f16(q[t, (hk * gqa + g) * d_k + i])


@numba.njit(cache=True)
def _group_scores(k, cl, mask_add, scale, t, hk, r0, r1, qv, w, tmp, kf):
    """w[g, r] = scaled, masked kq of visible slots r0..r1-1 (cells cl[r]) for the query heads g of KV head hk
    (qv: `_round_queries`), 16 slots at a time, a block's K rows widened once into kf (16, d_k) for the group's
    heads; tmp (1, 16) scratch."""
    gqa, d_k = qv.shape
    for r in range(r0, r1, 16):
        _widen_rows(k, cl, r, 16, hk * d_k, d_k, kf)
        for g in range(gqa):
            s = wscale(_scores16(qv, g, kf, d_k), scale)
            if r + 16 <= r1:
                fstore16(w, g, r, fadd16(s, fload16(mask_add, t, r)))
            else:
                fstore16(tmp, 0, 0, s)
                for j in range(r1 - r):
                    w[g, r + j] = tmp[0, j] + mask_add[t, r + j]


@numba.njit(cache=True, inline="always")
def _value_lane(acc, vf, p, g, r, c0, j):
    """acc + f16(probability) * V row of slot r (row r - c0 of the widened chunk vf), columns j..j+15 (one of
    tinyBLAS's kqv lanes)."""
    return ffma16s(acc, fload16(vf, r - c0, j), p[g, r])


@numba.njit(cache=True, inline="always")
def _lane_tree(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    """kqv's 16 lanes of 16 columns reduced as `_mm512_reduce_add_ps` per column: lanes i + 8 and i, then i + 4
    and i, then (0 + 2) + (1 + 3)."""
    t0, t1, t2, t3 = fadd16(a8, a0), fadd16(a9, a1), fadd16(a10, a2), fadd16(a11, a3)
    t4, t5, t6, t7 = fadd16(a12, a4), fadd16(a13, a5), fadd16(a14, a6), fadd16(a15, a7)
    u0, u1, u2, u3 = fadd16(t4, t0), fadd16(t5, t1), fadd16(t6, t2), fadd16(t7, t3)
    return fadd16(fadd16(u0, u2), fadd16(u1, u3))


V_CHUNK_BYTES = 16384  # kqv widens a KV head's V rows in chunks of about this size (as f16), each used from L1


@numba.njit(cache=True)
def v_chunk(d_v):
    """Slots per chunk of V rows (a multiple of 16)."""
    return max(16, V_CHUNK_BYTES // (2 * d_v) // 16 * 16)


@numba.njit(cache=True)
def _group_values(v, cl, hk, d_v, m, e, p, lanes, vf, out, t):
    """out[t, columns of each query head g of KV head hk] = kqv over visible slots 0..m-1 (cells cl[r]) from the
    probabilities e (gqa, >= m rounded up to 16, zero past m); p (like e) scratch for them rounded to f16;
    lanes (gqa * d_v, 16) and vf (v_chunk(d_v), d_v) scratch. The V rows are widened to f32 a chunk at a time
    (once for every head and column block, from L1). tinyBLAS's 16 lanes of a 16-column block (lane = rank mod
    16) are 16 registers while a chunk passes, saved between chunks (each lane's sum continues in slot order; a
    slot past m adds 0 * a valid row: exactly nothing), and reduced as `_mm512_reduce_add_ps` at the end."""
    gqa = e.shape[0]
    m16 = (m + 15) // 16 * 16
    for g in range(gqa):
        for r in range(m16):
            p[g, r] = round_f16(e[g, r])
    chunk = v_chunk(d_v)
    for c0 in range(0, max(m16, 1), chunk):  # (no visible slot: one pass that stores zeros)
        c1 = min(c0 + chunk, m16)
        _widen_rows(v, cl, c0, c1 - c0, hk * d_v, d_v, vf)
        for g in range(gqa):
            for j in range(0, d_v, 16):
                x = g * d_v + j  # lanes row of this head and column block's lane 0
                if c0 == 0:
                    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = wzero()
                    a8 = a9 = a10 = a11 = a12 = a13 = a14 = a15 = wzero()
                else:
                    a0, a1 = fload16(lanes, x, 0), fload16(lanes, x + 1, 0)
                    a2, a3 = fload16(lanes, x + 2, 0), fload16(lanes, x + 3, 0)
                    a4, a5 = fload16(lanes, x + 4, 0), fload16(lanes, x + 5, 0)
                    a6, a7 = fload16(lanes, x + 6, 0), fload16(lanes, x + 7, 0)
                    a8, a9 = fload16(lanes, x + 8, 0), fload16(lanes, x + 9, 0)
                    a10, a11 = fload16(lanes, x + 10, 0), fload16(lanes, x + 11, 0)
                    a12, a13 = fload16(lanes, x + 12, 0), fload16(lanes, x + 13, 0)
                    a14, a15 = fload16(lanes, x + 14, 0), fload16(lanes, x + 15, 0)
                for r in range(c0, c1, 16):
                    a0 = _value_lane(a0, vf, p, g, r, c0, j)
                    a1 = _value_lane(a1, vf, p, g, r + 1, c0, j)
                    a2 = _value_lane(a2, vf, p, g, r + 2, c0, j)
                    a3 = _value_lane(a3, vf, p, g, r + 3, c0, j)
                    a4 = _value_lane(a4, vf, p, g, r + 4, c0, j)
                    a5 = _value_lane(a5, vf, p, g, r + 5, c0, j)
                    a6 = _value_lane(a6, vf, p, g, r + 6, c0, j)
                    a7 = _value_lane(a7, vf, p, g, r + 7, c0, j)
                    a8 = _value_lane(a8, vf, p, g, r + 8, c0, j)
                    a9 = _value_lane(a9, vf, p, g, r + 9, c0, j)
                    a10 = _value_lane(a10, vf, p, g, r + 10, c0, j)
                    a11 = _value_lane(a11, vf, p, g, r + 11, c0, j)
                    a12 = _value_lane(a12, vf, p, g, r + 12, c0, j)
                    a13 = _value_lane(a13, vf, p, g, r + 13, c0, j)
                    a14 = _value_lane(a14, vf, p, g, r + 14, c0, j)
                    a15 = _value_lane(a15, vf, p, g, r + 15, c0, j)
                if c1 < m16:
                    fstore16(lanes, x, 0, a0)
                    fstore16(lanes, x + 1, 0, a1)
                    fstore16(lanes, x + 2, 0, a2)
                    fstore16(lanes, x + 3, 0, a3)
                    fstore16(lanes, x + 4, 0, a4)
                    fstore16(lanes, x + 5, 0, a5)
                    fstore16(lanes, x + 6, 0, a6)
                    fstore16(lanes, x + 7, 0, a7)
                    fstore16(lanes, x + 8, 0, a8)
                    fstore16(lanes, x + 9, 0, a9)
                    fstore16(lanes, x + 10, 0, a10)
                    fstore16(lanes, x + 11, 0, a11)
                    fstore16(lanes, x + 12, 0, a12)
                    fstore16(lanes, x + 13, 0, a13)
                    fstore16(lanes, x + 14, 0, a14)
                    fstore16(lanes, x + 15, 0, a15)
                else:
                    y = _lane_tree(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)
                    fstore16(out, t, (hk * gqa + g) * d_v + j, y)


@numba.njit(parallel=True, cache=True)
def _attend_groups(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads,
                   sinks):  # pragma: no cover
    """`attend` with (token, KV head) groups dealt round robin to the threads (rows of a causal prefill see more
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
        lanes = np.empty((gqa * d_v, 16), np.float32)
        kf = np.empty((16, d_k), np.float32)
        vf = np.empty((v_chunk(d_v), d_v), np.float32)
        cl = np.empty(m_max, np.int64)
        tmp = np.empty((1, 16), np.float32)
        for p in range(task, n_g, n_tasks):
            t = p // n_head_kv
            hk = p - t * n_head_kv
            m = n_cells[t]
            m_pad = (m + 63) // 64 * 64
            _slot_cells(cells, t, m, cl[: (m + 15) // 16 * 16])
            _round_queries(q, t, hk, qv)
            _group_scores(k, cl, mask_add, scale, t, hk, 0, m, qv, w_buf, tmp, kf)
            for g in range(gqa):
                _soft_max(w_buf[g, :m_pad], m, e_buf[g, :m_pad], sinks[hk * gqa + g])
            _group_values(v, cl, hk, d_v, m, e_buf, p_buf, lanes, vf, out, t)


@numba.njit(parallel=True, cache=True)
def _split_scores(q, k, n_head, n_head_kv, cl, n_cells, mask_add, scale, w, n_blocks):  # pragma: no cover
    """w[t, h, r] = scaled, masked kq of every visible slot, in (token, cell block) tasks over all heads: each
    thread reads its own contiguous share of the K rows, once (every KV head's columns of a row together)."""
    n = q.shape[0]
    d_k = q.shape[1] // n_head
    gqa = n_head // n_head_kv
    for task in numba.prange(n * n_blocks):
        t, b = task // n_blocks, task % n_blocks
        m = n_cells[t]
        r0, r1 = b * m // n_blocks // 16 * 16, (b + 1) * m // n_blocks // 16 * 16
        if b == n_blocks - 1:
            r1 = m
        qv = np.empty((n_head_kv, gqa, d_k), np.float32)
        for hk in range(n_head_kv):
            _round_queries(q, t, hk, qv[hk])
        tmp = np.empty((1, 16), np.float32)
        kf = np.empty((16, d_k), np.float32)
        for r in range(r0, r1, 16):
            for hk in range(n_head_kv):
                rows = w[t, hk * gqa : (hk + 1) * gqa]
                _group_scores(k, cl[t], mask_add, scale, t, hk, r, min(r + 16, r1), qv[hk], rows, tmp, kf)


@numba.njit(parallel=True, cache=True)
def _split_soft_max(w, n_cells, e, sinks):  # pragma: no cover
    """e[t, h] = ggml_vec_soft_max_f32 of w[t, h, :n_cells[t]] with head h's sink, one task per (token, head)."""
    n, n_head = w.shape[0], w.shape[1]
    for task in numba.prange(n * n_head):
        t, h = task // n_head, task % n_head
        m = n_cells[t]
        m_pad = (m + 63) // 64 * 64
        _soft_max(w[t, h, :m_pad], m, e[t, h, :m_pad], sinks[h])


V_AHEAD = 16  # the kqv lanes prefetch their V rows this many of their own slots (16 apart) ahead


@numba.njit(cache=True, inline="always")
def _lane_fma(a, x0, x1, x2, x3, pr):
    """A head's four registers + pr * a V row's four 16-column pieces."""
    return ffma16s(a[0], x0, pr), ffma16s(a[1], x1, pr), ffma16s(a[2], x2, pr), ffma16s(a[3], x3, pr)


@numba.njit(cache=True)
def _lane_store(lanes, t, h, ln, j, nb, a):
    """lanes[t, h, ln, j + 16 i] = the first nb (1-4) registers of a."""
    row = lanes[t, h]
    fstore16(row, ln, j, a[0])
    if nb > 1:
        fstore16(row, ln, j + 16, a[1])
    if nb > 2:
        fstore16(row, ln, j + 32, a[2])
    if nb > 3:
        fstore16(row, ln, j + 48, a[3])


@numba.njit(cache=True)
def _lane_heads(v, cl, t, ln, m, h, nh, col, j, d_v, e, lanes):
    """Lane ln of kqv (slots ln, ln + 16, ... < m in order) for nh (1 or 3) query heads h.. of one KV head (V
    columns from col), columns j..j+63: each V row's four pieces loaded and widened once for the heads (twelve
    chains), the row V_AHEAD lane slots ahead prefetched. Past d_v a register repeats the last one (not stored)."""
    j1, j2, j3, nb = min(j + 16, d_v - 16), min(j + 32, d_v - 16), min(j + 48, d_v - 16), min(4, (d_v - j) // 16)
    z = wzero()
    a = b = c = (z, z, z, z)
    last = cl.shape[1] - 1
    for r in range(ln, m, 16):
        ahead = cl[t, min(r + 16 * V_AHEAD, last)]
        prefetch(v, ahead, col + j)
        prefetch(v, ahead, col + j3 + 15)
        cr = cl[t, r]
        x0, x1 = hload16(v, cr, col + j), hload16(v, cr, col + j1)
        x2, x3 = hload16(v, cr, col + j2), hload16(v, cr, col + j3)
        a = _lane_fma(a, x0, x1, x2, x3, round_f16(e[t, h, r]))
        if nh == 3:
            b = _lane_fma(b, x0, x1, x2, x3, round_f16(e[t, h + 1, r]))
            c = _lane_fma(c, x0, x1, x2, x3, round_f16(e[t, h + 2, r]))
    _lane_store(lanes, t, h, ln, j, nb, a)
    if nh == 3:
        _lane_store(lanes, t, h + 1, ln, j, nb, b)
        _lane_store(lanes, t, h + 2, ln, j, nb, c)


@numba.njit(parallel=True, cache=True)
def _split_values(v, n_head, n_head_kv, cl, n_cells, e, lanes):  # pragma: no cover
    """lanes[t, h, l] = tinyBLAS's kqv lane l (slots r = l, l + 16, ... in order) of every head, in (token,
    lane) tasks: lane l reads only its own slots' V rows, so each thread streams its own rows of V, once per
    64-column block, for the query heads of a KV head three at a time (`_lane_heads`)."""
    n = e.shape[0]
    d_v = v.shape[1] // n_head_kv
    gqa = n_head // n_head_kv
    n3 = gqa - gqa % 3
    for task in numba.prange(n * 16):
        t, ln = task // 16, task % 16
        m = n_cells[t]
        for hk in range(n_head_kv):
            for j in range(0, d_v, 64):
                g = 0
                while g < gqa:
                    nh = 3 if g < n3 else 1
                    _lane_heads(v, cl, t, ln, m, hk * gqa + g, nh, hk * d_v, j, d_v, e, lanes)
                    g += nh


@numba.njit(parallel=True, cache=True)
def _split_reduce(lanes, out):  # pragma: no cover
    """out[t, h * d_v + j] = `_mm512_reduce_add_ps` of lanes[t, h, 0:16, j], 16 columns at a time."""
    n, n_head, _, d_v = lanes.shape
    for task in numba.prange(n * n_head):
        t, h = task // n_head, task % n_head
        x = lanes[t, h]
        for j in range(0, d_v, 16):
            y = _lane_tree(fload16(x, 0, j), fload16(x, 1, j), fload16(x, 2, j), fload16(x, 3, j), fload16(x, 4, j),
                           fload16(x, 5, j), fload16(x, 6, j), fload16(x, 7, j), fload16(x, 8, j), fload16(x, 9, j),
                           fload16(x, 10, j), fload16(x, 11, j), fload16(x, 12, j), fload16(x, 13, j),
                           fload16(x, 14, j), fload16(x, 15, j))
            fstore16(out, t, h * d_v + j, y)


@numba.njit(cache=True)
def _attend_split(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads,
                  sinks):  # pragma: no cover
    """`attend` for few tokens over many cells: scores split over cell blocks, softmax per head, kqv split over
    its 16 lanes, then the lanes reduced; the same sums in the same order as `_attend_groups`."""
    n = q.shape[0]
    d_v = v.shape[1] // n_head_kv
    m_pad = (n_cells.max() + 63) // 64 * 64
    w = np.empty((n, n_head, m_pad), np.float32)
    e = np.empty((n, n_head, m_pad), np.float32)
    cl = np.empty((n, m_pad), np.int64)
    for t in range(n):
        _slot_cells(cells, t, n_cells[t], cl[t])
    _split_scores(q, k, n_head, n_head_kv, cl, n_cells, mask_add, scale, w, 4 * n_threads)
    _split_soft_max(w, n_cells, e, sinks)
    lanes = np.empty((n, n_head, 16, d_v), np.float32)
    _split_values(v, n_head, n_head_kv, cl, n_cells, e, lanes)
    _split_reduce(lanes, out)

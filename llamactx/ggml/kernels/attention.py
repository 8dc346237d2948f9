"""Attention over the f16 KV cache without flash attention (ggml-cpu's kq mul_mat, soft_max, kqv mul_mat), fast.

The arithmetic is llamactx.ggml.attention's (ReferenceOps), which follows llama.cpp bit for bit: q rounded to f16,
kq in tinyBLAS order (16 FMA lanes over the head dimension, `_mm512_reduce_add_ps`), `ggml_vec_soft_max_f32`,
probabilities rounded to f16, kqv in tinyBLAS order over the token's visible cells by rank (lane = rank mod 16).
Here the lanes are 512-bit registers (wide.py): a cell's key row is read as f16 and widened in registers, its
value row is added into the 16 lane rows with one FMA per 16 dimensions, and only the cells a token sees are read,
wherever they sit in the cache, so attention over many sequences costs what their own cells cost. The query heads
of one KV head are computed together (a cell's K and V rows are read once for the group). Parallel over (token, KV
head) groups dealt round robin (rows of a causal prefill see more cells the later they come); a few tokens over
many cells (decode at depth) split their cells and columns into even blocks instead.
"""

from __future__ import annotations

import numba
import numpy as np

from llamactx.ggml.attention import _soft_max
from llamactx.ggml.intrinsics import round_f16
from llamactx.ggml.kernels.wide import fadd16, ffma16, ffma16s, fload16, fstore16, hload16, reduce_add16, wzero

_F32 = np.float32


@numba.njit(cache=True)
def _score(qv, k, c, k0, d_k):
    """kq of cell c against the f16-rounded query qv (1, d_k): 16 FMA lanes over the head dimension from zero,
    reduced as `_mm512_reduce_add_ps` (tinyBLAS<16, __m512>)."""
    acc = wzero()
    for i in range(0, d_k, 16):
        acc = ffma16(acc, hload16(k, c, k0 + i), fload16(qv, 0, i))
    return reduce_add16(acc)


@numba.njit(cache=True)
def _reduce_lanes(lanes, out, t, o, d):
    """out[t, o : o + d] = `_mm512_reduce_add_ps` of lanes[0:16, :d], 16 dimensions at a time."""
    for j in range(0, d, 16):
        t0 = fadd16(fload16(lanes, 8, j), fload16(lanes, 0, j))
        t1 = fadd16(fload16(lanes, 9, j), fload16(lanes, 1, j))
        t2 = fadd16(fload16(lanes, 10, j), fload16(lanes, 2, j))
        t3 = fadd16(fload16(lanes, 11, j), fload16(lanes, 3, j))
        t4 = fadd16(fload16(lanes, 12, j), fload16(lanes, 4, j))
        t5 = fadd16(fload16(lanes, 13, j), fload16(lanes, 5, j))
        t6 = fadd16(fload16(lanes, 14, j), fload16(lanes, 6, j))
        t7 = fadd16(fload16(lanes, 15, j), fload16(lanes, 7, j))
        u0, u1, u2, u3 = fadd16(t4, t0), fadd16(t5, t1), fadd16(t6, t2), fadd16(t7, t3)
        fstore16(out, t, o + j, fadd16(fadd16(u0, u2), fadd16(u1, u3)))


SPLIT_MIN_CELLS = 512  # few tokens over at least this many cells: attention in three passes split over cells


@numba.njit(cache=True)
def attend(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads):  # pragma: no cover
    """out (n, n_head * d_v) = attention of q (n, n_head * d_k) float32 over the cells each token sees: k (n_kv,
    n_head_kv * d_k) and v (n_kv, n_head_kv * d_v) are an f16 cache's rows as uint16 bits; cells (n, max
    visible) lists token t's n_cells[t] visible cells in cell order, mask_add their mask values. d_k, d_v
    multiples of 16 (checked by the callers). The query heads of one KV head are computed together, so each
    cell's K and V rows are read once for the group (from L1 for its other heads). Few tokens over many cells
    (decode at depth) run in three passes whose work splits evenly over `n_threads` (`_attend_split`); else each
    thread takes (token, KV head) groups round robin (`_attend_groups`)."""
    n = q.shape[0]
    if n == 0:
        return
    if n * n_head_kv < 2 * n_threads and n_cells.max() >= SPLIT_MIN_CELLS:
        _attend_split(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads)
    else:
        _attend_groups(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads)


@numba.njit(cache=True)
def _group_scores(q, k, cells, mask_add, scale, t, hk, r0, r1, qv, w):
    """w[g, r] = scaled, masked kq of visible slots r0..r1-1 for the query heads g of KV head hk (qv (gqa, d_k):
    scratch for the queries rounded to f16, from_float of the f16 vec_dot_type); each cell's K row is read once
    for the group."""
    gqa, d_k = qv.shape
    for g in range(gqa):
        for i in range(d_k):
            qv[g, i] = round_f16(q[t, (hk * gqa + g) * d_k + i])
    for r in range(r0, r1):
        c = cells[t, r]
        for g in range(gqa):
            w[g, r] = _score(qv[g : g + 1], k, c, hk * d_k, d_k) * scale + mask_add[t, r]


@numba.njit(cache=True)
def _group_values(v, cells, t, hk, d_v, m, e, lanes, out, j0):
    """out[t, columns j0 : j0 + width of each query head g of KV head hk] = kqv over visible slots 0..m-1 from the
    probabilities e (gqa, >= m); lanes (16, width) scratch."""
    gqa, width = e.shape[0], lanes.shape[1]
    for g in range(gqa):
        lanes[:, :] = _F32(0.0)
        _accumulate_v(v, cells, t, 0, m, e[g], lanes, hk, d_v, j0, j0 + width)
        _reduce_lanes(lanes, out, t, (hk * gqa + g) * d_v + j0, width)


@numba.njit(cache=True)
def _accumulate_v(v, cells, t, r0, r1, e, lanes, hk, d_v, j0, j1):
    """lanes[r % 16, j0:j1] += f16(e[r]) * V[cells[t, r], head hk, j0:j1] over visible slots r0..r1-1, in order
    (tinyBLAS's kqv lanes: lane = rank mod 16)."""
    for r in range(r0, r1):
        pr = round_f16(e[r])
        if pr == 0:
            continue  # adds an exact zero (fma(0, v, acc) = acc)
        c, ln = cells[t, r], r % 16
        for j in range(j0, j1, 16):
            fstore16(lanes, ln, j - j0, ffma16s(fload16(lanes, ln, j - j0), hload16(v, c, hk * d_v + j), pr))


@numba.njit(parallel=True, cache=True)
def _attend_groups(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads):  # pragma: no cover
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
        lanes = np.empty((16, d_v), np.float32)
        for p in range(task, n_g, n_tasks):
            t = p // n_head_kv
            hk = p - t * n_head_kv
            m = n_cells[t]
            m_pad = (m + 63) // 64 * 64
            _group_scores(q, k, cells, mask_add, scale, t, hk, 0, m, qv, w_buf)
            for g in range(gqa):
                _soft_max(w_buf[g, :m_pad], m, e_buf[g, :m_pad])
            _group_values(v, cells, t, hk, d_v, m, e_buf, lanes, out, 0)


@numba.njit(parallel=True, cache=True)
def _split_scores(q, k, n_head, n_head_kv, cells, n_cells, mask_add, scale, w, n_blocks):  # pragma: no cover
    """w[t, h, r] = scaled, masked kq of every visible slot, in (token, KV head, cell block) tasks."""
    n = q.shape[0]
    d_k = q.shape[1] // n_head
    gqa = n_head // n_head_kv
    for task in numba.prange(n * n_head_kv * n_blocks):
        t = task // (n_head_kv * n_blocks)
        hk = task // n_blocks % n_head_kv
        b = task % n_blocks
        m = n_cells[t]
        r0, r1 = b * m // n_blocks, (b + 1) * m // n_blocks
        qv = np.empty((gqa, d_k), np.float32)
        _group_scores(q, k, cells, mask_add, scale, t, hk, r0, r1, qv, w[t, hk * gqa : (hk + 1) * gqa])


@numba.njit(parallel=True, cache=True)
def _split_soft_max(w, n_cells, e):  # pragma: no cover
    """e[t, h] = ggml_vec_soft_max_f32 of w[t, h, :n_cells[t]], one task per (token, head)."""
    n, n_head = w.shape[0], w.shape[1]
    for task in numba.prange(n * n_head):
        t, h = task // n_head, task % n_head
        m = n_cells[t]
        m_pad = (m + 63) // 64 * 64
        _soft_max(w[t, h, :m_pad], m, e[t, h, :m_pad])


@numba.njit(parallel=True, cache=True)
def _split_values(v, n_head, n_head_kv, cells, n_cells, e, out, n_cols):  # pragma: no cover
    """out = kqv in (token, KV head, column block) tasks: a block's columns of V summed in every slot's order,
    as a whole row would be (each column's sum is its own)."""
    n = e.shape[0]
    d_v = v.shape[1] // n_head_kv
    gqa = n_head // n_head_kv
    width = d_v // n_cols
    for task in numba.prange(n * n_head_kv * n_cols):
        t = task // (n_head_kv * n_cols)
        hk = task // n_cols % n_head_kv
        j0 = task % n_cols * width
        lanes = np.empty((16, width), np.float32)
        _group_values(v, cells, t, hk, d_v, n_cells[t], e[t, hk * gqa : (hk + 1) * gqa], lanes, out, j0)


@numba.njit(cache=True)
def _attend_split(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads):  # pragma: no cover
    """`attend` for few tokens over many cells: scores split over cell blocks, softmax per head, kqv split over
    column blocks (16 columns or more); the same sums in the same order as `_attend_groups`."""
    n = q.shape[0]
    d_v = v.shape[1] // n_head_kv
    m_pad = (n_cells.max() + 63) // 64 * 64
    w = np.empty((n, n_head, m_pad), np.float32)
    e = np.empty((n, n_head, m_pad), np.float32)
    groups = n * n_head_kv
    n_blocks = 4 * n_threads  # a multiple of the threads: every thread gets as many blocks
    _split_scores(q, k, n_head, n_head_kv, cells, n_cells, mask_add, scale, w, n_blocks)
    _split_soft_max(w, n_cells, e)
    n_cols = 1
    while groups * n_cols < 2 * n_threads and d_v % (32 * n_cols) == 0:
        n_cols *= 2
    _split_values(v, n_head, n_head_kv, cells, n_cells, e, out, n_cols)

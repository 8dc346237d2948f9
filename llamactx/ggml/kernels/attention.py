"""Attention over the f16 KV cache without flash attention (ggml-cpu's kq mul_mat, soft_max, kqv mul_mat), fast.

The arithmetic is llamactx.ggml.attention's (ReferenceOps), which follows llama.cpp bit for bit: q rounded to f16,
kq in tinyBLAS order (16 FMA lanes over the head dimension, `_mm512_reduce_add_ps`), `ggml_vec_soft_max_f32`,
probabilities rounded to f16, kqv in tinyBLAS order over the token's visible cells by rank (lane = rank mod 16).
Here the lanes are 512-bit registers (wide.py): a cell's key row is read as f16 and widened in registers, its
value row is added into the 16 lane rows with one FMA per 16 dimensions, and only the cells a token sees are read,
wherever they sit in the cache, so attention over many sequences costs what their own cells cost. Parallel over
(token, head) pairs, dealt round robin (rows of a causal prefill see more cells the later they come).
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


@numba.njit(parallel=True, cache=True)
def attend(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_chunks):  # pragma: no cover
    """out (n, n_head * d_v) = attention of q (n, n_head * d_k) float32 over the cells each token sees: k (n_kv,
    n_head_kv * d_k) and v (n_kv, n_head_kv * d_v) are an f16 cache's rows as uint16 bits; cells (n, max
    visible) lists token t's n_cells[t] visible cells in cell order, mask_add their mask values. d_k, d_v
    multiples of 16 (checked by the callers). The (token, head) pairs are dealt round robin to `n_chunks`
    tasks, each with its own scratch."""
    n = q.shape[0]
    d_k = q.shape[1] // n_head
    d_v = v.shape[1] // n_head_kv
    gqa = n_head // n_head_kv
    n_p = n * n_head
    n_chunks = max(min(n_chunks, n_p), 1)
    m_max = (n_cells.max() + 63) // 64 * 64 if n > 0 else 64
    for ch in numba.prange(n_chunks):
        qv = np.empty((1, d_k), np.float32)
        w_buf = np.zeros(m_max, np.float32)
        e_buf = np.zeros(m_max, np.float32)
        lanes = np.empty((16, d_v), np.float32)
        for p in range(ch, n_p, n_chunks):
            t = p // n_head
            h = p - t * n_head
            hk = h // gqa
            m = n_cells[t]
            m_pad = (m + 63) // 64 * 64
            for i in range(d_k):
                qv[0, i] = round_f16(q[t, h * d_k + i])  # from_float of the f16 vec_dot_type
            w = w_buf[:m_pad]
            for r in range(m):
                w[r] = _score(qv, k, cells[t, r], hk * d_k, d_k) * scale + mask_add[t, r]
            e = e_buf[:m_pad]
            _soft_max(w, m, e)
            lanes[:, :] = _F32(0.0)
            for r in range(m):
                pr = round_f16(e[r])
                if pr == 0:
                    continue  # adds an exact zero (fma(0, v, acc) = acc)
                c, ln = cells[t, r], r % 16
                for j in range(0, d_v, 16):
                    fstore16(lanes, ln, j, ffma16s(fload16(lanes, ln, j), hload16(v, c, hk * d_v + j), pr))
            _reduce_lanes(lanes, out, t, h * d_v, d_v)

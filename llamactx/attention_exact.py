"""Attention over an f16 KV cache without flash attention, as ggml-cpu computes it on x86 (AVX-512 build).

llama.cpp's graph (build_attn_mha) is kq = mul_mat(k, q); kq = soft_max_ext(kq, mask, kq_scale);
kqv = mul_mat(v^T, kq). With an f16 cache both mul_mats convert their f32 operand to f16 and then
(ggml-cpu.c `ggml_compute_forward_mul_mat`):

- for a ubatch of two or more tokens run llamafile's tinyBLAS (llamafile/sgemm.cpp, `tinyBLAS<16, __m512, ...>`):
  each output is 16 float lanes, lane l accumulating fma(a[i], b[i]) over i = l mod 16 in order, then
  `hsum` = `_mm512_reduce_add_ps`;
- for a single token run `ggml_vec_dot_f16` (ggml-cpu/vec.cpp): four 16-lane accumulators, element i going to
  accumulator (i / 16) mod 4, reduced as (0+2) + (1+3) then `_mm512_reduce_add_ps`, into a double.

So in llama.cpp a token's attention depends on whether it is alone in its ubatch. `attention_f16(...,
vec_dot_for_one=True)` follows that; by default one token is computed in the tinyBLAS order too.

The softmax (`ggml_compute_forward_soft_max_f32`, `ggml_vec_soft_max_f32`) scales, adds the mask, takes the max,
exponentiates with `ggml_v_expf` 16 lanes at a time summing each group with `_mm512_reduce_add_ps` into a double,
and multiplies by the float of 1/sum. The probabilities are rounded to f16 before kqv.

In kqv the sums run over KV cells, so ggml's lanes depend on absolute cell indices. Here the lanes follow each
token's visible cells in order (rank 0, 1, ...): for one sequence that fills the cache from cell 0, the usual
case and the reference outputs' case, that is ggml's own order (masked cells add exact zeros); elsewhere it keeps
a token's result independent of where other sequences sit in the cache.
"""

from __future__ import annotations

import numba
import numpy as np

from llamactx.ggml_vec import dot_tinyblas, dot_vec, fma32, reduce_add16, round_f16, v_expf

_F32 = np.float32


@numba.njit(cache=True)
def _soft_max(w, m, e):  # pragma: no cover - compiled
    """ggml_vec_soft_max_f32 over w[:m] (already scaled and masked) in 16-lane groups; writes the normalized
    probabilities to e[:m] and zeros to e[m:] (the masked cells of the group)."""
    mx = _F32(-np.inf)
    for r in range(m):
        if w[r] > mx:
            mx = w[r]
    s = 0.0
    for i in range(0, e.shape[0], 16):
        for ln in range(16):
            r = i + ln
            e[r] = v_expf(w[r] - mx) if r < m else _F32(0.0)
        s += np.float64(reduce_add16(e, i))
    inv = _F32(1.0 / s) if s > 0 else _F32(np.nan)  # no visible cell: ggml's row is NaN too
    for r in range(m):
        e[r] = e[r] * inv


@numba.njit(parallel=True, cache=True)
def _attention(q, k, v, cells, n_cells, scale, mask_add, single, out):  # pragma: no cover - compiled
    n, n_head, d_k = q.shape
    n_head_kv = k.shape[1]
    d_v = v.shape[2]
    gqa = n_head // n_head_kv
    for p in numba.prange(n * n_head):
        t = p // n_head
        h = p - t * n_head
        hk = h // gqa
        m = n_cells[t]
        m_pad = (m + 63) // 64 * 64
        acc = np.zeros(64, np.float32)
        w = np.zeros(m_pad, np.float32)  # scaled + masked scores of the visible cells, by rank
        qv = q[t, h]
        for r in range(m):
            c = cells[t, r]
            kq = dot_vec(k[c, hk], qv, acc, True) if single else dot_tinyblas(k[c, hk], qv, acc)
            w[r] = kq * scale + mask_add[t, r]  # ggml_vec_scale_f32, then += 1.0f * mask
        e = np.zeros(m_pad, np.float32)
        _soft_max(w, m, e)
        for r in range(m):
            e[r] = round_f16(e[r])
        # kqv: lanes over ranks; 16 lanes (tinyBLAS) or 4 x 16 (vec_dot_f16) per output element
        lanes = np.zeros((d_v, 64), np.float32)
        for r in range(m):
            c = cells[t, r]
            pr = e[r]
            if pr == 0:
                continue  # adds an exact zero (fma(0, v, acc) = acc)
            lane = (r % 64) if single else (r % 16)
            for j in range(d_v):
                lanes[j, lane] = fma32(v[c, hk, j], pr, lanes[j, lane])
        for j in range(d_v):
            if single:
                for ln in range(16):
                    lanes[j, ln] = lanes[j, ln] + lanes[j, 32 + ln]
                    lanes[j, 16 + ln] = lanes[j, 16 + ln] + lanes[j, 48 + ln]
                for ln in range(16):
                    lanes[j, ln] = lanes[j, ln] + lanes[j, 16 + ln]
                out[t, h, j] = _F32(np.float64(reduce_add16(lanes[j], 0)))
            else:
                out[t, h, j] = reduce_add16(lanes[j], 0)


def attention_f16(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, kq_scale: float, vec_dot_for_one: bool = False
) -> np.ndarray:
    """Non-flash attention over an f16 cache, bit for bit as ggml-cpu (module docstring).

    q: (n, n_head, d_k) float32; k: (n_kv, n_head_kv, d_k) and v: (n_kv, n_head_kv, d_v) float32 holding f16
    values; mask: (n, n_kv) float32, -inf where a cell is not visible. d_k must be a multiple of 16.
    vec_dot_for_one: a single token goes through ggml_vec_dot_f16, as in llama.cpp's decode.
    -> (n, n_head * d_v) float32"""
    n, n_head, d_k = q.shape
    if d_k % 16:
        raise ValueError(f"attention_f16: head size d_k={d_k} is not a multiple of 16")
    visible = mask > -np.inf  # (n, n_kv)
    n_cells = visible.sum(axis=1).astype(np.int64)  # (n,)
    order = np.argsort(~visible, axis=1, kind="stable")  # visible cells first, in cell order
    cells = np.ascontiguousarray(order[:, : max(int(n_cells.max(initial=0)), 1)], np.int64)  # (n, max visible)
    mask_add = np.ascontiguousarray(np.take_along_axis(mask, cells, axis=1), np.float32)  # (n, max visible)
    q16 = q.astype(np.float16).astype(np.float32)  # from_float of the f16 vec_dot_type
    out = np.empty((n, n_head, v.shape[2]), np.float32)  # (n, n_head, d_v)
    _attention(
        q16,
        np.ascontiguousarray(k, np.float32),
        np.ascontiguousarray(v, np.float32),
        cells,
        n_cells,
        _F32(kq_scale),
        mask_add,
        n == 1 and vec_dot_for_one,
        out,
    )
    return out.reshape(n, -1)

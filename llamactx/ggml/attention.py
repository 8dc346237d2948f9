"""Attention over an f16 KV cache without flash attention, as ggml-cpu computes it on x86 (the target's build).

llama.cpp's graph (build_attn_mha) is kq = mul_mat(k, q); kq = soft_max_ext(kq, mask, kq_scale);
kqv = mul_mat(v^T, kq). With an f16 cache both mul_mats convert their f32 operand to f16 and then
(ggml-cpu.c `ggml_compute_forward_mul_mat`):

- for a ubatch of two or more tokens run llamafile's tinyBLAS (llamafile/sgemm.cpp, `tinyBLAS<16, __m512, ...>`;
  AVX2: `<8, __m256>`): each output is F32_EPR float lanes, lane l accumulating fma(a[i], b[i]) over
  i = l mod F32_EPR in order, then `hsum` (`vec.hsum_vec`);
- for a single token run `ggml_vec_dot_f16` (ggml-cpu/vec.cpp): four F32_EPR-lane accumulators, element i going
  to accumulator (i / F32_EPR) mod 4, reduced as (0+2) + (1+3) then `_mm512_reduce_add_ps` (AVX2: two `hadd`s),
  into a double.

So in llama.cpp a token's attention depends on whether it is alone in its ubatch. `attention_f16(...,
vec_dot_for_one=True)` follows that; by default one token is computed in the tinyBLAS order too.

This is the reference (ReferenceOps); ggml/kernels/attention.py is the same arithmetic compiled (FastOps), and
ggml/kernels/attention8.py for an 8-lane (AVX2) target.

The softmax (`ggml_compute_forward_soft_max_f32`, `ggml_vec_soft_max_f32`) scales, adds the mask, takes the max,
exponentiates with `ggml_v_expf` F32_EPR lanes at a time summing each group (`hsum_vec`) into a double,
and multiplies by the float of 1/sum. The probabilities are rounded to f16 before kqv. A model with attention
sinks (gpt-oss, `ggml_soft_max_add_sinks`) has one more logit per head, without a value row: it joins the max,
and libm's expf(sink - max) joins the sum.

In kqv the sums run over KV cells, so ggml's lanes depend on absolute cell indices. Here the lanes follow each
token's visible cells in order (rank 0, 1, ...): for one sequence that fills the cache from cell 0, the usual
case and the reference outputs' case, that is ggml's own order (masked cells add exact zeros); elsewhere it keeps
a token's result independent of where other sequences sit in the cache.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import overload

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.inputs import VisibleCells
from llamactx.ggml.intrinsics import f16_to_f32, fma32, round_f16
from llamactx.ggml.vec import dot_tinyblas, dot_vec, hsum_vec, tanhf, v_expf, vec_max

_F32 = np.float32


NO_SINK = _F32(-np.inf)  # a head without an attention sink


@numba.njit(cache=True, error_model="numpy")
def _soft_max(w, m, e, sink):  # pragma: no cover - compiled
    """ggml_vec_soft_max_f32 over w[:m] (already scaled and masked) in F32_EPR-lane groups; writes the normalized
    probabilities to e[:m] and zeros to e[m:] (the masked cells of the group). The max is `vec_max`'s, and the
    loops run over slices under numpy's error model so that LLVM vectorizes them. sink: the head's attention sink
    (ggml_soft_max_add_sinks, gpt-oss; NO_SINK: none), a logit that joins the max and the sum but has no value
    row: `max = MAX(max, sink)` before the exponentials, `sum += (double) expf(sink - max)` after their sum."""
    wv, ev = w[:m], e[:m]
    mx = vec_max(wv, m)
    if sink != NO_SINK:
        mx = mx if mx > sink else sink
    for r in range(m):
        ev[r] = v_expf(wv[r] - mx)
    for r in range(m, e.shape[0]):
        e[r] = _F32(0.0)
    s = 0.0
    for i in range(0, e.shape[0], F32_EPR):
        s += np.float64(hsum_vec(e, i))
    if sink != NO_SINK:
        s += np.float64(_F32(math.exp(sink - mx)))  # libm expf
    inv = _F32(1.0 / s) if s > 0 else _F32(np.nan)  # no visible cell: ggml's row is NaN too
    for r in range(m):
        ev[r] = ev[r] * inv


def _as_f32(x):
    """A stored K/V element as float32: f32 as is, a raw f16 cache element (uint16 bits) converted exactly."""


@overload(_as_f32, jit_options={"cache": True})
def _as_f32_impl(x):
    if isinstance(x, types.Integer):
        return lambda x: f16_to_f32(x)
    return lambda x: x


@numba.njit(parallel=True, cache=True)
def kv_to_f32(k, v, n_head_kv, kt, vf):  # pragma: no cover - compiled
    """The first kt.shape[2] cells of k (n_kv, n_head_kv * d_k) and v as float32 (exact): kt (n_head_kv, d_k,
    cells), K transposed so that the score loops run over contiguous cells; vf (n_head_kv, cells, d_v)."""
    d_k = kt.shape[1]
    n_c = kt.shape[2]
    d_v = vf.shape[2]
    for hk in numba.prange(n_head_kv):
        k0 = np.uintp(hk * d_k)
        v0 = np.uintp(hk * d_v)
        for c in range(n_c):
            for i in range(d_k):
                kt[hk, i, c] = _as_f32(k[c, k0 + np.uintp(i)])
            for j in range(d_v):
                vf[hk, c, j] = _as_f32(v[c, v0 + np.uintp(j)])


@numba.njit(parallel=True, cache=True)
def _attention(q, k, v, n_head_kv, cells, n_cells, scale, mask_add, single, out, kt, vf, n_ch,
               cap, sinks):  # pragma: no cover
    """q (n, n_head, d_k) float32 (not yet rounded); k (n_kv, n_head_kv * d_k) and v (n_kv, n_head_kv * d_v):
    float32 holding f16 values, or the f16 cache itself as uint16 bits (read in place). kt, vf: `kv_to_f32`
    of the first kt.shape[2] cells (kt.shape[2] == 0: none); a token whose visible cells are consecutive and
    among those reads them there, with the same arithmetic in the same order, vectorized over cells. cap: the
    attention logit soft-cap (0: none), applied to kq before the softmax's scale and mask (`_soft_cap`).
    sinks (n_head,): each head's attention sink (NO_SINK: none; `_soft_max`)."""
    n, n_head, d_k = q.shape
    inv_cap = _F32(1.0) / cap if cap != _F32(0.0) else _F32(0.0)
    d_v = v.shape[1] // n_head_kv
    gqa = n_head // n_head_kv
    n_conv = kt.shape[2]
    n_p = n * n_head
    # cells per token grow along a causal batch: deal the (token, head) pairs out round robin, not in blocks
    n_ch = max(min(n_ch, n_p), 1)
    m_max = (n_cells.max() + 63) // 64 * 64 if n > 0 else 64
    for ch in numba.prange(n_ch):
        # scratch of each chunk, reused by its pairs
        acc = np.zeros(64, np.float32)
        w_buf = np.zeros(m_max, np.float32)
        e_buf = np.zeros(m_max, np.float32)
        qv = np.empty(d_k, np.float32)
        kr = np.empty(d_k, np.float32)
        lanes_kq = np.empty((F32_EPR, m_max), np.float32)
        lanes = np.empty((64, d_v), np.float32)
        for p in range(ch, n_p, n_ch):
            t = p // n_head
            h = p - t * n_head
            hk = h // gqa
            m = n_cells[t]
            m_pad = (m + 63) // 64 * 64
            w = w_buf[:m_pad]  # scaled + masked scores of the visible cells, by rank (w[:m] written, read)
            for i in range(d_k):
                qv[i] = round_f16(q[t, h, i])  # from_float of the f16 vec_dot_type
            c0 = cells[t, 0]
            fast = (not single) and m > 0 and c0 >= 0 and c0 + m <= n_conv
            if fast:
                for r in range(m):
                    if cells[t, r] != c0 + r:
                        fast = False
                        break
            k0 = np.uintp(hk * d_k)  # unsigned indices: no negative-index wraparound, so the loops vectorize
            v0 = np.uintp(hk * d_v)
            if fast:
                # the tinyBLAS lanes of every cell at once: lane ln of cell r is fma over i = ln, ln + F32_EPR, ...
                cb = np.uintp(c0)
                mu = np.uintp(m)
                for ln in range(F32_EPR):
                    row = lanes_kq[ln]
                    for r in range(mu):
                        row[r] = _F32(0.0)
                    for i in range(ln, d_k, F32_EPR):
                        qi = qv[i]
                        krow = kt[hk, i, cb:]
                        for r in range(mu):
                            row[r] = fma32(krow[r], qi, row[r])
                for r in range(mu):
                    w[r] = _soft_cap(_hsum_col(lanes_kq, r), inv_cap, cap) * scale + mask_add[t, r]
            else:
                for r in range(m):
                    c = np.uintp(cells[t, r])
                    for i in range(d_k):
                        kr[i] = _as_f32(k[c, k0 + np.uintp(i)])
                    kq = dot_vec(kr, qv, acc, True) if single else dot_tinyblas(kr, qv, acc)
                    # ggml_vec_scale_f32, then += 1.0f * mask
                    w[r] = _soft_cap(kq, inv_cap, cap) * scale + mask_add[t, r]
            e = e_buf[:m_pad]  # all of it written by _soft_max
            _soft_max(w, m, e, sinks[h])
            for r in range(m):
                e[r] = round_f16(e[r])
            # kqv: lanes over ranks; F32_EPR lanes (tinyBLAS) or 4 x F32_EPR (vec_dot_f16) per output element j
            lanes[:, :] = _F32(0.0)  # (lane, j): the j loop runs over contiguous floats
            if fast:
                for r in range(m):
                    pr = e[r]
                    if pr == 0:
                        continue  # adds an exact zero (fma(0, v, acc) = acc)
                    vrow = vf[hk, c0 + r]
                    lrow = lanes[r % F32_EPR]
                    for j in range(d_v):
                        lrow[j] = fma32(vrow[j], pr, lrow[j])
            else:
                for r in range(m):
                    c = np.uintp(cells[t, r])
                    pr = e[r]
                    if pr == 0:
                        continue  # adds an exact zero (fma(0, v, acc) = acc)
                    lane = np.uintp(r % (4 * F32_EPR)) if single else np.uintp(r % F32_EPR)
                    for j in range(d_v):
                        lanes[lane, j] = fma32(_as_f32(v[c, v0 + np.uintp(j)]), pr, lanes[lane, j])
            if single:
                for ln in range(F32_EPR):
                    for j in range(d_v):
                        lanes[ln, j] = lanes[ln, j] + lanes[2 * F32_EPR + ln, j]
                        lanes[F32_EPR + ln, j] = lanes[F32_EPR + ln, j] + lanes[3 * F32_EPR + ln, j]
                for ln in range(F32_EPR):
                    for j in range(d_v):
                        lanes[ln, j] = lanes[ln, j] + lanes[F32_EPR + ln, j]
            for j in range(d_v):
                if single:  # GGML_F32_VEC_REDUCE's last step
                    out[t, h, j] = _F32(np.float64(_hsum_col(lanes, j) if F32_EPR == 16 else _hadd8_col(lanes, j)))
                else:
                    out[t, h, j] = _hsum_col(lanes, j)


@numba.njit(cache=True)
def _soft_cap(kq, inv_cap, cap):  # pragma: no cover - compiled
    """build_attn_mha's attention logit soft-capping without flash attention (gemma2): ggml_scale(kq, 1.0f /
    cap), ggml_tanh, ggml_scale(cap), each rounded to float32, before ggml_soft_max_ext. cap 0: kq as is."""
    if cap == _F32(0.0):
        return kq
    return tanhf(kq * inv_cap) * cap


@numba.njit(cache=True)
def _hsum_col(a, j):  # pragma: no cover - compiled
    """`vec.hsum_vec` over a[0:F32_EPR, j]: 16 lanes as `_mm512_reduce_add_ps` (8 pair sums, then 4, then
    (0+2) + (1+3)), 8 lanes as `hsum_float_8`."""
    if F32_EPR == 16:
        u0 = (a[12, j] + a[4, j]) + (a[8, j] + a[0, j])
        u1 = (a[13, j] + a[5, j]) + (a[9, j] + a[1, j])
        u2 = (a[14, j] + a[6, j]) + (a[10, j] + a[2, j])
        u3 = (a[15, j] + a[7, j]) + (a[11, j] + a[3, j])
        return (u0 + u2) + (u1 + u3)
    return ((a[4, j] + a[0, j]) + (a[6, j] + a[2, j])) + ((a[5, j] + a[1, j]) + (a[7, j] + a[3, j]))


@numba.njit(cache=True)
def _hadd8_col(a, j):  # pragma: no cover - compiled
    """`vec.reduce_hadd8` over a[0:8, j] (GGML_F32x8_REDUCE's two `hadd`s)."""
    return ((a[0, j] + a[4, j]) + (a[1, j] + a[5, j])) + ((a[2, j] + a[6, j]) + (a[3, j] + a[7, j]))


def sink_values(sinks: np.ndarray | None, n_head: int) -> np.ndarray:
    """Each query head's attention sink as the kernels take them: (n_head,) float32, NO_SINK for a model without
    sinks (None). A model's attn_sinks.weight must have one value per head (ValueError otherwise)."""
    if sinks is None:
        return np.full(n_head, NO_SINK, np.float32)
    out = np.ascontiguousarray(sinks, np.float32).reshape(-1)
    if out.shape != (n_head,):
        raise ValueError(f"attention sinks: {out.shape[0]} values for {n_head} heads")
    return out


def attention_f16(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, kq_scale: float, vec_dot_for_one: bool = False,
    softcap: float = 0.0, sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Non-flash attention over an f16 cache, bit for bit as ggml-cpu (module docstring).

    q: (n, n_head, d_k) float32; k: (n_kv, n_head_kv, d_k) and v: (n_kv, n_head_kv, d_v) float32 holding f16
    values; mask: (n, n_kv) float32, -inf where a cell is not visible. d_k must be a multiple of 16.
    vec_dot_for_one: a single token goes through ggml_vec_dot_f16, as in llama.cpp's decode. softcap: the
    attention logit soft-cap (gemma2's attn_logit_softcapping; 0: none). sinks: (n_head,) each head's attention
    sink (gpt-oss's attn_sinks, ggml_soft_max_add_sinks; None: none).
    -> (n, n_head * d_v) float32"""
    n_kv, n_head_kv = k.shape[:2]
    k2 = np.ascontiguousarray(k, np.float32).reshape(n_kv, -1)  # (n_kv, n_head_kv * d_k)
    v2 = np.ascontiguousarray(v, np.float32).reshape(n_kv, -1)  # (n_kv, n_head_kv * d_v)
    return attention_f16_cells(q, k2, v2, n_head_kv, VisibleCells.from_mask(mask), kq_scale, vec_dot_for_one,
                               softcap, sinks)


def attention_f16_cells(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    n_head_kv: int,
    vis: VisibleCells,
    kq_scale: float,
    vec_dot_for_one: bool = False,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """`attention_f16` over K/V rows as stored: k (n_kv, n_head_kv * d_k), v (n_kv, n_head_kv * d_v), either
    float32 holding f16 values or an f16 cache's rows (np.float16, read in place without a copy); `vis` lists
    the cells each token sees. -> (n, n_head * d_v) float32"""
    n, n_head, d_k = q.shape
    if d_k % 16:
        raise ValueError(f"attention_f16: head size d_k={d_k} is not a multiple of 16")
    if k.dtype == np.float16:
        k, v = k.view(np.uint16), v.view(np.uint16)  # the kernel converts the bits itself
    d_v = v.shape[1] // n_head_kv
    out = np.empty((n, n_head, d_v), np.float32)  # (n, n_head, d_v)
    single = n == 1 and vec_dot_for_one
    # prefill: the tokens share their cells, so convert the used cells of k and v to float32 once per call
    n_conv = min(int(vis.cells.max(initial=0)) + 1, k.shape[0]) if n >= 2 and not single else 0
    kt = np.empty((n_head_kv, d_k, n_conv), np.float32)
    vf = np.empty((n_head_kv, n_conv, d_v), np.float32)
    if n_conv:
        kv_to_f32(k, v, n_head_kv, kt, vf)
    _attention(
        np.ascontiguousarray(q, np.float32),
        k,
        v,
        n_head_kv,
        vis.cells,
        vis.n_cells,
        _F32(kq_scale),
        vis.mask_add,
        single,
        out,
        kt,
        vf,
        numba.get_num_threads() * 8,
        _F32(softcap),
        sink_values(sinks, n_head),
    )
    return out.reshape(n, -1)

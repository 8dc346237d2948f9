"""Flash attention over an f16 KV cache as ggml-cpu computes it on x86 (`ggml_compute_forward_flash_attn_ext_f16`,
ggml-cpu/ops.cpp, the target's build): `flash_attn="enabled"` (and llama.cpp's default `auto` on a CPU).

ggml picks one of three kernels for the whole op, from the ubatch's shape:

- **tiled** (`_flash_attn_ext_tiled`, n_tokens >= GGML_FA_TILE_Q = 64): KV cells in tiles of 64. Per tile,
  kq = `simd_gemm` of the f32 q (not rounded) with the f16 K widened to f32: one fma chain over d_k per score;
  times scale, plus the mask; then per token an online softmax: tile max, `M = fmaxf(M, max)`, on a new max
  VKQ and S are multiplied by `expf(M_old - M)`; `S += ggml_vec_soft_max_f32(64 scores)` (ggml_v_expf, groups
  of F32_EPR lanes each `hsum_vec` into a double: four of 16 with AVX-512, eight of 8 with AVX2); VKQ += P V
  by `simd_gemm` (one fma chain over the tile's cells per output, continuing VKQ). A tile without a visible
  cell is skipped. Out = VKQ * (1 / S).
- **one chunk** (`_f16_one_chunk`, fewer tokens): q rounded to f16, per visible cell in order
  s = `ggml_vec_dot_f16`(k, q) * scale; on a new max VKQ16 *= expf(M_old - s) else vs = expf(s - M); VKQ16 +=
  v * vs, both rounded to f16 per element (the accumulator is f16); `S = S * ms + vs` (fused). On a CPU with
  AVX512-FP16 (which a native build uses) `ggml_vec_mad_f16` / `ggml_vec_scale_f16` run the first d_v & ~127
  elements in half precision: the factor rounded to f16, one f16 rounding of x * v + y (`vfmadd...ph`); the rest
  (all of it without AVX512-FP16) in float: f16(f32(y) + f32(x) * v).
- **split KV** (one token and n_kv >= 512): the cells [0, n_kv) are cut into one chunk per thread
  (ceil(n_kv / n_threads) each); each chunk runs the one-chunk loop from M = -inf, and the chunks are merged in
  order with `VKQ = VKQ * expf(M_old - M) + VKQ_c * expf(M_c - M)` (first product fused), same for S.

Attention sinks (gpt-oss) are added to each row after its cells as one more score without a value row (in the
split kernel, to the first chunk's partials): `_add_sink`.

By default (`ggml_single_row=False`, as ReferenceOps computes one row like several elsewhere) every token takes the
tiled kernel's arithmetic, which is row invariant: llama.cpp's bits for n >= 64 (prompts, perplexity), and for
fewer tokens the same answer a token would get in a larger batch. `ggml_single_row=True` (the ReferenceOps
setting of that name) picks the kernel from the shape as ggml does and reproduces llama.cpp's decode too.

As in llamactx.ggml.attention, the lanes and tiles follow each token's visible cells by rank (0, 1, ...) instead
of absolute cell indices: identical to ggml for a sequence that fills the cache from cell 0 (the references'
case), and independent of other sequences elsewhere. n_kv for the split rule is the padded count a sequence alone
would have (llama_kv_cache::get_n_kv: pad(used, 256), at most the cache size).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from llamactx.ggml.attention import NO_SINK, kv_to_f32, sink_values
from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.inputs import VisibleCells
from llamactx.ggml.intrinsics import f16_to_f32, fma32, round_f16, round_f16_f64
from llamactx.ggml.vec import dot_vec, hsum_vec, tanhf, v_expf

_F32 = np.float32
TILE_Q = 64  # GGML_FA_TILE_Q
TILE_KV = 64  # GGML_FA_TILE_KV
SPLIT_KV_MIN = 512  # use_split_kv_path: neq1 == 1 and nek1 >= 512


@numba.njit(cache=True)
def _exp(x):  # pragma: no cover - compiled
    """libm expf (ggml calls expf for the rescaling factors)."""
    return _F32(math.exp(x))


@numba.njit(cache=True)
def _tiled_row(q, k, v, k0, v0, cells, m, mask_add, scale, vkq, kq, e, kt, vf, hk, cap,
               sink):  # pragma: no cover
    """One token and head through `_flash_attn_ext_tiled`: vkq (d_v,) gets the normalized output. kt (n_head_kv,
    d_k, n_conv), vf (n_head_kv, n_conv, d_v): the first n_conv cells as float32; a token whose visible cells are
    0..m-1 among them reads them there (the same arithmetic, vectorized over a tile's cells). cap: the logit
    soft-cap (0: none; `scale` is then already divided by it, as ggml does). sink: the head's attention sink
    (NO_SINK: none), added after the last tile (`_add_sink`)."""
    d_k = q.shape[0]
    d_v = vkq.shape[0]
    fast = m <= kt.shape[2]
    if fast:
        for r in range(m):
            if cells[r] != r:
                fast = False
                break
    vkq[:] = _F32(0.0)
    big_m = _F32(-np.inf)
    s = _F32(0.0)
    for r0 in range(0, m, TILE_KV):
        n_t = min(TILE_KV, m - r0)
        if fast:
            kq[:] = _F32(0.0)
            for i in range(d_k):  # simd_gemm: one fma chain over d_k per score, vectorized over the tile's cells
                qi = q[i]
                krow = kt[hk, i, r0:r0 + n_t]
                for j in range(n_t):
                    kq[j] = fma32(krow[j], qi, kq[j])
            for j in range(n_t):
                kq[j] = _soft_cap(kq[j] * scale, cap) + mask_add[r0 + j]
        else:
            for j in range(n_t):
                c = cells[r0 + j]
                acc = _F32(0.0)
                for i in range(d_k):
                    acc = fma32(f16_to_f32(k[c, k0 + i]), q[i], acc)
                kq[j] = _soft_cap(acc * scale, cap) + mask_add[r0 + j]
        for j in range(n_t, TILE_KV):
            kq[j] = _F32(-np.inf)
        tile_max = _F32(-np.inf)
        for j in range(TILE_KV):
            if kq[j] > tile_max:
                tile_max = kq[j]
        if tile_max == _F32(-np.inf):
            continue
        m_new = max(big_m, tile_max)
        if m_new > big_m:
            ms = _exp(big_m - m_new)
            for d in range(d_v):
                vkq[d] = vkq[d] * ms
            s = s * ms
        big_m = m_new
        for j in range(TILE_KV):
            e[j] = v_expf(kq[j] - m_new)
        tot = 0.0
        for g in range(0, TILE_KV, F32_EPR):
            tot += np.float64(hsum_vec(e, g))
        s = _F32(np.float64(s) + tot)
        for j in range(n_t):
            p = e[j]
            if p == 0:
                continue  # fma(v, 0, acc) = acc
            if fast:
                vrow = vf[hk, r0 + j]
                for d in range(d_v):
                    vkq[d] = fma32(vrow[d], p, vkq[d])
            else:
                c = cells[r0 + j]
                for d in range(d_v):
                    vkq[d] = fma32(f16_to_f32(v[c, v0 + d]), p, vkq[d])
    big_m, s = _add_sink(vkq, big_m, s, sink, True)
    inv = _F32(0.0) if s == _F32(0.0) else _F32(1.0) / s
    for d in range(d_v):
        vkq[d] = vkq[d] * inv


@numba.njit(cache=True)
def _add_sink(vkq, big_m, s, sink, fused):  # pragma: no cover - compiled
    """ggml_compute_forward_flash_attn_ext's sinks (gpt-oss), once per row after its cells (the first KV chunk's,
    when split): the sink is one more score without a value row. A sink above the running max M rescales the f32
    accumulator vkq (d_v,) by expf(M - sink) and becomes the max; else it adds expf(sink - M) to the sum:
    S = S * ms + vs, which GCC fuses in the tiled kernel (`fused`) but not in the one-chunk one (measured against
    llama.cpp's kqv_out tensors: each other choice misses rows). NO_SINK: nothing. -> (M, S)"""
    if sink == NO_SINK:
        return big_m, s
    if sink > big_m:
        ms = _exp(big_m - sink)
        for d in range(vkq.shape[0]):
            vkq[d] = vkq[d] * ms
        if fused:
            return sink, fma32(s, ms, _F32(1.0))
        p = s * ms
        return sink, p + _F32(1.0)
    return big_m, s + _exp(sink - big_m)


@numba.njit(cache=True)
def _soft_cap(s, cap):  # pragma: no cover - compiled
    """ggml_flash_attn_ext's logit soft-capping of a scaled score: `logit_softcap * tanhf(s)` (one chunk), or
    ggml_vec_tanh_f32 then ggml_vec_scale_f32 (tiled): the same float32 product. cap 0: s as is."""
    if cap == _F32(0.0):
        return s
    return tanhf(s) * cap


@numba.njit(cache=True)
def _chunk_row(qh, k, v, k0, v0, cells, r_start, r_end, mask_add, scale, vkq16, kr, acc, n_h,
               cap):  # pragma: no cover
    """The `_f16_one_chunk` loop over ranks [r_start, r_end) of one token and head, q already f16-rounded:
    vkq16 (d_v,) float32 holding f16 values (the f16 accumulator); its first n_h elements are updated in half
    precision (AVX512-FP16), the rest in float. -> (M, S)"""
    d_k = qh.shape[0]
    d_v = vkq16.shape[0]
    vkq16[:] = _F32(0.0)
    big_m = _F32(-np.inf)
    s_sum = _F32(0.0)
    for r in range(r_start, r_end):
        if mask_add[r] == _F32(-np.inf):
            continue  # a masked cell is skipped
        c = cells[r]
        for i in range(d_k):
            kr[i] = f16_to_f32(k[c, k0 + i])
        sc = _soft_cap(dot_vec(kr, qh, acc, True) * scale, cap) + mask_add[r]
        ms = _F32(1.0)
        vs = _F32(1.0)
        if sc > big_m:
            m_old = big_m
            big_m = sc
            ms = _exp(m_old - big_m)
            ms16 = round_f16(ms)
            for d in range(n_h):  # ggml_vec_scale_f16: _mm512_mul_ph (a product of halves is exact in float)
                vkq16[d] = round_f16(vkq16[d] * ms16)
            for d in range(n_h, d_v):
                vkq16[d] = round_f16(vkq16[d] * ms)
        else:
            vs = _exp(sc - big_m)
        vs16 = np.float64(round_f16(vs))
        for d in range(n_h):  # ggml_vec_mad_f16: _mm512_fmadd_ph, exact in double then one rounding
            vkq16[d] = round_f16_f64(np.float64(f16_to_f32(v[c, v0 + d])) * vs16 + np.float64(vkq16[d]))
        for d in range(n_h, d_v):
            vkq16[d] = round_f16(fma32(f16_to_f32(v[c, v0 + d]), vs, vkq16[d]))
        s_sum = fma32(s_sum, ms, vs)
    return big_m, s_sum


@numba.njit(parallel=True, cache=True)
def _flash(q, k, v, n_head_kv, cells, n_cells, scale, mask_add, mode, n_split, fp16, kt, vf, out,
           cap, sinks):  # pragma: no cover
    """mode 0: tiled; 1: one chunk; 2: split KV into n_split chunks (one token). k, v: the f16 cache rows as
    uint16 bits, (n_kv, n_head_kv * d). fp16: the f16 vector ops run in half precision (AVX512-FP16).
    sinks (n_head,): each head's attention sink (NO_SINK: none). out (n, n_head, d_v)."""
    n, n_head, d_k = q.shape
    d_v = out.shape[2]
    n_h = d_v & ~127 if fp16 else 0  # GGML_F16_STEP = 128 elements per SIMD step with AVX512-FP16
    gqa = n_head // n_head_kv
    for p in numba.prange(n * n_head):
        t = p // n_head
        h = p - t * n_head
        hk = h // gqa
        k0 = hk * d_k
        v0 = hk * d_v
        m = n_cells[t]
        vkq = np.empty(d_v, np.float32)
        if mode == 0:
            kq = np.empty(TILE_KV, np.float32)
            e = np.empty(TILE_KV, np.float32)
            _tiled_row(q[t, h], k, v, k0, v0, cells[t], m, mask_add[t], scale, vkq, kq, e, kt, vf, hk, cap,
                       sinks[h])
            out[t, h] = vkq
            continue
        qh = np.empty(d_k, np.float32)
        for i in range(d_k):
            qh[i] = round_f16(q[t, h, i])
        kr = np.empty(d_k, np.float32)
        acc = np.empty(64, np.float32)
        if mode == 1:
            big_m, s_sum = _chunk_row(qh, k, v, k0, v0, cells[t], 0, m, mask_add[t], scale, vkq, kr, acc, n_h, cap)
            big_m, s_sum = _add_sink(vkq, big_m, s_sum, sinks[h], False)  # VKQ16 widened to f32 first: exact
            inv = _F32(0.0) if s_sum == _F32(0.0) else _F32(1.0) / s_sum
            for d in range(d_v):
                out[t, h, d] = vkq[d] * inv
            continue
        # split KV: chunks of the padded cell range, merged in order (ggml_flash_attn_ext_reduce_partials)
        n_kv = n_split[0]
        nth = n_split[1]
        chunk = (n_kv + nth - 1) // nth
        fin = np.zeros(d_v, np.float32)
        m_fin = _F32(-np.inf)
        s_fin = _F32(0.0)
        for ci in range(nth):
            r_start = ci * chunk
            if r_start >= n_kv:
                continue
            r_end = min(r_start + chunk, m)
            if r_start >= r_end and (ci > 0 or sinks[h] == NO_SINK):
                continue  # S_chunk == 0: skipped
            m_c, s_c = _chunk_row(qh, k, v, k0, v0, cells[t], r_start, r_end, mask_add[t], scale, vkq, kr, acc, n_h,
                                  cap)
            if ci == 0:  # the sink joins the first chunk's partials only
                m_c, s_c = _add_sink(vkq, m_c, s_c, sinks[h], False)
            if s_c == _F32(0.0):
                continue
            m_new = max(m_fin, m_c)
            sc_old = _exp(m_fin - m_new)
            sc_new = _exp(m_c - m_new)
            for d in range(d_v):
                fin[d] = fma32(fin[d], sc_old, vkq[d] * sc_new)
            s_fin = fma32(s_fin, sc_old, s_c * sc_new)
            m_fin = m_new
        if s_fin != _F32(0.0):
            inv = _F32(1.0) / s_fin
            for d in range(d_v):
                fin[d] = fin[d] * inv
        out[t, h] = fin


def flash_attn_f16_cells(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_head_kv: int, vis: VisibleCells,
                         kq_scale: float, kv_size: int, n_threads: int, ggml_single_row: bool = False,
                         fp16: bool = False, softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """ggml_flash_attn_ext over an f16 cache's rows (module docstring). q: (n, n_head, d_k) float32; k (n_kv,
    n_head_kv * d_k) and v (n_kv, n_head_kv * d_v) np.float16 rows as stored; vis: each token's visible cells by
    rank; kv_size: the cache's cells (bounds the padded n_kv of the split rule); n_threads: the threads ggml would
    split one token's cells over. ggml_single_row: pick the kernel from the ubatch's shape as ggml does (a token's
    bits then depend on how many tokens share its ubatch); by default every token goes through the tiled kernel's
    arithmetic, so that its result does not depend on the rest of the batch (what ggml gives for n >= 64).
    fp16: the one-chunk kernel's f16 vector ops in half precision, as ggml built with AVX512-FP16 runs them.
    softcap: ggml_flash_attn_ext's logit_softcap (gemma2; 0: none): the scale is divided by it (`scale /=
    logit_softcap`, in float), and each score becomes softcap * tanhf(kq * scale) before the mask. sinks: (n_head,)
    each head's attention sink (gpt-oss's attn_sinks, ggml_flash_attn_ext_add_sinks; None: none).
    -> (n, n_head * d_v) float32"""
    n, n_head, _ = q.shape
    d_v = v.shape[1] // n_head_kv
    out = np.empty((n, n_head, d_v), np.float32)  # (n, n_head, d_v)
    n_conv = 0
    if n >= TILE_Q or not ggml_single_row:
        mode, split = 0, (0, 1)
        # the tokens of a prompt share their cells: widen the used cells of K and V to float32 once per call
        n_conv = min(int(vis.cells.max(initial=0)) + 1, k.shape[0]) if n >= 2 else 0
    else:
        n_kv = min(kv_size, max(256, -(-int(vis.n_cells.max(initial=0)) // 256) * 256))
        mode, split = (2, (n_kv, max(1, n_threads))) if n == 1 and n_kv >= SPLIT_KV_MIN else (1, (0, 1))
    k16, v16 = k.view(np.uint16), v.view(np.uint16)
    kt = np.empty((n_head_kv, q.shape[2], n_conv), np.float32)  # (n_head_kv, d_k, n_conv)
    vf = np.empty((n_head_kv, n_conv, d_v), np.float32)  # (n_head_kv, n_conv, d_v)
    if n_conv:
        kv_to_f32(k16, v16, n_head_kv, kt, vf)
    scale = _F32(kq_scale) / _F32(softcap) if softcap else _F32(kq_scale)
    _flash(np.ascontiguousarray(q, np.float32), k16, v16, n_head_kv, vis.cells, vis.n_cells, scale,
           vis.mask_add, mode, np.array(split, np.int64), fp16, kt, vf, out, _F32(softcap), sink_values(sinks, n_head))
    return out.reshape(n, -1)

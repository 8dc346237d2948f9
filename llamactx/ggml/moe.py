"""ggml-cpu's ops for mixture-of-experts routing, as llama.cpp's `build_moe_ffn` (src/llama-graph.cpp) uses them.

The router's ops, in graph order (each exact here):
- `ggml_soft_max` of the router logits (ops.cpp `ggml_compute_forward_soft_max_f32` without mask or scale):
  the max, `ggml_vec_soft_max_f32` (`ggml_v_expf` F32_EPR lanes at a time, each group's horizontal sum added to a
  double, the tail with libm `expf`), then every value times the float of 1/sum (`soft_max_rows`);
- `ggml_argsort_top_k`: `ggml_argsort(..., GGML_SORT_ORDER_DESC)` viewed to its first k columns. ggml sorts the
  indices with `std::sort` and the comparator `data[a] > data[b]`, so which of two equal probabilities comes first
  is libstdc++'s introsort's doing; `argsort_desc` runs that same algorithm (GCC 12's `std::__sort`: introsort
  with median-of-three pivots down to runs of 16, a heapsort past 2 log2(n) levels, then insertion sort), so ties
  come out in llama.cpp's order. The order matters beyond the chosen set: the experts' outputs are added in it;
- `ggml_get_rows` of the probabilities, `ggml_sum_rows` (`ggml_vec_sum_f32`: a double sum in order), `ggml_clamp`
  to 6.103515625e-5 and `ggml_div` (`norm_weights`).
gpt-oss's experts add one bias row per selected expert to their matmuls' outputs (`ggml_add_id`: a float add,
`add_id`) and gate with `ggml_swiglu_oai` (`swiglu_oai`), its router gates with "softmax_weight" (the top k of the
raw logits, then `ggml_soft_max` of their k logits).
The expert matmuls (`ggml_mul_mat_id`) compute every row on its own: `vec_dot` with one row
(ggml-cpu.c `ggml_compute_forward_mul_mat_id_one_chunk`) or a repacked weight's `gemv` (repack.cpp
`forward_mul_mat_id`), never the tinyBLAS or gemm kernels of a plain mul_mat; the ops layer runs them.
The block that uses all of these is models/moe.py.
"""

from __future__ import annotations

import dataclasses
import math

import numba
import numpy as np

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.vec import hsum_vec, v_expf

_F32 = np.float32
_SORT_THRESHOLD = 16  # libstdc++'s _S_threshold


@numba.njit(cache=True, error_model="numpy")
def _soft_max_row(x, y, buf):  # pragma: no cover - compiled
    """y = ggml_soft_max(x) for one row (no mask, scale 1). buf: scratch of at least F32_EPR floats."""
    n = x.shape[0]
    mx = _F32(-np.inf)
    for i in range(n):  # ggml_vec_max_f32
        mx = x[i] if x[i] > mx else mx
    s = 0.0
    n_vec = n // F32_EPR * F32_EPR
    for i in range(0, n_vec, F32_EPR):
        for ln in range(F32_EPR):
            buf[ln] = v_expf(x[i + ln] - mx)
            y[i + ln] = buf[ln]
        s += np.float64(hsum_vec(buf, 0))
    for i in range(n_vec, n):  # the scalar tail: libm expf
        v = _F32(math.exp(x[i] - mx))
        s += np.float64(v)
        y[i] = v
    inv = _F32(1.0 / s)
    for i in range(n):
        y[i] = y[i] * inv


@numba.njit(cache=True)
def _soft_max_rows(x, y):  # pragma: no cover - compiled
    buf = np.empty(16, np.float32)
    for r in range(x.shape[0]):
        _soft_max_row(x[r], y[r], buf)


def soft_max_rows(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max over the last axis, no mask (the router's gating). (n, n_expert) float32 -> same"""
    xr = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(xr)
    _soft_max_rows(xr, y)
    return y


# -- std::sort (libstdc++, GCC 12) on indices with the comparator data[a] > data[b] ----------------------------


@numba.njit(cache=True, inline="always")
def _gt(d, a, b):  # pragma: no cover - compiled
    return d[a] > d[b]


@numba.njit(cache=True)
def _adjust_heap(d, v, first, hole, length, value):  # pragma: no cover - compiled
    """std::__adjust_heap then std::__push_heap on v[first:first+length]."""
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if _gt(d, v[first + child], v[first + child - 1]):
            child -= 1
        v[first + hole] = v[first + child]
        hole = child
    if (length & 1) == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        v[first + hole] = v[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and _gt(d, v[first + parent], value):
        v[first + hole] = v[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    v[first + hole] = value


@numba.njit(cache=True)
def _heap_sort(d, v, first, last):  # pragma: no cover - compiled
    """std::__partial_sort(first, last, last): std::__make_heap, then std::__sort_heap."""
    length = last - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(d, v, first, parent, length, v[first + parent])
            if parent == 0:
                break
            parent -= 1
    while last - first > 1:
        last -= 1
        value = v[last]
        v[last] = v[first]
        _adjust_heap(d, v, first, 0, last - first, value)


@numba.njit(cache=True)
def _median_to_first(d, v, result, a, b, c):  # pragma: no cover - compiled
    """std::__move_median_to_first: swaps the median of v[a], v[b], v[c] into v[result]."""
    if _gt(d, v[a], v[b]):
        if _gt(d, v[b], v[c]):
            m = b
        elif _gt(d, v[a], v[c]):
            m = c
        else:
            m = a
    elif _gt(d, v[a], v[c]):
        m = a
    elif _gt(d, v[b], v[c]):
        m = c
    else:
        m = b
    v[result], v[m] = v[m], v[result]


@numba.njit(cache=True)
def _partition_pivot(d, v, first, last):  # pragma: no cover - compiled
    """std::__unguarded_partition_pivot: the median of (first + 1, mid, last - 1) as pivot at `first`."""
    _median_to_first(d, v, first, first + 1, first + (last - first) // 2, last - 1)
    lo, hi, pivot = first + 1, last, v[first]
    while True:
        while _gt(d, v[lo], pivot):
            lo += 1
        hi -= 1
        while _gt(d, pivot, v[hi]):
            hi -= 1
        if not lo < hi:
            return lo
        v[lo], v[hi] = v[hi], v[lo]
        lo += 1


@numba.njit(cache=True)
def _introsort(d, v, n, depth):  # pragma: no cover - compiled
    """std::__introsort_loop over v[:n]: it recurses on the right part and loops on the left one; the parts are
    disjoint and each carries its own depth, so a stack of (first, last, depth) visits the same partitions (numba
    cannot cache a recursive function)."""
    stack = np.empty((n + 1, 3), np.int64)
    stack[0] = (0, n, depth)
    top = 1
    while top:
        top -= 1
        first, last, depth = stack[top]
        while last - first > _SORT_THRESHOLD:
            if depth == 0:
                _heap_sort(d, v, first, last)
                break
            depth -= 1
            cut = _partition_pivot(d, v, first, last)
            stack[top] = (cut, last, depth)
            top += 1
            last = cut


@numba.njit(cache=True)
def _linear_insert(d, v, i):  # pragma: no cover - compiled
    """std::__unguarded_linear_insert."""
    value = v[i]
    while _gt(d, value, v[i - 1]):
        v[i] = v[i - 1]
        i -= 1
    v[i] = value


@numba.njit(cache=True)
def _insertion_sort(d, v, first, last):  # pragma: no cover - compiled
    """std::__insertion_sort."""
    for i in range(first + 1, last):
        if _gt(d, v[i], v[first]):
            value = v[i]
            v[first + 1 : i + 1] = v[first:i].copy()
            v[first] = value
        else:
            _linear_insert(d, v, i)


@numba.njit(cache=True)
def _std_sort_desc(d, v):  # pragma: no cover - compiled
    """std::sort(v, v + n, data[a] > data[b]): introsort to depth 2 floor(log2 n), then the final insertion sort."""
    n = v.shape[0]
    if n == 0:
        return
    _introsort(d, v, n, 2 * int(math.floor(math.log2(n))))
    if n > _SORT_THRESHOLD:
        _insertion_sort(d, v, 0, _SORT_THRESHOLD)
        for i in range(_SORT_THRESHOLD, n):
            _linear_insert(d, v, i)
    else:
        _insertion_sort(d, v, 0, n)


@numba.njit(cache=True)
def _argsort_rows(x, k, out):  # pragma: no cover - compiled
    v = np.empty(x.shape[1], np.int32)
    for r in range(x.shape[0]):
        for j in range(x.shape[1]):
            v[j] = j
        _std_sort_desc(x[r], v)
        out[r] = v[:k]


@numba.njit(cache=True)
def _route_out(probs, idx, k, norm_w, w_scale, out):  # pragma: no cover - compiled
    """The routers' output: out[:k] the experts idx[:k] (as floats), out[k:2k] their probabilities, divided by
    their sum (in double, at least 2^-14) when norm_w and scaled by w_scale (norm_weights, then ggml_scale)."""
    s = 0.0
    for j in range(k):
        s += np.float64(probs[idx[j]])
    s32 = max(_F32(s), _F32(6.103515625e-5))
    for j in range(k):
        w = probs[idx[j]]
        if norm_w:
            w = w / s32
        if w_scale != 0.0 and w_scale != 1.0:
            w = w * w_scale
        out[j] = _F32(idx[j])
        out[k + j] = w


@numba.njit(cache=True)
def route_row(logits, k, norm_w, w_scale, probs, idx, out):  # pragma: no cover - compiled
    """The softmax router of one token, compiled (the graph executor's MOE_ROUTE): out[:k] its experts (as
    floats), out[k:2k] their weights, computed as soft_max_rows, argsort_desc and norm_weights do. probs, idx:
    scratch of n_expert floats / int32."""
    buf = np.empty(16, np.float32)
    _soft_max_row(logits, probs, buf)
    for j in range(idx.shape[0]):
        idx[j] = j
    _std_sort_desc(probs, idx)
    _route_out(probs, idx, k, norm_w, w_scale, out)


@numba.njit(cache=True)
def route_row_biased(logits, k, sigmoid, probs_b, n_groups, n_group_used, norm_w, w_scale, probs, sel, idx,
                     out):  # pragma: no cover - compiled
    """DeepSeek-V3's router of one token, compiled (the graph executor's MOE_ROUTE_SEL): probabilities by softmax
    or sigmoid, the choice made on them plus the selection bias `probs_b` (n_expert,) (an empty array: none)
    among the experts of the n_group_used best groups (n_groups > 1), as ReferenceOps.moe_route computes it
    (sigmoid_rows, group_mask, argsort_desc, norm_weights). out[:k] the experts (as floats), out[k:2k] their
    weights; probs, sel: scratch of n_expert floats, idx of n_expert int32."""
    n_expert = logits.shape[0]
    if sigmoid:
        _sigmoid(logits, probs)
    else:
        buf = np.empty(16, np.float32)
        _soft_max_row(logits, probs, buf)
    for j in range(n_expert):
        sel[j] = probs[j] + probs_b[j] if probs_b.shape[0] else probs[j]
    if n_groups > 1:
        _mask_groups(sel, n_groups, n_group_used)
    for j in range(n_expert):
        idx[j] = j
    _std_sort_desc(sel, idx)
    _route_out(probs, idx, k, norm_w, w_scale, out)


@numba.njit(cache=True)
def _mask_groups(sel, n_groups, n_group_used):  # pragma: no cover - compiled
    """group_mask of one row, in place: the experts outside the n_group_used groups of best top-2 sum -> -inf."""
    per = sel.shape[0] // n_groups
    scores = np.empty(n_groups, np.float32)
    gidx = np.empty(per, np.int32)
    for g in range(n_groups):
        for j in range(per):
            gidx[j] = j
        _std_sort_desc(sel[g * per : (g + 1) * per], gidx)
        scores[g] = _F32(np.float64(sel[g * per + gidx[0]]) + np.float64(sel[g * per + gidx[1]]))
    order = np.empty(n_groups, np.int32)
    for g in range(n_groups):
        order[g] = g
    _std_sort_desc(scores, order)
    keep = np.zeros(n_groups, np.bool_)
    for g in range(n_group_used):
        keep[order[g]] = True
    for g in range(n_groups):
        if not keep[g]:
            for j in range(per):
                sel[g * per + j] = -np.inf


def argsort_desc(x: np.ndarray, k: int | None = None) -> np.ndarray:
    """ggml_argsort_top_k(x, k) (ggml_argsort, descending, its first k columns), ties in llama.cpp's order.
    (n, m) float32 -> (n, k) int32"""
    xr = np.ascontiguousarray(x, np.float32)
    k = xr.shape[1] if k is None else k
    out = np.empty((xr.shape[0], k), np.int32)
    _argsort_rows(xr, k, out)
    return out


def group_mask(selection: np.ndarray, n_groups: int, n_group_used: int) -> np.ndarray:
    """build_moe_ffn's expert groups (DeepSeek-V3): the experts, n_expert / n_groups per group in order, scored per
    group by the sum of its top two (ggml_argsort_top_k of 2, ggml_get_rows, ggml_sum_rows: a double sum rounded
    to float); the top n_group_used groups (ggml_argsort_top_k) keep their values, the others become -inf
    (ggml_fill, ggml_set_rows). (n, n_expert) float32 -> same"""
    n, n_expert = selection.shape
    per = n_expert // n_groups
    grouped = np.ascontiguousarray(selection, np.float32).reshape(n * n_groups, per)  # (n * groups, per)
    top2 = np.take_along_axis(grouped, argsort_desc(grouped, 2), axis=1).astype(np.float64)  # (n * groups, 2)
    scores = (top2[:, 0] + top2[:, 1]).astype(np.float32).reshape(n, n_groups)  # (n, groups)
    keep = argsort_desc(scores, n_group_used)  # (n, n_group_used)
    out = np.full((n, n_groups, per), -np.inf, np.float32)  # (n, groups, per)
    rows = np.arange(n)[:, None]
    out[rows, keep] = grouped.reshape(n, n_groups, per)[rows, keep]
    return out.reshape(n, n_expert)


def norm_weights(w: np.ndarray) -> np.ndarray:
    """ggml_div(w, ggml_clamp(ggml_sum_rows(w), 6.103515625e-5, inf)): each row over its double sum rounded to
    float (ggml_vec_sum_f32), clamped to the smallest normal f16. (n, k) float32 -> same"""
    s = np.zeros(w.shape[0], np.float64)
    for j in range(w.shape[1]):  # in order, as the C loop
        s += w[:, j].astype(np.float64)
    s32 = np.maximum(s.astype(np.float32), np.float32(6.103515625e-5))
    return (w / s32[:, None]).astype(np.float32)


def sigmoid_rows(x: np.ndarray) -> np.ndarray:
    """ggml_sigmoid (ggml_vec_sigmoid_f32: 1 / (1 + expf(-x)) with libm expf, element by element)."""
    xr = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(xr)
    _sigmoid(xr.reshape(-1), y.reshape(-1))
    return y


@numba.njit(cache=True)
def _sigmoid(x, y):  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        y[i] = _F32(1.0) / (_F32(1.0) + _F32(math.exp(-x[i])))


@numba.njit(cache=True, error_model="numpy")
def _swiglu_oai(g, u, alpha, limit, y):  # pragma: no cover - compiled
    for i in range(g.shape[0]):
        x = limit if limit < g[i] else g[i]  # std::min(x, limit)
        v = -limit if u[i] < -limit else (limit if limit < u[i] else u[i])  # std::clamp(y, -limit, limit)
        glu = x / (_F32(1.0) + _F32(math.exp(alpha * -x)))  # libm expf
        y[i] = glu * (v + _F32(1.0))


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """ggml_swiglu_oai (ops.cpp `ggml_compute_forward_swiglu_oai_f32`, a scalar loop): x = min(gate, limit),
    y = clamp(up, -limit, limit), x / (1 + expf(alpha * -x)) * (y + 1), in float with libm expf. gpt-oss's
    experts use alpha 1.702, limit 7 (build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE). (..., k) float32 -> same"""
    g = np.ascontiguousarray(gate, np.float32)
    u = np.ascontiguousarray(up, np.float32)
    if g.shape != u.shape:
        raise ValueError(f"swiglu_oai: gate {g.shape} and up {u.shape} differ")
    y = np.empty_like(g)
    _swiglu_oai(g.reshape(-1), u.reshape(-1), _F32(alpha), _F32(limit), y.reshape(-1))
    return y


def add_id(x: np.ndarray, bias: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """ggml_add_id(x, bias, selected): each slot's row plus its expert's bias row (ggml_vec_add_f32, a float add).
    x (n, k, m), bias (n_expert, m), selected (n, k) -> (n, k, m)"""
    return np.add(x, np.asarray(bias, np.float32)[selected], dtype=np.float32)


def expert(weight, e: int):
    """Expert `e` of a stacked expert weight (ggml shape (ne0, ne1, n_expert), rows of all experts in order) as a
    2-D weight of the same type: a view of its rows, nothing copied."""
    ne0, ne1 = weight.shape[0], weight.shape[1]
    return dataclasses.replace(weight, name=f"{weight.name}#{e}", shape=(ne0, ne1),
                               data=weight.data[e * ne1 : (e + 1) * ne1])


def stacked(weight):
    """A stacked expert weight (ggml shape (ne0, ne1, n_expert)) as one 2-D weight of n_expert * ne1 rows, expert
    by expert (the matrix the kernels pack once for all experts)."""
    ne0, ne1, n_expert = (int(s) for s in weight.shape)
    return dataclasses.replace(weight, shape=(ne0, ne1 * n_expert))


def group_by_expert(selected: np.ndarray, n_expert: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (token, slot) pairs of `selected` (n, k) grouped by expert, in token order within each, as
    ggml_mul_mat_id groups the rows of src1 (matrix_row_counts): (tokens (n*k,), slots (n*k,), starts
    (n_expert + 1,) int64: expert e's pairs are [starts[e], starts[e + 1]))."""
    flat = np.argsort(selected, axis=None, kind="stable")  # (n * k,)
    tokens, slots = np.divmod(flat, selected.shape[1])
    starts = np.searchsorted(selected.reshape(-1)[flat], np.arange(n_expert + 1)).astype(np.int64)
    return tokens, slots, starts

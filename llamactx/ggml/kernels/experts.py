"""A decoded token's experts as one weight stream: ggml_mul_mat_id's rows for the experts that hold a single
activation row (ggml-cpu.c `ggml_compute_forward_mul_mat_id_one_chunk`: one `vec_dot` per (expert row, token row)).

A token routes to k of n_expert experts scattered over the stacked matrix. Each expert's rows are contiguous, but
the jump from one expert to the next is a new stream that the hardware prefetcher has to learn again: k times per
matmul, three matmuls a layer (measured on Zen 4, one thread, a Q8_0 1024 -> 512 expert: 26 GB/s with the
prefetcher alone, 28-29 with the stream below). Here the single-row experts' row groups are one stream, in expert
order: while block b of a row group is computed, the same lines of the next group of the stream are prefetched
(the expert's next group, or at its end the first group of the next single-row expert's share), a line per 64
bytes read, so no expert starts cold.

The arithmetic per output is legacy.x4_rows's single activation row (ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0 in
x86 ggml-cpu's order), the same helpers on the same bytes: bit for bit what matmul._experts_share computes
expert by expert. Q4_0 experts that llama.cpp repacks (n_ff % 8 == 0) take the repacked order and stay there.

A single decoded token (`decode_experts`, the graph executor's MUL_MAT_ID of one row) skips the grouping by
expert altogether: its row is quantized once, not once per slot (a shared input: gate, up), each slot's expert
reads it in place and writes its (slot) row of the node's output, no rows gathered or scattered; and the gate and
up nodes of one FFN (the same input, the same experts) run as one stream in one parallel region, gate and up of
each expert in turn, the next matrix's lines prefetched across the switch (one quantization, one launch and
barrier, one stream for the pair).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange
from numba.extending import overload

from llamactx.ggml.kernels.legacy import (
    DEC_Q4_0,
    DEC_Q5_0,
    DEC_Q8_0,
    ROWS_PER_GROUP,
    _x4_block_scales,
    _x4_min1,
    _x4_row,
    _x4_store,
    decode_x4,
)
from llamactx.ggml.kernels.q8 import activations_q8_0
from llamactx.ggml.kernels.simd import PORTABLE, VNNI, TagType, prefetch
from llamactx.ggml.kernels.wide import wzero, wzero4

Q4_0, Q5_0, Q8_0 = int(T.Q4_0), int(T.Q5_0), int(T.Q8_0)


@njit(cache=True)
def _prefetch_block(arr, g, b, width):
    """Prefetch the 64-byte lines that start in block b's share of row group g of a packed slot (qs, qh or sc):
    bytes [b * width, (b + 1) * width), `width` = the slot's bytes per block, 0 (an unused slot), a divisor of 64
    (a line every 64 / width blocks) or 128 (two lines). No loop per slot and block: its bounds arithmetic and
    branches sat beside every block's dot products (the stream measured ~3% faster without, Zen 4, one thread)."""
    lo = b * width
    if width != 0 and lo % 64 == 0:
        prefetch(arr, g, lo)
        if width > 64:
            prefetch(arr, g, lo + 64)


@njit(cache=True)
def _next_single(starts, e):
    """The first expert from e on with exactly one activation row (len(starts) - 1 when none)."""
    n_expert = starts.shape[0] - 1
    while e < n_expert and starts[e + 1] - starts[e] != 1:
        e += 1
    return e


@njit(cache=True)
def _group(path, dec, W, Wp, ahead, g, a, r, out, o, u):
    """out[o] unit u's four rows = row group g of W times a's row r, block by block, with group `ahead` of Wp
    (the stream's next: the same matrix or the other one; none when < 0) prefetched alongside."""
    qs, qh, sc = W[0], W[1], W[2]
    nb = a[1].shape[1]
    wq, wh, ws = qs.shape[1] // nb, qh.shape[1] // nb, sc.shape[1] // nb  # bytes per block of each slot
    a0, b0, m0 = wzero(), wzero(), wzero4()
    for b in range(nb):
        if ahead >= 0:
            _prefetch_block(Wp[0], ahead, b, wq)
            _prefetch_block(Wp[1], ahead, b, wh)
            _prefetch_block(Wp[2], ahead, b, ws)
        wA, wB = decode_x4(dec, qs, qh, g, b)
        d16, m4 = _x4_block_scales(dec, sc, g, b)
        a0, b0 = _x4_row(path, dec, wA, wB, d16, a, r, b, a0, b0)
        m0 = _x4_min1(dec, m4, a, r, b, m0)
    _x4_store(dec, out, o, u * ROWS_PER_GROUP, a0, b0, m0)


@njit(cache=True)
def _stream(path, dec, W, a, starts, unit, u0, u1, out):
    """Units [u0, u1) of every single-row expert (its row r = starts[e]: out[r] from a's row r), in expert order, the
    next group of the stream prefetched block by block."""
    n_expert = starts.shape[0] - 1
    e = _next_single(starts, 0)
    while e < n_expert:
        nxt = _next_single(starts, e + 1)
        r = starts[e]
        for u in range(u0, u1):
            g = e * unit + u
            ahead = g + 1 if u + 1 < u1 else (nxt * unit + u0 if nxt < n_expert else -1)
            _group(path, dec, W, W, ahead, g, a, r, out, r, u)
        e = nxt


@njit(cache=True)
def stream_experts(path, kind, other_order, W, a, starts, unit, u0, u1, out):
    """Units [u0, u1) of every expert with one activation row, as one stream, for Q4_0 / Q5_0 / Q8_0 experts in
    vec_dot's order (`other_order`: a repacked or per-row order, not streamed here). W: the stacked expert's packed
    slots (qs, qh, sc, ...), expert e's units [e * unit, (e + 1) * unit); a: the activations (matmul._activations),
    expert e's rows [starts[e], starts[e + 1]); out (M, rows of one expert). -> True when those experts are done
    (the caller skips them), False when the caller computes every expert."""
    if other_order:
        return False
    if kind == Q8_0:
        _stream(path, DEC_Q8_0, W, a, starts, unit, u0, u1, out)
    elif kind == Q4_0:
        _stream(path, DEC_Q4_0, W, a, starts, unit, u0, u1, out)
    elif kind == Q5_0:
        _stream(path, DEC_Q5_0, W, a, starts, unit, u0, u1, out)
    else:
        return False
    return True


# -- one decoded token: its slots' experts streamed in place, gate and up together ------------------------------


@njit(cache=True)
def streams_one(kind, n_ff, per_row):
    """Whether `decode_experts` runs a token's experts of this type: Q8_0, Q5_0, and Q4_0 in vec_dot's order
    (n_ff % 8 != 0: llama.cpp repacks the others), rows in whole groups of four, not one row at a time."""
    if per_row or n_ff % ROWS_PER_GROUP:
        return False
    return kind == Q8_0 or kind == Q5_0 or (kind == Q4_0 and n_ff % 8 != 0)


@njit(cache=True)
def _items(ids, k, shared, fused):
    """The stream of one token: (matrix 0 gate / 1 up, expert, activation row, output row) per item, the slots
    in ascending expert order (the stacked matrices' order), gate and up of an expert in turn when fused.
    -> int64 (n_items, 4)"""
    slots = np.empty(k, np.int64)
    for s in range(k):  # insertion sort of the k slots by expert
        e = int(ids[s])
        j = s
        while j > 0 and int(ids[slots[j - 1]]) > e:
            slots[j] = slots[j - 1]
            j -= 1
        slots[j] = s
    per = 2 if fused else 1
    items = np.empty((k * per, 4), np.int64)
    for j in range(k):
        s = slots[j]
        for m in range(per):
            items[j * per + m, 0] = m
            items[j * per + m, 1] = int(ids[s])
            items[j * per + m, 2] = 0 if shared else s
            items[j * per + m, 3] = s
    return items


@njit(cache=True)
def _stream_items(path, dec, W0, W1, a, items, unit, u0, u1, out0, out1):
    """Units [u0, u1) of every item (`_items`) in order, as `_stream`: while a group is computed, the next group
    of the stream (the item's next, or the next item's first: maybe of the other matrix) is prefetched."""
    n_items = items.shape[0]
    for j in range(n_items):
        W = W0 if items[j, 0] == 0 else W1
        out = out0 if items[j, 0] == 0 else out1
        e, r, o = items[j, 1], items[j, 2], items[j, 3]
        last = j + 1 == n_items
        Wn = W1 if not last and items[j + 1, 0] == 1 else W0
        for u in range(u0, u1):
            g = e * unit + u
            if u + 1 < u1:
                _group(path, dec, W, W, g + 1, g, a, r, out, o, u)
            else:
                _group(path, dec, W, Wn, -1 if last else items[j + 1, 1] * unit + u0, g, a, r, out, o, u)


@njit(cache=True)
def _items_of_type(path, kind, W0, W1, a, items, unit, u0, u1, out0, out1):
    if kind == Q8_0:
        _stream_items(path, DEC_Q8_0, W0, W1, a, items, unit, u0, u1, out0, out1)
    elif kind == Q4_0:
        _stream_items(path, DEC_Q4_0, W0, W1, a, items, unit, u0, u1, out0, out1)
    else:
        _stream_items(path, DEC_Q5_0, W0, W1, a, items, unit, u0, u1, out0, out1)


@njit(parallel=True, cache=True)
def _decode_vnni(n_tasks, kind, W0, W1, a, items, unit, out0, out1):
    for task in prange(n_tasks):
        _items_of_type(VNNI, kind, W0, W1, a, items, unit, task * unit // n_tasks, (task + 1) * unit // n_tasks,
                       out0, out1)


@njit(parallel=True, cache=True)
def _decode_portable(n_tasks, kind, W0, W1, a, items, unit, out0, out1):
    for task in prange(n_tasks):
        _items_of_type(PORTABLE, kind, W0, W1, a, items, unit, task * unit // n_tasks,
                       (task + 1) * unit // n_tasks, out0, out1)


def _decode(path, n_tasks, kind, W0, W1, a, items, unit, out0, out1):
    """_decode_vnni or _decode_portable, chosen at compile time by the path tag."""


@overload(_decode, jit_options={"cache": True})
def _decode_impl(path, n_tasks, kind, W0, W1, a, items, unit, out0, out1):
    if not isinstance(path, TagType):
        return None
    if path.tag_name == "vnni":

        def vnni(path, n_tasks, kind, W0, W1, a, items, unit, out0, out1):
            _decode_vnni(n_tasks, kind, W0, W1, a, items, unit, out0, out1)

        return vnni

    def portable(path, n_tasks, kind, W0, W1, a, items, unit, out0, out1):
        _decode_portable(n_tasks, kind, W0, W1, a, items, unit, out0, out1)

    return portable


@njit(cache=True)
def decode_experts(path, n_tasks, kind, W0, W1, fused, x, shared, ids, k, unit, out0, out1):
    """ggml_mul_mat_id of one token on its k experts (`streams_one` types): x (1, ne0) its row when `shared`,
    else (k, ne0) one row per slot; ids (k,) the slots' experts (floats, as MOE_ROUTE writes them); W0 the stacked
    experts' packed slots (qs, qh, sc), expert e's units [e * unit, (e + 1) * unit); out0 (k, n_ff): slot s's
    row = expert ids[s]'s rows . its input. With `fused`, W1 / out1 a second matrix on the same input and experts
    (up beside gate), computed in the same stream (else unused: pass W0 / out0). Every output as ggml_vec_dot
    computes it."""
    xq, xd, xoff = activations_q8_0(kind, x)
    a = (xq, xd, xoff, np.empty((x.shape[0], 0), np.float32))
    items = _items(ids, k, shared, fused)
    n_tasks = max(1, min(n_tasks, unit))
    _decode(path, n_tasks, kind, W0, W1, a, items, unit, out0, out1)


@njit(cache=True)
def decode_experts_vnni(n_tasks, kind, W0, W1, fused, x, shared, ids, k, unit, out0, out1):
    """`decode_experts` on the VNNI path, callable from Python (a path tag is a compile-time constant only)."""
    decode_experts(VNNI, n_tasks, kind, W0, W1, fused, x, shared, ids, k, unit, out0, out1)


@njit(cache=True)
def decode_experts_portable(n_tasks, kind, W0, W1, fused, x, shared, ids, k, unit, out0, out1):
    """`decode_experts` on the portable path, callable from Python."""
    decode_experts(PORTABLE, n_tasks, kind, W0, W1, fused, x, shared, ids, k, unit, out0, out1)

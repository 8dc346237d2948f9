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
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T
from numba import njit

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
from llamactx.ggml.kernels.simd import prefetch
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
def _stream(path, dec, W, a, starts, unit, u0, u1, out):
    """Units [u0, u1) of every single-row expert (its row r = starts[e]: out[r] from a's row r), in expert order, the
    next group of the stream prefetched block by block."""
    qs, qh, sc = W[0], W[1], W[2]
    nb = a[1].shape[1]
    wq, wh, ws = qs.shape[1] // nb, qh.shape[1] // nb, sc.shape[1] // nb  # bytes per block of each slot
    n_expert = starts.shape[0] - 1
    e = _next_single(starts, 0)
    while e < n_expert:
        nxt = _next_single(starts, e + 1)
        r = starts[e]
        for u in range(u0, u1):
            g = e * unit + u
            ahead = g + 1 if u + 1 < u1 else (nxt * unit + u0 if nxt < n_expert else -1)
            a0, b0, m0 = wzero(), wzero(), wzero4()
            for b in range(nb):
                if ahead >= 0:
                    _prefetch_block(qs, ahead, b, wq)
                    _prefetch_block(qh, ahead, b, wh)
                    _prefetch_block(sc, ahead, b, ws)
                wA, wB = decode_x4(dec, qs, qh, g, b)
                d16, m4 = _x4_block_scales(dec, sc, g, b)
                a0, b0 = _x4_row(path, dec, wA, wB, d16, a, r, b, a0, b0)
                m0 = _x4_min1(dec, m4, a, r, b, m0)
            _x4_store(dec, out, r, u * ROWS_PER_GROUP, a0, b0, m0)
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

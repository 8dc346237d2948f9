"""Quantized matrix multiplication y = x @ W^T the way x86 ggml-cpu computes it (ggml_mul_mat), as numba kernels.

A call quantizes the activation rows to the weight type's `vec_dot_type` (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for
Q4_1/Q5_1, Q8_K for the K-quants; ggml-cpu.c `type_traits_cpu`; quantize.py) and then runs ggml's AVX2/VNNI
vec_dot for every (weight row, activation row) pair, operation for operation: integer lanes of 4 products, each
converted and scaled on its own, ggml's horizontal sum. So every output is bit-identical to ggml's vec_dot
(legacy.py for Q4_0..Q8_0, kquants.py for Q4_K/Q5_K/Q6_K, kxquants.py / kxtile.py for Q2_K/Q3_K/IQ4_XS/
IQ4_NL/MXFP4 and Q5_K's tiled order) and does not depend on the other rows of the batch.
F16/F32 weights take a float32 dot product (x rounded to f16 for F16, as ggml; the summation order differs).

One parallel kernel per path serves every type (numba compiles two, not twenty): `prange` gives each thread a
contiguous share of the weight rows; there each weight block is decoded once and used for every activation row
(prompt processing, batched decode: four at a time). The 32-element block types run four weight rows per 512-bit
register (legacy.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from llamactx.ggml.cpu import PATH_PORTABLE, PATH_VNNI, active_path, cpu_features, set_threads
from llamactx.ggml.intrinsics import round_f16
from llamactx.ggml.kernels.bf16 import gemm as gemm_bf16
from llamactx.ggml.kernels.experts import stream_experts
from llamactx.ggml.kernels.klowbit import is_iq, lowbit_rows, post_of
from llamactx.ggml.kernels.kquants import DEC_Q4K, DEC_Q5K, k45_rows, q4k_x8_rows, q6k_rows, q6k_tiled_rows
from llamactx.ggml.kernels.ktile import TILE_MIN_ROWS, q4k_tile_rows, q6k_tile_rows
from llamactx.ggml.kernels.kxquants import (
    DEC_IQ4XS,
    DEC_Q3K,
    LUT_IQ4NL,
    LUT_MXFP4,
    kx_rows,
    nl_rows,
    q2k_rows,
    q5k_tiled_rows,
)
from llamactx.ggml.kernels.kxtile import kx_tile_rows, nl_tile_rows, q5k_tile_rows
from llamactx.ggml.kernels.legacy import (
    DEC_Q4_0,
    DEC_Q4_1,
    DEC_Q5_0,
    DEC_Q5_1,
    DEC_Q8_0,
    ROWS_PER_GROUP,
    x4_rows,
    x4_rows_repacked,
)
from llamactx.ggml.kernels.q8 import activations_q8_0, quantize_q8_1, quantize_q8_K
from llamactx.ggml.kernels.repack import NL_GROUP, PackedWeight, units
from llamactx.ggml.kernels.simd import (
    PORTABLE,
    VNNI,
    fmadd,
    fsum,
    fzero,
    load_f16,
    load_f32,
    vload_f16,
    vload_f32,
)

_F0 = np.float32(0.0)

F32, F16, BF16 = int(T.F32), int(T.F16), int(T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1), int(T.Q8_0)
Q4_K, Q5_K, Q6_K = int(T.Q4_K), int(T.Q5_K), int(T.Q6_K)
Q2_K, Q3_K, IQ4_XS, IQ4_NL, MXFP4 = int(T.Q2_K), int(T.Q3_K), int(T.IQ4_XS), int(T.IQ4_NL), int(T.MXFP4)
_IQ_TYPES = frozenset(int(t) for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M))
TILED_MIN_ROWS = 8  # llama.cpp's tiled Q6_K kernel serves ubatches of 8 rows or more (tiled.cpp ggml_tiled_min_batch)


# --- activations -----------------------------------------------------------------------------------------------


@njit(cache=True)
def _activations(kind, x):
    """x (n, k) float32 as the kernels of weight type `kind` read it -> (xq, xd, xi, xf):

    Q4_0/Q5_0/Q8_0: Q8_0 quants, f16 scales, xi (n, k/4) = -o * (sum of each 4 quants): the weights' offset o
    (8 / 16 / 128) times the activations of one `vdot` lane, so every lane holds ggml's signed (q - o) . x;
    Q4_1/Q5_1: Q8_1 quants, f16 scales, xf = s (nblk, n), block-major; K-quants: Q8_K quants, f32 scales, xi = bsums;
    F32: xf = x; F16: xf = x rounded to f16. Unused arrays are (n, 0)."""
    n, k = x.shape
    none_i = np.empty((n, 0), np.int32)
    none_f = np.empty((n, 0), np.float32)
    if kind == F32 or kind == F16:
        xf = np.empty((n, k), np.float32)
        for i in range(n):
            for j in range(k):
                xf[i, j] = round_f16(x[i, j]) if kind == F16 else x[i, j]
        return np.empty((n, 0), np.int8), none_f, none_i, xf
    if kind == Q4_1 or kind == Q5_1:
        xq = np.empty((n, k), np.int8)
        xd = np.empty((n, k // 32), np.float32)
        xs = np.empty((k // 32, n), np.float32)  # block-major
        quantize_q8_1(x, xq, xd, xs)
        return xq, xd, none_i, xs
    if kind == Q4_K or kind == Q5_K or kind == Q6_K or kind == Q3_K or kind == IQ4_XS or kind == Q2_K or is_iq(kind):
        xq = np.empty((n, k), np.int8)
        xd = np.empty((n, k // 256), np.float32)
        bsums = np.empty((n, k // 16), np.int32)
        quantize_q8_K(x, xq, xd, bsums)
        return xq, xd, bsums, none_f
    xq, xd, xoff = activations_q8_0(kind, x)
    return xq, xd, xoff, none_f


# --- F32 / F16 -----------------------------------------------------------------------------------------------


@njit(cache=True)
def _float_rows(f16, W, a, r0, r1, out):
    """F32 / F16 weights (raw row bytes) . xf in float32 (ggml_vec_dot_f32 / _f16; the order of the float sums
    differs from ggml's). Each weight row is re-read from L1 per activation row."""
    qs = W[0]
    xf = a[3]
    n, k = xf.shape
    k8 = k - k % 8
    for r in range(r0, r1):
        for i in range(n):
            acc = fzero()
            tail = _F0
            if f16:
                for j in range(0, k8, 8):
                    acc = fmadd(acc, vload_f16(qs, r, 2 * j), vload_f32(xf, i, j))
                for j in range(k8, k):
                    tail += load_f16(qs, r, 2 * j) * xf[i, j]
            else:
                for j in range(0, k8, 8):
                    acc = fmadd(acc, vload_f32(qs, r, 4 * j), vload_f32(xf, i, j))
                for j in range(k8, k):
                    tail += load_f32(qs, r, 4 * j) * xf[i, j]
            out[i, r] = fsum(acc) + tail


# --- the kernel ----------------------------------------------------------------------------------------------


@njit(cache=True)
def _rows_of_type(path, kind, llama_order, W, a, u0, u1, out):
    """out for units u0..u1-1 of weights of ggml type `kind` (the branch is taken once per task, not per row): groups
    of four rows for the 32-element block types, else rows. llama_order: Q4_0 / Q4_K / Q6_K / Q5_K / Q3_K /
    IQ4_XS in the order of llama.cpp's repacked / tiled kernels (`matmul`). IQ4_NL / MXFP4 always run in the
    repacked order (kxquants.nl_rows)."""
    if llama_order and kind == Q4_0:
        x4_rows_repacked(path, W, a, u0, u1, out)
    elif kind == Q4_0:
        x4_rows(path, DEC_Q4_0, W, a, u0, u1, out)
    elif kind == Q4_1:
        x4_rows(path, DEC_Q4_1, W, a, u0, u1, out)
    elif kind == Q5_0:
        x4_rows(path, DEC_Q5_0, W, a, u0, u1, out)
    elif kind == Q5_1:
        x4_rows(path, DEC_Q5_1, W, a, u0, u1, out)
    elif kind == Q8_0:
        x4_rows(path, DEC_Q8_0, W, a, u0, u1, out)
    elif llama_order and kind == Q4_K and a[0].shape[0] >= TILE_MIN_ROWS:  # Q4_K: units of eight rows
        q4k_tile_rows(path, W, a, u0 * NL_GROUP, min(u1 * NL_GROUP, out.shape[1]), out)
    elif llama_order and kind == Q4_K:
        q4k_x8_rows(path, W, a, u0 * NL_GROUP, min(u1 * NL_GROUP, out.shape[1]), out)
    elif llama_order and kind == Q6_K and a[0].shape[0] >= TILE_MIN_ROWS:
        q6k_tile_rows(path, W, a, u0, u1, out)
    elif llama_order and kind == Q6_K and a[0].shape[0] >= TILED_MIN_ROWS:
        q6k_tiled_rows(path, W, a, u0, u1, out)
    elif llama_order and kind == Q5_K and a[0].shape[0] >= TILE_MIN_ROWS:
        q5k_tile_rows(path, W, a, u0, u1, out)
    elif llama_order and (kind == Q3_K or kind == IQ4_XS) and a[0].shape[0] >= TILE_MIN_ROWS:
        kx_tile_rows(path, kind == IQ4_XS, W, a, u0, u1, out)
    elif llama_order and kind == Q5_K and a[0].shape[0] >= TILED_MIN_ROWS:
        q5k_tiled_rows(path, W, a, u0, u1, out)
    elif kind == Q2_K:
        q2k_rows(path, llama_order, W, a, u0, u1, out)
    elif kind == Q3_K:
        kx_rows(path, DEC_Q3K, llama_order and a[0].shape[0] >= TILED_MIN_ROWS, W, a, u0, u1, out)
    elif kind == IQ4_XS:
        kx_rows(path, DEC_IQ4XS, llama_order and a[0].shape[0] >= TILED_MIN_ROWS, W, a, u0, u1, out)
    elif (kind == IQ4_NL or kind == MXFP4) and a[0].shape[0] >= TILE_MIN_ROWS:  # units of eight rows
        nl_tile_rows(path, kind == MXFP4, W, a, u0 * NL_GROUP, min(u1 * NL_GROUP, out.shape[1]), out)
    elif kind == IQ4_NL:
        nl_rows(path, LUT_IQ4NL, W, a, u0, u1, out)
    elif kind == MXFP4:
        nl_rows(path, LUT_MXFP4, W, a, u0, u1, out)
    elif kind == Q4_K:
        k45_rows(path, DEC_Q4K, W, a, u0 * NL_GROUP, min(u1 * NL_GROUP, out.shape[1]), out)
    elif kind == Q5_K:
        k45_rows(path, DEC_Q5K, W, a, u0, u1, out)
    elif kind == Q6_K:
        q6k_rows(path, W, a, u0, u1, out)
    elif is_iq(kind):  # IQ1_S .. IQ3_S from their blocks, vec_dot or tiled by the row count (klowbit.py)
        lowbit_rows(path, kind, post_of(kind), W[0], a, u0, u1, out)
    else:
        _float_rows(kind == F16, W, a, u0, u1, out)


@njit(cache=True)
def _n_units(kind, n_rows):
    """Rows, or groups of four rows for the 32-element block types, of eight for IQ4_NL / MXFP4 (repack.units)."""
    if kind == Q4_0 or kind == Q4_1 or kind == Q5_0 or kind == Q5_1 or kind == Q8_0:
        return (n_rows + ROWS_PER_GROUP - 1) // ROWS_PER_GROUP
    if kind == IQ4_NL or kind == MXFP4 or kind == Q4_K:
        return (n_rows + NL_GROUP - 1) // NL_GROUP
    return n_rows


# One parallel kernel per path, the path a global constant: a Tag passed as an argument would cost numba's
# dispatcher a Python-level typeof on every call. Each thread gets one contiguous share of the weight rows: a task
# costs a call that reference-counts every array (atomics), too much per 16 rows.


@njit(cache=True)
def _share(task, n_tasks, n_units):
    """Units (rows or row groups) [u0, u1) of task `task` out of `n_tasks`."""
    return task * n_units // n_tasks, (task + 1) * n_units // n_tasks


@njit(parallel=True, cache=True)
def matmul_vnni(n_tasks, kind, llama_order, x, qs, qh, sc, mn, d, m, out):
    """out (n, n_rows) = x (n, k) @ W^T for weights of ggml type `kind` in repack.py's slots, with `vpdpbusd`,
    in `n_tasks` shares (one per thread). The caller checks shapes: k matches the weights, out is C-contiguous
    float32 (n, n_rows)."""
    a = _activations(kind, x)
    W = (qs, qh, sc, mn, d, m)
    n_units = _n_units(kind, out.shape[1])
    n_tasks = max(1, min(n_tasks, n_units))
    for task in prange(n_tasks):
        u0, u1 = _share(task, n_tasks, n_units)
        _rows_of_type(VNNI, kind, llama_order, W, a, u0, u1, out)


@njit(parallel=True, cache=True)
def matmul_portable(n_tasks, kind, llama_order, x, qs, qh, sc, mn, d, m, out):
    """`matmul_vnni` with the portable integer dot product."""
    a = _activations(kind, x)
    W = (qs, qh, sc, mn, d, m)
    n_units = _n_units(kind, out.shape[1])
    n_tasks = max(1, min(n_tasks, n_units))
    for task in prange(n_tasks):
        u0, u1 = _share(task, n_tasks, n_units)
        _rows_of_type(PORTABLE, kind, llama_order, W, a, u0, u1, out)


@njit(cache=True)
def _experts_share(path, kind, per_row, a, starts, unit, task, n_tasks, qs, qh, sc, mn, d, m, out):
    """Task `task`'s share of every expert's units: ggml_mul_mat_id's experts in one parallel region (`x` (M, k)
    holds the rows routed to each expert, grouped: expert e's are [starts[e], starts[e + 1]); its weights are
    units [e * unit, (e + 1) * unit) of the packed slots; out (M, rows of one expert)), so that one token's
    experts keep every thread busy with one launch. Each row is computed as ggml computes it alone: ggml_vec_dot,
    a repacked Q4_0 expert's gemv (its order is row invariant: all rows in one call), or with `per_row` (a
    repacked Q4_K expert) the repacked gemv, one row at a time."""
    u0, u1 = _share(task, n_tasks, unit)
    repacked = kind == Q4_0 and out.shape[1] % 8 == 0  # vecdot.is_repacked_q4_0 of one expert (n_ff rows)
    # a decoded token's experts (one row each) as one prefetched stream (experts.py), the others below
    streamed = stream_experts(path, kind, per_row or repacked, (qs, qh, sc), a, starts, unit, u0, u1, out)
    for e in range(starts.shape[0] - 1):
        r0, r1 = starts[e], starts[e + 1]
        if r0 == r1 or (streamed and r1 - r0 == 1):
            continue
        if kind == Q4_K and not per_row:  # eight rows to a group (kblocks.py): an expert may start mid-group
            ae = (a[0][r0:r1], a[1][r0:r1], a[2][r0:r1], a[3][r0:r1])
            k45_rows(path, DEC_Q4K, (qs, qh, sc, mn, d, m), ae, u0 * NL_GROUP, min(u1 * NL_GROUP, out.shape[1]),
                     out[r0:r1], e * out.shape[1])
            continue
        w0, w1 = e * unit, (e + 1) * unit
        W = (qs[w0:w1], qh[w0:w1], sc[w0:w1], mn[w0:w1], d[w0:w1], m[w0:w1])
        if per_row:
            for r in range(r0, r1):
                ar = (a[0][r : r + 1], a[1][r : r + 1], a[2][r : r + 1], a[3][r : r + 1])
                _rows_of_type(path, kind, True, W, ar, u0, u1, out[r : r + 1])
        else:
            ae = (a[0][r0:r1], a[1][r0:r1], a[2][r0:r1], a[3][r0:r1])
            _rows_of_type(path, kind, repacked, W, ae, u0, u1, out[r0:r1])


@njit(parallel=True, cache=True)
def _activations_par(kind, x, n_tasks):
    """`_activations`, a prompt's Q8_K quantization (the K-quants' and IQ types') in n_tasks shares of the rows:
    mul_mat_id quantizes every (token, slot) row, which left the other threads idle for ~8% of a MoE prompt."""
    n, k = x.shape
    q8k = kind == Q4_K or kind == Q5_K or kind == Q6_K or kind == Q3_K or kind == IQ4_XS or kind == Q2_K or is_iq(kind)
    if not q8k or n < 8 * n_tasks or n_tasks < 2:
        return _activations(kind, x)
    xq = np.empty((n, k), np.int8)
    xd = np.empty((n, k // 256), np.float32)
    bsums = np.empty((n, k // 16), np.int32)
    for task in prange(n_tasks):
        r0, r1 = _share(task, n_tasks, n)
        quantize_q8_K(x[r0:r1], xq[r0:r1], xd[r0:r1], bsums[r0:r1])
    return xq, xd, bsums, np.empty((n, 0), np.float32)


@njit(parallel=True, cache=True)
def matmul_id_vnni(n_tasks, kind, per_row, x, starts, unit, qs, qh, sc, mn, d, m, out):
    """`_experts_share` of every task, with `vpdpbusd`."""
    a = _activations_par(kind, x, n_tasks)
    n_tasks = max(1, min(n_tasks, unit))
    for task in prange(n_tasks):
        _experts_share(VNNI, kind, per_row, a, starts, unit, task, n_tasks, qs, qh, sc, mn, d, m, out)


@njit(parallel=True, cache=True)
def matmul_id_portable(n_tasks, kind, per_row, x, starts, unit, qs, qh, sc, mn, d, m, out):
    """`_experts_share` of every task, with the portable integer dot product."""
    a = _activations_par(kind, x, n_tasks)
    n_tasks = max(1, min(n_tasks, unit))
    for task in prange(n_tasks):
        _experts_share(PORTABLE, kind, per_row, a, starts, unit, task, n_tasks, qs, qh, sc, mn, d, m, out)


def expert_order(ggml_type: int, n_ff: int) -> int:
    """How the kernels run a stacked expert weight's rows as ggml_mul_mat_id does (each row alone): 0 all of an
    expert's rows in one call (row invariant: Q4_0 in ggml_vec_dot's order, or with n_ff % 8 == 0 repacked, in its
    gemv's order; Q5_0, Q8_0, Q4_K unless repacked, Q3_K, Q5_K, Q6_K, IQ4_XS in ggml_vec_dot's; IQ4_NL / MXFP4
    with n_ff % 8 == 0 in the repacked gemv's), 1 one row at a time (a Q4_K expert of ne1 % 8 == 0, repacked: its
    gemv), -1 not on the kernels (the reference computes it: Q4_1 / Q5_1 whose activation sums are block-major,
    the other types, and Q4_0 / Q5_0 / Q8_0 experts of n_ff % 4 != 0, whose packed row groups would straddle
    two experts)."""
    t = int(ggml_type)
    if t == Q4_K:
        return 1 if n_ff % 8 == 0 else 0
    if t in (Q4_0, Q5_0, Q8_0):  # packed four rows to a group: an expert must own whole groups
        return 0 if n_ff % 4 == 0 else -1
    if t in (Q3_K, Q5_K, Q6_K, IQ4_XS):
        return 0
    if t in _IQ_TYPES:  # vec_dot below 8 rows of an expert, tiled from 8: by each expert's own row count
        return 0
    if t in (IQ4_NL, MXFP4) and n_ff % 8 == 0:  # repacked: one FMA per block, the same order for any row count
        return 0
    return -1


def matmul_id(x: np.ndarray, pw: PackedWeight, starts: np.ndarray, n_ff: int, n_threads: int) -> np.ndarray:
    """The rows routed to each expert of a stacked expert matrix (pw: n_expert * n_ff rows), in one launch.
    x (M, k) float32, expert e's rows [starts[e], starts[e + 1]) -> (M, n_ff) float32. Raises ValueError for a
    type `expert_order` does not run on the kernels."""
    order = expert_order(pw.ggml_type, n_ff)
    if order < 0:
        raise ValueError(f"matmul_id {pw.name!r}: {pw.type_name} experts of {n_ff} rows are not on the kernels")
    out = np.empty((x.shape[0], n_ff), np.float32)  # (M, n_ff)
    kernel = matmul_id_vnni if _DEFAULT_KERNEL is matmul_vnni else matmul_id_portable
    set_threads(n_threads)
    kernel(n_threads, pw.ggml_type, order == 1, np.ascontiguousarray(x, np.float32), starts,
           units(pw.ggml_type, n_ff), pw.qs, pw.qh, pw.sc, pw.mn, pw.d, pw.m, out)
    return out


# --- the entry point -----------------------------------------------------------------------------------------

_KERNELS = {PATH_VNNI: matmul_vnni, PATH_PORTABLE: matmul_portable}


def matmul(
    x: np.ndarray,
    pw: PackedWeight,
    n_threads: int,
    path: str | None = None,
    out: np.ndarray | None = None,
    llama_order: bool = False,
) -> np.ndarray:
    """y = x @ W^T as ggml_mul_mat(W, x) computes it on the CPU. x: (n, k) float32 -> (n, n_rows) float32.

    `path` ("vnni" / "portable") defaults to `active_path()`; `out`, when given, must be a C-contiguous float32
    (n, n_rows) array and is returned. `llama_order`: Q4_0 and Q4_K in the order of llama.cpp's repacked kernels
    (what it runs for weights with ne1 % 8 == 0) and Q6_K / Q5_K / Q3_K / IQ4_XS in its tiled kernel's order for
    n >= 8, bit for bit as llamactx.ggml.vecdot.matmul_repacked_blocks (Q4_0), vecdot_k and vecdot_kx; otherwise
    (and for the other types) ggml_vec_dot's order. IQ4_NL / MXFP4 take the repacked order (ne1 % 8 == 0 in
    llama.cpp; vecdot_nl) either way. Raises ValueError for a row length that is not the weight's, an unknown
    path, the VNNI path on a CPU without it, or an unusable `out`.
    """
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != pw.k:
        raise ValueError(f"matmul {pw.name!r}: x has shape {x.shape}, expected (n, {pw.k})")
    kernel = _DEFAULT_KERNEL if path is None else _kernel_for(path)
    shape = (x.shape[0], pw.n_rows)
    if out is None:
        out = np.empty(shape, dtype=np.float32)  # (n, n_rows)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"matmul {pw.name!r}: out must be a writeable C-contiguous float32 array of shape {shape}")
    set_threads(n_threads)
    if pw.ggml_type == BF16:  # llamafile's tinyBLAS order, on the weight's stored rows (bf16.py)
        gemm_bf16(pw.qs.view(np.uint16), x, n_threads, out)
        return out
    kernel(n_threads, pw.ggml_type, llama_order, x, pw.qs, pw.qh, pw.sc, pw.mn, pw.d, pw.m, out)
    return out


def _kernel_for(path: str):
    kernel = _KERNELS.get(path)
    if kernel is None:
        raise ValueError(f"matmul: path {path!r} is not one of {sorted(_KERNELS)}")
    if path == PATH_VNNI and not cpu_features()["vnni"]:
        raise ValueError("matmul: the vnni path needs AVX512-VNNI+VL or AVX-VNNI, which this CPU lacks")
    return kernel


_DEFAULT_KERNEL = _kernel_for(active_path())

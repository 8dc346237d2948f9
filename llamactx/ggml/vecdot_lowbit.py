"""IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0 and TQ2_0 matmuls as llama.cpp's x86 CPU backend
(build 0c1e570) computes them, bit for bit.

The activations are quantized to Q8_K (`quantize_row_q8_K_ref`, llamactx.ggml.vecdot_k); the weights are unpacked
into integers (llamactx.gguf.quants_lowbit). Every integer sum is exact (no `maddubs` pair can saturate with these
codes), so what has to match is where the integers become floats and how those are accumulated. None of these types
is repacked and llamafile's tinyBLAS has none of them (ggml-cpu.c `ggml_compute_forward_mul_mat`):

- the IQ types with n >= 8 run the tiled kernel (tiled.cpp `tiled_unpack_src0` per type, tiled-kernel.cpp
  `tiled_run_micro_vnni_8x16` / `tiled_run_microtile_avx2`): weights as codes + 128 with the tile's d =
  f16(d) * 1/8 (IQ2, IQ1), * 1/4 (IQ3_XXS), * 1 (IQ3_S), IQ1's codes as 8 * grid + delta; per super-block
  result = float(sum sc * dot) * d_w, out = fma(result, d_x, out) (llamactx.ggml.vecdot_kx's `_tiled`, no mins);
- the IQ types with n < 8 run `ggml_vec_dot_iq*_q8_K` (arch/x86/quants.c, the __AVX2__ code in AVX2 and AVX-512
  builds): 8 int32 lanes per super-block, lane j = sum over the eight 32-element groups of the 16-element
  sub-block's scale times the 4 products at bytes 4j..4j+3, acc_j = fma(d_w * d_x, float(lane_j), acc_j), and
  `POST * hsum_float_8(acc)` (1/8, 1/4 or 1). IQ1_S adds its delta apart: accum1 = fma(d, float(sum over groups of
  ±sc * (bsum pair)), accum1), result hsum + 1/8 * accum1; IQ1_M in lanes of its own (delta * q8 times the same
  scales, a second accumulator), result hsum(acc1) + 1/8 * hsum(acc2);
- TQ1_0 / TQ2_0 always run `ggml_vec_dot_tq*_q8_K` (AVX2): int16 lanes of stored trit * q8 minus the Q8_K bsums,
  paired into 8 int32 lanes (lane j: bytes 4j..4j+3 of every 32, minus bsums 2j and 2j + 1), acc_j =
  fma(float(lane_j), d, acc_j), hsum_float_8.

The IQ types run compiled from their packed blocks (llamactx.ggml.kernels.klowbit: the same integers and float
order, one weight row decoded at a time); TQ1_0 / TQ2_0, and `matmul_lowbit_unpacked` for every type, unpack the
weight into integers first and run `_vec_dot_lowbit` / vecdot_kx's `_tiled` (the oracle klowbit is tested against).
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.ggml.cpu import PATH_VNNI, active_path
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.lowbit_decode import COMPILED_TYPES, unpack_iq
from llamactx.ggml.vec import hsum_float_8
from llamactx.ggml.vecdot_k import quantize_activations_k
from llamactx.ggml.vecdot_kx import _tiled
from llamactx.gguf.quants import block_format
from llamactx.gguf.quants_lowbit import IQ1_TYPES, LOWBIT_TYPES, POST, TQ_TYPES, lowbit_parts

_F32 = np.float32
_TILED_MIN_ROWS = 8  # tiled.cpp `ggml_tiled_min_batch`
_MODE_PLAIN, _MODE_IQ1_S, _MODE_IQ1_M, _MODE_TQ = 0, 1, 2, 3


def unpack_weight_lowbit(weight):
    """The weight's `LowbitParts`, rows first: codes and delta int8 (rows, k), scales int32 (rows, k/16),
    d float32 (rows, k/256). IQ2 / IQ3 unpack compiled (llamactx.ggml.lowbit_decode), the others in numpy."""
    rows = weight.n_rows
    blocks = weight.data.reshape(-1, block_format(weight.ggml_type).type_size)  # (rows * nb, type_size)
    t = weight.ggml_type
    p = unpack_iq(t, blocks) if t in COMPILED_TYPES else lowbit_parts(t, blocks)
    return (np.ascontiguousarray(p.codes).reshape(rows, -1), np.ascontiguousarray(p.scales).reshape(rows, -1),
            np.ascontiguousarray(p.delta).reshape(rows, -1), p.d.reshape(rows, -1))


@numba.njit(parallel=True, cache=True)
def _vec_dot_lowbit(qw, sc, dq, dw, qx, dx, bsums, mode, post, out):  # pragma: no cover - compiled
    rows, k = qw.shape
    n = qx.shape[0]
    nb = dw.shape[1]
    for r in numba.prange(rows):
        quads = np.empty(k // 4, np.int32)  # sums of 4 consecutive products
        quads2 = np.zeros(k // 4, np.int32)  # IQ1_M: of delta * q8
        lanes = np.zeros(8, np.int32)
        lanes2 = np.zeros(8, np.int32)
        acc = np.zeros(8, np.float32)
        acc2 = np.zeros(8, np.float32)
        for t in range(n):
            for i in range(k // 4):
                s = 0
                s2 = 0
                for e in range(4 * i, 4 * i + 4):
                    s += np.int32(qw[r, e]) * np.int32(qx[t, e])
                    s2 += np.int32(dq[r, e]) * np.int32(qx[t, e])
                quads[i] = s
                quads2[i] = s2
            acc[:] = 0
            acc2[:] = 0
            accum1 = _F32(0.0)
            for b in range(nb):
                d = dx[t, b] * dw[r, b]
                lanes[:] = 0
                lanes2[:] = 0
                for g in range(8):  # 32-element groups; lanes 0-3 in sub-block 2g, 4-7 in 2g + 1
                    for j in range(8):
                        s = sc[r, b * 16 + 2 * g + j // 4]
                        lanes[j] += s * quads[b * 64 + g * 8 + j]
                        lanes2[j] += s * quads2[b * 64 + g * 8 + j]
                if mode == _MODE_TQ:  # _mm256_sub_epi16(sumi0, ysum), then madd pairs
                    for j in range(8):
                        lanes[j] -= bsums[t, b * 16 + 2 * j] + bsums[t, b * 16 + 2 * j + 1]
                for j in range(8):
                    acc[j] = fma32(d, _F32(lanes[j]), acc[j])
                    acc2[j] = fma32(d, _F32(lanes2[j]), acc2[j])
                if mode == _MODE_IQ1_S:  # sumi1: the bsum pair of each 32 times its signed scale
                    s1 = 0
                    for g in range(8):
                        s1 += dq[r, b * 256 + 32 * g] * sc[r, b * 16 + 2 * g] * (
                            bsums[t, b * 16 + 2 * g] + bsums[t, b * 16 + 2 * g + 1])
                    accum1 = fma32(d, _F32(s1), accum1)  # accum1 += d * sumi1, contracted
            h = hsum_float_8(acc)
            if mode == _MODE_IQ1_S:
                out[t, r] = fma32(post, accum1, h)
            elif mode == _MODE_IQ1_M:
                out[t, r] = fma32(post, hsum_float_8(acc2), h)
            elif mode == _MODE_TQ:
                out[t, r] = h
            else:
                out[t, r] = post * h


def uses_tiled(weight, n: int) -> bool:
    """Whether llama.cpp's tiled kernel computes this weight's matmul of n rows (the IQ types from 8 rows)."""
    return weight.ggml_type not in TQ_TYPES and n >= _TILED_MIN_ROWS


def _check_type(weight) -> None:
    if weight.ggml_type not in LOWBIT_TYPES:
        raise ValueError(f"matmul_lowbit: {block_format(weight.ggml_type).name} is not one of "
                         f"{', '.join(T(u).name for u in LOWBIT_TYPES)}")


def matmul_lowbit(x: np.ndarray, weight, n_threads: int | None = None) -> np.ndarray:
    """y = x @ W^T for a weight of one of the LOWBIT_TYPES with the kernel llama.cpp picks for it and n (module
    docstring): the IQ types compiled from their blocks on `n_threads` (default: numba's current count) on the
    active kernel path. (n, k) float32 -> (n, rows) float32. Raises ValueError for another type."""
    _check_type(weight)
    t = weight.ggml_type
    if t in TQ_TYPES or x.shape[0] == 0:
        return matmul_lowbit_unpacked(x, weight)
    # the kernels load (and compile, once) on the first IQ matmul: importing the API loads no kernel
    from llamactx.ggml.kernels.klowbit import matmul_lowbit_portable, matmul_lowbit_vnni

    out = np.empty((x.shape[0], weight.n_rows), np.float32)  # (n, rows)
    blocks = weight.data.reshape(weight.n_rows, -1)  # (rows, row bytes)
    kernel = matmul_lowbit_vnni if active_path() == PATH_VNNI else matmul_lowbit_portable
    kernel(n_threads or numba.get_num_threads(), int(t), _F32(POST[T(t)]), blocks,
           np.ascontiguousarray(x, np.float32), out)
    return out


def matmul_lowbit_unpacked(x: np.ndarray, weight) -> np.ndarray:
    """`matmul_lowbit` on the unpacked integers (every low-bit type; the TQ types' only path)."""
    _check_type(weight)
    t = weight.ggml_type
    n = x.shape[0]
    qx, dx, bsums = quantize_activations_k(x)
    codes, sc, delta, d = unpack_weight_lowbit(weight)
    out = np.empty((n, weight.n_rows), np.float32)  # (n, rows)
    post = _F32(POST[T(t)])
    if uses_tiled(weight, n):
        if t in IQ1_TYPES:
            codes = (8 * codes + delta).astype(np.int8)  # tiled_unpk_tern8: 8 * grid + delta
        dt = (d * post).astype(np.float32)  # the tile's d: f16(d) * 0.125f etc., exact
        zero = np.zeros_like(sc)
        _tiled(codes, sc, zero, dt, np.zeros_like(dt), qx, dx, bsums, False, out)
        return out
    mode = {T.IQ1_S: _MODE_IQ1_S, T.IQ1_M: _MODE_IQ1_M, T.TQ1_0: _MODE_TQ, T.TQ2_0: _MODE_TQ}.get(T(t), _MODE_PLAIN)
    _vec_dot_lowbit(codes, sc, delta, d, qx, dx, bsums, mode, post, out)
    return out

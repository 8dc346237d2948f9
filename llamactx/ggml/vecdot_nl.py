"""IQ4_NL and MXFP4 matmuls (32-element blocks of 4-bit codebook indices, Q8_0 activations) as llama.cpp's x86 CPU
backend (build 0c1e570) computes them, bit for bit.

The activations are quantized as ggml's x86 `quantize_row_q8_0` (llamactx.ggml.quants_cpu; the repacked path's
`ggml_quantize_mat_q8_0_4x8` gives the same blocks). A block's 32 integer products are summed exactly; what has to
match is where the sums become floats. Which kernel runs (ggml-cpu.c `ggml_compute_forward_mul_mat`):

- ne1 % 8 == 0: the weight is repacked at load into `block_iq4_nlx8` / `block_mxfp4x8` (repack.cpp, AVX2 and
  AVX-512 builds) and every row goes through `gemm_q4_b32_8x8_q8_0_lut_avx` (groups of 4 rows) or
  `gemv_q4_b32_8x8_q8_0_lut_avx` (the rest), both one FMA per block with the block's whole dot product:
  acc = fma(float(dot), d_w * d_x, acc).
- otherwise IQ4_NL with n >= 2 runs llamafile's `tinyBLAS_Q0_AVX` (sgemm.cpp): 8 int32 lanes of 4 products,
  acc_j = fma(d_w * d_x, float(lane_j), acc_j), `hsum` (= hsum_float_8): llamactx.ggml.vecdot's kernel.
- and the rest (IQ4_NL with n = 1, MXFP4 always: tinyBLAS has no MXFP4) runs `ggml_vec_dot_iq4_nl_q8_0` /
  `ggml_vec_dot_mxfp4_q8_0` (arch/x86/quants.c, AVX2): blocks in pairs, the even block's 8 lanes FMA'd into one
  accumulator and the odd block's into another, hsum_float_8(acc1 + acc2), then a last odd block as
  sumf = fma(d, float(dot), sumf).

MXFP4's scale is `GGML_CPU_E8M0_TO_FP32_HALF(e)` (its codebook holds twice the E2M1 values).
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.vec import hsum_float_8
from llamactx.ggml.vecdot import _lane_major, _matmul_blocks, matmul_repacked_blocks, quantize_activations
from llamactx.gguf.block_fields import f16_field
from llamactx.gguf.quants import block_format
from llamactx.gguf.quants_iq import e8m0_to_fp32_half, iq4_nl_codes, mxfp4_codes

NL_TYPES = (T.IQ4_NL, T.MXFP4)
_F32 = np.float32


def unpack_weight_nl(weight) -> tuple[np.ndarray, np.ndarray]:
    """The codes (int8 (rows, k), element order) and block scales (f32 (rows, k/32)) of an IQ4_NL / MXFP4 weight."""
    rows = weight.n_rows
    blocks = weight.data.reshape(-1, block_format(weight.ggml_type).type_size)  # (rows * nb, 18 or 17)
    if weight.ggml_type == T.IQ4_NL:
        q, d = iq4_nl_codes(blocks), f16_field(blocks, 0)
    else:
        q, d = mxfp4_codes(blocks), e8m0_to_fp32_half(blocks[:, 0:1])
    return np.ascontiguousarray(q).reshape(rows, -1), d.reshape(rows, -1)


@numba.njit(parallel=True, cache=True)
def _vec_dot_pairs(qw, dw, qx, dx, out):  # pragma: no cover - compiled
    rows, k = qw.shape
    nb = k // 32
    for r in numba.prange(rows):
        acc = np.zeros(16, np.float32)  # accum1 (even blocks), accum2 (odd blocks)
        sums = np.zeros(8, np.float32)
        for t in range(qx.shape[0]):
            acc[:] = 0
            for b in range(nb - nb % 2):
                d = dx[t, b] * dw[r, b]  # GGML_CPU_FP16_TO_FP32(y.d) * scale(x)
                for j in range(8):
                    s = 0
                    for e in range(32 * b + 4 * j, 32 * b + 4 * j + 4):
                        s += np.int32(qw[r, e]) * np.int32(qx[t, e])
                    a = 8 * (b % 2) + j
                    acc[a] = fma32(d, _F32(s), acc[a])
            for j in range(8):
                sums[j] = acc[j] + acc[8 + j]
            sumf = hsum_float_8(sums)
            if nb % 2:
                b = nb - 1
                s = 0
                for e in range(32 * b, 32 * b + 32):
                    s += np.int32(qw[r, e]) * np.int32(qx[t, e])
                sumf = fma32(dx[t, b] * dw[r, b], _F32(s), sumf)
            out[t, r] = sumf


def is_repacked_nl(weight) -> bool:
    """Whether llama.cpp repacks this IQ4_NL / MXFP4 weight (ne1 % 8 == 0; every x86 build has AVX2)."""
    return weight.ggml_type in NL_TYPES and weight.n_rows % 8 == 0


def matmul_nl(x: np.ndarray, weight) -> np.ndarray:
    """y = x @ W^T for an IQ4_NL or MXFP4 weight with the kernel llama.cpp picks for this weight and n (module
    docstring). (n, k) float32 -> (n, rows) float32. Raises ValueError for another type."""
    if weight.ggml_type not in NL_TYPES:
        raise ValueError(f"matmul_nl: {block_format(weight.ggml_type).name} is not IQ4_NL or MXFP4")
    n = x.shape[0]
    qw, dw = unpack_weight_nl(weight)
    qx, dx, sx = quantize_activations(x, T.Q8_0)
    out = np.empty((n, weight.n_rows), np.float32)  # (n, rows)
    if is_repacked_nl(weight):
        matmul_repacked_blocks(qw, dw, qx, dx, out)
    elif weight.ggml_type == T.IQ4_NL and n >= 2:  # tinyBLAS_Q0_AVX: ggml_vec_dot_q4_0_q8_0's lanes and chain
        _matmul_blocks(_lane_major(qw), dw, np.zeros_like(dw), _lane_major(qx), dx, sx, False, out)
    else:
        _vec_dot_pairs(qw, dw, qx, dx, out)
    return out

"""The KV cache types' `from_float`: what ggml_set_rows / ggml_cpy write into a K or V row of each cache type
(ggml-cpu.c type_traits_cpu[type].from_float; ggml-cpu/quants.c `quantize_row_*`, ggml-quants.c `*_ref`).

q8_0 is the CPU's SIMD quantize_row_q8_0 and q4_0 `quantize_row_q4_0_ref` (llamactx.ggml.quants_cpu); q4_1,
q5_0 and q5_1 are their `_ref` rows (gguf-py's quantizers, which follow them bit for bit); bf16 is
`ggml_cpu_fp32_to_bf16` (round to nearest even); iq4_nl is `quantize_row_iq4_nl_ref`: per block of 32,
d = max / kvalues[0] (max: the first element of largest |x|), every element's nearest codebook value for x / d,
then d refined to sum(w q x) / sum(w q q) with w = x^2 (no extra tries), stored as f16.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from llamactx.ggml.quants_cpu import bf16_bits, quantize_q4_0, quantize_q8_0

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
_F32 = np.float32


def _rows(x: np.ndarray, block: int, what: str) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if x.shape[-1] % block:
        raise ValueError(f"{what}: a row of {x.shape[-1]} values is not whole blocks of {block}")
    return x


def _gguf(t: T, what: str):
    def quantize(x: np.ndarray) -> np.ndarray:
        x = _rows(x, 32, what)
        return np.ascontiguousarray(gguf_quants.quantize(x, t)).view(np.uint8)
    quantize.__doc__ = f"f32 rows (..., n) -> {what} blocks uint8 (..., n / 32 * block bytes)"
    return quantize


def quantize_bf16(x: np.ndarray) -> np.ndarray:
    """f32 rows (..., n) -> bf16 bits as uint8 (..., 2 n)."""
    x = np.ascontiguousarray(x, np.float32)
    return bf16_bits(x).view(np.uint8).reshape(*x.shape[:-1], -1)


@numba.njit(cache=True)
def _best_index(values, x):  # pragma: no cover - compiled
    """ggml-quants.c best_index_int8(16, values, x)."""
    if x <= _F32(values[0]):
        return 0
    if x >= _F32(values[15]):
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < _F32(values[mav]):
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - _F32(values[mu - 1]) < _F32(values[mu]) - x else mu


@numba.njit(cache=True)
def _iq4_nl_rows(x, values, d_out, qs):  # pragma: no cover - compiled
    """quantize_row_iq4_nl_ref on every row of x (n_rows, n): d_out (n_rows, nb) float32 (before f16),
    qs (n_rows, nb, 16) the packed nibbles."""
    n_rows, n = x.shape
    L = np.zeros(32, np.uint8)
    for r in range(n_rows):
        L[:] = 0  # a fresh (uninitialized in C) L per row; an all-zero block keeps the previous block's codes
        for ib in range(n // 32):
            xb = x[r, ib * 32 : ib * 32 + 32]
            amax = _F32(0.0)
            mx = _F32(0.0)
            for j in range(32):
                ax = abs(xb[j])
                if ax > amax:
                    amax = ax
                    mx = xb[j]
            if amax < _F32(1e-15):
                d_out[r, ib] = _F32(0.0)
            else:
                d = mx / _F32(values[0])
                inv = _F32(1.0) / d
                sumqx = _F32(0.0)
                sumq2 = _F32(0.0)
                for j in range(32):
                    al = inv * xb[j]
                    li = _best_index(values, al)
                    L[j] = li
                    q = _F32(values[li])
                    w = xb[j] * xb[j]
                    sumqx += w * q * xb[j]
                    sumq2 += w * q * q
                d_out[r, ib] = sumqx / sumq2 if sumq2 > _F32(0.0) else _F32(0.0)
            for j in range(16):
                qs[r, ib, j] = L[j] | (L[16 + j] << 4)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """f32 rows (..., n) -> IQ4_NL blocks uint8 (..., n / 32 * 18): f16 d, 16 bytes of nibbles (elements j and
    16 + j in byte j), as quantize_row_iq4_nl_ref."""
    x = _rows(x, 32, "quantize_iq4_nl")
    flat = x.reshape(-1, x.shape[-1])
    nb = flat.shape[1] // 32
    d = np.empty((flat.shape[0], nb), np.float32)
    qs = np.empty((flat.shape[0], nb, 16), np.uint8)
    _iq4_nl_rows(flat, KVALUES_IQ4NL, d, qs)
    out = np.empty((flat.shape[0], nb, 18), np.uint8)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:] = qs
    return out.reshape(*x.shape[:-1], nb * 18)


KV_QUANTIZE = {  # cache type -> from_float of its rows; f32 and f16 are stored as numpy floats
    "q8_0": quantize_q8_0, "q4_0": quantize_q4_0, "bf16": quantize_bf16,
    "q4_1": _gguf(T.Q4_1, "quantize_q4_1"), "q5_0": _gguf(T.Q5_0, "quantize_q5_0"),
    "q5_1": _gguf(T.Q5_1, "quantize_q5_1"), "iq4_nl": quantize_iq4_nl,
}

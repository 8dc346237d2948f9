"""Decoders of ggml's non-linear 4-bit formats: IQ4_NL, IQ4_XS (a codebook of 16 int8 values) and MXFP4 (FP4 E2M1
values with an E8M0 block exponent).

Block layouts are ggml-common.h `block_iq4_nl`, `block_iq4_xs` and `block_mxfp4`; element order and scales follow
ggml-quants.c `dequantize_row_iq4_nl` / `_iq4_xs` / `_mxfp4`. Every product below is exact in float32 (an f16
scale times a 6-bit scale times a 7-bit code needs 24 bits; MXFP4 is a power of two times a small integer), so the
results are ggml's bit for bit whatever the order.

Every decoder maps `(n_blocks, type_size)` uint8 -> `(n_blocks, block_size)` float32; `quants.py` registers them.
The int8 codebooks are also what ggml-cpu's integer dot products use (llamactx.ggml.vecdot_q8_0x).
"""

from __future__ import annotations

import numpy as np

from llamactx.gguf.block_fields import f16_field, nibbles

# ggml-common.h kvalues_iq4nl and kvalues_mxfp4 (twice the E2M1 value; the E8M0 scale is halved to match)
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """ggml-impl.h `ggml_e8m0_to_fp32_half`: 2^(e - 128) as float32 (denormal for e < 2). uint8 -> float32"""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return bits.view(np.float32)


def iq4_nl_codes(blocks: np.ndarray) -> np.ndarray:
    """IQ4_NL's quants as codebook values in element order: (n, 32) int8."""
    return KVALUES_IQ4NL[nibbles(blocks[:, 2:18])].reshape(-1, 32)


def mxfp4_codes(blocks: np.ndarray) -> np.ndarray:
    """MXFP4's quants as (doubled) E2M1 values in element order: (n, 32) int8."""
    return KVALUES_MXFP4[nibbles(blocks[:, 1:17])].reshape(-1, 32)


def iq4_xs_codes(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ4_XS's quants as codebook values in element order, (n, 256) int8, and its 6-bit sub-block scales minus
    32, (n, 8) int32 (`ls - 32` of `dequantize_row_iq4_xs`)."""
    n = blocks.shape[0]
    scales_h = blocks[:, 2:4].copy().view("<u2").astype(np.int32)  # (n, 1)
    scales_l = blocks[:, 4:8].astype(np.int32)  # (n, 4)
    ib = np.arange(8)
    low = (scales_l[:, ib // 2] >> (4 * (ib % 2))) & 0xF  # (n, 8)
    high = (scales_h >> (2 * ib)) & 3  # (n, 8)
    ls = (low | (high << 4)) - 32  # (n, 8) in -32..31
    q = KVALUES_IQ4NL[nibbles(blocks[:, 8:136].reshape(n * 8, 16))]  # (n * 8, 2, 16)
    return q.reshape(n, 256), ls


def dequantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    """IQ4_NL (f16 d, 16 bytes of nibbles indexing kvalues_iq4nl): x = d * kvalues[q]."""
    return np.multiply(iq4_nl_codes(blocks), f16_field(blocks, 0), dtype=np.float32)  # (n, 32)


def dequantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    """IQ4_XS (f16 d, u16 scales_h, scales_l[4], qs[128]): x = (d * (ls - 32)) * kvalues[q] per 32 elements."""
    q, ls = iq4_xs_codes(blocks)  # (n, 256), (n, 8)
    dl = f16_field(blocks, 0) * ls.astype(np.float32)  # (n, 8)
    return np.multiply(q.reshape(-1, 8, 32), dl[:, :, None], dtype=np.float32).reshape(-1, 256)


def dequantize_mxfp4(blocks: np.ndarray) -> np.ndarray:
    """MXFP4 (u8 e, 16 bytes of nibbles indexing kvalues_mxfp4): x = kvalues[q] * 2^(e - 128)."""
    d = e8m0_to_fp32_half(blocks[:, 0:1])  # (n, 1)
    return np.multiply(mxfp4_codes(blocks), d, dtype=np.float32)  # (n, 32)

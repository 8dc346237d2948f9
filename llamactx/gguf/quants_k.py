"""Decoders of ggml's K-quant super-blocks (256 weights each): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Block layouts are ggml-common.h `block_q{2..6}_K`; element order and scale unpacking follow ggml-quants.c
`dequantize_row_q{2..6}_K`. Results are bit-identical to gguf-py's `gguf/quants.py` decoders: each step below
is either exact in float32 or is the same single rounding gguf-py performs (see the notes per type).

Every decoder maps `(n_blocks, type_size)` uint8 -> `(n_blocks, 256)` float32; `quants.py` registers them.
"""

from __future__ import annotations

import numpy as np

from llamactx.gguf.block_fields import SHIFT_2BIT, bit_planes, crumbs, f16_field, nibbles_k

QK_K = 256


def scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack Q4_K/Q5_K's 12 bytes of 6-bit (scale, min) pairs (ggml-quants.c `get_scale_min_k4`).

    Returns two `(n, 8)` uint8 arrays: the scales and the mins of the eight 32-element sub-blocks.
    """
    n = scales.shape[0]
    sc = np.empty((n, 8), dtype=np.uint8)  # (n, 8)
    mn = np.empty((n, 8), dtype=np.uint8)  # (n, 8)
    low, high, mixed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]  # (n, 4) each
    sc[:, :4] = low & 0x3F
    mn[:, :4] = high & 0x3F
    sc[:, 4:] = (mixed & 0x0F) | ((low >> 6) << 4)
    mn[:, 4:] = (mixed >> 4) | ((high >> 6) << 4)
    return sc, mn


def dequantize_q2_K(blocks: np.ndarray) -> np.ndarray:
    """Q2_K (scales[16] as 4-bit scale | 4-bit min, qs[64], f16 d, f16 dmin): x = d*sc * q - dmin*m.

    d*sc and dmin*m are exact (11 x 4 bits), as is (d*sc) * q (q < 4); only the subtraction rounds.
    """
    n = blocks.shape[0]
    sc = blocks[:, 0:16]  # (n, 16)
    d = f16_field(blocks, 80)  # (n, 1)
    dmin = f16_field(blocks, 82)  # (n, 1)
    dl = (d * (sc & 0x0F).astype(np.float32))[:, :, None]  # (n, 16, 1)
    ml = (dmin * (sc >> 4).astype(np.float32))[:, :, None]  # (n, 16, 1)
    q = crumbs(blocks[:, 16:80]).reshape(n, 16, 16)  # (n, 16, 16)
    out = np.multiply(q, dl, dtype=np.float32)  # (n, 16, 16)
    out -= ml
    return out.reshape(n, QK_K)


def dequantize_q3_K(blocks: np.ndarray) -> np.ndarray:
    """Q3_K (hmask[32], qs[64], scales[12] as 6-bit, f16 d): x = d*(sc - 32) * (q - (hbit ? 0 : 4)).

    All products are exact in float32 (11 + 6 + 3 bits), so no rounding happens at all.
    """
    n = blocks.shape[0]
    packed = blocks[:, 96:108]  # (n, 12)
    d = f16_field(blocks, 108)  # (n, 1)
    # 16 scales: low 4 bits from the nibbles of bytes 0-7 (low nibbles first), high 2 bits from bytes 8-11
    # (scale i takes bits 2*(i // 4) of byte 8 + i % 4), as the kmask1/kmask2 shuffle in dequantize_row_q3_K.
    low = np.concatenate([packed[:, 0:8] & 0x0F, packed[:, 0:8] >> 4], axis=1)  # (n, 16)
    high = (packed[:, None, 8:12] >> SHIFT_2BIT[0]) & np.uint8(3)  # (n, 4, 4)
    sc = (low | (high.reshape(n, 16) << 4)).view(np.int8) - np.int8(32)  # (n, 16) in -32..31
    dl = (d * sc.astype(np.float32))[:, :, None]  # (n, 16, 1)
    q = crumbs(blocks[:, 32:96]) | (bit_planes(blocks[:, 0:32]) << 2)  # (n, 8, 32) in 0..7
    q = q.view(np.int8) - np.int8(4)  # (n, 8, 32) in -4..3: a clear hmask bit subtracts 4
    return np.multiply(q.reshape(n, 16, 16), dl, dtype=np.float32).reshape(n, QK_K)


def dequantize_q4_K(blocks: np.ndarray) -> np.ndarray:
    """Q4_K (f16 d, f16 dmin, scales[12], qs[128]): x = d*sc * q - dmin*m per 32-element sub-block.

    (d*sc) * q is exact (11 + 6 + 4 bits); only the subtraction rounds.
    """
    n = blocks.shape[0]
    d = f16_field(blocks, 0)  # (n, 1)
    dmin = f16_field(blocks, 2)  # (n, 1)
    sc, mn = scale_min_k4(blocks[:, 4:16])  # (n, 8) each
    dl = (d * sc.astype(np.float32))[:, :, None]  # (n, 8, 1)
    ml = (dmin * mn.astype(np.float32))[:, :, None]  # (n, 8, 1)
    out = np.multiply(nibbles_k(blocks[:, 16:144]), dl, dtype=np.float32)  # (n, 8, 32)
    out -= ml
    return out.reshape(n, QK_K)


def dequantize_q5_K(blocks: np.ndarray) -> np.ndarray:
    """Q5_K (f16 d, f16 dmin, scales[12], qh[32], qs[128]): as Q4_K with a fifth bit from qh.

    Sub-block s takes bit s of qh[l] for its element l. (d*sc) * q is exact (11 + 6 + 5 bits).
    """
    n = blocks.shape[0]
    d = f16_field(blocks, 0)  # (n, 1)
    dmin = f16_field(blocks, 2)  # (n, 1)
    sc, mn = scale_min_k4(blocks[:, 4:16])  # (n, 8) each
    dl = (d * sc.astype(np.float32))[:, :, None]  # (n, 8, 1)
    ml = (dmin * mn.astype(np.float32))[:, :, None]  # (n, 8, 1)
    q = nibbles_k(blocks[:, 48:176]) | (bit_planes(blocks[:, 16:48]) << 4)  # (n, 8, 32) in 0..31
    out = np.multiply(q, dl, dtype=np.float32)  # (n, 8, 32)
    out -= ml
    return out.reshape(n, QK_K)


def dequantize_q6_K(blocks: np.ndarray) -> np.ndarray:
    """Q6_K (ql[128], qh[64], int8 scales[16], f16 d): x = (d * sc) * (q - 32), q = 4 low | 2 high bits.

    Per 128-element half h: elements 0-63 are the low nibbles of ql[64h:64h+64], 64-127 the high nibbles;
    quarter t takes bits 2t of qh[32h + l]. (d*sc) is exact but (d*sc) * q may need 25 bits and rounds, so
    the order is gguf-py's: scale first, then the quant.
    """
    n = blocks.shape[0]
    d = f16_field(blocks, 208)  # (n, 1)
    dl = (d * blocks[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]  # (n, 16, 1)
    ql = blocks[:, 0:128].reshape(n, 2, 64)  # (n, half, 64)
    nib = np.empty((n, 2, 2, 64), dtype=np.uint8)  # (n, half, lo/hi, 64)
    np.bitwise_and(ql, 0x0F, out=nib[:, :, 0])
    np.right_shift(ql, 4, out=nib[:, :, 1])
    qh = crumbs(blocks[:, 128:192])  # (n, 8, 32): 2-bit fields in the same element order
    q = (nib.reshape(n, 8, 32) | (qh << 4)).view(np.int8) - np.int8(32)  # (n, 8, 32) in -32..31
    return np.multiply(q.reshape(n, 16, 16), dl, dtype=np.float32).reshape(n, QK_K)

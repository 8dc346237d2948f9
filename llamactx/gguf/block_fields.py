"""Field readers shared by the block decoders (ggml-common.h block layouts): f16 scales, packed nibbles, 2-bit
crumbs and bit planes, each a vectorized numpy view or small copy of `(n_blocks, type_size)` uint8 blocks."""

from __future__ import annotations

import numpy as np

SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)  # four 2-bit fields of a byte
_SHIFT_1BIT = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # eight 1-bit fields of a byte


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian f16 field at byte `offset` of every block, widened exactly to float32."""
    return blocks[:, offset : offset + 2].view(np.float16).astype(np.float32)  # (n_blocks, 1)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """Split `(n, 16)` packed bytes into `(n, 2, 16)` uint8: low nibbles (elements 0-15), then high."""
    q = np.empty((qs.shape[0], 2, qs.shape[1]), dtype=np.uint8)  # (n, 2, 16)
    np.bitwise_and(qs, 0x0F, out=q[:, 0])
    np.right_shift(qs, 4, out=q[:, 1])
    return q


def high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 `qh[4]` as a little-endian uint32, bit j = element j's fifth bit -> `(n, 2, 16)` of 0/16."""
    bits = np.unpackbits(qh, axis=1, bitorder="little")  # (n, 32), element order
    return (bits << 4).reshape(qh.shape[0], 2, 16)  # (n, 2, 16)


def crumbs(qs: np.ndarray) -> np.ndarray:
    """2-bit fields of `(n, 64)` bytes in K-quant order: element h*128 + j*32 + l = qs[h*32+l] >> 2j & 3."""
    q = (qs.reshape(qs.shape[0], 2, 1, 32) >> SHIFT_2BIT) & np.uint8(3)  # (n, 2, 4, 32)
    return q.reshape(qs.shape[0], 8, 32)  # (n, 8, 32)


def nibbles_k(qs: np.ndarray) -> np.ndarray:
    """4-bit fields of `(n, 128)` bytes: chunk c of 64 elements = low nibbles of qs[32c:32c+32], then high."""
    n = qs.shape[0]
    q = np.empty((n, 4, 2, 32), dtype=np.uint8)  # (n, chunk, lo/hi, 32)
    src = qs.reshape(n, 4, 32)
    np.bitwise_and(src, 0x0F, out=q[:, :, 0])
    np.right_shift(src, 4, out=q[:, :, 1])
    return q.reshape(n, 8, 32)  # (n, 8 sub-blocks, 32)


def bit_planes(qh: np.ndarray) -> np.ndarray:
    """`(n, 32)` bytes -> `(n, 8, 32)` of 0/1: plane s holds bit s of each byte (element s*32 + l)."""
    return (qh[:, None, :] >> _SHIFT_1BIT) & np.uint8(1)  # (n, 8, 32)

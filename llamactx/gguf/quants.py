"""ggml block formats: the type registry, and dequantization of stored tensors to float32.

Every ggml type that gguf-py knows has a `BlockFormat` (block size, bytes per block). The types llamactx can
compute with also carry a decoder, `dequantize_blocks(blocks) -> float32`, that turns `(n_blocks, type_size)`
bytes into `(n_blocks, block_size)` weights, bit for bit what gguf-py's numpy dequantizers produce (which in
turn follow ggml-quants.c `dequantize_row_*`). Decoders are plain vectorized numpy functions; the registry is
the seam where a faster kernel (numba) replaces one: `register_decoder(GGMLQuantizationType.Q4_0, fast_fn)`.

Bit-exactness notes. For most formats every product (f16 scale x small integer) is exact in float32, so only
the final `+ m` / `- dmin*m` rounds and the order of exact steps does not matter. Q6_K is the exception:
`(d * scale) * q` can need 25 bits, so it is computed in exactly gguf-py's order.

The activation / KV-cache quantizers (what ggml-cpu's `from_float` does on x86) are ggml arithmetic, not file
format: they live in `llamactx.ggml.quants_cpu`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from llamactx.errors import LlamactxError
from llamactx.gguf.block_fields import f16_field, high_bits, nibbles
from llamactx.gguf.quants_iq import dequantize_iq4_nl, dequantize_iq4_xs, dequantize_mxfp4
from llamactx.gguf.quants_k import (
    dequantize_q2_K,
    dequantize_q3_K,
    dequantize_q4_K,
    dequantize_q5_K,
    dequantize_q6_K,
)
from llamactx.gguf.quants_lowbit import LOWBIT_TYPES, dequantize_lowbit

__all__ = [
    "BlockDecoder",
    "BlockFormat",
    "UnsupportedTypeError",
    "block_format",
    "dequantize",
    "is_supported",
    "register_decoder",
    "row_nbytes",
    "supported_type_names",
]

GGMLType = GGMLQuantizationType

# (n_blocks, type_size) uint8 -> (n_blocks, block_size) float32
BlockDecoder = Callable[[np.ndarray], np.ndarray]

# Elements decoded per step of `dequantize`: temporaries of a few MiB stay near the 1 MiB L2 / 32 MiB L3.
_CHUNK_ELEMENTS = 1 << 19


class UnsupportedTypeError(LlamactxError, ValueError):
    """A tensor's ggml type is known but llamactx has no compute path (no decoder) for it."""


@dataclass(frozen=True, slots=True)
class BlockFormat:
    """One ggml type's storage layout (ggml.c `type_traits`: blck_size, type_size) and its decoder."""

    ggml_type: int  # GGMLQuantizationType value
    name: str  # "Q4_1"
    block_size: int  # elements per block
    type_size: int  # bytes per block
    dequantize_blocks: BlockDecoder | None  # None = metadata only (not supported for compute)


# --- decoders: one per supported type, each mirroring gguf-py's arithmetic order --------------------------








def dequantize_f32(blocks: np.ndarray) -> np.ndarray:
    """F32: the stored bytes are the weights (a view of `blocks`; `dequantize` copies it out)."""
    return blocks.view(np.float32)  # (n, 1)


def dequantize_f16(blocks: np.ndarray) -> np.ndarray:
    """F16: IEEE half widened to float32 (exact)."""
    return blocks.view(np.float16).astype(np.float32)  # (n, 1)


def dequantize_bf16(blocks: np.ndarray) -> np.ndarray:
    """BF16: the top 16 bits of a float32 (ggml-impl.h `ggml_compute_bf16_to_fp32`)."""
    return (blocks.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # (n, 1)


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 (ggml-common.h `block_q4_0`: f16 d, 16 bytes of nibbles): x = d * (q - 8).

    Element j < 16 is the low nibble of byte j, element 16 + j the high nibble (ggml-quants.c
    `dequantize_row_q4_0`).
    """
    d = f16_field(blocks, 0)  # (n, 1)
    q = nibbles(blocks[:, 2:18]).view(np.int8) - np.int8(8)  # (n, 2, 16)
    out = np.multiply(q, d[:, :, None], dtype=np.float32)  # (n, 2, 16)
    return out.reshape(-1, 32)


def dequantize_q4_1(blocks: np.ndarray) -> np.ndarray:
    """Q4_1 (`block_q4_1`: f16 d, f16 m, 16 bytes of nibbles): x = d * q + m (`dequantize_row_q4_1`)."""
    d = f16_field(blocks, 0)[:, :, None]  # (n, 1, 1)
    m = f16_field(blocks, 2)[:, :, None]  # (n, 1, 1)
    out = np.multiply(nibbles(blocks[:, 4:20]), d, dtype=np.float32)  # (n, 2, 16)
    out += m
    return out.reshape(-1, 32)


def dequantize_q5_0(blocks: np.ndarray) -> np.ndarray:
    """Q5_0 (`block_q5_0`: f16 d, u32 qh, 16 bytes of nibbles): x = d * (q - 16) (`dequantize_row_q5_0`)."""
    d = f16_field(blocks, 0)[:, :, None]  # (n, 1, 1)
    q = nibbles(blocks[:, 6:22]) | high_bits(blocks[:, 2:6])  # (n, 2, 16) in 0..31
    q = q.view(np.int8) - np.int8(16)
    return np.multiply(q, d, dtype=np.float32).reshape(-1, 32)


def dequantize_q5_1(blocks: np.ndarray) -> np.ndarray:
    """Q5_1 (`block_q5_1`: f16 d, f16 m, u32 qh, 16 nibble bytes): x = d * q + m (`dequantize_row_q5_1`)."""
    d = f16_field(blocks, 0)[:, :, None]  # (n, 1, 1)
    m = f16_field(blocks, 2)[:, :, None]  # (n, 1, 1)
    q = nibbles(blocks[:, 8:24]) | high_bits(blocks[:, 4:8])  # (n, 2, 16) in 0..31
    out = np.multiply(q, d, dtype=np.float32)  # (n, 2, 16)
    out += m
    return out.reshape(-1, 32)


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0 (`block_q8_0`: f16 d, int8 qs[32]): x = d * q (`dequantize_row_q8_0`)."""
    d = f16_field(blocks, 0)  # (n, 1)
    return np.multiply(blocks[:, 2:34].view(np.int8), d, dtype=np.float32)  # (n, 32)


# --- the registry ---------------------------------------------------------------------------------------

# ggml.c type_traits sizes where they differ from gguf-py's table: gguf-py 0.19 still lists Q8_1 as 40 bytes
# (two f32 fields); ggml-common.h `block_q8_1` is { ggml_half d; ggml_half s; int8_t qs[32]; } = 36 bytes.
_TYPE_SIZE_OVERRIDES: dict[int, int] = {GGMLType.Q8_1: 36}

_DECODERS: dict[int, BlockDecoder] = {
    GGMLType.F32: dequantize_f32,
    GGMLType.F16: dequantize_f16,
    GGMLType.BF16: dequantize_bf16,
    GGMLType.Q4_0: dequantize_q4_0,
    GGMLType.Q4_1: dequantize_q4_1,
    GGMLType.Q5_0: dequantize_q5_0,
    GGMLType.Q5_1: dequantize_q5_1,
    GGMLType.Q8_0: dequantize_q8_0,
    GGMLType.Q2_K: dequantize_q2_K,
    GGMLType.Q3_K: dequantize_q3_K,
    GGMLType.Q4_K: dequantize_q4_K,
    GGMLType.Q5_K: dequantize_q5_K,
    GGMLType.Q6_K: dequantize_q6_K,
    GGMLType.IQ4_NL: dequantize_iq4_nl,
    GGMLType.IQ4_XS: dequantize_iq4_xs,
    GGMLType.MXFP4: dequantize_mxfp4,
    **{t: dequantize_lowbit(t) for t in LOWBIT_TYPES},  # IQ1-IQ3, TQ1_0, TQ2_0
}

_FORMATS: dict[int, BlockFormat] = {
    int(t): BlockFormat(
        ggml_type=int(t),
        name=t.name,
        block_size=block_size,
        type_size=_TYPE_SIZE_OVERRIDES.get(t, type_size),
        dequantize_blocks=_DECODERS.get(t),
    )
    for t, (block_size, type_size) in GGML_QUANT_SIZES.items()
}


def block_format(ggml_type: int) -> BlockFormat:
    """The `BlockFormat` of a ggml type id. Raises ValueError for an id no known ggml type has."""
    fmt = _FORMATS.get(int(ggml_type))
    if fmt is None:
        known = ", ".join(str(t) for t in sorted(_FORMATS))
        raise ValueError(f"ggml type {int(ggml_type)} is unknown (known type ids: {known})")
    return fmt


def is_supported(ggml_type: int) -> bool:
    """True when tensors of this type can be dequantized (and so computed with); False for unknown ids too."""
    fmt = _FORMATS.get(int(ggml_type))
    return fmt is not None and fmt.dequantize_blocks is not None


def supported_type_names() -> list[str]:
    """Names of the types with a decoder, in ggml id order."""
    return [fmt.name for _, fmt in sorted(_FORMATS.items()) if fmt.dequantize_blocks is not None]


def register_decoder(ggml_type: int, dequantize_blocks: BlockDecoder) -> BlockFormat:
    """Install `dequantize_blocks` as the decoder of `ggml_type` (e.g. a numba kernel replacing numpy's).

    The new decoder must keep the contract: `(n_blocks, type_size)` uint8 -> `(n_blocks, block_size)` float32.
    Returns the new format; raises ValueError for an unknown type.
    """
    fmt = replace(block_format(ggml_type), dequantize_blocks=dequantize_blocks)
    _FORMATS[fmt.ggml_type] = fmt
    return fmt


def row_nbytes(ggml_type: int, n: int) -> int:
    """Bytes of one row of `n` elements (ggml.c `ggml_row_size`); ValueError unless n is whole blocks."""
    fmt = block_format(ggml_type)
    if n < 0 or n % fmt.block_size != 0:
        raise ValueError(f"row of {n} elements: {fmt.name} rows must be a multiple of {fmt.block_size}")
    return n // fmt.block_size * fmt.type_size


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], name: str = "?") -> np.ndarray:
    """Decode one stored tensor to a new float32 array.

    `raw` is the tensor's bytes as stored (uint8, 1-D, may be a read-only mmap view). `shape` is in ggml `ne`
    order (ne[0] fastest); the result has numpy shape `reversed(shape)`, e.g. (ne[1], ne[0]) for a matrix.
    Raises UnsupportedTypeError (naming `name` and the type) when the type has no decoder, ValueError for an
    unknown type, a row length that is not whole blocks, or a byte count that does not match the shape.
    """
    fmt = block_format(ggml_type)
    shape = tuple(int(ne) for ne in shape)
    decode = fmt.dequantize_blocks
    if decode is None:
        raise UnsupportedTypeError(
            f"tensor {name!r}: ggml type {fmt.name} ({fmt.ggml_type}) is not supported for compute "
            f"(supported: {', '.join(supported_type_names())})"
        )
    blocks = _as_blocks(raw, fmt, shape, name)  # (n_blocks, type_size)
    n_blocks = blocks.shape[0]
    out = np.empty((n_blocks, fmt.block_size), dtype=np.float32)  # (n_blocks, block_size)
    step = max(1, _CHUNK_ELEMENTS // fmt.block_size)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 in a corrupt scale: NaN, as gguf-py gives
        for start in range(0, n_blocks, step):
            out[start : start + step] = decode(blocks[start : start + step])
    return out.reshape(tuple(reversed(shape)))


def _as_blocks(raw: np.ndarray, fmt: BlockFormat, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Check `raw` against the tensor's shape and view it as `(n_blocks, type_size)` bytes."""
    if len(shape) == 0 or any(ne < 0 for ne in shape):
        raise ValueError(f"tensor {name!r}: shape {shape} needs at least one dimension, none negative")
    if shape[0] % fmt.block_size != 0:
        raise ValueError(
            f"tensor {name!r}: ne[0] = {shape[0]} is not a multiple of the {fmt.name} block {fmt.block_size}"
        )
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 1:
        got = f"{raw.dtype} array of shape {raw.shape}" if isinstance(raw, np.ndarray) else type(raw).__name__
        raise ValueError(f"tensor {name!r}: raw data must be a 1-D uint8 array, got {got}")
    n_blocks = math.prod(shape) // fmt.block_size
    if raw.size != n_blocks * fmt.type_size:
        raise ValueError(
            f"tensor {name!r}: {raw.size} bytes of data, but {fmt.name} shape {shape} "
            f"needs {n_blocks * fmt.type_size}"
        )
    return raw.reshape(n_blocks, fmt.type_size)

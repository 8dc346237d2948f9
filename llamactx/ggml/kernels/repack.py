"""Repacking a weight matrix once, at load, into the structure-of-arrays layout the matmul kernels read.

ggml stores each block as one struct (ggml-common.h `block_q4_0` etc.): an f16 scale next to its quants. The
kernels want each field as its own contiguous array, so the inner loops are plain vector loads. The quants keep
ggml's nibble order (Q4_0..Q5_1: low nibbles = elements 0-15 of a block, high = 16-31; K-quants: low nibbles of 32
bytes = one 32-element sub-block, high = the next), which the kernels decode in registers, so activations never
need permuting. Q8_0 quants are stored offset by 128 (as uint8) so that every type reaches the kernels as unsigned
bytes and one u8 x s8 dot product serves all.

The 32-element block types interleave their rows in groups of four, as ggml-cpu's repack.cpp does
(`block_q4_0x4`): per block, the four rows' 16 bytes of nibbles side by side (Q8_0: elements 0-15 of the four
rows, then 16-31), their f16 scales side by side (then their mins), and Q5's fifth bits rearranged into one
64-bit mask per 64-byte register (legacy.py, wide.py). IQ4_NL and MXFP4 interleave groups of eight rows four
bytes at a time (`_interleave_nl`, kxquants.nl_rows). A last partial group is filled with zero rows.

Every `PackedWeight` has the same six slots, so one kernel signature serves all types (n = n_rows, or n/4 groups
for the 32-element types, n/8 for IQ4_NL / MXFP4 / Q4_K; nb = blocks per row; a slot a type does not use is an empty
(n, 0) array):

    type  qs (u8)               qh (u8)            sc (u8)               mn (u8)      d (f32)   m (f32)
    F32   the f32 row bytes     -                  -                     -            -         -
    F16   the f16 row bytes     -                  -                     -            -         -
    BF16  the bf16 row bytes    -                  -                     -            -         -
    Q4_0  nibbles (nb*64)       -                  f16 d x4 (nb*8)       -            -         -
    Q4_1  nibbles (nb*64)       -                  f16 d, m x4 (nb*16)   -            -         -
    Q5_0  nibbles (nb*64)       2 u64 masks (nb*16) f16 d x4 (nb*8)      -            -         -
    Q5_1  nibbles (nb*64)       2 u64 masks (nb*16) f16 d, m x4 (nb*16)  -            -         -
    Q8_0  q + 128 (nb*128)      -                  f16 d x4 (nb*8)       -            -         -
    Q4_K  block_q4_K x8 (nb*1152) -                -                     -            -         -
    Q5_K  nibbles (nb*128)      bits (nb*32)       6-bit sc (nb*8)       mins (nb*8)  d         dmin
    Q6_K  block_q6_K (nb*210)   -                  -                     -            -         -
    Q2_K  2-bit (nb*64)         -                  4-bit sc (nb*16)      4-bit m (nb*16) d      dmin
    Q3_K  2-bit (nb*64)         hmask (nb*32)      int8 sc-32 (nb*16)    -            d         -
    IQ4_XS nibbles (nb*128)     -                  int8 ls-32 x2 (nb*16) -            d         -
    IQ4_NL nibbles x8 (nb*128)  -                  -                     -            d x8 (nb*8) -
    MXFP4 nibbles x8 (nb*128)   -                  -                     -            E8M0/2 x8 -
    IQ1_S .. IQ3_S  their blocks (nb*type_size)  -                    -            -         -

Q4_K and Q6_K keep ggml's blocks whole: decode streams each row once, and a row split into several arrays is
several streams for the hardware prefetcher (kblocks.py); Q4_K interleaves them in groups of eight rows, as
llama.cpp's block_q4_Kx8 (one 64-byte load serves eight rows). Q2_K, Q3_K, IQ4_XS, IQ4_NL and MXFP4 run in
kxquants.py; IQ4_XS's per-32 scales are stored once per 16 elements, as Q3_K's, so both share one kernel.

F32/F16/BF16 rows are views of the stored tensor (BF16 runs in bf16.py). The 32-element types, Q4_K and Q6_K take
exactly their stored bytes; the other K-quants widen their f16 scales to f32 (Q5_K: 1.03x); nothing holds a
float32 copy of a quantized matrix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.ggml.kernels.kblocks import interleave_q4k
from llamactx.ggml.kernels.legacy import ROWS_PER_GROUP
from llamactx.gguf.block_fields import SHIFT_2BIT
from llamactx.gguf.quants import block_format
from llamactx.gguf.quants_iq import e8m0_to_fp32_half
from llamactx.gguf.quants_k import scale_min_k4

SLOTS = ("qs", "qh", "sc", "mn", "d", "m")


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A weight matrix in the kernels' layout (module docstring): `k` = row length (ggml ne[0]), `n_rows` =
    ne[1]; every array (units(ggml_type, n_rows), ...) and read-only."""

    name: str
    ggml_type: int
    k: int
    n_rows: int
    qs: np.ndarray
    qh: np.ndarray
    sc: np.ndarray
    mn: np.ndarray
    d: np.ndarray
    m: np.ndarray

    @property
    def type_name(self) -> str:
        return block_format(self.ggml_type).name

    @property
    def nbytes(self) -> int:
        """Bytes the packed arrays hold (views of the stored tensor count too)."""
        return sum(getattr(self, s).nbytes for s in SLOTS)


def _half(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 field at byte `offset` of every block as float32. (n, nb, size) -> (n, nb)"""
    return blocks[:, :, offset : offset + 2].copy().view(np.float16)[:, :, 0].astype(np.float32)


def _bytes(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes start:stop of every block, rows contiguous. (n, nb, size) -> (n, nb * (stop - start))"""
    return np.ascontiguousarray(blocks[:, :, start:stop]).reshape(blocks.shape[0], -1)


def _k_scales(blocks: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 6-bit sub-block scales and mins (ggml-quants.c get_scale_min_k4). -> two (n, nb*8) u8"""
    n, nb, _ = blocks.shape
    sc, mn = scale_min_k4(blocks[:, :, offset : offset + 12].reshape(n * nb, 12))  # (n*nb, 8) each
    return sc.reshape(n, nb * 8), mn.reshape(n, nb * 8)


# --- the 32-element block types: rows interleaved in groups of four (legacy.py, wide.py) ---------------------


def _groups(field: np.ndarray) -> np.ndarray:
    """A per-row field (n, nb, *f), n a multiple of 4, with the four rows of each group side by side in every
    block. -> (n/4, nb, 4, *f)"""
    g = field.reshape(field.shape[0] // ROWS_PER_GROUP, ROWS_PER_GROUP, *field.shape[1:])
    return np.moveaxis(g, 1, 2)


def _flat(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(a.shape[0], -1)


def _x4_nibbles(b: np.ndarray, start: int) -> np.ndarray:
    """16 bytes of nibbles per block -> (n/4, nb * 64): [row 0 | row 1 | row 2 | row 3] per block."""
    return _flat(_groups(b[:, :, start : start + 16]))


def _x4_scales(b: np.ndarray, *offsets: int) -> np.ndarray:
    """The f16 fields at `offsets` (d, then m) -> (n/4, nb * 8 * len(offsets)): per block the four rows' d, then
    the four rows' m, as raw f16 bytes."""
    fields = [_groups(b[:, :, o : o + 2]) for o in offsets]  # each (n/4, nb, 4, 2)
    return _flat(np.stack(fields, axis=2))  # (n/4, nb, len, 4, 2)


def _x4_fifth_bits(b: np.ndarray, offset: int) -> np.ndarray:
    """Q5_0/Q5_1's u32 of fifth bits per block -> (n/4, nb * 16): per block two u64 masks, bit 16j + e = element
    e (A: 0-15, then B: 16-31) of row j, the byte order of the two registers `decode_x4` fills."""
    qh = np.ascontiguousarray(b[:, :, offset : offset + 4]).view("<u4")[:, :, 0].astype(np.uint64)  # (n, nb)
    g = _groups(qh)  # (n/4, nb, 4)
    shift = (np.arange(ROWS_PER_GROUP, dtype=np.uint64) * np.uint64(16))  # row j -> bits 16j..16j+15
    lo = np.bitwise_or.reduce((g & np.uint64(0xFFFF)) << shift, axis=2)
    hi = np.bitwise_or.reduce((g >> np.uint64(16)) << shift, axis=2)
    return _flat(np.stack([lo, hi], axis=2).astype("<u8").view(np.uint8))


def _pack_q4_0(b: np.ndarray) -> dict[str, np.ndarray]:
    return {"qs": _x4_nibbles(b, 2), "sc": _x4_scales(b, 0)}


def _pack_q4_1(b: np.ndarray) -> dict[str, np.ndarray]:
    return {"qs": _x4_nibbles(b, 4), "sc": _x4_scales(b, 0, 2)}


def _pack_q5_0(b: np.ndarray) -> dict[str, np.ndarray]:
    return {"qs": _x4_nibbles(b, 6), "qh": _x4_fifth_bits(b, 2), "sc": _x4_scales(b, 0)}


def _pack_q5_1(b: np.ndarray) -> dict[str, np.ndarray]:
    return {"qs": _x4_nibbles(b, 8), "qh": _x4_fifth_bits(b, 4), "sc": _x4_scales(b, 0, 2)}


def _pack_q8_0(b: np.ndarray) -> dict[str, np.ndarray]:
    q = np.bitwise_xor(b[:, :, 2:34], np.uint8(0x80)).reshape(b.shape[0], b.shape[1], 2, 16)  # q + 128
    return {"qs": _flat(np.moveaxis(_groups(q), 2, 3)), "sc": _x4_scales(b, 0)}  # (n/4, nb, 2, 4, 16)


def _pack_q4_K(b: np.ndarray) -> dict[str, np.ndarray]:
    return {"qs": interleave_q4k(b)}  # ggml's block_q4_K bytes, eight rows interleaved (kblocks.py)


def _pack_q5_K(b: np.ndarray) -> dict[str, np.ndarray]:
    sc, mn = _k_scales(b, 4)
    return {"qs": _bytes(b, 48, 176), "qh": _bytes(b, 16, 48), "sc": sc, "mn": mn, "d": _half(b, 0), "m": _half(b, 2)}


def _pack_q6_K(b: np.ndarray) -> dict[str, np.ndarray]:
    return {"qs": _bytes(b, 0, b.shape[2])}  # ggml's block_q6_K rows, one stream each (kblocks.py)


def _pack_q3_K(b: np.ndarray) -> dict[str, np.ndarray]:
    """hmask[32], qs[64], scales[12] (6-bit, offset 32: ggml-quants.c dequantize_row_q3_K's aux), f16 d."""
    n, nb, _ = b.shape
    packed = b[:, :, 96:108].reshape(n * nb, 12)
    low = np.concatenate([packed[:, 0:8] & 0x0F, packed[:, 0:8] >> 4], axis=1)  # (n*nb, 16)
    high = (packed[:, None, 8:12] >> SHIFT_2BIT[0]) & np.uint8(3)  # (n*nb, 4, 4)
    sc = ((low | (high.reshape(-1, 16) << 4)).astype(np.int16) - 32).astype(np.int8).view(np.uint8)
    return {"qs": _bytes(b, 32, 96), "qh": _bytes(b, 0, 32), "sc": sc.reshape(n, nb * 16), "d": _half(b, 108)}


def _pack_q2_K(b: np.ndarray) -> dict[str, np.ndarray]:
    """scales[16] (4-bit scale | 4-bit min << 4), qs[64], f16 d, f16 dmin."""
    sc = _bytes(b, 0, 16)
    return {"qs": _bytes(b, 16, 80), "sc": sc & np.uint8(0x0F), "mn": sc >> np.uint8(4), "d": _half(b, 80),
            "m": _half(b, 82)}


def _pack_iq4_xs(b: np.ndarray) -> dict[str, np.ndarray]:
    """f16 d, u16 scales_h, scales_l[4], qs[128]: ls - 32 per 32 elements (dequantize_row_iq4_xs), twice."""
    n, nb, _ = b.shape
    scales_h = np.ascontiguousarray(b[:, :, 2:4]).view("<u2").astype(np.int32)  # (n, nb, 1)
    scales_l = b[:, :, 4:8].astype(np.int32)  # (n, nb, 4)
    ib = np.arange(8)
    ls = (((scales_l[:, :, ib // 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)) - 32
    sc = np.repeat(ls.astype(np.int8), 2, axis=2).view(np.uint8)  # (n, nb, 16)
    return {"qs": _bytes(b, 8, 136), "sc": sc.reshape(n, nb * 16), "d": _half(b, 0)}


NL_GROUP = 8  # IQ4_NL / MXFP4: rows per interleaved group


def _interleave_nl(nibbles: np.ndarray, d: np.ndarray) -> dict[str, np.ndarray]:
    """IQ4_NL / MXFP4 in groups of eight rows (llama.cpp's block_iq4_nlx8 idea, kxquants.nl_rows): per block b of
    a group, 4 runs of 32 bytes, run c holding bytes 4c..4c+3 of the eight rows' blocks side by side (row j at
    4j), so that one 32-byte load's low nibbles are elements 4c..4c+3 of every row and its high nibbles elements
    16+4c..; the eight rows' scales side by side. nibbles (n, nb, 16) u8, d (n, nb) f32 -> qs (n/8, nb*128),
    d (n/8, nb*8)"""
    n, nb, _ = nibbles.shape
    g = nibbles.reshape(n // NL_GROUP, NL_GROUP, nb, 4, 4)  # (group, row j, block, run c, byte e)
    qs = np.ascontiguousarray(g.transpose(0, 2, 3, 1, 4)).reshape(n // NL_GROUP, nb * 128)  # (group, b, c, j, e)
    dg = np.ascontiguousarray(d.reshape(n // NL_GROUP, NL_GROUP, nb).transpose(0, 2, 1)).reshape(n // NL_GROUP, -1)
    return {"qs": qs, "d": dg}


def _pack_iq4_nl(b: np.ndarray) -> dict[str, np.ndarray]:
    return _interleave_nl(b[:, :, 2:18], _half(b, 0))


def _pack_blocks(b: np.ndarray) -> dict[str, np.ndarray]:
    return {"qs": _bytes(b, 0, b.shape[2])}  # the IQ1 .. IQ3 types: ggml's blocks as stored (klowbit.py)


def _pack_mxfp4(b: np.ndarray) -> dict[str, np.ndarray]:
    return _interleave_nl(b[:, :, 1:17], e8m0_to_fp32_half(np.ascontiguousarray(b[:, :, 0])))


_PACKERS: dict[int, Callable[[np.ndarray], dict[str, np.ndarray]]] = {
    T.Q4_0: _pack_q4_0,
    T.Q4_1: _pack_q4_1,
    T.Q5_0: _pack_q5_0,
    T.Q5_1: _pack_q5_1,
    T.Q8_0: _pack_q8_0,
    T.Q4_K: _pack_q4_K,
    T.Q5_K: _pack_q5_K,
    T.Q6_K: _pack_q6_K,
    T.Q2_K: _pack_q2_K,
    T.Q3_K: _pack_q3_K,
    T.IQ4_XS: _pack_iq4_xs,
    T.IQ4_NL: _pack_iq4_nl,
    T.MXFP4: _pack_mxfp4,
    **{t: _pack_blocks for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)},
}

PACKABLE_TYPES: tuple[int, ...] = (T.F32, T.F16, T.BF16, *_PACKERS)
GROUPED_TYPES = frozenset(int(t) for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0))  # rows in groups of 4

# Rows repacked per step: keeps numpy's temporaries to a few MiB even for a 262144-row output matrix.
_ROWS_PER_STEP = 4096


def can_pack(ggml_type: int) -> bool:
    """True when the kernels have a matmul for weights of this ggml type."""
    return int(ggml_type) in PACKABLE_TYPES


def pack_weight(weight) -> PackedWeight:
    """Repack a 2-D `llamactx.model.Weight` (raw read-only data) for `kernels.matmul`.

    Raises ValueError for a type without a kernel, a tensor that is not a matrix, or data whose shape does not
    match `weight.shape`. The source array is only read; F32/F16 weights are used in place.
    """
    t, k, n_rows = _check(weight)
    fmt = block_format(t)
    n_units = units(t, n_rows)
    if t in (T.F32, T.F16, T.BF16):  # (n_rows, k * 4 or 2)
        parts = {"qs": _read_only_view(np.ascontiguousarray(weight.data).view(np.uint8).reshape(n_rows, -1))}
    else:
        blocks = weight.data.reshape(n_rows, k // fmt.block_size, fmt.type_size)  # (n_rows, nb, type_size)
        per = _rows_per_unit(t)
        if n_rows % per:  # a last, partial group: zero rows (d = 0) fill it
            pad = np.zeros((n_units * per - n_rows, *blocks.shape[1:]), np.uint8)
            blocks = np.concatenate([blocks, pad])
        parts = _pack_rows(blocks, _PACKERS[t])
    empty = {np.uint8: np.empty((n_units, 0), np.uint8), np.float32: np.empty((n_units, 0), np.float32)}
    for e in empty.values():
        e.flags.writeable = False
    slots = {s: parts.get(s, empty[np.float32 if s in ("d", "m") else np.uint8]) for s in SLOTS}
    return PackedWeight(name=weight.name, ggml_type=t, k=k, n_rows=n_rows, **slots)


def pack_weights(weights, name: str | None = None) -> PackedWeight:
    """Several weights with the same type and row length packed as one matrix, rows stacked in order (e.g. Q, K
    and V; gate and up): one matmul then computes all of them, with one activation quantization and one thread
    launch, and every output is bit-identical to its own matmul. Raises ValueError for mixed types or lengths.
    """
    if not weights:
        raise ValueError("pack_weights: no weights given")
    first = weights[0]
    for w in weights[1:]:
        if (w.ggml_type, w.shape[0]) != (first.ggml_type, first.shape[0]):
            raise ValueError(
                f"pack_weights: {w.name!r} is {w.type_name} with rows of {w.shape[0]}, "
                f"but {first.name!r} is {first.type_name} with rows of {first.shape[0]}"
            )
    n_rows = sum(int(w.shape[1]) for w in weights)
    data = np.concatenate([w.data for w in weights])  # (n_rows, row) the stacked stored rows
    data.flags.writeable = False
    name = name or "+".join(w.name for w in weights)
    return pack_weight(dataclasses.replace(first, name=name, shape=(first.shape[0], n_rows), data=data))


def _rows_per_unit(ggml_type: int) -> int:
    t = int(ggml_type)
    return ROWS_PER_GROUP if t in GROUPED_TYPES else NL_GROUP if t in (T.IQ4_NL, T.MXFP4, T.Q4_K) else 1


def units(ggml_type: int, n_rows: int) -> int:
    """The first dimension of a packed matrix's slots: groups of four rows for the 32-element block types, of
    eight for IQ4_NL / MXFP4 / Q4_K, else rows."""
    return -(-n_rows // _rows_per_unit(ggml_type))


def _check(weight) -> tuple[int, int, int]:
    """(type, k, n_rows) of a weight the kernels can use; ValueError naming the tensor otherwise."""
    t = int(weight.ggml_type)
    fmt = block_format(t)
    if len(weight.shape) != 2 and not (len(weight.shape) > 2 and all(int(s) == 1 for s in weight.shape[2:])):
        raise ValueError(f"tensor {weight.name!r}: matmul weights must be 2-D, got shape {tuple(weight.shape)}")
    k, n_rows = int(weight.shape[0]), int(weight.shape[1])
    if not can_pack(t):
        names = ", ".join(block_format(p).name for p in PACKABLE_TYPES)
        raise ValueError(f"tensor {weight.name!r}: no matmul kernel for type {fmt.name} (have: {names})")
    if k % fmt.block_size != 0:
        raise ValueError(
            f"tensor {weight.name!r}: row length {k} is not a multiple of the {fmt.name} block size {fmt.block_size}"
        )
    row_bytes = k // fmt.block_size * fmt.type_size
    expected = (n_rows, k) if t in (T.F32, T.F16) else (n_rows, row_bytes)
    if weight.data.shape != expected:
        raise ValueError(f"tensor {weight.name!r}: data shape {weight.data.shape} does not match {fmt.name} {expected}")
    return t, k, n_rows


def _pack_rows(blocks: np.ndarray, packer) -> dict[str, np.ndarray]:
    """Run `packer` over row chunks of (n, nb, type_size) blocks into preallocated, then read-only, arrays (one
    row of theirs per weight row, or per group of four or eight)."""
    n = blocks.shape[0]
    first = packer(blocks[: min(n, _ROWS_PER_STEP)])
    per = min(n, _ROWS_PER_STEP) // next(iter(first.values())).shape[0]  # weight rows per packed row
    parts = {s: np.empty((n // per, *p.shape[1:]), dtype=p.dtype) for s, p in first.items()}
    for s, chunk in first.items():
        parts[s][: chunk.shape[0]] = chunk
    for start in range(_ROWS_PER_STEP, n, _ROWS_PER_STEP):
        for s, chunk in packer(blocks[start : start + _ROWS_PER_STEP]).items():
            parts[s][start // per : start // per + chunk.shape[0]] = chunk
    for p in parts.values():
        p.flags.writeable = False
    return parts


def _read_only_view(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v

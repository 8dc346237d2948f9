"""Reading GGUF files safely: a read-only mmap, a validated header, and zero-copy tensor views.

Follows `gguf_init_from_file_impl` in llama.cpp's `ggml/src/gguf.cpp`: header (magic, version, counts), KV
pairs, tensor infos, then the aligned data section. Every check that llama.cpp makes is made here too, and
every rejection is a `GGUFError` naming the byte offset and the field. Nothing the header claims is allocated
or looped over before it has been checked against the bytes that remain, so hostile files fail fast.

gguf-py is used for its constants only; its `GGUFReader` trusts the counts in the header (and hangs on a file
claiming 2**63 array elements).
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np
from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
)

from llamactx.gguf.values import Cursor, GGUFError, read_value, value_type_name

__all__ = ["GGML_MAX_DIMS", "GGML_MAX_NAME", "GGUFError", "GGUFFile", "TensorInfo"]

GGML_MAX_NAME = 64  # ggml/include/ggml.h: a tensor name plus its NUL must fit in char[64]
GGML_MAX_DIMS = 4
GGUF_KEY_GENERAL_ALIGNMENT = "general.alignment"
_SUPPORTED_VERSIONS = (2, 3)  # v2 and v3 share a layout (u64 counts); v3 only allows big-endian files too
_INT64_MAX = (1 << 63) - 1
# The smallest KV: key length (8) + a 1-byte key + value type (4) + a u8 value (1).
_MIN_KV_BYTES = 8 + 1 + 4 + 1
# The smallest tensor info: name length (8) + 1-byte name + n_dims (4) + one dim (8) + type (4) + offset (8).
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a GGUF file: name, ggml type, `ne`-order shape and where its bytes are.

    `shape[0]` is the fastest-varying dimension (ggml's `ne[0]`, the row length); `offset` is absolute in the
    file, and `nbytes` = n_elements / block size * type size (gguf.constants.GGML_QUANT_SIZES).
    """

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    split: int = 0  # which file of a split model holds it (llamactx.gguf.split); 0 for a single file

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class _RawTensorInfo:
    """A parsed tensor info before the data section's start is known (`rel_offset` is relative to it)."""

    info_pos: int  # byte offset of this tensor info in the file, for error messages
    field: str
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    rel_offset: int
    nbytes: int


class GGUFFile:
    """A GGUF file opened read-only: `meta` (every KV, in file order), `tensors` and zero-copy tensor data.

    The file is mapped with `mmap.ACCESS_READ`, so every array handed out (numeric metadata arrays and
    `tensor_data`) is a non-writeable view of the page cache. Raises GGUFError for a malformed or unsupported
    file, OSError if it cannot be opened.
    """

    path: Path
    version: int
    alignment: int
    data_offset: int
    file_size: int
    meta: dict[str, object]
    meta_types: dict[str, int]
    meta_array_types: dict[str, int]
    tensors: dict[str, TensorInfo]

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.meta, self.meta_types, self.meta_array_types, self.tensors = {}, {}, {}, {}
        self.alignment = GGUF_DEFAULT_ALIGNMENT
        self.version = self.data_offset = 0
        self._kv_pos: dict[str, int] = {}  # key -> byte offset of its value type, for error messages
        self._kv_span: dict[str, tuple[int, int]] = {}  # key -> [start, end) of the whole KV entry
        with open(self.path, "rb") as f:
            self.file_size = os.fstat(f.fileno()).st_size
            if self.file_size == 0:
                raise GGUFError.at(0, "magic", "file is empty")
            self._mm: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(Cursor(self._mm, 0, len(self._mm)))
        except BaseException:
            self.meta, self.tensors = {}, {}
            self.close()
            raise

    def _parse(self, cur: Cursor) -> None:
        n_tensors, n_kv = self._read_header(cur)
        for i in range(n_kv):
            self._read_kv(cur, i)
        self._read_alignment()
        seen: set[str] = set()
        raw = [self._read_tensor_info(cur, i, seen) for i in range(n_tensors)]
        # The data section starts at the next multiple of the alignment (gguf.cpp: GGML_PAD(tell, alignment)).
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self._check_layout(raw)
        for r in raw:
            self.tensors[r.name] = TensorInfo(
                r.name, r.ggml_type, r.shape, self.data_offset + r.rel_offset, r.nbytes
            )

    def _read_header(self, cur: Cursor) -> tuple[int, int]:
        magic = cur.u32("magic")
        if magic != GGUF_MAGIC:
            raise GGUFError.at(0, "magic", f"bad magic {magic.to_bytes(4, 'little')!r}, expected b'GGUF'")
        version = cur.u32("version")
        if version != 0 and version & 0xFFFF == 0:
            # gguf.cpp: a byte-swapped version 3 reads as 0x03000000.
            raise GGUFError.at(
                4, "version", f"version {version:#x} looks byte-swapped: big-endian GGUF is unsupported"
            )
        if version == 1:
            raise GGUFError.at(4, "version", "GGUF v1 is no longer supported (supported: 2, 3)")
        if version not in _SUPPORTED_VERSIONS:
            raise GGUFError.at(4, "version", f"unsupported version {version} (supported: 2, 3)")
        self.version = version
        n_tensors = cur.i64("tensor count")
        n_kv = cur.i64("kv count")
        for pos, field, n in ((8, "tensor count", n_tensors), (16, "kv count", n_kv)):
            if n < 0:
                raise GGUFError.at(pos, field, f"{n} is negative")
        if n_kv * _MIN_KV_BYTES > cur.remaining:
            raise GGUFError.at(
                16,
                "kv count",
                f"{n_kv} KVs need at least {n_kv * _MIN_KV_BYTES} bytes but only {cur.remaining} remain",
            )
        need = n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
        if need > cur.remaining:
            raise GGUFError.at(
                8,
                "tensor count",
                f"{n_tensors} tensor infos (after {n_kv} KVs) need at least "
                f"{need} bytes but only {cur.remaining} remain",
            )
        return n_tensors, n_kv

    def _read_kv(self, cur: Cursor, i: int) -> None:
        start = cur.pos
        key = cur.string(f"kv[{i}] key", strict=True)
        if not key:
            raise GGUFError.at(start, f"kv[{i}] key", "key is empty")
        field = f"kv[{i}] key {key!r}"
        if key in self.meta:
            raise GGUFError.at(start, field, "duplicate key")
        self._kv_pos[key] = cur.pos
        vtype = cur.u32(f"{field} value type")
        value, etype = read_value(cur, vtype, field)
        self._kv_span[key] = (start, cur.pos)
        self.meta[key] = value
        self.meta_types[key] = vtype
        if etype is not None:
            self.meta_array_types[key] = etype

    def _read_alignment(self) -> None:
        # gguf.cpp: general.alignment must be a u32 and a non-zero power of two.
        key = GGUF_KEY_GENERAL_ALIGNMENT
        if key not in self.meta:
            return
        vtype, value, pos = self.meta_types[key], self.meta[key], self._kv_pos[key]
        if vtype != GGUFValueType.UINT32 or not isinstance(value, int):
            raise GGUFError.at(pos, f"kv {key!r}", f"must be of type UINT32 but is {value_type_name(vtype)}")
        if value == 0 or value & (value - 1):
            raise GGUFError.at(pos, f"kv {key!r}", f"alignment {value} is not a power of two")
        self.alignment = value

    def _read_tensor_info(self, cur: Cursor, i: int, seen: set[str]) -> _RawTensorInfo:
        start = cur.pos
        name = cur.string(f"tensor[{i}] name", strict=True)
        field = f"tensor[{i}] {name[:GGML_MAX_NAME]!r}"
        if not name:
            raise GGUFError.at(start, f"tensor[{i}] name", "name is empty")
        size = len(name.encode("utf-8"))
        if size >= GGML_MAX_NAME:
            raise GGUFError.at(
                start, field, f"name is {size} bytes, must be under GGML_MAX_NAME = {GGML_MAX_NAME}"
            )
        if name in seen:
            raise GGUFError.at(start, field, "duplicate tensor name")
        seen.add(name)
        shape = _read_shape(cur, field)
        type_pos = cur.pos
        ggml_type = cur.u32(f"{field} type")
        block_size, type_size = _type_sizes(type_pos, field, ggml_type)
        if shape[0] % block_size:
            raise GGUFError.at(
                type_pos,
                field,
                f"ne[0] = {shape[0]} is not a multiple of the block size "
                f"{block_size} of {GGMLQuantizationType(ggml_type).name}",
            )
        offset_pos = cur.pos
        rel_offset = cur.u64(f"{field} offset")
        nbytes = math.prod(shape) // block_size * type_size
        return _RawTensorInfo(offset_pos, field, name, ggml_type, shape, rel_offset, nbytes)

    def _check_layout(self, raw: list[_RawTensorInfo]) -> None:
        """Offsets aligned, no two tensors overlapping, all data inside the file.

        llama.cpp additionally demands that tensors be packed back to back in file order; we only require what
        makes the views safe, so files written with extra padding or out-of-order data still load.
        """
        for r in raw:
            if r.rel_offset % self.alignment:
                raise GGUFError.at(
                    r.info_pos,
                    f"{r.field} offset",
                    f"data offset {r.rel_offset} is not a multiple of the alignment {self.alignment}",
                )
            end = self.data_offset + r.rel_offset + r.nbytes
            if end > self.file_size:
                raise GGUFError.at(
                    r.info_pos,
                    f"{r.field} offset",
                    f"data section start {self.data_offset} + offset "
                    f"{r.rel_offset} + size {r.nbytes} exceeds file size {self.file_size}",
                )
        prev: _RawTensorInfo | None = None
        for r in sorted(raw, key=lambda r: (r.rel_offset, r.nbytes)):
            if prev is not None and r.nbytes and r.rel_offset < prev.rel_offset + prev.nbytes:
                raise GGUFError.at(
                    r.info_pos,
                    f"{r.field} offset",
                    f"data [{r.rel_offset}, "
                    f"{r.rel_offset + r.nbytes}) overlaps {prev.field} at [{prev.rel_offset}, "
                    f"{prev.rel_offset + prev.nbytes})",
                )
            if r.nbytes:
                prev = r

    def kv_bytes(self, key: str) -> bytes:
        """The KV entry `key` exactly as the file stores it (key, value type, value): what gguf.cpp's writer
        writes for the same pair, so tools that copy metadata (gguf-split) copy these bytes."""
        if self._mm is None:
            raise ValueError(f"GGUFFile {self.path.name} is closed")
        start, end = self._kv_span[key]
        return self._mm[start:end]

    def tensor_data(self, name: str) -> np.ndarray:
        """The bytes of tensor `name`: a 1-D uint8 non-writeable view into the file map (no copy).

        Raises KeyError for an unknown name and ValueError once the file is closed.
        """
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"tensor {name!r} not in {self.path.name} ({len(self.tensors)} tensors)")
        if self._mm is None:
            raise ValueError(f"GGUFFile {self.path.name} is closed")
        data = np.frombuffer(self._mm, np.uint8, count=info.nbytes, offset=info.offset)  # (nbytes,)
        data.flags.writeable = False
        return data

    def read_copy(self) -> list[np.ndarray]:
        """The file read into memory, read-only (use_mmap=False): one buffer, indexed by TensorInfo.split."""
        data = np.fromfile(self.path, dtype=np.uint8)
        data.flags.writeable = False
        return [data]

    def release_pages(self, name: str) -> None:
        """Tell the OS that tensor `name`'s file pages are not needed now (MADV_DONTNEED on the whole pages inside
        it): they stop counting as resident and are read again from the file if touched. For weights that live on
        in another form (repacked for the kernels)."""
        info = self.tensors[name]
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = -(-info.offset // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = (info.offset + info.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if stop > start:
            self._mm.madvise(mmap.MADV_DONTNEED, start, stop - start)

    def close(self) -> None:
        """Release the map. Views already handed out (numeric `meta` arrays, `tensor_data`) keep it alive and
        stay valid; it is unmapped when the last of them is garbage-collected."""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # exported views still exist; the mmap object closes itself when they are gone

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GGUFFile({str(self.path)!r}, version={self.version}, kv={len(self.meta)}, "
            f"tensors={len(self.tensors)})"
        )


def _read_shape(cur: Cursor, field: str) -> tuple[int, ...]:
    """n_dims (u32, 1..GGML_MAX_DIMS) then that many int64 `ne`, each >= 0, with a product that fits int64."""
    start = cur.pos
    n_dims = cur.u32(f"{field} n_dims")
    if not 1 <= n_dims <= GGML_MAX_DIMS:
        raise GGUFError.at(start, field, f"n_dims {n_dims} outside 1..{GGML_MAX_DIMS}")
    shape = tuple(cur.i64(f"{field} ne[{j}]") for j in range(n_dims))
    for j, ne in enumerate(shape):
        if ne < 0:
            raise GGUFError.at(start + 4 + 8 * j, field, f"ne[{j}] = {ne} is negative")
    if math.prod(shape) > _INT64_MAX:
        raise GGUFError.at(start, field, f"shape {shape} has more than INT64_MAX elements")
    return shape


def _type_sizes(pos: int, field: str, ggml_type: int) -> tuple[int, int]:
    """(block size, type size) of a ggml type, from gguf-py's GGML_QUANT_SIZES; GGUFError if unknown."""
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFError.at(pos, field, f"unknown ggml type {ggml_type}") from None

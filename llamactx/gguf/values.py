"""Bounds-checked reading of GGUF metadata values from a byte buffer.

The value half of llama.cpp's `ggml/src/gguf.cpp` (`gguf_reader::read`, `gguf_read_emplace_helper`): a cursor
that never reads past the end of the buffer, and decoders for every `gguf_type`. Every size a file claims is
checked against the bytes that remain *before* anything of that size is built, with Python ints (no uint64
wraparound), so a 43-byte file claiming 2**63 array elements fails at once instead of allocating or looping.

Value mapping: integer types -> int, f32/f64 -> float, bool -> bool, string -> str (UTF-8, undecodable bytes
kept with ``surrogateescape``), numeric arrays -> read-only little-endian numpy views into the buffer, string
arrays -> list[str], arrays of arrays -> list of those.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGUFValueType

from llamactx.errors import LlamactxError

# ggml/src/gguf.cpp: GGUF_MAX_STRING_LENGTH and GGUF_MAX_ARRAY_ELEMENTS.
MAX_STRING_LENGTH = 1 << 30
MAX_ARRAY_ELEMENTS = 1 << 30
# The GGUF spec allows nested arrays; llama.cpp rejects them outright. We accept one level (an array of
# arrays) and stop there, so hostile nesting can never recurse deeply.
MAX_ARRAY_DEPTH = 2

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")

# Scalar value types: struct format (all little-endian) and the numpy dtype used for arrays of them.
_SCALAR_STRUCTS: dict[int, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: _U32,
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<B"),
    GGUFValueType.UINT64: _U64,
    GGUFValueType.INT64: _I64,
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_ARRAY_DTYPES: dict[int, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("u1"),
    GGUFValueType.INT8: np.dtype("i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("?"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}
# Fewest bytes one array element of each type can occupy: a string is at least its u64 length, a nested array
# at least its u32 element type and u64 count.
_MIN_ELEMENT_BYTES: dict[int, int] = {
    **{t: s.size for t, s in _SCALAR_STRUCTS.items()},
    GGUFValueType.STRING: 8,
    GGUFValueType.ARRAY: 4 + 8,
}


class GGUFError(LlamactxError, ValueError):
    """A GGUF file is malformed or unsupported; the message names the byte offset and the field."""

    offset: int | None = None
    field: str | None = None

    @classmethod
    def at(cls, offset: int, field: str, problem: str) -> GGUFError:
        """Build the error for `problem` found in `field`, which starts at byte `offset` of the file."""
        err = cls(f"offset {offset}: {field}: {problem}")
        err.offset = offset
        err.field = field
        return err


def value_type_name(vtype: int) -> str:
    """'UINT32' for a known gguf value type, else the number itself."""
    try:
        return GGUFValueType(vtype).name
    except ValueError:
        return str(vtype)


@dataclass(slots=True)
class Cursor:
    """A read position in `buf` (the whole file) that refuses to move past `end`, which is `len(buf)`."""

    buf: mmap.mmap | bytes
    pos: int
    end: int

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int, field: str, what: str = "value") -> int:
        """Claim the next `n` bytes for `field` and return where they start; GGUFError if fewer remain."""
        if n > self.end - self.pos:
            raise GGUFError.at(
                self.pos, field, f"{what} needs {n} bytes but only {self.end - self.pos} remain"
            )
        start = self.pos
        self.pos += n
        return start

    def u32(self, field: str) -> int:
        return _U32.unpack_from(self.buf, self.take(4, field))[0]

    def u64(self, field: str) -> int:
        return _U64.unpack_from(self.buf, self.take(8, field))[0]

    def i64(self, field: str) -> int:
        return _I64.unpack_from(self.buf, self.take(8, field))[0]

    def string(self, field: str, strict: bool = False) -> str:
        """A u64-length-prefixed UTF-8 string. `strict` (keys, tensor names) rejects invalid UTF-8."""
        start = self.pos
        size = self.u64(field)
        check_length(start, field, "string", size, MAX_STRING_LENGTH, self.remaining)
        data = self.buf[self.pos : self.pos + size]
        self.pos += size
        try:
            return str(data, "utf-8", "strict" if strict else "surrogateescape")
        except UnicodeDecodeError as exc:
            raise GGUFError.at(
                start, field, f"string is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None


def check_length(
    offset: int, field: str, what: str, n: int, limit: int, remaining: int, unit: int = 1
) -> None:
    """Reject a claimed length `n` (of `unit`-byte items) over `limit` or over the `remaining` bytes."""
    if n > limit:
        raise GGUFError.at(offset, field, f"{what} length {n} exceeds maximum {limit}")
    if n * unit > remaining:
        need = f"{n} x {unit} bytes" if unit != 1 else f"{n}"
        raise GGUFError.at(offset, field, f"{what} length {need} exceeds remaining {remaining} bytes")


def read_value(cur: Cursor, vtype: int, field: str) -> tuple[object, int | None]:
    """Read one KV value of type `vtype`; returns (value, array element type or None for scalars)."""
    if vtype == GGUFValueType.ARRAY:
        return read_array(cur, field, depth=1)
    return _read_scalar(cur, vtype, field), None


def _read_scalar(cur: Cursor, vtype: int, field: str) -> object:
    start = cur.pos
    if vtype == GGUFValueType.STRING:
        return cur.string(field)
    packer = _SCALAR_STRUCTS.get(vtype)
    if packer is None:
        raise GGUFError.at(start, field, f"unknown value type {vtype} (valid: 0..12)")
    value = packer.unpack_from(cur.buf, cur.take(packer.size, field))[0]
    if vtype == GGUFValueType.BOOL:
        # GGUF spec: a bool is one byte, 0 or 1; anything else means a broken writer or reader.
        if value > 1:
            raise GGUFError.at(start, field, f"bool value {value} is not 0 or 1")
        return bool(value)
    return value


def read_array(cur: Cursor, field: str, depth: int) -> tuple[object, int]:
    """Read an array (element type u32, count u64, elements) at nesting `depth` (1 = a KV's own value)."""
    start = cur.pos
    etype = cur.u32(f"{field} array element type")
    n = cur.u64(f"{field} array length")
    min_size = _MIN_ELEMENT_BYTES.get(etype)
    if min_size is None:
        raise GGUFError.at(start, field, f"unknown array element type {etype} (valid: 0..12)")
    if etype == GGUFValueType.ARRAY and depth >= MAX_ARRAY_DEPTH:
        raise GGUFError.at(
            start, field, f"arrays nested deeper than {MAX_ARRAY_DEPTH} levels are not supported"
        )
    check_length(start, field, "array", n, MAX_ARRAY_ELEMENTS, cur.remaining, unit=min_size)
    if etype == GGUFValueType.STRING:
        return read_string_array(cur, n, field), etype
    if etype == GGUFValueType.ARRAY:
        return [read_array(cur, f"{field}[{i}]", depth + 1)[0] for i in range(n)], etype
    return _read_numeric_array(cur, etype, n, field), etype


def _read_numeric_array(cur: Cursor, etype: int, n: int, field: str) -> np.ndarray:
    dtype = _ARRAY_DTYPES[etype]
    start = cur.take(n * dtype.itemsize, field, "array data")
    if etype == GGUFValueType.BOOL:
        raw = np.frombuffer(cur.buf, np.uint8, count=n, offset=start)
        if n and int(raw.max()) > 1:
            bad = int(np.argmax(raw > 1))
            raise GGUFError.at(start + bad, f"{field}[{bad}]", f"bool value {int(raw[bad])} is not 0 or 1")
    arr = np.frombuffer(cur.buf, dtype, count=n, offset=start)  # (n,) view, read-only because the map is
    arr.flags.writeable = False
    return arr


def read_string_array(cur: Cursor, n: int, field: str) -> list[str]:
    """Read `n` length-prefixed strings. Hot path: Gemma-3's vocabulary holds 262144 of them, so the loop
    keeps everything in locals, lets struct.error flag a truncated length (`cur.end` is the buffer's end),
    and checks each string's end once."""
    buf, pos, end = cur.buf, cur.pos, cur.end
    unpack = _U64.unpack_from
    out: list[str] = []
    append = out.append
    try:
        for _ in range(n):
            size = unpack(buf, pos)[0]
            stop = pos + 8 + size
            if stop > end or size > MAX_STRING_LENGTH:
                check_length(pos, f"{field}[{len(out)}]", "string", size, MAX_STRING_LENGTH, end - pos - 8)
            append(buf[pos + 8 : stop].decode("utf-8", "surrogateescape"))
            pos = stop
    except struct.error:
        raise GGUFError.at(
            pos, f"{field}[{len(out)}]", f"string length needs 8 bytes but only {end - pos} remain"
        ) from None
    cur.pos = pos
    return out

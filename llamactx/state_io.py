"""Bytes in and out of state blobs (`llama_io_read_i` / `llama_io_write_i`, src/llama-io.h).

The context writes the framing (state.py), each memory writes its own section (memory/*.py); both read through
`StateReader`, which checks every length against what is left before it takes anything. Integers are
little-endian; strings are u16 length + UTF-8.
"""

from __future__ import annotations

import struct

import numpy as np

from llamactx.errors import LlamactxError


class StateError(LlamactxError, ValueError):
    """A state blob or session file that cannot be loaded into this context; memory is left unchanged."""


class StateReader:
    """Sequential reads from a blob; every read names what it reads, so a short blob says what was missing."""

    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.off = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.off + n > len(self.data):
            raise StateError(f"state is truncated: {what} needs {n} bytes at offset {self.off}, "
                             f"{len(self.data) - self.off} remain")
        view = self.data[self.off : self.off + n]
        self.off += n
        return view

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def string(self, what: str) -> str:
        n = struct.unpack("<H", self.take(2, what))[0]
        try:
            return bytes(self.take(n, what)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise StateError(f"state field {what} is not valid UTF-8") from e

    def array(self, dtype, count: int, what: str) -> np.ndarray:
        itemsize = np.dtype(dtype).itemsize
        return np.frombuffer(self.take(count * itemsize, what), dtype=dtype).copy()

    def remaining(self) -> int:
        return len(self.data) - self.off


def pack_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<H", len(b)) + b

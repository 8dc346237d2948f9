"""Importance-matrix files: the GGUF format llama-imatrix writes by default (tools/imatrix/imatrix.cpp
`IMatrixCollector::save_imatrix`) and the legacy `.dat` format, read as common/imatrix-loader.cpp
`common_imatrix_load` reads them and turned into per-column weights as tools/quantize/quantize.cpp `load_imatrix`.

A GGUF imatrix holds the keys general.type = "imatrix", imatrix.datasets (array of strings), imatrix.chunk_count
and imatrix.chunk_size (u32), and per weight two F32 tensors, sorted by name: `<weight>.in_sum2` (ne = [n_embd,
n_mat]: each column's sum of squared activations) and `<weight>.counts` (ne = [1, n_mat]: the rows summed).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llamactx.gguf.reader import GGUFFile
from llamactx.gguf.values import GGUFError

GGUF_DEFAULT_ALIGNMENT = 32
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4


@dataclass(slots=True)
class IMatrix:
    """common_imatrix: per weight name its sums (n_mat * ne0,) float32 and counts (n_mat,) int."""

    entries: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    is_legacy: bool = False
    has_metadata: bool = False

    def weights(self) -> dict[str, np.ndarray]:
        """quantize.cpp `load_imatrix`: each entry's sums divided by its per-matrix count (float32), 1 where a
        matrix was never used; legacy files divide by their call count."""
        out = {}
        for name, (sums, counts) in self.entries.items():
            e = np.empty(len(sums), np.float32)  # (n_mat * ne0,)
            if self.is_legacy:
                ncall = int(counts[0]) if len(counts) else 0
                e[:] = sums / np.float32(ncall) if ncall > 0 else sums
            else:
                ne0 = len(sums) // len(counts)
                for j, c in enumerate(counts):
                    part = slice(j * ne0, (j + 1) * ne0)
                    e[part] = sums[part] / np.float32(c) if c > 0 else np.float32(1)
            out[name] = e
        return out


def load(path: str | Path) -> IMatrix:
    """common_imatrix_load: a GGUF imatrix, else the legacy format. Raises GGUFError naming the file."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _load_gguf(path)
    return _load_legacy(path)


def _load_gguf(path: Path) -> IMatrix:
    im = IMatrix()
    with GGUFFile(path) as g:
        datasets = g.meta.get("imatrix.datasets")
        if isinstance(datasets, list):
            im.datasets = [str(d) for d in datasets]
        im.has_metadata = all(k in g.meta for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"))
        im.chunk_count = int(g.meta.get("imatrix.chunk_count", 0))
        im.chunk_size = int(g.meta.get("imatrix.chunk_size", 0))
        pairs: dict[str, list] = {}
        for name, info in g.tensors.items():
            for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
                if name.endswith(suffix):
                    if info.ggml_type != 0:
                        raise GGUFError(f"imatrix '{path}': tensor '{name}' is not F32")
                    data = g.tensor_data(name).view(np.float32).copy()
                    pairs.setdefault(name[: -len(suffix)], [None, None])[slot] = data
        if not pairs:
            raise GGUFError(f"imatrix '{path}': no data (no <weight>.in_sum2 / .counts tensors)")
        for name, (sums, counts) in sorted(pairs.items()):
            if sums is None or counts is None:
                raise GGUFError(f"imatrix '{path}': mismatched sums and counts for '{name}'")
            im.entries[name] = (sums, np.rint(counts).astype(np.int64))  # std::lround
    return im


def _load_legacy(path: Path) -> IMatrix:
    data = path.read_bytes()
    im = IMatrix(is_legacy=True)
    try:
        (n_entries,), o = struct.unpack_from("<i", data, 0), 4
        if n_entries < 1:
            raise GGUFError(f"imatrix '{path}': no data (neither a GGUF nor a legacy imatrix file)")
        for _ in range(n_entries):
            (n,) = struct.unpack_from("<i", data, o)
            name = data[o + 4 : o + 4 + n].decode("utf-8", "replace")
            o += 4 + n
            ncall, nval = struct.unpack_from("<ii", data, o)
            o += 8
            if nval < 1 or o + 4 * nval > len(data):
                raise GGUFError(f"imatrix '{path}': entry '{name}' has a bad value count {nval}")
            sums = np.frombuffer(data, np.float32, nval, o).copy()
            o += 4 * nval
            im.entries[name] = (sums, np.array([ncall], np.int64))
        if o < len(data):
            (im.chunk_count,) = struct.unpack_from("<i", data, o)
            (n,) = struct.unpack_from("<i", data, o + 4)
            if n > 0:
                im.datasets.append(data[o + 8 : o + 8 + n].decode("utf-8", "replace"))
    except struct.error:
        raise GGUFError(f"imatrix '{path}': truncated (neither a GGUF nor a legacy imatrix file)") from None
    return im


def save(path: str | Path, entries: dict[str, tuple[np.ndarray, np.ndarray]], datasets: list[str],
         chunk_count: int, chunk_size: int) -> None:
    """Write a GGUF imatrix byte for byte as ggml's gguf_write_to_file does for llama-imatrix: entries are
    name -> (sums (n_mat, ne0) float32, counts (n_mat,)), written sorted by name."""
    kv = [_kv_str("general.type", "imatrix"), _kv_str_array("imatrix.datasets", datasets),
          _kv_u32("imatrix.chunk_count", chunk_count), _kv_u32("imatrix.chunk_size", chunk_size)]
    tensors = []
    for name in sorted(entries):
        sums, counts = entries[name]
        n_mat, ne0 = sums.shape
        tensors.append((f"{name}.in_sum2", (ne0, n_mat), np.ascontiguousarray(sums, np.float32)))
        tensors.append((f"{name}.counts", (1, n_mat), np.asarray(counts, np.float32)))
    infos, blobs, offset = [], [], 0
    for name, ne, data in tensors:
        dims = list(ne)
        while len(dims) > 1 and dims[-1] == 1:  # ggml_n_dims
            dims.pop()
        infos.append(_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<q", d) for d in dims)
                     + struct.pack("<IQ", 0, offset))
        raw = data.tobytes()
        blobs.append(raw + bytes(_pad(len(raw))))
        offset += len(raw) + _pad(len(raw))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
    Path(path).write_bytes(head + bytes(_pad(len(head))) + b"".join(blobs))


def _pad(n: int) -> int:
    return (-n) % GGUF_DEFAULT_ALIGNMENT


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _kv_str(key: str, value: str) -> bytes:
    return _str(key) + struct.pack("<I", _GGUF_STRING) + _str(value)


def _kv_str_array(key: str, values: list[str]) -> bytes:
    return (_str(key) + struct.pack("<IIQ", _GGUF_ARRAY, _GGUF_STRING, len(values))
            + b"".join(_str(v) for v in values))


def _kv_u32(key: str, value: int) -> bytes:
    return _str(key) + struct.pack("<II", _GGUF_UINT32, value)

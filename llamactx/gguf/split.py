"""Models published as several GGUF files (`<prefix>-00001-of-00003.gguf` ...), and llama-gguf-split.

llama.cpp counterparts: `llama_split_path` / `llama_split_prefix` (src/llama.cpp), the split handling of
`llama_model_loader` (src/llama-model-loader.cpp: the first file holds the metadata and `split.count`, every file
its `split.no` and a share of the tensors, `split.tensors.count` the total) and tools/gguf-split/gguf-split.cpp
(`--split` / `--merge`, written through gguf.cpp's writer: version 3, every KV as stored, tensor infos with
`ggml_n_dims` dimensions, the meta and each tensor padded to 32 bytes).

`open_model_file(path)` opens a single file as a `GGUFFile` and the first file of a split model as a `GGUFSplit`,
which answers the same questions (`meta`, `tensors`, `tensor_data`, `release_pages`, `close`) over all its files:
each file is mapped read-only, so the weights stay zero-copy views as for one file. A missing, foreign or
misnumbered part is a `GGUFError` naming the file and key.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

import numpy as np
from gguf.constants import GGUF_MAGIC

from llamactx.gguf.reader import GGUFFile, TensorInfo
from llamactx.gguf.values import GGUFError

__all__ = ["GGUFSplit", "SplitPlan", "merge", "open_model_file", "parse_split_size", "plan_split", "split_path",
           "split_prefix", "write_split"]

KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS_COUNT = "split.tensors.count"
SPLIT_KEYS = (KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT)
ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT: gguf.cpp's writer pads to it whatever general.alignment says
GGUF_VERSION = 3
_U16, _I32 = 2, 5  # gguf value types of split.no / split.count and split.tensors.count


def split_path(prefix: str, split_no: int, split_count: int) -> str:
    """llama_split_path: the name of file `split_no` (0-based) of `split_count`."""
    return f"{prefix}-{split_no + 1:05d}-of-{split_count:05d}.gguf"


def split_prefix(path: str, split_no: int, split_count: int) -> str | None:
    """llama_split_prefix: `path` without its `-0000i-of-0000n.gguf` postfix, None when it does not end so."""
    postfix = f"-{split_no + 1:05d}-of-{split_count:05d}.gguf"
    if len(path) <= len(postfix) or not path.endswith(postfix):
        return None
    return path[: -len(postfix)]


def _split_count(gguf: GGUFFile) -> int:
    value = gguf.meta.get(KEY_SPLIT_COUNT, 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise GGUFError(f"{gguf.path.name}: '{KEY_SPLIT_COUNT}' is {value!r}, not an integer")
    return value


def _split_no(gguf: GGUFFile) -> int:
    if KEY_SPLIT_NO not in gguf.meta:
        raise GGUFError(f"missing key {KEY_SPLIT_NO} in GGUF split {gguf.path}")
    value = gguf.meta[KEY_SPLIT_NO]
    if not isinstance(value, int) or isinstance(value, bool):
        raise GGUFError(f"{gguf.path.name}: '{KEY_SPLIT_NO}' is {value!r}, not an integer")
    return value


def open_model_file(path: str | os.PathLike[str]) -> GGUFFile | GGUFSplit:
    """The model file at `path`: a `GGUFFile`, or a `GGUFSplit` when its `split.count` is above 1."""
    first = GGUFFile(path)
    try:
        if _split_count(first) <= 1:
            return first
        return GGUFSplit(first)
    except BaseException:
        first.close()
        raise


class GGUFSplit:
    """The files of a split model, read as one: `meta` of the first file, `tensors` of all (each TensorInfo's
    `split` says which file holds it), zero-copy `tensor_data` from that file's read-only map."""

    def __init__(self, first: GGUFFile):
        n_split = _split_count(first)
        if _split_no(first) != 0:
            raise GGUFError(f"illegal split file idx: {_split_no(first)} (file: {first.path}), model must be "
                            "loaded with the first split")
        prefix = split_prefix(str(first.path), 0, n_split)
        if prefix is None:
            raise GGUFError(f"invalid split file name: {first.path} (a model of {n_split} files is given by its "
                            f"first, named <prefix>{split_path('', 0, n_split)})")
        self.path = first.path
        self.files: list[GGUFFile] = [first]
        try:
            for idx in range(1, n_split):
                self.files.append(_open_part(split_path(prefix, idx, n_split), idx, n_split))
            self.tensors = _merged_tensors(self.files)
            expected = first.meta.get(KEY_SPLIT_TENSORS_COUNT)
            if expected != len(self.tensors):
                raise GGUFError(f"corrupted model: {expected} tensors expected ('{KEY_SPLIT_TENSORS_COUNT}' of "
                                f"{first.path.name}) but {len(self.tensors)} found in its {n_split} files")
        except BaseException:
            for f in self.files[1:]:
                f.close()
            raise
        self.meta, self.meta_types, self.meta_array_types = first.meta, first.meta_types, first.meta_array_types
        self.alignment, self.version = first.alignment, first.version
        self.file_size = sum(f.file_size for f in self.files)

    def tensor_data(self, name: str) -> np.ndarray:
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"tensor {name!r} not in {self.path.name} ({len(self.tensors)} tensors in "
                           f"{len(self.files)} files)")
        return self.files[info.split].tensor_data(name)

    def read_copy(self) -> list[np.ndarray]:
        """Each file read into memory, read-only (use_mmap=False), indexed by TensorInfo.split."""
        return [f.read_copy()[0] for f in self.files]

    def release_pages(self, name: str) -> None:
        self.files[self.tensors[name].split].release_pages(name)

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> GGUFSplit:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFSplit({str(self.path)!r}, files={len(self.files)}, tensors={len(self.tensors)})"


def _open_part(path: str, idx: int, n_split: int) -> GGUFFile:
    """Part `idx` of a split model, checked to be that part of a set of `n_split`."""
    if not os.path.isfile(path):
        raise GGUFError(f"failed to load GGUF split from {path}: the file is missing (part {idx + 1} of "
                        f"{n_split})")
    part = GGUFFile(path)
    try:
        got = _split_no(part)
        if got != idx:
            raise GGUFError(f"invalid split file idx: {got} (file: {path}), expected {idx}")
        count = _split_count(part)
        if count != n_split:
            raise GGUFError(f"{path}: '{KEY_SPLIT_COUNT}' is {count} but the first file's is {n_split}: a part of "
                            "another split model")
    except BaseException:
        part.close()
        raise
    return part


def _merged_tensors(files: list[GGUFFile]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for idx, f in enumerate(files):
        for name, info in f.tensors.items():
            if name in tensors:
                raise GGUFError(f"invalid model: tensor '{name}' is duplicated ({f.path.name} and "
                                f"{files[tensors[name].split].path.name})")
            tensors[name] = dataclasses.replace(info, split=idx)
    return tensors


# -- writing: gguf.cpp's writer, as llama-gguf-split calls it ---------------------------------------------------------


def _pad(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def _n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: the dimensions up to the last one above 1 (at least one)."""
    for i in range(len(shape) - 1, 0, -1):
        if shape[i] > 1:
            return i + 1
    return 1


def _gguf_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _kv_int(key: str, vtype: int, value: int) -> bytes:
    fmt = "<H" if vtype == _U16 else "<i"
    return _gguf_string(key) + struct.pack("<I", vtype) + struct.pack(fmt, value)


@dataclass(frozen=True)
class _OutTensor:
    info: TensorInfo
    source: GGUFFile  # the file whose bytes it copies


def _meta_bytes(kvs: list[bytes], tensors: list[_OutTensor]) -> bytes:
    """gguf_get_meta_data: header, KVs, tensor infos (offsets packed at 32-byte steps), padded to 32 bytes."""
    out = [struct.pack("<IIqq", GGUF_MAGIC, GGUF_VERSION, len(tensors), len(kvs)), *kvs]
    offset = 0
    for t in tensors:
        shape = t.info.shape[: _n_dims(t.info.shape)]
        out.append(_gguf_string(t.info.name) + struct.pack("<I", len(shape))
                   + struct.pack(f"<{len(shape)}q", *shape) + struct.pack("<iQ", t.info.ggml_type, offset))
        offset += _pad(t.info.nbytes)
    meta = b"".join(out)
    return meta + bytes(_pad(len(meta)) - len(meta))


def _write_file(path: str, kvs: list[bytes], tensors: list[_OutTensor]) -> None:
    with open(path, "wb") as f:
        f.write(_meta_bytes(kvs, tensors))
        for t in tensors:
            data = t.source.tensor_data(t.info.name)
            f.write(data.tobytes())
            f.write(bytes(_pad(t.info.nbytes) - t.info.nbytes))


def _copied_kvs(gguf: GGUFFile, skip: Iterable[str] = ()) -> list[bytes]:
    skip = set(skip)
    return [gguf.kv_bytes(k) for k in gguf.meta if k not in skip]


@dataclass(frozen=True)
class SplitPlan:
    """Which input tensors go to which output file (gguf-split's split_strategy)."""

    parts: list[list[str]]

    @property
    def n_split(self) -> int:
        return len(self.parts)


def plan_split(gguf: GGUFFile, *, max_tensors: int = 128, max_bytes: int | None = None,
               no_tensor_first_split: bool = False) -> SplitPlan:
    """split_strategy: a new file every `max_tensors` tensors, or before a tensor that would take the current one
    past `max_bytes` (tensor bytes padded to 32, metadata not counted); with `no_tensor_first_split` the first file
    holds metadata only. A file left without tensors is an error, as in gguf-split."""
    if max_tensors < 1 and max_bytes is None:
        raise GGUFError(f"--split-max-tensors must be at least 1, got {max_tensors}")
    names = list(gguf.tensors)
    parts: list[list[str]] = [[]]
    if no_tensor_first_split:
        parts.append([])
    size = 0
    for i, name in enumerate(names):
        n_bytes = _pad(gguf.tensors[name].nbytes)
        if max_bytes is not None:
            cut = size + n_bytes > max_bytes
        else:
            cut = 0 < i < len(names) and i % max_tensors == 0
        if cut:
            if not parts[-1]:
                raise GGUFError("one of splits have 0 tensors. Maybe size or tensors limit is too small")
            parts.append([])
            size = n_bytes
        else:
            size += n_bytes
        parts[-1].append(name)
    return SplitPlan(parts)


def write_split(gguf: GGUFFile, plan: SplitPlan, out_prefix: str,
                log: Callable[[str], None] | None = None) -> list[str]:
    """gguf-split --split: the files `out_prefix-0000i-of-0000n.gguf`, byte-identical to llama-gguf-split's."""
    n_split, n_tensors = plan.n_split, len(gguf.tensors)
    paths = []
    for idx, names in enumerate(plan.parts):
        kvs = _copied_kvs(gguf, SPLIT_KEYS) if idx == 0 else []
        # set in this order, split.count last: gguf-split sets it again once the number of files is known
        kvs += [_kv_int(KEY_SPLIT_NO, _U16, idx), _kv_int(KEY_SPLIT_TENSORS_COUNT, _I32, n_tensors),
                _kv_int(KEY_SPLIT_COUNT, _U16, n_split)]
        path = split_path(out_prefix, idx, n_split)
        if log:
            log(f"Writing file {path} ... ")
        _write_file(path, kvs, [_OutTensor(gguf.tensors[n], gguf) for n in names])
        paths.append(path)
    return paths


def merge(first_path: str, out_path: str, log: Callable[[str], None] | None = None) -> int:
    """gguf-split --merge: one file from the parts of a split model, byte-identical to llama-gguf-split's (the
    first part's KVs with `split.count` set to 0 and moved last, so the result is not read as split again).
    Returns the number of tensors."""
    if os.path.exists(out_path):
        raise GGUFError(f"output file {out_path} already exists")
    first = GGUFFile(first_path)
    files = [first]
    try:
        if KEY_SPLIT_COUNT not in first.meta:
            raise GGUFError(f"input file {first_path} does not contain {KEY_SPLIT_COUNT} metadata")
        n_split = _split_count(first)
        if n_split < 1:
            raise GGUFError(f"input file {first_path} does not contain a valid split count {n_split}")
        prefix = split_prefix(str(first_path), 0, n_split)
        if prefix is None:
            raise GGUFError(f"unexpected input file name: {first_path} i_split=0 n_split={n_split}")
        for idx in range(1, n_split):
            path = split_path(prefix, idx, n_split)
            if not os.path.isfile(path):
                raise GGUFError(f"failed to load input GGUF from {path}: the file is missing")
            files.append(GGUFFile(path))
        _merged_tensors(files)  # duplicated tensors would write an unreadable file
        kvs = _copied_kvs(first, [KEY_SPLIT_COUNT]) + [_kv_int(KEY_SPLIT_COUNT, _U16, 0)]
        tensors = [_OutTensor(info, f) for f in files for info in f.tensors.values()]
        if log:
            log(f"writing {out_path} from {n_split} files")
        _write_file(out_path, kvs, tensors)
        return len(tensors)
    finally:
        for f in files:
            f.close()


def parse_split_size(text: str) -> int:
    """gguf-split's --split-max-size: N followed by M (10^6 bytes) or G (10^9 bytes)."""
    unit = {"M": 1000**2, "G": 1000**3}.get(text[-1:] if text else "")
    if unit is None:
        raise GGUFError(f"--split-max-size {text!r}: supported units are M (megabytes) or G (gigabytes)")
    try:
        n = int(text[:-1])
    except ValueError:
        raise GGUFError(f"--split-max-size {text!r}: {text[:-1]!r} is not an integer") from None
    if n <= 0:
        raise GGUFError(f"--split-max-size {text!r}: size must be a positive value")
    return n * unit


"""GGUFFile against gguf-py (round trips through GGUFWriter, the two real models against GGUFReader) and
against hostile files: every malformed case must raise GGUFError naming the byte offset and the field."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT
from gguf.constants import GGUFValueType as VT

from llamactx.embedded import ModelNotInstalledError, gemma3_path, smollm2_path
from llamactx.gguf.reader import GGUFError, GGUFFile, TensorInfo
from tests.gguf.tiny_model import finish

# ----------------------------------------------------------------------------------------------------
# Hand-packed GGUF pieces (little-endian, v3 layout), for byte-exact malformed files.


def _str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", vtype) + payload


def _u32_kv(key: str, value: int) -> bytes:
    return _kv(key, VT.UINT32, struct.pack("<I", value))


def _ti(name: str | bytes, ne: tuple[int, ...], ggml_type: int = QT.F32, offset: int = 0) -> bytes:
    dims = struct.pack(f"<{len(ne)}q", *ne)
    return _str(name) + struct.pack("<I", len(ne)) + dims + struct.pack("<IQ", ggml_type, offset)


def _gguf(
    kvs=(), tis=(), data=b"", *, version=3, n_tensors=None, n_kv=None, magic=b"GGUF", align=32
) -> bytes:
    n_tensors = len(tis) if n_tensors is None else n_tensors
    n_kv = len(kvs) if n_kv is None else n_kv
    blob = magic + struct.pack("<Iqq", version, n_tensors, n_kv) + b"".join(kvs) + b"".join(tis)
    if tis:
        blob += b"\0" * (-len(blob) % align)
    return blob + data


def _open(tmp_path: Path, blob: bytes, name: str = "t.gguf") -> GGUFFile:
    path = tmp_path / name
    path.write_bytes(blob)
    return GGUFFile(path)


# ----------------------------------------------------------------------------------------------------
# Round trip through gguf-py's GGUFWriter.

Q8_0_BLOCK = 34  # gguf.constants.GGML_QUANT_SIZES[Q8_0] = (32, 2 + 32)


def _write_sample(path: Path, alignment: int | None = 64) -> dict[str, np.ndarray]:
    """A file with every value type, string and nested arrays and four tensors (one quantized)."""
    w = gguf.GGUFWriter(path, "test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.true", True)
    w.add_bool("t.false", False)
    w.add_string("t.str", "héllo ▁wörld 🦙")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, -1.25])
    w.add_array("t.arr_bool", [True, False, True])
    w.add_key_value("t.arr_u64", [1, 2**64 - 1], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("t.arr_i16", [-7, 7], VT.ARRAY, sub_type=VT.INT16)
    w.add_array("t.arr_str", ["a", "", "▁the", "<0x0A>"])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_array("t.nested_str", [["x"], ["y", "zz"]])
    rng = np.random.default_rng(0)
    tensors = {
        "tok_embd.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "norm.weight": rng.standard_normal(5).astype(np.float16),
        "pos.ids": np.arange(6, dtype=np.int32).reshape(2, 3),
        "blk.0.q8": rng.integers(0, 256, (2, 2 * Q8_0_BLOCK), dtype=np.uint8),  # 2 rows of 64 Q8_0 values
    }
    for name, arr in tensors.items():
        w.add_tensor(name, arr, raw_dtype=QT.Q8_0 if name == "blk.0.q8" else None)
    finish(w)
    return tensors


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("sample") / "sample.gguf"
    return path, _write_sample(path)


def test_round_trip_scalars(sample: tuple[Path, dict[str, np.ndarray]]) -> None:
    with GGUFFile(sample[0]) as f:
        m, t = f.meta, f.meta_types
        assert f.version == 3 and f.alignment == 64 and m["general.alignment"] == 64
        assert list(m)[:2] == ["general.architecture", "general.alignment"]
        assert (m["t.u8"], m["t.i8"], m["t.u16"], m["t.i16"]) == (200, -100, 60000, -30000)
        assert (m["t.u32"], m["t.i32"], m["t.u64"], m["t.i64"]) == (
            4_000_000_000,
            -2_000_000_000,
            2**64 - 1,
            -(2**63),
        )
        assert m["t.f32"] == float(np.float32(0.1)) and m["t.f64"] == 0.1
        assert m["t.true"] is True and m["t.false"] is False
        assert m["t.str"] == "héllo ▁wörld 🦙" and m["general.architecture"] == "test"
        assert t["t.u8"] == VT.UINT8 and t["t.i64"] == VT.INT64 and t["t.f64"] == VT.FLOAT64
        assert t["t.true"] == VT.BOOL and t["t.str"] == VT.STRING
        assert all(type(m[k]) is int for k in ("t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.u64", "t.i64"))


def test_round_trip_arrays(sample: tuple[Path, dict[str, np.ndarray]]) -> None:
    with GGUFFile(sample[0]) as f:
        m, at = f.meta, f.meta_array_types
        for key, dtype, values in [
            ("t.arr_i32", "<i4", [1, -2, 3]),
            ("t.arr_f32", "<f4", [0.5, -1.25]),
            ("t.arr_bool", "?", [True, False, True]),
            ("t.arr_u64", "<u8", [1, 2**64 - 1]),
            ("t.arr_i16", "<i2", [-7, 7]),
        ]:
            arr = m[key]
            assert isinstance(arr, np.ndarray) and arr.dtype == np.dtype(dtype), key
            assert arr.tolist() == values and not arr.flags.writeable
            assert f.meta_types[key] == VT.ARRAY
        assert at["t.arr_i32"] == VT.INT32 and at["t.arr_u64"] == VT.UINT64 and at["t.arr_bool"] == VT.BOOL
        assert m["t.arr_str"] == ["a", "", "▁the", "<0x0A>"] and at["t.arr_str"] == VT.STRING
        assert [a.tolist() for a in m["t.nested"]] == [[1, 2], [3]] and at["t.nested"] == VT.ARRAY
        assert m["t.nested_str"] == [["x"], ["y", "zz"]]
        with pytest.raises(ValueError):
            m["t.arr_i32"].flags.writeable = True  # the map itself is read-only
    assert m["t.arr_f32"].tolist() == [0.5, -1.25]  # views handed out outlive close()


def test_round_trip_tensors(sample: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, written = sample
    with GGUFFile(path) as f:
        assert list(f.tensors) == list(written)
        assert f.data_offset % 64 == 0
        for name, arr in written.items():
            info = f.tensors[name]
            data = f.tensor_data(name)
            assert data.dtype == np.uint8 and data.ndim == 1 and not data.flags.writeable
            assert data.tobytes() == arr.tobytes() and info.nbytes == arr.nbytes
            assert (info.offset - f.data_offset) % 64 == 0
        assert f.tensors["tok_embd.weight"] == TensorInfo(
            "tok_embd.weight", QT.F32, (4, 3), f.data_offset, 48
        )
        assert f.tensors["norm.weight"].ggml_type == QT.F16 and f.tensors["pos.ids"].shape == (3, 2)
        q8 = f.tensors["blk.0.q8"]
        assert (q8.ggml_type, q8.shape, q8.n_elements, q8.nbytes) == (
            QT.Q8_0,
            (64, 2),
            128,
            2 * 2 * Q8_0_BLOCK,
        )
        with pytest.raises(ValueError):
            data[0] = 1
        with pytest.raises(KeyError, match="nope"):
            f.tensor_data("nope")
    with pytest.raises(ValueError, match="closed"):
        f.tensor_data("pos.ids")


def _assert_matches_gguf_py(ours: GGUFFile, ref: gguf.GGUFReader, data_checks: int | None = None) -> None:
    """Every KV and tensor info of `ours` equals gguf-py's; tensor bytes compared for the first
    `data_checks` tensors and the last (all when None)."""
    fields = {k: v for k, v in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.meta) == list(fields)
    for key, field in fields.items():
        assert ours.meta_types[key] == field.types[0], key
        value = ours.meta[key]
        if field.types[0] != VT.ARRAY:
            assert value == field.contents() and type(value) is type(field.contents()), key
        elif len(field.types) > 2:  # gguf-py's contents() cannot decode nested arrays; compare the leaves
            parts = [field.parts[i] for i in field.data]
            is_str = field.types[-1] == VT.STRING
            leaves = [bytes(p).decode() if is_str else p.tolist()[0] for p in parts]
            assert [x for inner in value for x in (inner if is_str else inner.tolist())] == leaves, key
        elif field.types[1] == VT.STRING:
            assert ours.meta_array_types[key] == VT.STRING and value == field.contents(), key
        else:
            expected = np.concatenate([field.parts[i] for i in field.data]) if field.data else []
            assert ours.meta_array_types[key] == field.types[1], key
            assert value.dtype == np.asarray(expected).dtype or not len(value), key
            np.testing.assert_array_equal(value, expected, err_msg=key)
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    assert (ours.alignment, ours.data_offset) == (ref.alignment, ref.data_offset)
    for i, t in enumerate(ref.tensors):
        info = ours.tensors[t.name]
        assert (info.ggml_type, info.shape) == (int(t.tensor_type), tuple(int(d) for d in t.shape)), t.name
        assert (info.offset, info.nbytes, info.n_elements) == (t.data_offset, t.n_bytes, t.n_elements), t.name
        if data_checks is None or i < data_checks or i == len(ref.tensors) - 1:
            assert ours.tensor_data(t.name).tobytes() == np.ascontiguousarray(t.data).tobytes(), t.name


class _PlainArrayReader(gguf.GGUFReader):
    """gguf-py's reader, parsing from a plain ndarray view of its np.memmap: same logic, ~3x faster, because
    slicing a memmap subclass runs Python-level __array_finalize__ for each of Gemma's 262144 strings."""

    def _get(self, offset, dtype, count=1, override_order=None):  # type: ignore[no-untyped-def]
        if type(self.data) is not np.ndarray:
            self.data = self.data.view(np.ndarray)
        return super()._get(offset, dtype, count, override_order)


def test_round_trip_matches_gguf_py(sample: tuple[Path, dict[str, np.ndarray]]) -> None:
    with GGUFFile(sample[0]) as f:
        _assert_matches_gguf_py(f, gguf.GGUFReader(sample[0]))


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_model_matches_gguf_py(model: str) -> None:
    try:
        path = smollm2_path() if model == "smollm2" else gemma3_path(assemble=False)
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))
    with GGUFFile(path) as f:
        _assert_matches_gguf_py(f, _PlainArrayReader(path), data_checks=3)
        assert f.file_size == path.stat().st_size and f.version == 3
        tokens = f.meta["tokenizer.ggml.tokens"]
        assert isinstance(tokens, list) and len(tokens) == len(f.meta["tokenizer.ggml.token_type"])
        biggest = max(f.tensors.values(), key=lambda t: t.nbytes)
        data = f.tensor_data(biggest.name)
        assert not data.flags.writeable and data.size == biggest.nbytes
        with pytest.raises(ValueError):
            data.flags.writeable = True


def test_v2_and_empty_arrays_and_surrogates_accepted(tmp_path: Path) -> None:
    kvs = [
        _kv("a.empty", VT.ARRAY, struct.pack("<IQ", VT.FLOAT32, 0)),
        _kv("a.bytes", VT.STRING, _str(b"ok\xff\xfe")),  # invalid UTF-8 in a value survives round trip
        _kv("a.nested", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 2) + struct.pack("<IQ", VT.UINT8, 0) * 2),
    ]
    name63 = "n" * 63
    with _open(tmp_path, _gguf(kvs, [_ti(name63, (8,))], b"\0" * 32, version=2)) as f:
        assert f.version == 2 and f.meta["a.empty"].shape == (0,)
        assert f.meta["a.bytes"].encode("utf-8", "surrogateescape") == b"ok\xff\xfe"
        assert [a.size for a in f.meta["a.nested"]] == [0, 0]
        assert f.tensors[name63].nbytes == 32


# ----------------------------------------------------------------------------------------------------
# Malformed files: each must raise GGUFError naming the offset and the field.

# Enough trailing bytes that the header's count check passes and the targeted check is reached.
_PAD = b"\0" * 64


def _arr(etype: int, n: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IQ", etype, n) + payload


MALFORMED = [
    pytest.param(b"GGU", r"^offset 0: magic: .*needs 4 bytes but only 3 remain", id="truncated-magic"),
    pytest.param(_gguf(magic=b"GGML"), r"^offset 0: magic: bad magic b'GGML'", id="bad-magic"),
    pytest.param(_gguf(version=0), r"^offset 4: version: unsupported version 0", id="version-0"),
    pytest.param(_gguf(version=1), r"^offset 4: version: GGUF v1 is no longer supported", id="version-1"),
    pytest.param(_gguf(version=4), r"^offset 4: version: unsupported version 4", id="version-4"),
    pytest.param(
        b"GGUF" + struct.pack(">Iqq", 3, 0, 0),
        r"^offset 4: version: .*byte-swapped: big-endian",
        id="big-endian",
    ),
    pytest.param(_gguf(n_tensors=-1), r"^offset 8: tensor count: -1 is negative", id="tensor-count-negative"),
    pytest.param(
        _gguf(n_kv=-(2**63)), r"^offset 16: kv count: -9223372036854775808 is negative", id="kv-negative"
    ),
    pytest.param(
        _gguf(n_kv=5) + _PAD, r"^offset 16: kv count: 5 KVs need at least 70 bytes but only 64", id="kv-many"
    ),
    pytest.param(
        _gguf(n_tensors=2**62), r"^offset 8: tensor count: 4611686018427387904 tensor infos", id="ti-many"
    ),
    pytest.param(
        _gguf(n_kv=1) + struct.pack("<Q", 2**32) + _PAD,
        r"^offset 24: kv\[0\] key: string length 4294967296 exceeds maximum 1073741824",
        id="key-over-1GiB",
    ),
    pytest.param(
        _gguf(n_kv=1) + struct.pack("<Q", 100) + _PAD,
        r"^offset 24: kv\[0\] key: string length 100 exceeds remaining 64 bytes",
        id="key-over-remaining",
    ),
    pytest.param(
        _gguf([_kv("general.name", VT.STRING, struct.pack("<Q", 2**63 + 5))]) + _PAD,
        r"^offset 48: kv\[0\] key 'general.name': string length 9223372036854775813 exceeds maximum",
        id="value-string-over-1GiB",
    ),
    pytest.param(
        _gguf([_kv("k", VT.STRING, struct.pack("<Q", 120))]) + _PAD,
        r"^offset 37: kv\[0\] key 'k': string length 120 exceeds remaining 64 bytes",
        id="value-string-over-remaining",
    ),
    pytest.param(
        _gguf([_kv("k", VT.ARRAY, _arr(VT.UINT32, 17))]) + _PAD,
        r"^offset 37: kv\[0\] key 'k': array length 17 x 4 bytes exceeds remaining 64 bytes",
        id="array-over-remaining",
    ),
    pytest.param(
        _gguf([_kv("k", VT.ARRAY, _arr(VT.UINT8, 2**30 + 1))]) + _PAD,
        r"^offset 37: kv\[0\] key 'k': array length 1073741825 exceeds maximum 1073741824",
        id="array-over-1GiB",
    ),
    pytest.param(
        _gguf([_kv("k", VT.ARRAY, _arr(VT.STRING, 9))]) + _PAD,
        r"array length 9 x 8 bytes exceeds remaining 64 bytes",
        id="string-array-over-remaining",
    ),
    pytest.param(
        _gguf([_kv("k", VT.ARRAY, _arr(VT.STRING, 2, _str("ab") + struct.pack("<Q", 99)))]) + _PAD[:40],
        r"^offset 59: kv\[0\] key 'k'\[1\]: string length 99 exceeds remaining 40 bytes",
        id="string-array-element-over-remaining",
    ),
    pytest.param(
        _gguf([_kv("k", VT.ARRAY, _arr(VT.ARRAY, 1, _arr(VT.ARRAY, 1, _arr(VT.UINT8, 0))))]) + _PAD,
        r"^offset 49: kv\[0\] key 'k'\[0\]: arrays nested deeper than 2 levels",
        id="nested-depth-3",
    ),
    pytest.param(
        _gguf([_kv("k", VT.ARRAY, _arr(VT.ARRAY, 1) * 100_000)]),
        r"key 'k'\[0\]: arrays nested deeper than 2 levels",
        id="nested-depth-100000",
    ),
    pytest.param(
        _gguf([_kv("k", 13, b"\0" * 8)]), r"^offset 37: kv\[0\] key 'k': unknown value type 13", id="vtype"
    ),
    pytest.param(
        _gguf([_kv("k", VT.ARRAY, _arr(99, 1))]) + _PAD,
        r"^offset 37: kv\[0\] key 'k': unknown array element type 99",
        id="array-element-type",
    ),
    pytest.param(_gguf([_kv("k", VT.BOOL, b"\x02")]), r"key 'k': bool value 2 is not 0 or 1", id="bool-2"),
    pytest.param(
        _gguf([_kv("k", VT.ARRAY, _arr(VT.BOOL, 3, b"\x01\x00\x07"))]),
        r"^offset 51: kv\[0\] key 'k'\[2\]: bool value 7 is not 0 or 1",
        id="bool-array-7",
    ),
    pytest.param(
        _gguf([_kv("", VT.UINT8, b"\0")]) + _PAD, r"^offset 24: kv\[0\] key: key is empty", id="empty-key"
    ),
    pytest.param(
        _gguf([_u32_kv("k", 1), _u32_kv("k", 2)]),
        r"^offset 41: kv\[1\] key 'k': duplicate key",
        id="duplicate-key",
    ),
    pytest.param(
        _gguf([_kv(b"k\xff", VT.UINT8, b"\0")]),
        r"^offset 24: kv\[0\] key: string is not valid UTF-8",
        id="key-utf8",
    ),
    pytest.param(
        _gguf([_u32_kv("general.alignment", 48)]),
        r"^offset 49: kv 'general.alignment': alignment 48 is not a power of two",
        id="alignment-48",
    ),
    pytest.param(
        _gguf([_u32_kv("general.alignment", 0)]),
        r"kv 'general.alignment': alignment 0 is not a power",
        id="align-0",
    ),
    pytest.param(
        _gguf([_kv("general.alignment", VT.UINT64, struct.pack("<Q", 32))]),
        r"^offset 49: kv 'general.alignment': must be of type UINT32 but is UINT64",
        id="alignment-u64",
    ),
    pytest.param(
        _gguf([], [_ti("a", (8,)), _ti("a", (8,), offset=32)], b"\0" * 64),
        r"^offset 57: tensor\[1\] 'a': duplicate tensor name",
        id="duplicate-tensor",
    ),
    pytest.param(
        _gguf([], [_ti("", (8,))], _PAD), r"^offset 24: tensor\[0\] name: name is empty", id="empty-name"
    ),
    pytest.param(
        _gguf([], [_ti("n" * 64, (8,))], _PAD),
        r"^offset 24: tensor\[0\] 'n{64}': name is 64 bytes, must be under GGML_MAX_NAME = 64",
        id="name-64-bytes",
    ),
    pytest.param(
        _gguf([], [_ti(b"\xc3(", (8,))], _PAD), r"tensor\[0\] name: string is not valid UTF-8", id="name-utf8"
    ),
    pytest.param(
        _gguf([], [_ti("a", ())], _PAD), r"^offset 33: tensor\[0\] 'a': n_dims 0 outside 1..4", id="ndims-0"
    ),
    pytest.param(
        _gguf([], [_ti("a", (1, 1, 1, 1, 1))], _PAD), r"tensor\[0\] 'a': n_dims 5 outside 1..4", id="ndims-5"
    ),
    pytest.param(
        _gguf([], [_ti("a", (8, -2))], _PAD),
        r"^offset 45: tensor\[0\] 'a': ne\[1\] = -2 is negative",
        id="ne-negative",
    ),
    pytest.param(
        _gguf([], [_ti("a", (2**32, 2**31))], _PAD),
        r"tensor\[0\] 'a': shape \(4294967296, 2147483648\) has more than INT64_MAX elements",
        id="nelements-overflow",
    ),
    pytest.param(
        _gguf([], [_ti("a", (32,), ggml_type=4)], _PAD),
        r"^offset 45: tensor\[0\] 'a': unknown ggml type 4",
        id="removed-type-Q4_2",
    ),
    pytest.param(
        _gguf([], [_ti("a", (32,), ggml_type=2**31)], _PAD), r"unknown ggml type 2147483648", id="type-big"
    ),
    pytest.param(
        _gguf([], [_ti("a", (16, 2), ggml_type=QT.Q4_0)], _PAD),
        r"^offset 53: tensor\[0\] 'a': ne\[0\] = 16 is not a multiple of the block size 32 of Q4_0",
        id="block-size",
    ),
    pytest.param(
        _gguf([], [_ti("a", (4,), offset=16)], _PAD),
        r"^offset 49: tensor\[0\] 'a' offset: data offset 16 is not a multiple of the alignment 32",
        id="misaligned",
    ),
    pytest.param(
        _gguf([], [_ti("a", (16,)), _ti("b", (8,), offset=32)], b"\0" * 96),
        r"tensor\[1\] 'b' offset: data \[32, 64\) overlaps tensor\[0\] 'a' at \[0, 64\)",
        id="overlap",
    ),
    pytest.param(
        _gguf([], [_ti("a", (16,))], b"\0" * 63),
        r"^offset 49: tensor\[0\] 'a' offset: data section start 64 \+ offset 0 \+ size 64 exceeds "
        r"file size 127",
        id="past-end",
    ),
    pytest.param(
        _gguf([], [_ti("a", (8,), offset=2**64 - 32)], b"\0" * 32),
        r"offset 18446744073709551584 \+ size 32 exceeds file size",
        id="offset-huge",
    ),
]


@pytest.mark.parametrize("blob, match", MALFORMED)
def test_malformed_rejected(tmp_path: Path, blob: bytes, match: str) -> None:
    with pytest.raises(GGUFError, match=match) as info:
        _open(tmp_path, blob)
    assert info.value.offset is not None and info.value.field


@pytest.mark.parametrize("etype", [VT.UINT8, VT.FLOAT64, VT.STRING, VT.ARRAY])
def test_hostile_2_pow_63_elements_rejected_instantly(tmp_path: Path, etype: int) -> None:
    blob = _gguf([_kv("a", VT.ARRAY, _arr(etype, 2**63))])  # 49 bytes that gguf-py's reader would loop over
    start = time.perf_counter()
    with pytest.raises(
        GGUFError, match=r"^offset 37: kv\[0\] key 'a': array length 9223372036854775808 exceeds"
    ):
        _open(tmp_path, blob)
    assert time.perf_counter() - start < 1.0


def test_empty_file_rejected(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=r"^offset 0: magic: file is empty"):
        _open(tmp_path, b"")


def test_truncation_at_every_byte_rejected(tmp_path: Path) -> None:
    full = tmp_path / "full.gguf"
    _write_sample(full, alignment=32)
    blob = full.read_bytes()
    with GGUFFile(full) as f:
        data_end = max(t.offset + t.nbytes for t in f.tensors.values())
    path = tmp_path / "cut.gguf"
    for cut in range(data_end):
        path.write_bytes(blob[:cut])
        with pytest.raises(GGUFError, match=r"^offset \d+: "):
            GGUFFile(path)


def test_random_corruption_raises_only_gguf_error(tmp_path: Path) -> None:
    """Flip random header bytes: each file either loads or raises GGUFError, never another exception."""
    full = tmp_path / "full.gguf"
    _write_sample(full, alignment=32)
    blob = full.read_bytes()
    with GGUFFile(full) as f:
        header_end = f.data_offset
    rng = random.Random(1234)
    path = tmp_path / "bad.gguf"
    for _ in range(300):
        bad = bytearray(blob)
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(header_end)] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        path.write_bytes(bytes(bad))
        try:
            GGUFFile(path).close()
        except GGUFError:
            pass

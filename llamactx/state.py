"""Saving and restoring a context's state (`llama_state_*`, src/llama-context.cpp state_write_data/read_data).

A state blob is self-describing and checked whole before anything is written to memory:

    magic b"LLCTXST\\0" | u32 version | u8 kind (0 whole context, 1 one sequence) | str arch | str fingerprint
    | str type_k | str type_v | u32 n_layer, n_embd_k_gqa, n_embd_v_gqa, n_seq_bits | u32 n_cells
    | i32 pos[n_cells] | seq bitsets (whole-context blobs only) | per layer: K rows, then per layer: V rows
    | outputs (whole-context blobs only): u32 n_ids, i32 output_ids[n_ids], u32 n_logits, f32 logits,
      u32 n_embd_rows, f32 embd

Strings are u16 length + UTF-8; all integers little-endian. A session file (`state_save_file`) is
b"LLCTXSF\\0" | u32 version | u32 n_tokens | i32 tokens[n_tokens] | the blob.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

STATE_MAGIC = b"LLCTXST\0"
FILE_MAGIC = b"LLCTXSF\0"
STATE_VERSION = 1
KIND_FULL, KIND_SEQ = 0, 1


class StateError(ValueError):
    """A state blob or session file that cannot be loaded into this context; memory is left unchanged."""


class _Reader:
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


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<H", len(b)) + b


@dataclass(slots=True)
class _Parsed:
    pos: np.ndarray  # (n_cells,) int32
    seq: np.ndarray | None  # (n_cells, n_seq_max) bool, whole-context blobs only
    k: np.ndarray  # (n_layer, n_cells, k row)
    v: np.ndarray  # (n_layer, n_cells, v row)
    output_ids: np.ndarray | None
    logits: np.ndarray | None
    embd: np.ndarray | None


def write_state(ctx, seq_id: int | None) -> bytes:
    """Serialize the whole context (seq_id None) or one sequence's cells."""
    kv, model = ctx.memory, ctx.model
    cells = kv.cells
    idx = cells.seq_cells(-1 if seq_id is None else seq_id)  # (n_cells,) in position order
    parts = [STATE_MAGIC, struct.pack("<IB", STATE_VERSION, KIND_FULL if seq_id is None else KIND_SEQ),
             _str(model.arch), _str(model.fingerprint), _str(kv.type_k), _str(kv.type_v),
             struct.pack("<IIIII", kv.n_layer, kv.n_embd_k_gqa, kv.n_embd_v_gqa, kv.n_seq_max, idx.size),
             cells.pos[idx].astype("<i4").tobytes()]
    if seq_id is None:
        parts.append(np.packbits(cells.seq[idx], axis=1).tobytes())
    parts += [np.ascontiguousarray(kv.k[:, idx]).tobytes(), np.ascontiguousarray(kv.v[:, idx]).tobytes()]
    if seq_id is None:
        logits, embd = ctx._logits, ctx._embd
        parts += [struct.pack("<I", ctx._output_ids.size), ctx._output_ids.astype("<i4").tobytes(),
                  struct.pack("<I", logits.shape[0]), logits.astype("<f4").tobytes(),
                  struct.pack("<I", embd.shape[0]), embd.astype("<f4").tobytes()]
    return b"".join(parts)


def _parse(ctx, data: bytes, kind: int) -> _Parsed:
    """Check and decode a blob completely; raises StateError naming the first problem."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StateError(f"state must be bytes, got {type(data).__name__}")
    r = _Reader(bytes(data))
    if bytes(r.take(8, "magic")) != STATE_MAGIC:
        raise StateError("not a llamactx state: wrong magic")
    version, blob_kind = struct.unpack("<IB", r.take(5, "version"))
    if version != STATE_VERSION:
        raise StateError(f"state version {version} is not supported (expected {STATE_VERSION})")
    if blob_kind != kind:
        names = {KIND_FULL: "whole-context", KIND_SEQ: "sequence"}
        raise StateError(f"expected a {names[kind]} state, got a {names.get(blob_kind, blob_kind)} state")
    kv, model = ctx.memory, ctx.model
    arch, fp = r.string("arch"), r.string("fingerprint")
    if arch != model.arch or fp != model.fingerprint:
        raise StateError(f"state was saved from another model ({arch} {fp}), this context runs "
                         f"{model.arch} {model.fingerprint}")
    type_k, type_v = r.string("type_k"), r.string("type_v")
    if (type_k, type_v) != (kv.type_k, kv.type_v):
        raise StateError(f"state KV types {type_k}/{type_v} differ from this context's {kv.type_k}/{kv.type_v}")
    n_layer, n_k, n_v, n_seq_bits, n_cells = struct.unpack("<IIIII", r.take(20, "dimensions"))
    if (n_layer, n_k, n_v) != (kv.n_layer, kv.n_embd_k_gqa, kv.n_embd_v_gqa):
        raise StateError(f"state KV shape {n_layer}x{n_k}/{n_v} differs from this context's "
                         f"{kv.n_layer}x{kv.n_embd_k_gqa}/{kv.n_embd_v_gqa}")
    if n_cells > kv.size:
        raise StateError(f"state holds {n_cells} cells, more than this context's n_ctx = {kv.size}")
    pos = r.array("<i4", n_cells, "positions").astype(np.int32)
    if (pos < 0).any():
        raise StateError(f"state has a negative position {int(pos.min())}")
    seq = None
    if kind == KIND_FULL:
        if n_seq_bits < 1 or n_seq_bits > 256:
            raise StateError(f"state n_seq_max {n_seq_bits} is outside [1, 256]")
        packed = r.array(np.uint8, n_cells * ((n_seq_bits + 7) // 8), "sequence sets")
        bits = np.unpackbits(packed.reshape(n_cells, -1), axis=1)[:, :n_seq_bits].astype(bool)
        if bits[:, kv.n_seq_max :].any():
            raise StateError(f"state uses seq_id {int(np.flatnonzero(bits.any(0))[-1])}, this context has "
                             f"n_seq_max = {kv.n_seq_max}")
        seq = np.zeros((n_cells, kv.n_seq_max), bool)
        seq[:, : min(n_seq_bits, kv.n_seq_max)] = bits[:, : kv.n_seq_max]
        if n_cells and not seq.any(axis=1).all():
            raise StateError("state has a cell without any sequence")
    elif len(np.unique(pos)) != pos.size:
        raise StateError("sequence state has duplicate positions")
    k = _rows(r, kv.k, n_layer, n_cells, "K")
    v = _rows(r, kv.v, n_layer, n_cells, "V")
    output_ids = logits = embd = None
    if kind == KIND_FULL:
        output_ids, logits, embd = _outputs(r, ctx)
    if r.off != len(r.data):
        raise StateError(f"state has {len(r.data) - r.off} trailing bytes after offset {r.off}")
    return _Parsed(pos, seq, k, v, output_ids, logits, embd)


def _rows(r: _Reader, like: np.ndarray, n_layer: int, n_cells: int, what: str) -> np.ndarray:
    arr = r.array(like.dtype, n_layer * n_cells * like.shape[2], f"{what} rows")
    return arr.reshape(n_layer, n_cells, like.shape[2])


def _outputs(r: _Reader, ctx):
    hp = ctx.model.hparams
    n_ids = r.u32("output id count")
    if n_ids > ctx.params.n_batch:
        raise StateError(f"state has {n_ids} output ids, more than n_batch = {ctx.params.n_batch}")
    output_ids = r.array("<i4", n_ids, "output ids").astype(np.int32)
    n_logits = r.u32("logits count")
    logits = r.array("<f4", n_logits * hp.n_vocab, "logits").astype(np.float32).reshape(n_logits, hp.n_vocab)
    n_embd = r.u32("embeddings count")
    embd = r.array("<f4", n_embd * hp.n_embd, "embeddings").astype(np.float32).reshape(n_embd, hp.n_embd)
    n_out = int((output_ids >= 0).sum())
    if output_ids.size and (output_ids.max() >= max(n_logits, n_embd) or n_out not in (n_logits, n_embd)):
        raise StateError(f"state output ids do not match its {n_logits} logits rows / {n_embd} embedding rows")
    return output_ids, logits, embd


def read_state(ctx, data: bytes, dest_seq_id: int | None) -> None:
    """Load a blob into the context (whole state when dest_seq_id is None, else into that sequence)."""
    kind = KIND_FULL if dest_seq_id is None else KIND_SEQ
    parsed = _parse(ctx, data, kind)
    kv = ctx.memory
    n = parsed.pos.size
    if kind == KIND_FULL:
        kv.clear(data=False)
        kv.cells.pos[:n] = parsed.pos
        kv.cells.seq[:n] = parsed.seq
        kv.k[:, :n] = parsed.k
        kv.v[:, :n] = parsed.v
        ctx._output_ids, ctx._logits, ctx._embd, ctx._embd_seq = parsed.output_ids, parsed.logits, parsed.embd, {}
        return
    cells = kv.cells
    only_dest = cells.seq[:, dest_seq_id] & (cells.seq.sum(axis=1) == 1)
    available = int((cells.pos < 0).sum() + only_dest.sum())
    if n > available:
        raise StateError(f"sequence state needs {n} cells, only {available} are free for seq_id {dest_seq_id}")
    kv.seq_rm(dest_seq_id)
    idx = cells.find_slot(n)
    cells.apply(idx, parsed.pos, [(dest_seq_id,)] * n)
    kv.k[:, idx] = parsed.k
    kv.v[:, idx] = parsed.v


def save_file(path: str | os.PathLike, blob: bytes, tokens) -> None:
    toks = np.asarray(list(tokens), dtype="<i4")
    with open(path, "wb") as f:
        f.write(FILE_MAGIC + struct.pack("<II", STATE_VERSION, toks.size) + toks.tobytes() + blob)


def load_file(path: str | os.PathLike, n_token_capacity: int) -> tuple[bytes, list[int]]:
    """Read a session file; raises StateError for a bad header or more tokens than `n_token_capacity`."""
    with open(path, "rb") as f:
        data = f.read()
    r = _Reader(data)
    if bytes(r.take(8, "file magic")) != FILE_MAGIC:
        raise StateError(f"'{path}' is not a llamactx session file: wrong magic")
    version = r.u32("file version")
    if version != STATE_VERSION:
        raise StateError(f"session file version {version} is not supported (expected {STATE_VERSION})")
    n_tokens = r.u32("token count")
    if n_tokens > n_token_capacity:
        raise StateError(f"session file holds {n_tokens} tokens, more than the capacity {n_token_capacity}")
    tokens = r.array("<i4", n_tokens, "tokens").tolist()
    return bytes(r.data[r.off :]), tokens


"""Saving and restoring a context's state (`llama_state_*`, src/llama-context.cpp state_write_data/read_data).

A state blob is self-describing and checked whole before anything is written to memory:

    magic b"LLCTXST\\0" | u32 version | u8 kind (0 whole context, 1 one sequence) | str arch | str fingerprint
    | the memory's section (KVCache.state_write: KV types and shape, cell positions, sequence sets, K and V rows)
    | outputs (whole-context blobs only): u32 n_ids, i32 output_ids[n_ids], u32 n_logits, f32 logits,
      u32 n_embd_rows, f32 embd

Strings are u16 length + UTF-8; all integers little-endian. A session file (`state_save_file`, the server's slot
files) is b"LLCTXSF\\0" | u32 version | u32 n_tokens | i32 tokens[n_tokens] | sha256(tokens bytes + blob) | the
blob: the checksum binds the token list to the KV it was saved with, so a file whose tokens or KV were changed,
spliced from two files or cut short is refused before anything is parsed.

What can be checked is: the file's checksum, framing, lengths, the model (arch and fingerprint) and KV shape,
positions (>= 0, in the order written), sequence sets (each cell in >= 1 sequence of this context, no sequence
over n_ctx_seq cells), K/V values (finite), output ids and session-file token ids. The checksum is integrity,
not authenticity: whoever can write the file can write a matching checksum, and a blob from an untrusted source
can still make the model's output wrong, never the process fail or another sequence change (docs/state.md).
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np

from llamactx.state_io import StateError, StateReader, pack_str

STATE_MAGIC = b"LLCTXST\0"
FILE_MAGIC = b"LLCTXSF\0"
STATE_VERSION = 1
FILE_VERSION = 2  # 2: the sha256 after the tokens
KIND_FULL, KIND_SEQ = 0, 1

__all__ = ["StateError", "load_file", "read_state", "save_file", "write_state"]


def write_state(ctx, seq_id: int | None) -> bytes:
    """Serialize the whole context (seq_id None) or one sequence's cells."""
    model = ctx.model
    parts = [STATE_MAGIC, struct.pack("<IB", STATE_VERSION, KIND_FULL if seq_id is None else KIND_SEQ),
             pack_str(model.arch), pack_str(model.fingerprint), ctx.memory.state_write(seq_id)]
    if seq_id is None:
        out = ctx.outputs()
        parts += [struct.pack("<I", out.output_ids.size), out.output_ids.astype("<i4").tobytes(),
                  struct.pack("<I", out.logits.shape[0]), out.logits.astype("<f4").tobytes(),
                  struct.pack("<I", out.embd.shape[0]), out.embd.astype("<f4").tobytes()]
    return b"".join(parts)


def read_state(ctx, data: bytes, dest_seq_id: int | None) -> None:
    """Load a blob into the context (whole state when dest_seq_id is None, else into that sequence). The blob is
    parsed and checked completely first; on any problem StateError is raised with memory unchanged."""
    kind = KIND_FULL if dest_seq_id is None else KIND_SEQ
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StateError(f"state must be bytes, got {type(data).__name__}")
    r = StateReader(bytes(data))
    _check_header(r, ctx.model, kind)
    mem_state = ctx.memory.state_read(r, whole=kind == KIND_FULL)
    outputs = _read_outputs(r, ctx) if kind == KIND_FULL else None
    if r.remaining():
        raise StateError(f"state has {r.remaining()} trailing bytes after offset {r.off}")
    ctx.memory.state_check_fits(mem_state, dest_seq_id)
    ctx.memory.state_apply(mem_state, dest_seq_id)
    if outputs is not None:
        ctx.set_outputs(*outputs)


def _check_header(r: StateReader, model, kind: int) -> None:
    if bytes(r.take(8, "magic")) != STATE_MAGIC:
        raise StateError("not a llamactx state: wrong magic")
    version, blob_kind = struct.unpack("<IB", r.take(5, "version"))
    if version != STATE_VERSION:
        raise StateError(f"state version {version} is not supported (expected {STATE_VERSION})")
    if blob_kind != kind:
        names = {KIND_FULL: "whole-context", KIND_SEQ: "sequence"}
        raise StateError(f"expected a {names[kind]} state, got a {names.get(blob_kind, blob_kind)} state")
    arch, fp = r.string("arch"), r.string("fingerprint")
    if arch != model.arch or fp != model.fingerprint:
        raise StateError(f"state was saved from another model ({arch} {fp}), this context runs "
                         f"{model.arch} {model.fingerprint}")


def _read_outputs(r: StateReader, ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    hp = ctx.model.hparams
    n_ids = r.u32("output id count")
    if n_ids > ctx.params.n_batch:
        raise StateError(f"state has {n_ids} output ids, more than n_batch = {ctx.params.n_batch}")
    output_ids = r.array("<i4", n_ids, "output ids").astype(np.int32)
    n_logits = r.u32("logits count")
    logits = r.array("<f4", n_logits * hp.n_vocab, "logits").astype(np.float32).reshape(n_logits, hp.n_vocab)
    n_embd = r.u32("embeddings count")
    embd = r.array("<f4", n_embd * hp.n_embd, "embeddings").astype(np.float32).reshape(n_embd, hp.n_embd)
    if (output_ids < -1).any():
        raise StateError(f"state output id {int(output_ids.min())} is neither -1 nor a row index")
    n_out = int((output_ids >= 0).sum())
    if output_ids.size and (output_ids.max() >= max(n_logits, n_embd) or n_out not in (n_logits, n_embd)):
        raise StateError(f"state output ids do not match its {n_logits} logits rows / {n_embd} embedding rows")
    return output_ids, logits, embd


def save_file(path: str | os.PathLike, blob: bytes, tokens) -> None:
    toks = np.asarray(list(tokens), dtype="<i4").tobytes()
    digest = hashlib.sha256(toks + blob).digest()
    with open(path, "wb") as f:
        f.write(FILE_MAGIC + struct.pack("<II", FILE_VERSION, len(toks) // 4) + toks + digest + blob)


def load_file(path: str | os.PathLike, n_token_capacity: int, n_vocab: int) -> tuple[bytes, list[int]]:
    """Read a session file (llama_state_load_file); raises StateError for a bad header, more tokens than
    `n_token_capacity` or a token id outside [0, n_vocab)."""
    with open(path, "rb") as f:
        data = f.read()
    r = StateReader(data)
    if bytes(r.take(8, "file magic")) != FILE_MAGIC:
        raise StateError(f"'{os.path.basename(path)}' is not a llamactx session file: wrong magic")
    version = r.u32("file version")
    if version != FILE_VERSION:
        raise StateError(f"session file version {version} is not supported (expected {FILE_VERSION})")
    n_tokens = r.u32("token count")
    if n_tokens > n_token_capacity:
        raise StateError(f"session file holds {n_tokens} tokens, more than the capacity {n_token_capacity}")
    tokens = r.array("<i4", n_tokens, "tokens")  # (n_tokens,)
    digest = bytes(r.take(32, "checksum"))
    blob = bytes(r.data[r.off :])
    if hashlib.sha256(tokens.tobytes() + blob).digest() != digest:
        raise StateError(f"'{os.path.basename(path)}' fails its checksum: its tokens or state were changed or cut "
                         "short since it was saved")
    bad = np.flatnonzero((tokens < 0) | (tokens >= n_vocab))
    if bad.size:
        raise StateError(f"session file token {int(bad[0])} = {int(tokens[bad[0]])} is outside the vocab "
                         f"[0, {n_vocab})")
    return blob, tokens.tolist()

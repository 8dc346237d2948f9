"""The tests' one GGUF writer: a tiny llama-architecture model written from scratch, and the pieces every other
GGUF a test writes is made with (`finish`, `copy_meta`).

`write_tiny_llama` makes a complete, loadable model of a few hundred KiB. Tests use it where a real model would
be slow to copy (metadata or tensor changes that `Model.load` must refuse) and the fuzz targets use it as a
valid seed. Weights are random but finite; quantized ones get their f16 scale fields overwritten with small
finite values, so a decode gives finite logits. tests/data/tiny/make_tiny_models.py (the models with llama.cpp
references), tests/cli/test_quantize.py and tests/test_model.py write theirs with `finish` and `copy_meta`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

from tests.conftest import SCALE_OFFSETS

T = GGMLQuantizationType

# SPM vocab: <unk> <s> </s>, the 256 byte tokens, a few words
TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581the", "\u2581a", "\u2581cat", "at"]
TOKEN_TYPES = [2, 3, 3, *([6] * 256), 1, 1, 1, 1]  # UNKNOWN, CONTROL, CONTROL, BYTE..., NORMAL...


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (unicode_byte_to_utf8_map), in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def vocab_meta(tokenizer: str) -> dict[str, object]:
    """Tokenizer metadata: "spm" (llama: byte tokens and scores) or "bpe" (gpt2: byte-level tokens and merges)."""
    if tokenizer == "spm":
        return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": TOKENS,
                "tokenizer.ggml.scores": [0.0, 0.0, 0.0, *([-1000.0] * 256), -1.0, -2.0, -3.0, -4.0],
                "tokenizer.ggml.token_type": TOKEN_TYPES,
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    tokens = ["<|endoftext|>", *_byte_chars(), "\u0120t", "he", "\u0120the", "at"]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3, *([1] * (len(tokens) - 1))],
            "tokenizer.ggml.merges": ["\u0120 t", "h e", "\u0120t he", "a t"],
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}


def tiny_hparams(n_embd: int = 64, n_ff: int = 128, n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2,
                 n_ctx_train: int = 512) -> dict[str, object]:
    """The `llama.*` metadata of the tiny model (GGUF key -> value)."""
    return {
        "llama.context_length": n_ctx_train,
        "llama.embedding_length": n_embd,
        "llama.block_count": n_layer,
        "llama.feed_forward_length": n_ff,
        "llama.attention.head_count": n_head,
        "llama.attention.head_count_kv": n_head_kv,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 10000.0,
    }


def tensor_table(meta: Mapping[str, object], n_vocab: int = len(TOKENS)) -> dict[str, tuple[int, ...]]:
    """Tensor name -> ggml shape (ne order) for the hparams in `meta`."""
    n_embd, n_ff = int(meta["llama.embedding_length"]), int(meta["llama.feed_forward_length"])
    n_head, n_head_kv = int(meta["llama.attention.head_count"]), int(meta["llama.attention.head_count_kv"])
    n_kv = n_embd // n_head * n_head_kv
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_embd, n_vocab), "output_norm.weight": (n_embd,)}
    for il in range(int(meta["llama.block_count"])):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": (n_embd,), b + "attn_q.weight": (n_embd, n_embd),
            b + "attn_k.weight": (n_embd, n_kv), b + "attn_v.weight": (n_embd, n_kv),
            b + "attn_output.weight": (n_embd, n_embd), b + "ffn_norm.weight": (n_embd,),
            b + "ffn_gate.weight": (n_embd, n_ff), b + "ffn_up.weight": (n_embd, n_ff),
            b + "ffn_down.weight": (n_ff, n_embd),
        })
    return shapes


def tensor_bytes(shape: tuple[int, ...], ggml_type: int, rng: np.random.Generator) -> np.ndarray:
    """Random finite data of `shape` stored as `ggml_type`: float arrays for F32 / F16, else uint8 blocks."""
    n = int(np.prod(shape))
    if ggml_type == T.F32:
        return (rng.standard_normal(n) * 0.1).astype(np.float32).reshape(shape[::-1])
    if ggml_type == T.F16:
        return (rng.standard_normal(n) * 0.1).astype(np.float16).reshape(shape[::-1])
    if ggml_type == T.BF16:
        f32 = (rng.standard_normal(n) * 0.1).astype(np.float32)
        return (f32.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(*shape[:0:-1], -1)
    block, size = GGML_QUANT_SIZES[T(ggml_type)]
    blocks = rng.integers(0, 256, (n // block, size), dtype=np.uint8)
    for off in SCALE_OFFSETS.get(T(ggml_type), []):
        blocks[:, off : off + 2] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    if ggml_type == T.MXFP4:
        blocks[:, 0] = 120  # E8M0 exponent: 2^-8 per (doubled) E2M1 step
    if ggml_type == T.IQ1_M:  # d = f16 0x1819 (0.002) in the top nibbles of the 4 scale words (iq1m_scale_t)
        blocks[:, 49:57:2] = (blocks[:, 49:57:2] & 0x0F) | np.array([0x90, 0x10, 0x80, 0x10], np.uint8)
    return blocks.reshape(*shape[:0:-1], shape[0] // block * size)


def write_tiny_llama(path: str | Path, *, meta: Mapping[str, object] | None = None,
                     types: Mapping[str, int] | None = None, shapes: Mapping[str, tuple[int, ...]] | None = None,
                     drop: tuple[str, ...] = (), tokenizer: str = "spm", seed: int = 0, **hparams: int) -> Path:
    """Write the tiny model to `path`. `hparams` size it (see `tiny_hparams`); `meta` adds or replaces metadata
    keys after the tensor table is sized (a value of None removes the key); `types` sets tensors' ggml types
    (default F32); `shapes` replaces or adds tensors' shapes; `drop` leaves tensors out; `tokenizer` is "spm" or
    "bpe" (see `vocab_meta`)."""
    base = tiny_hparams(**hparams)
    vocab = vocab_meta(tokenizer)
    table = tensor_table(base, len(vocab["tokenizer.ggml.tokens"]))  # type: ignore[arg-type]
    table.update(shapes or {})
    keys: dict[str, object] = {**base, **vocab, **(meta or {})}
    writer = GGUFWriter(str(path), "llama")
    for key, value in keys.items():
        if value is not None:
            _add(writer, key, value)
    rng = np.random.default_rng(seed)
    for name, shape in table.items():
        if name in drop:
            continue
        ggml_type = (types or {}).get(name, T.F32)
        data = tensor_bytes(shape, ggml_type, rng)
        writer.add_tensor(name, data, raw_dtype=None if ggml_type in (T.F32, T.F16) else T(ggml_type))
    return finish(writer)


def finish(writer: GGUFWriter) -> Path:
    """Write out a GGUFWriter's header, metadata and tensors, close it, and return its path."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(writer.path)


def copy_meta(writer: GGUFWriter, src, keep=lambda key: True) -> None:
    """Copy the metadata of `src` (an open GGUFFile) that `keep` accepts, each with its GGUF value type, in file
    order; the GGUF header's own fields are never copied."""
    for key, value in src.meta.items():
        if key.startswith("GGUF.") or key == "general.architecture" or not keep(key):
            continue
        value = value.tolist() if isinstance(value, np.ndarray) else value
        sub = src.meta_array_types.get(key)
        writer.add_key_value(key, value, GGUFValueType(src.meta_types[key]),
                             None if sub is None else GGUFValueType(sub))


def rewrite_gguf(src: str | Path, dst: str | Path, meta: Mapping[str, object] | None = None,
                 tensors: Mapping[str, np.ndarray | None] | None = None) -> Path:
    """A copy of the GGUF `src` at `dst` with metadata keys replaced (None: removed; ints as UINT32, floats as
    FLOAT32) and tensors replaced (a float32 array in numpy order; None: removed); the rest as stored."""
    import gguf

    from llamactx.gguf.reader import GGUFFile

    meta, tensors = meta or {}, tensors or {}
    src_file = GGUFFile(Path(src))
    writer = GGUFWriter(str(dst), src_file.meta["general.architecture"])
    copy_meta(writer, src_file, keep=lambda key: key not in meta)
    for key, value in meta.items():
        if value is not None:
            _add(writer, key, value)
    for t in gguf.GGUFReader(src).tensors:
        if t.name in tensors:
            continue
        quantized = t.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
        writer.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape if quantized else None,
                          raw_dtype=t.tensor_type)
    for name, data in tensors.items():
        if data is not None:
            writer.add_tensor(name, data)
    src_file.close()
    return finish(writer)


def _add(writer: GGUFWriter, key: str, value: object) -> None:
    """One metadata value: ints as UINT32 (UINT64 past its range, INT32 when negative), floats as FLOAT32 (np.float64
    as FLOAT64), lists of str as string arrays, other lists as FLOAT32 / INT32 arrays."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        if value < 0:
            writer.add_int32(key, value)
        elif value >= 1 << 32:
            writer.add_uint64(key, value)
        else:
            writer.add_uint32(key, value)
    elif isinstance(value, np.float64):
        writer.add_float64(key, float(value))
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], str):
        writer.add_array(key, value)
    elif isinstance(value, list):
        kind = GGUFValueType.FLOAT32 if any(isinstance(v, float) for v in value) else GGUFValueType.INT32
        writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=kind)
    else:
        raise TypeError(f"{key}: cannot write {type(value).__name__}")

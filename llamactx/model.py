"""Model: hyperparameters + read-only weights + vocab, loaded once and shared by every context.

llama.cpp counterparts: `llama_model` (src/llama-model.*) and `llama_model_loader` (src/llama-model-loader.*). The
weights stay in the file's read-only mmap (or a read-only copy with `use_mmap=False`); nothing is dequantized at
load, and no array the model hands out is writeable, so no context can corrupt what the others share.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType

from llamactx.ggml.quants_cpu import vec_dot_type
from llamactx.gguf.quants import block_format, is_supported
from llamactx.gguf.quants_lowbit import LOWBIT_TYPES
from llamactx.gguf.reader import GGUFFile, TensorInfo
from llamactx.gguf.row_data import check_row_data
from llamactx.gguf.split import GGUFSplit, open_model_file
from llamactx.gguf.values import GGUFError
from llamactx.hparams import HParams, ModelLoadError
from llamactx.memory.base import Memory
from llamactx.models import (
    create_memory,
    expected_tensors,
    kv_bytes_per_token,
    layer_kinds,
    load_hparams,
    memory_description,
    memory_type,
    refused_tensors,
)
from llamactx.models.llm_arch import load_vocab_only_hparams
from llamactx.vocab import Vocab


@dataclass(frozen=True, slots=True)
class Weight:
    """One weight tensor as stored: `data` is the raw, read-only array; `shape` is ggml's `ne` order."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    data: np.ndarray  # F32/F16: typed (ne[1], ne[0]); quantized: uint8 (ne[1], row_bytes); 1-D for vectors

    @property
    def type_name(self) -> str:
        return block_format(self.ggml_type).name

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1


_TYPED = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}


def _tensor_array(raw: np.ndarray, info: TensorInfo) -> np.ndarray:
    """The raw bytes of a tensor viewed with its row structure (no copy; stays read-only). Tensors with a zero in
    their shape give empty arrays."""
    n_rows = math.prod(info.shape[1:])
    dtype = _TYPED.get(info.ggml_type)
    if dtype is not None:
        arr = raw.view(dtype)
        return arr if len(info.shape) == 1 else arr.reshape(n_rows, info.shape[0])
    fmt = block_format(info.ggml_type)
    return raw.reshape(n_rows, info.shape[0] // fmt.block_size * fmt.type_size)


def _computable(ggml_type: int) -> bool:
    """A weight matrix of this type can be multiplied (a vec_dot_type, ggml-cpu) and dequantized (get_rows)."""
    try:
        vec_dot_type(ggml_type)
    except ValueError:
        return False
    return is_supported(ggml_type)


# The types each role of tensor may have. Matrices go through the ops layer's matmul and get_rows; vectors (norm
# weights, biases) are used as floats directly, and llama.cpp's converters always store them as F32.
MATRIX_TYPES = frozenset(int(t) for t in GGMLQuantizationType if _computable(t))
VECTOR_TYPES = frozenset({int(GGMLQuantizationType.F32), int(GGMLQuantizationType.F16)})


class Model:
    """A loaded GGUF model. Build with `Model.load(path)`; see `hparams`, `tensors`, `vocab`, `desc`."""

    def __init__(self, path: Path, gguf: GGUFFile | GGUFSplit, hparams: HParams, vocab: Vocab,
                 buffer: list[np.ndarray] | None):
        self.path = path
        self.gguf = gguf
        self.meta = gguf.meta
        self.hparams = hparams
        self.arch = hparams.arch
        self.vocab = vocab
        self.tensor_infos: dict[str, TensorInfo] = dict(gguf.tensors)
        self._buffer = buffer  # the read-only in-memory copy of each file when use_mmap=False
        self.tensors: dict[str, np.ndarray] = {
            name: _tensor_array(self._raw(info), info) for name, info in self.tensor_infos.items()
        }
        self._weights: dict[str, Weight] = {}  # Weight views, built on first use
        self._derived: dict[object, object] = {}  # read-only data computed from the weights (packed matrices)
        self._derived_lock = threading.Lock()
        self.n_params = sum(info.n_elements for info in self.tensor_infos.values())
        self.size = sum(info.nbytes for info in self.tensor_infos.values())
        self.fingerprint = self._fingerprint()

    @classmethod
    def load(cls, path: str | os.PathLike, *, use_mmap: bool = True, vocab_only: bool = False) -> Model:
        """Open a GGUF model. Raises `GGUFError` for a malformed file, `VocabError` for unusable tokenizer
        metadata and `ModelLoadError` (`HParamsError` for the hyperparameters) for an unsupported architecture, a
        missing, impossible or out-of-range hyperparameter, or a tensor that is missing, mis-shaped or of a type
        llamactx cannot compute for its role."""
        path = Path(path)
        gguf = open_model_file(path)  # a split model is given by its first file
        try:
            n_params = sum(info.n_elements for info in gguf.tensors.values())
            # vocab_only: llama.cpp reads no hyperparameters, so any architecture it names loads its vocabulary
            hparams = (load_vocab_only_hparams if vocab_only else load_hparams)(gguf.meta, n_params)
            vocab = Vocab.from_gguf_meta(gguf.meta)
            if vocab.n_tokens != hparams.n_vocab:
                raise ModelLoadError(
                    f"vocab has {vocab.n_tokens} tokens but '{hparams.arch}.vocab_size' = {hparams.n_vocab}"
                )
            if not vocab_only:
                _check_tensors(gguf.tensors, hparams)
                _check_lowbit_scales(gguf)
            buffer = None
            if not use_mmap and not vocab_only:
                buffer = gguf.read_copy()
            return cls(path, gguf, hparams, vocab, buffer)
        except Exception:
            gguf.close()
            raise

    def _raw(self, info: TensorInfo) -> np.ndarray:
        if self._buffer is not None:
            return self._buffer[info.split][info.offset : info.offset + info.nbytes]
        return self.gguf.tensor_data(info.name)

    def _fingerprint(self) -> str:
        """A cheap identity for state blobs: the tensor table plus the first bytes of every tensor."""
        h = hashlib.sha256(self.arch.encode())
        for name, info in self.tensor_infos.items():
            h.update(f"{name}:{info.ggml_type}:{info.shape}:{info.nbytes};".encode())
            h.update(self._raw(info)[:64].tobytes())
        return h.hexdigest()[:32]

    # -- lookup -------------------------------------------------------------------------------------------------

    def create_memory(self, params) -> Memory:
        """What a context of this model keeps between decodes (llama_model::create_memory), for its resolved
        ContextParams: a KV cache, an iSWA cache, recurrent states or both (llamactx.models.create_memory)."""
        return create_memory(self.hparams, params)

    @property
    def is_embedding_only(self) -> bool:
        """An encoder without memory or output layer (bert): llama_decode runs llama_encode on it and leaves no
        logits, so it computes embeddings and cannot generate text."""
        return memory_type(self.arch) == "none"

    def memory_description(self, swa_full: bool = False) -> str:
        """`create_memory`'s choice in llama.cpp's class names, as `llamactx info` prints it."""
        return memory_description(self.hparams, swa_full)

    def tensor_type(self, name: str) -> int:
        return self._info(name).ggml_type

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._info(name).shape

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_infos

    def weight(self, name: str) -> Weight:
        w = self._weights.get(name)
        if w is None:
            info = self._info(name)
            w = self._weights[name] = Weight(name, info.ggml_type, info.shape, self.tensors[name])
        return w

    def derived(self, key: object, build, replaces: tuple[str, ...] = ()):
        """Data derived once from the weights and shared by every context (e.g. a matrix repacked for the
        kernels): `build()` runs on first use of `key`, under a lock; the result must be read-only. `replaces`
        names the tensors the result stands in for: their file pages are released once it is built, so the
        weights are not resident twice (they are re-read from the file if used directly)."""
        value = self._derived.get(key)
        if value is None:
            with self._derived_lock:
                value = self._derived.get(key)
                if value is None:
                    value = self._derived[key] = build()
                    if self._buffer is None:
                        for name in replaces:
                            self.gguf.release_pages(name)
        return value

    def _info(self, name: str) -> TensorInfo:
        if name not in self.tensor_infos:
            raise KeyError(f"model has no tensor '{name}'")
        return self.tensor_infos[name]

    # -- description ----------------------------------------------------------------------------------------------

    @property
    def chat_template(self) -> str | None:
        value = self.meta.get("tokenizer.chat_template")
        return value if isinstance(value, str) else None

    @property
    def ftype_name(self) -> str:
        """llama.cpp's ftype name from `general.file_type` ("Q4_1", "Q4_K_M"); without it, the dominant type."""
        file_type = self.meta.get("general.file_type")
        if isinstance(file_type, int):
            try:
                return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
            except ValueError:
                pass
        counts: dict[str, int] = {}
        for info in self.tensor_infos.values():
            if len(info.shape) >= 2:
                name = block_format(info.ggml_type).name
                counts[name] = counts.get(name, 0) + info.n_elements
        return max(counts, key=counts.get) if counts else "F32"

    @property
    def desc(self) -> str:
        """Like `llama_model_desc`: "llama 135M Q4_1"."""
        return f"{self.arch} {self.hparams.size_label} {self.ftype_name}"

    def quant_mix(self) -> dict[str, int]:
        """Number of tensors of each ggml type."""
        mix: dict[str, int] = {}
        for info in self.tensor_infos.values():
            name = block_format(info.ggml_type).name
            mix[name] = mix.get(name, 0) + 1
        return mix

    def card(self) -> str:
        """The model card printed by `llamactx info`."""
        hp = self.hparams
        mix = ", ".join(f"{k} x{v}" for k, v in sorted(self.quant_mix().items(), key=lambda kv: -kv[1]))
        lines = [
            f"model:          {self.path.name}",
            f"description:    {self.desc}",
            f"name:           {self.meta.get('general.name', '?')}",
            f"architecture:   {self.arch}",
            f"parameters:     {self.n_params:,} ({self.n_params / 1e6:.1f} M)",
            f"size:           {self.size:,} bytes ({self.size / 2**20:.1f} MiB)",
            f"quant mix:      {mix}",
            f"context length: {hp.n_ctx_train}",
            f"layers:         {hp.n_layer}, n_embd {hp.n_embd}, n_head {hp.n_head}, n_head_kv {hp.n_head_kv}, "
            f"n_ff {hp.n_ff}",
            f"vocab:          {self.vocab.n_tokens} tokens ({self.vocab.model_type}/{self.vocab.pre_type})",
            f"chat template:  {'present' if self.chat_template else 'absent (chatml fallback)'}",
        ]
        if hp.n_swa:
            lines.append(f"sliding window: {hp.n_swa} ({sum(hp.swa_layers)} of {hp.n_layer} layers)")
        if hp.n_embd_head_k_swa and len(set(hp.swa_layers)) == 2:  # gemma4: each layer kind its own heads
            il_full, il_swa = hp.swa_layers.index(False), hp.swa_layers.index(True)
            lines.append("heads:          " + "; ".join(
                f"{kind} layers {hp.n_head} x {hp.layer_head_size(il)} ({hp.layer_n_head_kv(il)} KV), RoPE over "
                f"{hp.layer_n_rot(il)}" for kind, il in (("global", il_full), ("sliding-window", il_swa))))
        if hp.n_embd_per_layer:
            lines.append(f"per-layer embd: {hp.n_embd_per_layer} per layer (per_layer_token_embd)")
        if hp.n_expert:
            shared = f", a shared expert of n_ff {hp.n_ff_shexp}" if hp.n_ff_shexp else ""
            lines.append(f"experts:        {hp.n_expert}, {hp.n_expert_used} used per token, n_ff_exp {hp.n_ff_exp}"
                         f"{shared}")
        if hp.ssm_d_inner:
            lines.append(f"ssm:            d_inner {hp.ssm_d_inner}, d_state {hp.ssm_d_state}, "
                         f"n_head {hp.ssm_dt_rank}, n_group {hp.ssm_n_group}, d_conv {hp.ssm_d_conv}")
        if memory_type(hp.arch) == "hybrid":
            lines.append(f"layer kinds:    {layer_kinds(hp)}")
        if hp.n_embd_head_k_mla:  # deepseek2: the cache holds the latent and the rope key, V is part of it
            lines.append(f"attention:      MLA, q_lora_rank {hp.n_lora_q}, kv_lora_rank {hp.n_lora_kv}, heads "
                         f"{hp.n_embd_head_k_mla} (K) / {hp.n_embd_head_v_mla} (V), RoPE over {hp.n_rot}")
        if kv_bytes_per_token(hp):
            lines.append(f"KV per token:   {kv_bytes_per_token(hp)} bytes (f16 K/V cache, {hp.n_layer} layers)")
        return "\n".join(lines)

    def close(self) -> None:
        self.tensors.clear()
        self._weights.clear()
        self._derived.clear()
        self.gguf.close()

    def __repr__(self) -> str:
        return f"Model({self.desc!r}, path={str(self.path)!r})"


def _check_tensors(tensors: dict[str, TensorInfo], hp: HParams) -> None:
    """Every tensor the architecture needs exists with the shape the hparams imply and a type llamactx can compute
    for its role (llama_model_loader::create_tensor checks the shape; llama.cpp's backends the type)."""
    for name, (shape, required) in expected_tensors(hp).items():
        info = tensors.get(name)
        if info is None:
            if required:
                raise ModelLoadError(f"tensor '{name}' is missing (architecture {hp.arch})")
            continue
        if tuple(info.shape) != tuple(shape):
            raise ModelLoadError(f"tensor '{name}' has shape {list(info.shape)}, expected {list(shape)}")
        _check_type(info, len(shape) == 1)
    for name, why in refused_tensors(hp).items():
        if name in tensors:
            raise ModelLoadError(f"tensor '{name}': {why}")


def _check_type(info: TensorInfo, vector: bool) -> None:
    allowed, role = (VECTOR_TYPES, "a norm weight or bias") if vector else (MATRIX_TYPES, "a weight matrix")
    if info.ggml_type not in allowed:
        names = ", ".join(block_format(t).name for t in sorted(allowed))
        raise ModelLoadError(f"tensor '{info.name}' has type {block_format(info.ggml_type).name}, which llamactx "
                             f"cannot compute as {role} (allowed: {names})")


def _check_lowbit_scales(gguf: GGUFFile | GGUFSplit) -> None:
    """A low-bit tensor (IQ1-IQ3, TQ1_0 / TQ2_0) with a super-block whose f16 scale is NaN or infinite is refused,
    naming it (ggml_validate_row_data's check; each of its weights would be NaN or infinite). Reads 2 bytes per
    256 weights."""
    for name, info in gguf.tensors.items():
        if info.ggml_type in LOWBIT_TYPES and info.nbytes:
            try:
                check_row_data(info.ggml_type, gguf.tensor_data(name), name)
            except GGUFError as e:
                raise ModelLoadError(str(e)) from None

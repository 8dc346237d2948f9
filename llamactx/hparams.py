"""Model hyperparameters, read from GGUF metadata with llama.cpp's names and defaults.

Follows `llama_model::load_hparams` (src/llama-model.cpp) and the per-architecture `load_arch_hparams`
(src/models/llama.cpp, src/models/gemma3.cpp). Keys are `<arch>.<name>` as in gguf-py's `Keys`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llamactx.errors import LlamactxError

SUPPORTED_ARCHS = ("llama", "gemma3")

# llama_rope_type (include/llama.h): NORM rotates adjacent pairs, NEOX rotates the two halves of each head.
ROPE_TYPE_NORM = 0
ROPE_TYPE_NEOX = 2
ROPE_TYPES = {"llama": ROPE_TYPE_NORM, "gemma3": ROPE_TYPE_NEOX}


class HParamsError(LlamactxError, ValueError):
    """GGUF metadata that a model cannot be built from (missing key, wrong type, impossible value)."""


@dataclass(frozen=True, slots=True)
class HParams:
    """The hyperparameters of one model (`llama_hparams`). Per-layer values are uniform for supported archs."""

    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_embd_head_k: int
    n_embd_head_v: int
    n_ff: int
    n_rot: int
    rope_type: int
    rope_freq_base: float  # rope_freq_base_train
    rope_freq_scale: float  # rope_freq_scale_train (1 / rope.scaling.factor)
    rope_scaling_type: str  # "none" | "linear" | "yarn" | "longrope"
    n_ctx_orig_yarn: int
    f_norm_rms_eps: float
    n_swa: int  # sliding window size; 0 = no sliding window
    swa_layers: tuple[bool, ...]  # is_swa(il) for each layer
    rope_freq_base_swa: float  # rope base of the sliding-window layers (gemma3: 10000)
    rope_freq_scale_swa: float
    f_attention_scale: float  # scale applied to Q before attention (gemma3); 0 = use kq_scale 1/sqrt(head)
    f_final_logit_softcapping: float  # 0 = none
    embd_scale: float  # input embeddings are multiplied by this (gemma3: sqrt(n_embd))
    size_label: str  # "135M", from general.size_label or the parameter count

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    def is_swa(self, il: int) -> bool:
        return self.swa_layers[il]


class _Meta:
    """Typed access to `<arch>.*` metadata keys with errors that name the key."""

    def __init__(self, meta: dict[str, object], arch: str):
        self.meta = meta
        self.arch = arch

    def get(self, name: str, kind: type, default: object = None, *, arch_key: bool = True) -> object:
        key = f"{self.arch}.{name}" if arch_key else name
        if key not in self.meta:
            if default is None:
                raise HParamsError(f"GGUF metadata key '{key}' is missing")
            return default
        value = self.meta[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise HParamsError(f"GGUF metadata key '{key}': expected an integer, got {value!r}")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise HParamsError(f"GGUF metadata key '{key}': expected a number, got {value!r}")
        if kind is str and not isinstance(value, str):
            raise HParamsError(f"GGUF metadata key '{key}': expected a string, got {value!r}")
        return kind(value)

    def positive(self, name: str, default: int | None = None) -> int:
        value = self.get(name, int, default)
        if value <= 0:
            raise HParamsError(f"GGUF metadata key '{self.arch}.{name}' = {value} must be > 0")
        return value


def _swa_pattern(meta: _Meta, n_layer: int, n_swa: int) -> tuple[bool, ...]:
    """`llama_hparams::set_swa_pattern(n_pattern)` without dense_first: every n_pattern-th layer is global."""
    if n_swa <= 0:
        return (False,) * n_layer
    key = f"{meta.arch}.attention.sliding_window_pattern"
    value = meta.meta.get(key, 6)
    if not isinstance(value, int):  # an explicit per-layer array
        flags = [bool(v) for v in value]
        if len(flags) != n_layer:
            raise HParamsError(f"GGUF metadata key '{key}': {len(flags)} entries for {n_layer} layers")
        return tuple(flags)
    return tuple(value == 0 or il % value < value - 1 for il in range(n_layer))


def _size_label(meta: dict[str, object], n_params: int) -> str:
    label = meta.get("general.size_label")
    if isinstance(label, str) and label:
        return label
    if n_params >= 1e9:
        return f"{n_params / 1e9:.1f}B"
    return f"{round(n_params / 1e6)}M"


def load_hparams(meta: dict[str, object], n_params: int = 0) -> HParams:
    """Build `HParams` from GGUF metadata; raises `HParamsError` naming the key for missing or bad values."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise HParamsError("GGUF metadata key 'general.architecture' is missing")
    if arch not in SUPPORTED_ARCHS:
        raise HParamsError(f"architecture '{arch}' is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    m = _Meta(meta, arch)
    n_embd = m.positive("embedding_length")
    n_layer = m.positive("block_count")
    n_head = m.positive("attention.head_count")
    n_head_kv = m.positive("attention.head_count_kv", n_head)
    if n_head % n_head_kv:
        raise HParamsError(f"'{arch}.attention.head_count' = {n_head} is not a multiple of head_count_kv = {n_head_kv}")
    n_embd_head_k = m.positive("attention.key_length", n_embd // n_head)
    n_embd_head_v = m.positive("attention.value_length", n_embd // n_head)
    n_rot = m.positive("rope.dimension_count", n_embd_head_k)
    if arch == "llama" and n_rot != n_embd_head_k:
        raise HParamsError(f"'{arch}.rope.dimension_count' = {n_rot}, expected {n_embd_head_k}")
    tokens = meta.get("tokenizer.ggml.tokens")
    n_vocab = m.get("vocab_size", int, len(tokens) if tokens is not None else None)
    n_ctx_train = m.positive("context_length")
    scale_factor = m.get("rope.scaling.factor", float, m.get("rope.scale_linear", float, 0.0))
    n_swa = m.get("attention.sliding_window", int, 0) if arch == "gemma3" else 0
    is_gemma = arch == "gemma3"
    return HParams(
        arch=arch,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head_k=n_embd_head_k,
        n_embd_head_v=n_embd_head_v,
        n_ff=m.positive("feed_forward_length"),
        n_rot=n_rot,
        rope_type=ROPE_TYPES[arch],
        rope_freq_base=m.get("rope.freq_base", float, 10000.0),
        rope_freq_scale=1.0 if scale_factor == 0.0 else 1.0 / scale_factor,
        rope_scaling_type=m.get("rope.scaling.type", str, "linear"),
        n_ctx_orig_yarn=m.get("rope.scaling.original_context_length", int, n_ctx_train),
        f_norm_rms_eps=m.get("attention.layer_norm_rms_epsilon", float),
        n_swa=n_swa,
        swa_layers=_swa_pattern(m, n_layer, n_swa),
        rope_freq_base_swa=m.get("rope.freq_base_swa", float, 10000.0),
        rope_freq_scale_swa=1.0,
        # gemma3 27B (62 layers) scales by n_embd / n_head instead of the head size (src/models/gemma3.cpp)
        f_attention_scale=(1.0 / math.sqrt(n_embd // n_head if n_layer == 62 else n_embd_head_k)) if is_gemma else 0.0,
        f_final_logit_softcapping=m.get("final_logit_softcapping", float, 0.0) if is_gemma else 0.0,
        embd_scale=math.sqrt(n_embd) if is_gemma else 1.0,
        size_label=_size_label(meta, n_params),
    )

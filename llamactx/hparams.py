"""Model hyperparameters, read from GGUF metadata with llama.cpp's names and defaults.

`read_hparams` follows `llama_model::load_hparams` (src/llama-model.cpp) for the keys every architecture has; the
keys of one architecture are read by its module's `arch_hparams` (llamactx/models/, as src/models/*.cpp
`load_arch_hparams`), which `llamactx.models.load_hparams` passes in. Keys are `<arch>.<name>` as in gguf-py's
`Keys`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

from llamactx.errors import LlamactxError

ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # llama_rope_scaling_type_from_string

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h: load_hparams asserts 0 < n_layer <= LLAMA_MAX_LAYERS
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h: load_hparams asserts n_expert <= LLAMA_MAX_EXPERTS
U32_MAX = (1 << 32) - 1  # llama.cpp reads every count and length as uint32_t


class ModelLoadError(LlamactxError, ValueError):
    """A GGUF file that is valid GGUF but not a model we can run: missing or mis-shaped tensors, bad hparams.
    Raised by `Model.load` (llamactx.model re-exports it); defined here so that HParamsError can derive from it."""


class HParamsError(ModelLoadError):
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
    rope_attn_factor: float  # rope.scaling.attn_factor (1.0)
    rope_yarn_log_mul: float  # rope.scaling.yarn_log_multiplier (0.0; deepseek2-style models)
    yarn_ext_factor: float  # llama_hparams defaults: -1 (not set), 1, 32, 1
    yarn_attn_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    f_norm_rms_eps: float
    n_swa: int  # sliding window size; 0 = no sliding window
    swa_layers: tuple[bool, ...]  # is_swa(il) for each layer
    rope_freq_base_swa: float  # rope base of the sliding-window layers (gemma3: 10000)
    rope_freq_scale_swa: float
    f_attention_scale: float  # gemma2/3: Q's scale before attention; granite: the kq scale; 0 = 1/sqrt(head)
    f_final_logit_softcapping: float  # 0 = none
    embd_scale: float  # input embeddings are multiplied by this (gemma2/3: sqrt(n_embd); granite: 0 = not at all)
    size_label: str  # "135M", from general.size_label or the parameter count
    # recurrent layers (llama_hparams ssm_* / n_shortconv_l_cache); zero for attention-only models
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0  # mamba2: the number of SSM heads
    ssm_n_group: int = 0
    n_shortconv_l_cache: int = 0  # lfm2: the short convolution's kernel length
    recurrent_layers: tuple[bool, ...] = ()  # is_recr(il) for each layer; () = none
    # mixture of experts (llama_hparams n_expert, n_expert_used, n_ff_exp, n_ff_shexp); zero for dense models
    n_expert: int = 0
    n_expert_used: int = 0  # experts each token is routed to
    n_ff_exp: int = 0  # one expert's FFN width
    n_ff_shexp: int = 0  # qwen2moe: the shared expert's FFN width
    # per-architecture scalars of llama_hparams (0 = not used)
    f_attn_logit_softcapping: float = 0.0  # gemma2: attention logits soft-capped (cap * tanh(kq / cap))
    f_logit_scale: float = 0.0  # granite: logits divided by it
    f_residual_scale: float = 0.0  # granite: attention and FFN outputs scaled before the residual adds
    # mistral3: Q times 1 + f_attn_temp_scale * log(floor((pos + offset) / n_attn_temp_floor_scale) + 1) by position
    f_attn_temp_scale: float = 0.0  # attention.temperature_scale (llm_graph_input_attn_temp)
    n_attn_temp_floor_scale: int = 0  # mistral3: the model's n_ctx_orig_yarn
    f_attn_temp_offset: float = 0.0
    rope_layers: tuple[bool, ...] = ()  # has_rope(il) per layer (llama_hparams::rope_pattern); () = every layer
    rope_sections: tuple[int, ...] = ()  # qwen35: IMRoPE's sections (t, h, w, e) (rope.dimension_sections)
    # gemma4: per-layer attention shapes (llama_hparams n_head_kv_arr, n_embd_head_k_swa, n_rot_swa), the last
    # layers reading earlier layers' KV (n_layer_kv_from_start) and per-layer token embeddings (n_embd_per_layer)
    n_head_kv_arr: tuple[int, ...] = ()  # attention.head_count_kv per layer; () = n_head_kv in every layer
    n_ff_arr: tuple[int, ...] = ()  # feed_forward_length per layer (double-wide MLPs); () = n_ff in every layer
    n_embd_head_k_swa: int = 0  # attention.key_length_swa: the sliding-window layers' head size; 0 = n_embd_head_k
    n_rot_swa: int = 0  # rope.dimension_count_swa; 0 = n_rot
    n_layer_kv_from_start: int = -1  # the first n layers have KV; -1 = all of them (attention.shared_kv_layers)
    n_embd_per_layer: int = 0  # embedding_length_per_layer_input (gemma4's E models)
    # encoders (bert): LayerNorm epsilon, attention over the whole sequence, the model's own pooling
    f_norm_eps: float = 0.0  # attention.layer_norm_epsilon (LLM_KV_ATTENTION_LAYERNORM_EPS)
    causal_attn: bool = True  # attention.causal (LLM_KV_ATTENTION_CAUSAL)
    pooling_type: str = "none"  # pooling_type (LLM_KV_POOLING_TYPE): none, mean, cls, last, rank
    n_token_types: int = 0  # tokenizer.ggml.token_type_count (bert: 2, "sentence A / B")
    # a classifier head (rerankers: pooling rank): its output values per sequence and the pooling before it
    n_cls_out: int = 1  # len(classifier.output_labels) (LLM_KV_CLASSIFIER_OUTPUT_LABELS), 1 without labels
    pooling_type_cls: str = "unspecified"  # classifier.pooling_type (LLM_KV_CLASSIFIER_POOLING_TYPE)
    # deepseek2's multi-head latent attention (MLA): low-rank Q and KV; the cache holds the KV latent and the shared
    # rope key (n_embd_head_k = n_lora_kv + n_rot, V its first n_lora_kv values); the heads as trained
    n_lora_q: int = 0  # attention.q_lora_rank; 0 = a plain attn_q
    n_lora_kv: int = 0  # attention.kv_lora_rank
    n_embd_head_k_mla: int = 0  # attention.key_length_mla; 0 = not MLA
    n_embd_head_v_mla: int = 0  # attention.value_length_mla
    # DeepSeek-style experts: dense leading layers, shared experts, the router's gating, groups and weights
    n_layer_dense_lead: int = 0  # leading_dense_block_count
    n_expert_shared: int = 0  # expert_shared_count
    expert_gating_func: str = "softmax"  # expert_gating_func: softmax, sigmoid, softmax_weight
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0  # 0 = no scaling
    n_expert_groups: int = 0  # expert_group_count; > 1: tokens choose n_group_used groups first
    n_group_used: int = 0
    n_layer_nextn: int = 0  # nextn_predict_layers: MTP layers after the n_layer trunk layers (loaded, not run)

    def is_recr(self, il: int) -> bool:
        """Whether layer `il` keeps a recurrent state instead of K/V (llama_hparams::is_recr)."""
        return bool(self.recurrent_layers) and self.recurrent_layers[il]

    @property
    def n_embd_r(self) -> int:
        """Floats of a layer's rolling (conv) state per sequence (llama_hparams::n_embd_r)."""
        if self.n_shortconv_l_cache:
            return self.n_embd * (self.n_shortconv_l_cache - 1)
        return max(self.ssm_d_conv - 1, 0) * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    @property
    def n_embd_s(self) -> int:
        """Floats of a layer's SSM state per sequence (llama_hparams::n_embd_s)."""
        return self.ssm_d_state * self.ssm_d_inner

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv

    def is_swa(self, il: int) -> bool:
        return self.swa_layers[il]

    def layer_n_head_kv(self, il: int) -> int:
        """KV heads of layer `il` (llama_hparams::n_head_kv(il))."""
        return self.n_head_kv_arr[il] if self.n_head_kv_arr else self.n_head_kv

    def layer_n_ff(self, il: int) -> int:
        """FFN width of layer `il` (llama_hparams::n_ff(il))."""
        return self.n_ff_arr[il] if self.n_ff_arr else self.n_ff

    def layer_head_size(self, il: int) -> int:
        """Head size (K = V) of layer `il` (llama_hparams::n_embd_head_k(il))."""
        return self.n_embd_head_k_swa if self.n_embd_head_k_swa and self.is_swa(il) else self.n_embd_head_k

    def layer_n_rot(self, il: int) -> int:
        """Rotated dimensions of layer `il` (llama_hparams::n_rot(il))."""
        return self.n_rot_swa if self.n_rot_swa and self.is_swa(il) else self.n_rot

    def layer_n_embd_gqa(self, il: int) -> int:
        """K (= V) floats per token of layer `il` (llama_hparams::n_embd_k_gqa(il))."""
        return self.layer_head_size(il) * self.layer_n_head_kv(il)

    def has_kv(self, il: int) -> bool:
        """Whether layer `il` stores K/V (llama_hparams::has_kv); the others read an earlier layer's."""
        return self.n_layer_kv_from_start < 0 or il < self.n_layer_kv_from_start

    def kv_reuse(self, il: int) -> int:
        """The layer whose KV a layer without its own reads, -1 for a layer with KV: the last sliding-window
        or the last global layer with KV (llama_model::create_memory's `reuse` for gemma3n / gemma4)."""
        if self.has_kv(il):
            return -1
        return self.n_layer_kv_from_start - (2 if self.is_swa(il) else 1)

    def has_rope(self, il: int) -> bool:
        """Whether layer `il` rotates q and k (llama_hparams::has_rope): smollm3 skips every fourth layer."""
        return not self.rope_layers or self.rope_layers[il]


class Meta:
    """Typed access to `<arch>.*` metadata keys with errors that name the key, the value and the limit."""

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

    def count(self, name: str, default: int | None = None, lo: int = 1, hi: int = U32_MAX) -> int:
        """A size-like integer (a count, a length) in [lo, hi]; `default` is used, and checked, when absent."""
        value = self.get(name, int, default)
        if not lo <= value <= hi:
            origin = "" if f"{self.arch}.{name}" in self.meta else " (absent; the default derived from other keys)"
            raise HParamsError(f"GGUF metadata key '{self.arch}.{name}' = {value}{origin} is outside [{lo}, {hi}]")
        return value

    def real(self, name: str, default: float | None = None, *, zero_ok: bool = False) -> float:
        """A float that must be finite as the float32 llama.cpp keeps, and > 0 (>= 0 with `zero_ok`)."""
        value = self.get(name, float, default)
        f32 = _as_f32(value)
        if not math.isfinite(f32) or f32 < 0 or (f32 == 0 and not zero_ok):
            limit = ">= 0" if zero_ok else "> 0"
            raise HParamsError(f"GGUF metadata key '{self.arch}.{name}' = {value!r} must be finite and {limit} "
                               f"(as a float32: {f32!r})")
        return value


def _as_f32(value: float) -> float:
    """`value` rounded to float32 (inf beyond its range, 0 below its smallest subnormal)."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def swa_pattern(meta: Meta, n_layer: int, n_swa: int, default: int = 6) -> tuple[bool, ...]:
    """`llama_hparams::set_swa_pattern(n_pattern)` without dense_first: every n_pattern-th layer is global.
    `load_swa_pattern(ml, default)`: the key may be absent (the architecture's default pattern: 6 for gemma3, 2 for
    gpt-oss) or hold one flag per layer."""
    if n_swa <= 0:
        return (False,) * n_layer
    key = f"{meta.arch}.attention.sliding_window_pattern"
    value = meta.meta.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        pattern = meta.count("attention.sliding_window_pattern", default, lo=0)
        return tuple(pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer))
    dtype = getattr(value, "dtype", None)  # a numeric GGUF array is a numpy array
    if dtype is None or dtype.kind not in "biu" or len(value) != n_layer:
        got = f"{len(value)} {dtype} values" if dtype is not None else type(value).__name__
        raise HParamsError(f"GGUF metadata key '{key}' must be an integer or {n_layer} per-layer flags, got {got}")
    return tuple(bool(v) for v in value)


def _size_label(meta: dict[str, object], n_params: int) -> str:
    label = meta.get("general.size_label")
    if isinstance(label, str) and label:
        return label
    if n_params >= 1e9:
        return f"{n_params / 1e9:.1f}B"
    return f"{round(n_params / 1e6)}M"


def read_hparams(meta: dict[str, object], arch: str, rope_type: int, memory: str,
                 arch_hparams: Callable[[Meta, dict], dict], n_params: int = 0,
                 per_layer_heads: bool = False, v_length_free: bool = False) -> HParams:
    """`HParams` from GGUF metadata: the keys every architecture has, then `arch_hparams(meta, fields)`'s (the
    architecture's own keys and checks, as field values). `memory`: "kv", "recurrent" (no attention: the head
    counts stay 0) or "hybrid" (head_count_kv may be per layer, 0 for a recurrent layer). Raises `HParamsError`
    naming the key for a missing or bad value. `per_layer_heads`: head_count_kv may hold one value per layer (gemma4;
its `arch_hparams` reads them). `v_length_free`: value_length may differ from key_length (deepseek2's MLA cache;
its `arch_hparams` checks them)."""
    m = Meta(meta, arch)
    n_embd = m.count("embedding_length")
    n_layer = m.count("block_count", hi=LLAMA_MAX_LAYERS)
    recurrent = memory == "recurrent"
    if recurrent:  # no attention: llama.cpp leaves the head counts at 0
        n_head = n_head_kv = n_embd_head_k = n_embd_head_v = n_rot = 0
        recurrent_layers = (True,) * n_layer
    else:
        n_head, n_head_kv, recurrent_layers = _head_counts(m, n_layer, per_layer=memory == "hybrid",
                                                           per_layer_heads=per_layer_heads)
        if n_head % n_head_kv:
            raise HParamsError(f"'{arch}.attention.head_count' = {n_head} is not a multiple of head_count_kv = "
                               f"{n_head_kv}")
        n_embd_head_k = m.count("attention.key_length", n_embd // n_head)
        n_embd_head_v = m.count("attention.value_length", n_embd // n_head)
        if n_embd_head_v != n_embd_head_k and not v_length_free:  # the graphs assert n_embd_head_k == n_embd_head_v
            raise HParamsError(f"'{arch}.attention.value_length' = {n_embd_head_v} differs from key_length = "
                               f"{n_embd_head_k}; {arch} needs them equal")
        n_rot = m.count("rope.dimension_count", n_embd_head_k, hi=n_embd_head_k)
        if n_rot % 2:
            raise HParamsError(f"'{arch}.rope.dimension_count' = {n_rot}: expected an even number")
    tokens = meta.get("tokenizer.ggml.tokens")
    n_vocab = m.count("vocab_size", len(tokens) if isinstance(tokens, list) else None)
    n_ctx_train = m.count("context_length")
    scale_factor = m.real("rope.scaling.factor", m.real("rope.scale_linear", 0.0, zero_ok=True), zero_ok=True)
    if scale_factor and not math.isfinite(_as_f32(1.0 / scale_factor)):
        raise HParamsError(f"GGUF metadata key '{arch}.rope.scaling.factor' = {scale_factor!r}: its inverse, the rope "
                           f"frequency scale, is not a finite float32")
    scaling_type = m.get("rope.scaling.type", str, "linear")
    if scaling_type not in ROPE_SCALING_TYPES:
        raise HParamsError(f"GGUF metadata key '{arch}.rope.scaling.type' = {scaling_type!r} is not one of "
                           f"{', '.join(ROPE_SCALING_TYPES)}")
    experts = _expert_counts(m)
    # llama.cpp reads feed_forward_length as optional (0): a model with experts takes its widths from the expert keys
    # (qwen35moe's converter writes n_ff only from a config's intermediate_size)
    ff_optional = recurrent or experts["n_expert"] > 0
    n_ff_arr = _ff_lengths(m, n_layer) if per_layer_heads else ()  # gemma4: feed_forward_length per layer too
    fields = dict(
        arch=arch,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head_k=n_embd_head_k,
        n_embd_head_v=n_embd_head_v,
        n_ff=n_ff_arr[0] if n_ff_arr else m.count("feed_forward_length", 0 if ff_optional else None,
                                                  lo=0 if ff_optional else 1),
        n_ff_arr=n_ff_arr,
        n_rot=n_rot,
        rope_type=rope_type,
        rope_freq_base=m.real("rope.freq_base", 10000.0),
        rope_freq_scale=1.0 if scale_factor == 0.0 else 1.0 / scale_factor,
        rope_scaling_type=scaling_type,
        n_ctx_orig_yarn=m.count("rope.scaling.original_context_length", n_ctx_train, lo=0),
        rope_attn_factor=m.real("rope.scaling.attn_factor", 1.0),
        rope_yarn_log_mul=m.real("rope.scaling.yarn_log_multiplier", 0.0, zero_ok=True),
        yarn_ext_factor=-1.0,
        yarn_attn_factor=1.0,
        yarn_beta_fast=32.0,
        yarn_beta_slow=1.0,
        # an encoder (memory "none": bert) normalizes with LayerNorm's attention.layer_norm_epsilon instead
        f_norm_rms_eps=m.real("attention.layer_norm_rms_epsilon", 0.0 if memory == "none" else None,
                              zero_ok=memory == "none"),
        n_swa=0,
        swa_layers=(False,) * n_layer,
        rope_freq_base_swa=m.real("rope.freq_base_swa", 10000.0),
        rope_freq_scale_swa=1.0,
        f_attention_scale=0.0,
        f_final_logit_softcapping=0.0,
        embd_scale=1.0,
        size_label=_size_label(meta, n_params),
        recurrent_layers=recurrent_layers if any(recurrent_layers) else (),
        **experts,
    )
    fields.update(arch_hparams(m, fields))
    return HParams(**fields)


def _expert_counts(m: Meta) -> dict:
    """n_expert and n_expert_used (llama_model::load_hparams): at most LLAMA_MAX_EXPERTS experts, and a model with
    experts routes each token to 1..n_expert of them (none without experts)."""
    n_expert = m.count("expert_count", 0, lo=0, hi=LLAMA_MAX_EXPERTS)
    n_expert_used = m.count("expert_used_count", 0, lo=1 if n_expert else 0, hi=n_expert)
    return dict(n_expert=n_expert, n_expert_used=n_expert_used)


def _ff_lengths(m: Meta, n_layer: int) -> tuple[int, ...]:
    """feed_forward_length as one value per layer (convert_hf_to_gguf.py writes Gemma 4's use_double_wide_mlp so);
    () when it is a number."""
    key = f"{m.arch}.feed_forward_length"
    value = m.meta.get(key)
    if getattr(value, "dtype", None) is None:
        return ()
    values = tuple(int(v) for v in value)
    if len(values) != n_layer or min(values, default=0) < 1:
        raise HParamsError(f"GGUF metadata key '{key}' = {list(values)}: expected {n_layer} values >= 1")
    return values


def _head_counts(m: Meta, n_layer: int, per_layer: bool,
                 per_layer_heads: bool = False) -> tuple[int, int, tuple[bool, ...]]:
    """n_head, n_head_kv and the recurrent layers. With `per_layer` (a hybrid memory), `head_count_kv` may hold
    one value per layer (lfm2: 0 marks a short-convolution layer, llama_model_lfm2::load_arch_hparams); the
    attention layers must then agree."""
    n_head = m.count("attention.head_count")
    key = f"{m.arch}.attention.head_count_kv"
    value = m.meta.get(key)
    if getattr(value, "dtype", None) is not None and per_layer_heads:  # gemma4: checked, the first one returned
        values = [int(v) for v in value]
        if len(values) != n_layer or not all(1 <= v <= n_head and n_head % v == 0 for v in values):
            raise HParamsError(f"GGUF metadata key '{key}' = {values}: expected {n_layer} values in [1, {n_head}] "
                               f"that divide head_count = {n_head}")
        return n_head, values[0], (False,) * n_layer
    if getattr(value, "dtype", None) is None or not per_layer:
        return n_head, m.count("attention.head_count_kv", n_head), (False,) * n_layer
    per_layer = [int(v) for v in value]
    kv = sorted(set(per_layer) - {0})
    if len(per_layer) != n_layer or len(kv) != 1 or kv[0] > n_head:
        raise HParamsError(f"GGUF metadata key '{key}' = {per_layer}: expected {n_layer} values, 0 for recurrent "
                           f"layers and one common value in [1, {n_head}] for attention layers")
    return n_head, kv[0], tuple(v == 0 for v in per_layer)

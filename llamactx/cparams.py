"""ContextParams: the fields and defaults of `llama_context_params`, and their resolution against a model.

llama.cpp counterparts: `llama_context_default_params()` and the constructor of `llama_context` that turns the
caller's params into the frozen `llama_cparams` (src/llama-context.cpp, src/llama-cparams.h). The context keeps
its own resolved copy (`ctx.params`); changing the caller's object afterwards changes nothing.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llamactx.errors import LlamactxError
from llamactx.ggml.libm import libm as ggml_libm
from llamactx.hparams import HParams

LLAMA_MAX_SEQ = 256
N_CTX_MAX = 1 << 24  # the largest context llamactx accepts, asked for (n_ctx) or taken from the model (n_ctx = 0)
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
POOLING_TYPES = ("unspecified", "none", "mean", "cls", "last", "rank")
ATTENTION_TYPES = ("unspecified", "causal", "non_causal")
ROPE_SCALING_TYPES = ("unspecified", "none", "linear", "yarn")
FLASH_ATTN_TYPES = ("auto", "enabled", "disabled")


class ContextParamsError(LlamactxError, ValueError):
    """A context parameter outside its allowed values; the message names the field, the value and the limit."""


def _default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 4))  # GGML_DEFAULT_N_THREADS is 4


@dataclass(slots=True)
class ContextParams:
    """What the caller asks for (`llama_context_params`). 0 / "unspecified" / negative values mean "from the
    model", as in llama.cpp. `flash_attn` is "auto" | "enabled" | "disabled" (or a bool)."""

    n_ctx: int = 512
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_threads: int = dataclasses.field(default_factory=_default_threads)
    n_threads_batch: int = dataclasses.field(default_factory=_default_threads)
    rope_scaling_type: str = "unspecified"
    pooling_type: str = "unspecified"
    attention_type: str = "unspecified"
    flash_attn: str | bool = "auto"
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_fast: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_orig_ctx: int = 0
    type_k: str = "f16"
    type_v: str = "f16"
    embeddings: bool = False
    no_perf: bool = False
    # llama_context_default_params() says true; llama.cpp's tools (common_params: llama-cli, llama-server,
    # llama-perplexity) and llamactx use the small SWA cache (llama_kv_cache_iswa) unless asked
    swa_full: bool = False
    kv_unified: bool = False
    # llamactx only: attention sums follow the KV cells' absolute indices, as ggml's SIMD lanes do, instead of
    # the cells' positions (docs/numerics.md)
    kv_layout_exact: bool = False
    abort_callback: Callable[[], bool] | None = None

    def resolve(self, hparams: HParams) -> ResolvedParams:
        """Validate every field and resolve the "from the model" values; raises `ContextParamsError`."""
        _check_int("n_ctx", self.n_ctx, 0, N_CTX_MAX)
        _check_int("n_batch", self.n_batch, 1, N_CTX_MAX)
        _check_int("n_ubatch", self.n_ubatch, 0, N_CTX_MAX)
        _check_int("n_seq_max", self.n_seq_max, 1, LLAMA_MAX_SEQ)
        _check_int("n_threads", self.n_threads, 1, 512)
        _check_int("n_threads_batch", self.n_threads_batch, 1, 512)
        _check_int("yarn_orig_ctx", self.yarn_orig_ctx, 0, N_CTX_MAX)
        for name, allowed in (("type_k", KV_TYPES), ("type_v", KV_TYPES), ("pooling_type", POOLING_TYPES),
                              ("attention_type", ATTENTION_TYPES), ("rope_scaling_type", ROPE_SCALING_TYPES)):
            value = getattr(self, name)
            if value not in allowed:
                raise ContextParamsError(f"{name} = {value!r} is not one of {', '.join(allowed)}")
        flash = {True: "enabled", False: "disabled"}.get(self.flash_attn, self.flash_attn)  # type: ignore[arg-type]
        if flash not in FLASH_ATTN_TYPES:
            raise ContextParamsError(f"flash_attn = {self.flash_attn!r} is not one of {', '.join(FLASH_ATTN_TYPES)}")
        for name in ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
                     "yarn_beta_slow"):
            if not math.isfinite(getattr(self, name)):
                raise ContextParamsError(f"{name} = {getattr(self, name)} must be finite")
        if self.rope_freq_base < 0 or self.rope_freq_scale < 0:
            raise ContextParamsError("rope_freq_base and rope_freq_scale must be >= 0 (0 = from the model)")
        if self.abort_callback is not None and not callable(self.abort_callback):
            raise ContextParamsError(f"abort_callback = {self.abort_callback!r} is not callable")
        return _resolve(self, hparams, flash)


@dataclass(frozen=True, slots=True)
class ResolvedParams:
    """The context's frozen copy (`llama_cparams`): every value resolved against the model."""

    n_ctx: int
    n_ctx_seq: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_threads: int
    n_threads_batch: int
    rope_freq_base: float
    rope_freq_scale: float
    yarn_ext_factor: float
    yarn_attn_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    n_ctx_orig_yarn: int
    rope_scaling_type: str
    pooling_type: str
    causal_attn: bool
    flash_attn: bool
    type_k: str
    type_v: str
    embeddings: bool
    no_perf: bool
    swa_full: bool
    kv_unified: bool
    kv_layout_exact: bool
    abort_callback: Callable[[], bool] | None


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContextParamsError(f"{name} = {value!r} must be an integer")
    if not lo <= value <= hi:
        raise ContextParamsError(f"{name} = {value} is outside [{lo}, {hi}]")


def _yarn_attn_factor(attn_factor: float, ext_factor: float, freq_scale: float, log_mul: float,
                      rope_attn_factor: float, deepseek2: bool = False) -> float:
    """llama_context's YaRN magnitude correction, in float32 with libm's logf and fmaf as GCC compiles it:
    get_mscale(factor) (or its log-multiplier ratio), divided by the 1 + 0.1 ln(factor) that ggml's rope_yarn
    multiplies back in, times the model's rope attn_factor. `deepseek2`: its mscale is the log multiplier itself
    unless that is 1 (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX; deepseek2's graph puts mscale into its KQ scale)."""
    if ext_factor != 0.0:
        libm = ggml_libm()
        factor = libm.f32(1.0 / libm.f32(freq_scale))

        def mscale(m: float) -> float:
            return 1.0 if factor <= 1.0 else libm.fmaf(libm.f32(0.1 * m), libm.logf(factor), 1.0)

        m_num = log_mul if deepseek2 and log_mul != 1.0 else 1.0
        attn_factor = libm.f32(mscale(m_num) / mscale(log_mul)) if log_mul != 0.0 else mscale(1.0)
        attn_factor = libm.f32(attn_factor * libm.f32(1.0 / libm.fmaf(0.1, libm.logf(factor), 1.0)))
    return float(np.float32(attn_factor) * np.float32(rope_attn_factor))


def _pad(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def _resolve(p: ContextParams, hp: HParams, flash: str) -> ResolvedParams:
    # llama_context::llama_context: n_ctx 0 = n_ctx_train; padded to 256; per-sequence context unless unified.
    if p.n_ctx == 0 and hp.n_ctx_train > N_CTX_MAX:  # llama.cpp would try (and fail) to allocate its KV cache
        raise ContextParamsError(f"n_ctx = 0 takes the model's context_length {hp.n_ctx_train}, more than the limit "
                                 f"{N_CTX_MAX}: pass a smaller n_ctx")
    n_ctx = _pad(p.n_ctx or hp.n_ctx_train, 256)
    n_ctx_seq = n_ctx if p.kv_unified else _pad(n_ctx // p.n_seq_max, 256)
    if not p.kv_unified:
        n_ctx = n_ctx_seq * p.n_seq_max
    causal = hp.causal_attn if p.attention_type == "unspecified" else p.attention_type == "causal"
    n_batch = min(n_ctx, p.n_batch) if causal else p.n_batch
    n_ubatch = min(n_batch, p.n_ubatch or n_batch)
    scaling = hp.rope_scaling_type if p.rope_scaling_type == "unspecified" else p.rope_scaling_type
    if scaling not in ("none", "linear", "yarn", "longrope"):  # longrope: as linear (its factors are tensors)
        raise ContextParamsError(f"rope_scaling_type = {scaling!r} is not supported (supported: none, linear, yarn, "
                                 f"longrope)")
    freq_scale = 1.0 if scaling == "none" else (p.rope_freq_scale or hp.rope_freq_scale)
    ext_factor = p.yarn_ext_factor if p.yarn_ext_factor >= 0 else hp.yarn_ext_factor
    if ext_factor < 0:  # not set: on exactly for YaRN
        ext_factor = 1.0 if scaling == "yarn" else 0.0
    attn_factor = _yarn_attn_factor(p.yarn_attn_factor if p.yarn_attn_factor >= 0 else hp.yarn_attn_factor,
                                    ext_factor, freq_scale, hp.rope_yarn_log_mul, hp.rope_attn_factor,
                                    deepseek2=hp.arch == "deepseek2")
    # llama.cpp's "auto" turns flash attention on wherever the device runs it, which a CPU does for every model
    # (llama_context's probe of the FA op): the same here. A quantized V cache requires it.
    flash_attn = flash != "disabled"
    if flash == "disabled" and p.type_v not in ("f16", "f32", "bf16"):
        raise ContextParamsError(f"type_v = {p.type_v!r} requires flash_attn (got flash_attn = 'disabled')")
    return ResolvedParams(
        n_ctx=n_ctx,
        n_ctx_seq=n_ctx_seq,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_seq_max=p.n_seq_max,
        n_threads=p.n_threads,
        n_threads_batch=p.n_threads_batch,
        rope_freq_base=p.rope_freq_base or hp.rope_freq_base,
        rope_freq_scale=freq_scale,
        yarn_ext_factor=ext_factor,
        yarn_attn_factor=attn_factor,
        yarn_beta_fast=p.yarn_beta_fast if p.yarn_beta_fast >= 0 else hp.yarn_beta_fast,
        yarn_beta_slow=p.yarn_beta_slow if p.yarn_beta_slow >= 0 else hp.yarn_beta_slow,
        n_ctx_orig_yarn=p.yarn_orig_ctx or hp.n_ctx_orig_yarn,
        rope_scaling_type=scaling,
        pooling_type=hp.pooling_type if p.pooling_type == "unspecified" else p.pooling_type,  # the model's
        causal_attn=causal,
        flash_attn=flash_attn,
        type_k=p.type_k,
        type_v=p.type_v,
        embeddings=p.embeddings,
        no_perf=p.no_perf,
        swa_full=p.swa_full,
        kv_unified=p.kv_unified,
        kv_layout_exact=p.kv_layout_exact,
        abort_callback=p.abort_callback,
    )

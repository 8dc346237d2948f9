"""What a forward pass needs besides the weights: the ubatch's attention input and where outputs go.

Like llama.cpp's llm_graph_input_* objects, these are built by the context for each ubatch and passed explicitly
to the architecture's `build` (as `GraphParams.inp`, llamactx/backend/ops.py), which never sees the KV cache itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from llamactx.ggml.inputs import RopeParams, VisibleCells


class AttentionInput(Protocol):
    """Stores the ubatch's K/V of a layer (if it has a cache) and attends over what the ubatch may see."""

    def __call__(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, kq_scale: float,
                 sinks: np.ndarray | None = None) -> np.ndarray:
        """q (n, n_head, d_k), k (n, n_head_kv, d_k), v (n, n_head_kv, d_v) float32 -> (n, n_head * d_v).
        sinks: the layer's attention sinks (n_head,) (build_attn's `sinks`: gpt-oss), or None."""


class RecurrentInput(Protocol):
    """The ubatch's view of the recurrent memory (llm_graph_input_rs; llamactx.memory.recurrent.RecurrentView):
    its sequence sets (`sets[k].idx`: the ubatch rows of set k, in order) and, per layer and set, the state the
    set continues and where its new state goes."""

    sets: tuple

    def conv_state(self, il: int, k: int) -> np.ndarray: ...  # (n_embd_r,) a copy
    def ssm_state(self, il: int, k: int) -> np.ndarray: ...  # (n_embd_s,) a copy
    def store_conv(self, il: int, k: int, r: np.ndarray) -> None: ...
    def store_ssm(self, il: int, k: int, s: np.ndarray) -> None: ...
    # the gated delta-net layers' ops (memory.recurrent.RecurrentView; a recorded graph's GraphRecurrent)
    def ssm_conv(self, ops, il: int, x: np.ndarray, weight: np.ndarray) -> np.ndarray: ...
    def gated_delta_net(self, ops, il: int, q, k, v, g, beta) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class HybridInput:
    """The inputs of a hybrid model's forward (llm_graph_input_mem_hybrid): attention for its attention layers,
    the recurrent view for the others. Over an f16 KV cache a compiled graph binds it (backend.ops
    CompiledAttentionInput): the attention part's views and visible cells, and `layer_rows`."""

    attn: AttentionInput
    rs: RecurrentInput

    @property
    def _kv(self):
        return self.attn.attn  # the KVAttention inside the LayerMappedAttention

    flash = property(lambda self: self._kv.flash)
    view = property(lambda self: self._kv.view)
    view_swa = property(lambda self: self._kv.view_swa)
    vis = property(lambda self: self._kv.vis)
    vis_swa = property(lambda self: self._kv.vis_swa)

    def layer_rows(self) -> np.ndarray | None:
        """(n_layer,) int64: an attention layer's row in the KV cache, a recurrent layer's in the recurrent
        states (RecurrentView.layer_row). None (op by op) unless the attention is a LayerMappedAttention over one
        f16 KVAttention view and the recurrent input a memory view."""
        mapped, rs = self.attn, self.rs
        kv = getattr(mapped, "attn", None)
        if not isinstance(kv, KVAttention) or not hasattr(rs, "layer_row") or kv.view_swa is not kv.view:
            return None
        if kv.view.type_k != "f16" or kv.view.type_v != "f16":
            return None
        rows = np.array([kv.view.layer_row(mapped.index[il]) if il in mapped.index else rs.layer_row(il)
                         for il in range(kv.hp.n_layer)], np.int64)
        return rows if (rows >= 0).all() else None


class LayerMappedAttention:
    """An attention input over a KV cache that holds only some layers (a hybrid model's attention layers, in
    order): model layer `il` is cache layer `layers.index(il)`."""

    def __init__(self, attn: AttentionInput, layers: tuple[int, ...]):
        self.attn = attn
        self.index = {il: i for i, il in enumerate(layers)}

    def __call__(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, kq_scale: float,
                 sinks: np.ndarray | None = None) -> np.ndarray:
        return self.attn(self.index[il], q, k, v, kq_scale, sinks)


@dataclass(frozen=True, slots=True)
class ForwardResult:
    logits: np.ndarray | None  # (n_outputs, n_vocab) float32
    embd: np.ndarray | None  # (n_outputs, n_embd) float32: the final-normed hidden state (t_embd)


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Per-layer RoPE parameters resolved from hparams + cparams (sliding-window layers may differ)."""

    full: RopeParams
    swa: RopeParams

    def for_layer(self, is_swa: bool) -> RopeParams:
        return self.swa if is_swa else self.full


def rope_config(hp, cparams, freq_factors: np.ndarray | None = None) -> RopeConfig:
    """RoPE parameters of full and sliding-window layers (llama_model::get_rope_freq_base / _scale); freq_factors:
    the model's rope_freqs.weight (n_rot/2,), if any (build_rope_factors)."""
    common = dict(n_rot=hp.n_rot, mode=hp.rope_type, ext_factor=cparams.yarn_ext_factor, freq_factors=freq_factors,
                  attn_factor=cparams.yarn_attn_factor, beta_fast=cparams.yarn_beta_fast,
                  beta_slow=cparams.yarn_beta_slow, n_ctx_orig=cparams.n_ctx_orig_yarn)
    full = RopeParams(freq_base=cparams.rope_freq_base, freq_scale=cparams.rope_freq_scale, **common)
    swa = RopeParams(freq_base=hp.rope_freq_base_swa, freq_scale=hp.rope_freq_scale_swa, **common)
    return RopeConfig(full=full, swa=swa)


def rope_factors(tensors, hp, cparams) -> np.ndarray | None:
    """llama_model::get_rope_factors: Llama 3's `rope_freqs.weight` where the model has it, else LongRoPE's
    (phi3) `rope_factors_long.weight` when a sequence's context n_ctx_seq exceeds the model's
    original_context_length (hp.n_ctx_orig_yarn, not the context's), else `rope_factors_short.weight`; None
    without any of them. (n_rot/2,) float32"""
    if "rope_freqs.weight" in tensors:
        return tensors["rope_freqs.weight"]
    long = cparams.n_ctx_seq > hp.n_ctx_orig_yarn
    return tensors.get("rope_factors_long.weight" if long else "rope_factors_short.weight")


def attn_temp_scale(pos: np.ndarray, n_floor: int, f_scale: float, f_offset: float) -> np.ndarray:
    """llm_graph_input_attn_temp::set_input (mistral3, llama4): each token's Q factor
    log(floorf((float(pos) + offset) / float(n_floor)) + 1.0) * scale + 1.0, the quotient and its floor in float,
    the rest in double (libm's log), stored as float. pos (n,) -> (n, 1) float32"""
    f32 = np.float32
    q = np.floor((np.asarray(pos).astype(f32) + f32(f_offset)) / f32(n_floor))  # (n,) float32
    out = [math.log(float(v) + 1.0) * float(f32(f_scale)) + 1.0 for v in q]  # double, as std::log
    return np.array(out, np.float32).reshape(-1, 1)  # (n, 1)


def visibility_mask(cell_pos: np.ndarray, cell_has_seq: np.ndarray, tok_pos: np.ndarray, causal: bool,
                    n_swa: int) -> np.ndarray:
    """(n_tokens, n_kv) float32 of 0 (visible) / -inf (llm_graph_input_attn_kv::set_input_kq_mask).
    cell_has_seq: (n_tokens, n_kv) bool, whether each cell holds the token's (first) sequence."""
    visible = cell_has_seq & (cell_pos[None, :] >= 0)
    if causal:
        visible &= cell_pos[None, :] <= tok_pos[:, None]
    if n_swa > 0:  # LLAMA_SWA_TYPE_STANDARD: masked when pos - cell_pos >= n_swa
        visible &= (tok_pos[:, None] - cell_pos[None, :]) < n_swa
    return np.where(visible, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


class KVAttention:
    """Attention input for one ubatch over the KV cache, through the view the memory handed out for it: stores
    each layer's K/V into the ubatch's cells, then attends over cells [0, n_kv) with the causal / sequence /
    sliding-window mask, soft-capping the logits where the model does (build_attn_mha reads
    hparams.attn_soft_cap: gemma2). An iSWA memory hands out one view for the global layers and one for the
    sliding-window layers (`view.views()`)."""

    def __init__(self, hp, cparams, ops, view, ub):
        self.hp, self.ops = hp, ops
        self.flash = cparams.flash_attn
        # the threads ggml runs this ubatch's graph on (llama_context::graph_compute); flash attention splits a
        # single token's cells over them
        self.n_threads = cparams.n_threads if len(ub.pos) == 1 else cparams.n_threads_batch
        self.view, self.view_swa = view.views()
        exact = getattr(cparams, "kv_layout_exact", False)
        has_seq = self.view.has_seq(ub.seq_id0)  # (n_tokens, n_kv)
        self.mask = visibility_mask(self.view.cell_pos, has_seq, ub.pos, cparams.causal_attn, 0)
        self.vis = _visible(self.mask, self.view.cell_pos, exact)  # once per ubatch, not per layer
        self.mask_swa, self.vis_swa = self.mask, self.vis
        if hp.n_swa:
            if self.view_swa is not self.view:
                has_seq = self.view_swa.has_seq(ub.seq_id0)
            self.mask_swa = visibility_mask(self.view_swa.cell_pos, has_seq, ub.pos, cparams.causal_attn, hp.n_swa)
            self.vis_swa = _visible(self.mask_swa, self.view_swa.cell_pos, exact)

    def __call__(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, kq_scale: float,
                 sinks: np.ndarray | None = None) -> np.ndarray:
        n = q.shape[0]
        if self.hp.is_swa(il):
            view, mask, vis = self.view_swa, self.mask_swa, self.vis_swa
        else:
            view, mask, vis = self.view, self.mask, self.vis
        if k is not None:  # None: a layer reading an earlier layer's KV (gemma4; build_attn with k_cur = nullptr)
            view.store(il, k.reshape(n, -1), v.reshape(n, -1))
        return self.ops.attention_kv(q, view, il, mask, vis, kq_scale, self.flash, n_threads=self.n_threads,
                                     softcap=self.hp.f_attn_logit_softcapping, sinks=sinks)

    def layer_rows(self) -> np.ndarray | None:
        """Each layer's row in the cache it reads, (n_layer,) int64, where a compiled graph binds this input
        (backend.ops.CompiledAttentionInput): f16 caches, one holding every layer or an iSWA pair whose SWA view
        may be rotated, with or without flash attention. None: op by op (quantized caches)."""
        if not all(v.type_k == "f16" and v.type_v == "f16" for v in (self.view, self.view_swa)):
            return None
        rows = np.array([(self.view_swa if self.hp.is_swa(il) else self.view).layer_row(il)
                         for il in range(self.hp.n_layer)], np.int64)  # (n_layer,)
        return rows if (rows >= 0).all() else None  # each layer in the cache its kind reads


def _visible(mask: np.ndarray, cell_pos: np.ndarray, layout_exact: bool) -> VisibleCells:
    """The order and lanes of the attention sums over the visible cells (docs/numerics.md): ggml's lanes follow
    the absolute cell index; by default llamactx's follow the cell's position, which is the same for a sequence
    that fills the cache from cell 0 and does not depend on where the cells sit (other sequences, reuse), and
    falls back to ranks in position order where positions repeat (seq_div). `layout_exact` follows the cell
    index as ggml does."""
    lanes = VisibleCells.on_lanes(mask, np.arange(mask.shape[1]) if layout_exact else cell_pos)
    return lanes if lanes is not None else VisibleCells.from_mask(mask, cell_pos)


class BatchAttention:
    """Attention input without memory (llm_graph_input_attn_no_cache): tokens attend within the ubatch, to the
    tokens of their own sequence. K/V are rounded to f16 as a cache would hold them."""

    def __init__(self, hp, cparams, ops, ub):
        self.hp, self.ops = hp, ops
        self.flash = cparams.flash_attn
        has_seq = np.array([[s in ids for ids in ub.seq_ids] for s in ub.seq_id0], bool)  # (n, n)
        self.mask = visibility_mask(ub.pos, has_seq, ub.pos, cparams.causal_attn, 0)
        self.mask_swa = (visibility_mask(ub.pos, has_seq, ub.pos, cparams.causal_attn, hp.n_swa)
                         if hp.n_swa else self.mask)

    def __call__(self, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, kq_scale: float,
                 sinks: np.ndarray | None = None) -> np.ndarray:
        if not self.hp.causal_attn:  # an encoder (bert): llama.cpp's kernels for the ubatch's f32 K/V, exactly
            return self.ops.attention_no_cache(q, k, v, self.mask, kq_scale, self.flash)
        k16 = k.astype(np.float16).astype(np.float32)
        v16 = v.astype(np.float16).astype(np.float32)
        mask = self.mask_swa if self.hp.is_swa(il) else self.mask
        return self.ops.attention(q, k16, v16, mask, kq_scale, self.flash, "f16",
                                  softcap=self.hp.f_attn_logit_softcapping, sinks=sinks)

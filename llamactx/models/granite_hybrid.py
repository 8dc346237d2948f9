"""The `granitehybrid` architecture (IBM Granite 4.0 H): src/models/granite-hybrid.cpp, build_mamba2_layer of
src/models/mamba-base.cpp.

A layer is `head_count_kv[il] == 0` ? Mamba-2 : attention, both RMS-pre-normed, then granite's FFN block: the
mixer's output times `residual_scale` before its residual add, an RMS-normed SwiGLU FFN (optional biases) or,
with experts (Granite 4.0 H Tiny / Small), build_moe_ffn's softmax router over experts of width
`feed_forward_length` plus an always-on SwiGLU shared expert (`expert_shared_feed_forward_length`), times
`residual_scale` again before the second add. The embeddings are times `embedding_scale`, the kq scale is
`attention.scale` (1/sqrt(head) when 0), the logits are divided by `logit_scale`; each scale is a ggml_scale and
is skipped when 0. Attention has no q/k norms; RoPE (NORM) unless `rope.scaling.finetuned` is false. The Mamba-2
layers are mamba2.py's (`mamba2_layer`), their states in the hybrid memory's recurrent half; only Granite's
expansion factor of 2 (ssm.inner_size = 2 n_embd) is accepted, as llama.cpp asserts.
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NORM
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models import mamba2
from llamactx.models.graph_inputs import ForwardResult, RopeConfig
from llamactx.models.llama import linear, linears, output_weight_name
from llamactx.models.moe import build_moe_ffn, expert_tensor_shapes

ARCHS = {"granitehybrid": ROPE_TYPE_NORM}  # llama_model_rope_type
MEMORY = "hybrid"  # llama_model::create_memory: llama_memory_hybrid
LAYER_KINDS = ("mamba2", "attention")

_F32 = np.float32


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_granite_hybrid::load_arch_hparams: the four granite scales (0 when absent: not applied), the
    ssm.* keys (mamba2's, with its divisibility checks), `rope.scaling.finetuned` as the RoPE switch (default
    true), the shared expert's width; load_arch_tensors' assertion d_inner == 2 n_embd."""
    fields = mamba2.arch_hparams(m, hp)
    if fields["ssm_d_inner"] != 2 * hp["n_embd"]:
        raise HParamsError(f"'{m.arch}.ssm.inner_size' = {fields['ssm_d_inner']}: granitehybrid needs 2 * "
                           f"embedding_length = {2 * hp['n_embd']}")
    if hp["n_rot"] != hp["n_embd_head_k"]:
        raise HParamsError(f"'{m.arch}.rope.dimension_count' = {hp['n_rot']}: granitehybrid rotates whole heads, "
                           f"expected the head size {hp['n_embd_head_k']}")
    if not any(hp["recurrent_layers"]) or all(hp["recurrent_layers"]):
        raise HParamsError(f"'{m.arch}.attention.head_count_kv' must hold one value per layer, 0 for each Mamba-2 "
                           f"layer and the KV head count for each attention layer")
    if hp["n_expert"] and not hp["n_ff"]:
        raise HParamsError(f"'{m.arch}.feed_forward_length' is missing or 0: granitehybrid's experts are that wide")
    key = f"{m.arch}.rope.scaling.finetuned"
    finetuned = m.meta.get(key, True)
    if not isinstance(finetuned, bool):
        raise HParamsError(f"GGUF metadata key '{key}': expected a bool, got {finetuned!r}")
    return fields | dict(f_logit_scale=m.real("logit_scale", 0.0, zero_ok=True),
                         f_residual_scale=m.real("residual_scale", 0.0, zero_ok=True),
                         embd_scale=m.real("embedding_scale", 0.0, zero_ok=True),
                         f_attention_scale=m.real("attention.scale", 0.0, zero_ok=True),
                         rope_layers=(finetuned,) * hp["n_layer"], n_ff_exp=hp["n_ff"] if hp["n_expert"] else 0,
                         n_ff_shexp=m.count("expert_shared_feed_forward_length", 0, lo=0))


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_granite_hybrid::load_arch_tensors: name -> (ggml shape, required). The conv bias, optional
    there, is required here: build_mamba2_layer adds it unconditionally."""
    mamba = mamba2.tensor_shapes(hp)
    n_q, n_kv = hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes[b + "attn_norm.weight"] = ((hp.n_embd,), True)
        shapes[b + "ffn_norm.weight"] = ((hp.n_embd,), True)
        if hp.is_recr(il):
            shapes.update({k: v for k, v in mamba.items() if k.startswith(b + "ssm_")})
        else:
            for part, ne0, ne1 in (("q", hp.n_embd, n_q), ("k", hp.n_embd, n_kv), ("v", hp.n_embd, n_kv),
                                   ("output", n_q, hp.n_embd)):
                shapes[f"{b}attn_{part}.weight"] = ((ne0, ne1), True)
                shapes[f"{b}attn_{part}.bias"] = ((ne1,), False)
        if hp.n_expert:
            shapes.update(expert_tensor_shapes(hp, b, gate_required=False))
            if hp.n_ff_shexp:
                shapes.update({b + "ffn_gate_shexp.weight": ((hp.n_embd, hp.n_ff_shexp), True),
                               b + "ffn_up_shexp.weight": ((hp.n_embd, hp.n_ff_shexp), True),
                               b + "ffn_down_shexp.weight": ((hp.n_ff_shexp, hp.n_embd), True)})
        else:
            for part, ne0, ne1 in (("gate", hp.n_embd, hp.n_ff), ("up", hp.n_embd, hp.n_ff),
                                   ("down", hp.n_ff, hp.n_embd)):
                shapes[f"{b}ffn_{part}.weight"] = ((ne0, ne1), True)
                shapes[f"{b}ffn_{part}.bias"] = ((ne1,), False)
    return shapes


def refused_tensors(hp: HParams) -> dict[str, str]:
    """Per-layer RoPE frequency factors (optional in llama.cpp's table) are not implemented."""
    return {f"blk.{il}.rope_freqs.weight": "RoPE frequency factors are not supported" for il in range(hp.n_layer)}


def build(ops, params: GraphParams) -> ForwardResult:
    """One ubatch through the network (llama_model_granite_hybrid::graph). inp: attention for the attention
    layers, the recurrent view for the Mamba-2 layers."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    inp, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    if hp.embd_scale:  # build_inp_embd
        x = x * _F32(hp.embd_scale)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        if hp.is_recr(il):
            cur = mamba2.mamba2_layer(model, ops, inp.rs, cur, il)
        else:
            cur = attention_layer(model, ops, inp.attn, cur, pos, rope, il)
        if il == hp.n_layer - 1:
            cur, x = cur[out_ids], x[out_ids]
        x = layer_ffn(model, ops, cur, x, il)  # (n, n_embd)
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = None
    if want_logits:
        logits = ops.matmul(x, w(output_weight_name(model)))  # (n_out, n_vocab)
        if hp.f_logit_scale:
            logits = logits * (_F32(1.0) / _F32(hp.f_logit_scale))
    return ForwardResult(logits=logits, embd=x)


def attention_layer(model, ops, attn, cur: np.ndarray, pos: np.ndarray, rope: RopeConfig, il: int) -> np.ndarray:
    """build_attention_layer: (n, n_embd) -> (n, n_embd)."""
    hp = model.hparams
    b = f"blk.{il}."
    n = cur.shape[0]
    q, k, v = linears(model, ops, cur, b + "attn_q", b + "attn_k", b + "attn_v")
    q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
    k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
    v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
    if hp.has_rope(il):
        rp = rope.for_layer(False)
        q, k = ops.rope(q, pos, rp), ops.rope(k, pos, rp)
    kq_scale = hp.f_attention_scale or float(_F32(1.0) / np.sqrt(_F32(hp.n_embd_head_k)))
    cur = attn(il, q, k, v, kq_scale)  # (n, n_head * n_embd_head_v)
    return linear(model, ops, cur, b + "attn_output")  # (n, n_embd)


def layer_ffn(model, ops, cur: np.ndarray, x: np.ndarray, il: int) -> np.ndarray:
    """build_layer_ffn: the mixer's output `cur` added to the residual `x` (scaled), then the FFN or the experts
    (and the shared expert), scaled and added. (n, n_embd) -> (n, n_embd)"""
    hp = model.hparams
    b = f"blk.{il}."
    residual_scale = _F32(hp.f_residual_scale)
    if residual_scale:
        cur = cur * residual_scale
    x = cur + x  # ffn_inp
    cur = ops.rms_norm(x, model.tensors[b + "ffn_norm.weight"], hp.f_norm_rms_eps)
    if hp.n_expert:
        moe = build_moe_ffn(model, ops, cur, b, norm_w=True)  # softmax gating, expert_weights_scale 0
        if hp.n_ff_shexp:
            gate, up = ops.matmuls(cur, [model.weight(b + "ffn_gate_shexp.weight"),
                                         model.weight(b + "ffn_up_shexp.weight")])  # (n, n_ff_shexp) each
            moe = moe + ops.matmul(ops.swiglu(gate, up), model.weight(b + "ffn_down_shexp.weight"))
        cur = moe
    else:
        up, gate = linears(model, ops, cur, b + "ffn_up", b + "ffn_gate")  # (n, n_ff) each
        cur = linear(model, ops, ops.swiglu(gate, up), b + "ffn_down")  # (n, n_embd)
    if residual_scale:
        cur = cur * residual_scale
    return cur + x

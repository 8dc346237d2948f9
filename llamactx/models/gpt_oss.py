"""The `gpt-oss` architecture (OpenAI's open-weight mixture of experts, LLM_ARCH_OPENAI_MOE): src/models/openai-moe.cpp
(llm_build_openai_moe_iswa).

Differences from llama: q/k/v and the attention output have biases; each head has an attention sink (a learned
logit without a value row that joins the softmax: `attn_sinks.weight`, passed to the attention input and from
there to every attention kernel); every other layer is a sliding-window one (`sliding_window_pattern` 2 by
default: layers 0, 2, 4, ...; SWA layers may have their own RoPE base, `rope.freq_base_swa`), with an iSWA KV
cache; RoPE rotates NEOX-style, with YaRN scaling in the released models (the SWA layers keep the trained
frequency scale); kq_scale is 1/sqrtf(n_rot); the FFN input is normed by `post_attention_norm`; the FFN is
build_moe_ffn with biases on the router and on every expert matmul (ggml_add_id), "softmax_weight" gating (top k
of the raw logits, then a softmax of those k: no renormalization) and swiglu_oai (alpha 1.702, limit 7); the
output rows are selected after the last layer (not before its FFN, as llama does), and the output matrix is
always its own.
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, HParamsError, Meta, swa_pattern
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import linear, linears
from llamactx.models.moe import build_moe_ffn, expert_tensor_shapes

ARCHS = {"gpt-oss": ROPE_TYPE_NEOX}  # llama_model_rope_type: LLM_ARCH_OPENAI_MOE rotates NEOX-style
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache_iswa (llama_kv_cache with swa_full)

_F32 = np.float32
SWA_PATTERN_DEFAULT = 2  # llama_model_openai_moe::load_arch_hparams: load_swa_pattern(ml, 2)


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_openai_moe::load_arch_hparams: the experts' FFN width, the sliding window (required) and its
    layer pattern (default 2), the SWA layers' RoPE base (default: the global one) and frequency scale (the
    trained one). gpt-oss needs experts, and its graph's heads are n_rot wide (build_qkv(n_rot, ...)), so n_rot
    must be the head size."""
    if not hp["n_expert"]:
        raise HParamsError("'gpt-oss.expert_count' is missing or 0: gpt-oss needs experts")
    if hp["n_rot"] != hp["n_embd_head_k"]:
        raise HParamsError(f"'gpt-oss.rope.dimension_count' = {hp['n_rot']}: gpt-oss rotates whole heads, expected "
                           f"the head size {hp['n_embd_head_k']}")
    n_swa = m.count("attention.sliding_window")  # a window of 0 would mask every cell of the SWA layers
    return dict(n_ff_exp=m.count("expert_feed_forward_length"), n_swa=n_swa,
                swa_layers=swa_pattern(m, hp["n_layer"], n_swa, SWA_PATTERN_DEFAULT),
                rope_freq_base_swa=m.real("rope.freq_base_swa", hp["rope_freq_base"]),
                rope_freq_scale_swa=hp["rope_freq_scale"])


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_openai_moe::load_arch_tensors (create_tensor_qkv: the q/k/v biases are optional)."""
    n_q = hp.n_embd_head_k * hp.n_head
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), True),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "post_attention_norm.weight": ((hp.n_embd,), True),
            b + "attn_q.weight": ((hp.n_embd, n_q), True),
            b + "attn_k.weight": ((hp.n_embd, hp.n_embd_k_gqa), True),
            b + "attn_v.weight": ((hp.n_embd, hp.n_embd_v_gqa), True),
            b + "attn_q.bias": ((n_q,), False),
            b + "attn_k.bias": ((hp.n_embd_k_gqa,), False),
            b + "attn_v.bias": ((hp.n_embd_v_gqa,), False),
            b + "attn_output.weight": ((n_q, hp.n_embd), True),
            b + "attn_output.bias": ((hp.n_embd,), True),
            b + "attn_sinks.weight": ((hp.n_head,), True),
        })
        shapes.update(expert_tensor_shapes(hp, b, biases=True))
    return shapes


def refused_tensors(hp: HParams) -> dict[str, str]:
    """A fused attn_qkv.weight, which create_tensor_qkv would use instead of attn_q/k/v (no gpt-oss has one)."""
    return {f"blk.{il}.attn_qkv.weight": "a fused q/k/v matrix in a gpt-oss file is not supported (llama.cpp would "
            "use it instead of attn_q/attn_k/attn_v)" for il in range(hp.n_layer)}


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_openai_moe::graph), computed by `ops` as it is built or recorded."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    n = len(pos)
    kq_scale = float(_F32(1.0) / np.sqrt(_F32(hp.n_rot)))  # 1.0f/sqrtf(float(n_rot))
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        rp = rope.for_layer(hp.is_swa(il))
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        q, k, v = linears(model, ops, cur, b + "attn_q", b + "attn_k", b + "attn_v")  # (n, n_embd_*) with biases
        q = ops.rope(q.reshape(n, hp.n_head, hp.n_rot), pos, rp)  # (n, n_head, n_rot)
        k = ops.rope(k.reshape(n, hp.n_head_kv, hp.n_rot), pos, rp)  # (n, n_head_kv, n_rot)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        cur = attn(il, q, k, v, kq_scale, t[b + "attn_sinks.weight"])  # (n, n_head * n_embd_head_v)
        x = linear(model, ops, cur, b + "attn_output") + x  # ffn_inp: wo, wo_b, then the residual
        cur = ops.rms_norm(x, t[b + "post_attention_norm.weight"], eps)  # (n, n_embd)
        # expert_weights_scale is not read for gpt-oss: llama_hparams' 0, no scaling
        cur = build_moe_ffn(model, ops, cur, b, norm_w=False, w_scale=0.0, gating="softmax_weight",
                            act="swiglu_oai", biases=True)  # (n, n_embd)
        x = cur + x
    x = x[out_ids]  # embeddings_nextn_masked is off: the rows are selected after the last layer
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = ops.matmul(x, w("output.weight")) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)

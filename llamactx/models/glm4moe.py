"""The `glm4moe` architecture (GLM-4.5 / 4.6 / 4.7, GLM-4.5-Air, Solar Open): src/models/glm4-moe.cpp
(llama_model_glm4_moe).

Attention as llama's with q/k/v biases (create_tensor_qkv), optional per-head q/k RMS norms (GLM-4.5 355B), and
partial RoPE: NEOX pairs over the first `rope.dimension_count` of each head (half of it in the released models),
the rest passing through; KQ scale 1/sqrt(head size). The FFN input is normed by `post_attention_norm`. FFN: the
first `leading_dense_block_count` layers are SwiGLU; the others are DeepSeek-V3-style experts (models/deepseek2.py's
`ffn`): sigmoid gating by default, the selection bias exp_probs_b (required), normalized and scaled weights,
plus `expert_shared_count` shared experts. The NextN (MTP) layers after the trunk (`nextn_predict_layers`) are
in the file but skipped, as llama.cpp does without a draft context (TENSOR_SKIP): they have no KV cells and are
never run. Multimodal RoPE (rope.dimension_sections) is refused.
"""

from __future__ import annotations

import math

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.deepseek2 import GATING, deepseek_experts, ffn, ffn_tensor_shapes
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import linear, linears, output_weight_name

ARCHS = {"glm4moe": ROPE_TYPE_NEOX}  # llama_model_rope_type (NEOX without rope sections)
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache over the trunk layers


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_glm4_moe::load_arch_hparams: experts (their width defaults to n_ff / n_expert_used), shared
    experts, dense leading layers, the router (sigmoid unless `expert_gating_func` says otherwise), NextN layers."""
    if f"{m.arch}.rope.dimension_sections" in m.meta:
        raise HParamsError(f"'{m.arch}.rope.dimension_sections': multimodal RoPE (GLM-4.xV) is not supported")
    f = deepseek_experts(m, hp, n_ff_exp_default=max(hp["n_ff"] // max(hp["n_expert_used"], 1), 1))
    gating = m.get("expert_gating_func", int, 0) or 2  # none: sigmoid (GLM-4.5)
    if gating not in GATING:
        raise HParamsError(f"'{m.arch}.expert_gating_func' = {gating} is not supported (1 softmax, 2 sigmoid, "
                           f"3 softmax_weight)")
    f["expert_gating_func"] = GATING[gating]
    return f


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_glm4_moe::load_arch_tensors for the trunk (the NextN layers' tensors are skipped)."""
    n_q = hp.n_embd_head_k * hp.n_head
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "attn_q.weight": ((hp.n_embd, n_q), True),
            b + "attn_k.weight": ((hp.n_embd, hp.n_embd_k_gqa), True),
            b + "attn_v.weight": ((hp.n_embd, hp.n_embd_v_gqa), True),
            b + "attn_q.bias": ((n_q,), False),
            b + "attn_k.bias": ((hp.n_embd_k_gqa,), False),
            b + "attn_v.bias": ((hp.n_embd_v_gqa,), False),
            b + "attn_output.weight": ((n_q, hp.n_embd), True),
            b + "attn_q_norm.weight": ((hp.n_embd_head_k,), False),
            b + "attn_k_norm.weight": ((hp.n_embd_head_k,), False),
            b + "post_attention_norm.weight": ((hp.n_embd,), True),
        })
        shapes.update(ffn_tensor_shapes(hp, il))
        shapes.pop(b + "ffn_norm.weight")  # glm4moe norms the FFN input with post_attention_norm
        if il >= hp.n_layer_dense_lead:
            shapes[b + "exp_probs_b.bias"] = ((hp.n_expert,), True)
    return shapes


def refused_tensors(hp: HParams) -> dict[str, str]:
    """A fused attn_qkv (create_tensor_qkv would use it) and fused gate+up experts."""
    refused = {}
    for il in range(hp.n_layer):
        refused[f"blk.{il}.attn_qkv.weight"] = "a fused q/k/v matrix is not supported"
        refused[f"blk.{il}.ffn_gate_up_exps.weight"] = "fused gate+up experts are not supported"
    return refused


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_glm4_moe::graph): computed by `ops` as it is built, or recorded (the
    compiled graph's MOE_ROUTE_SEL runs the sigmoid router with its selection bias)."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    t = model.tensors
    eps = hp.f_norm_rms_eps
    n = len(pos)
    kq_scale = 1.0 / math.sqrt(hp.n_embd_head_k)
    x = ops.get_rows(model.weight("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    rp = rope.for_layer(False)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        q, k, v = linears(model, ops, cur, b + "attn_q", b + "attn_k", b + "attn_v")  # with biases
        q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
        k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        if b + "attn_q_norm.weight" in t:
            q = ops.rms_norm(q, t[b + "attn_q_norm.weight"], eps)
        if b + "attn_k_norm.weight" in t:
            k = ops.rms_norm(k, t[b + "attn_k_norm.weight"], eps)
        q, k = ops.rope(q, pos, rp), ops.rope(k, pos, rp)  # the first n_rot of each head, NEOX pairs
        cur = linear(model, ops, attn(il, q, k, v, kq_scale), b + "attn_output")  # (n, n_embd)
        if il == hp.n_layer - 1:  # only the output rows go through the last FFN
            cur, x = cur[out_ids], x[out_ids]
        x = cur + x  # ffn_inp
        x = ffn(model, ops, ops.rms_norm(x, t[b + "post_attention_norm.weight"], eps), il) + x  # (n, n_embd)
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = ops.matmul(x, model.weight(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)

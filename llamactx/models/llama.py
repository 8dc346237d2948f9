"""The `llama` architecture (SmolLM2, Llama 2/3, Mistral and llama-style variants): src/models/llama.cpp, and the
two Qwen variants that differ from it only in optional tensors: `qwen2` (q/k/v biases, src/models/qwen2.cpp) and
`qwen3` (RMS-normed q and k per head before RoPE, src/models/qwen3.cpp); both rotate NEOX-style (hparams). A model
with experts (`llama.expert_count`: Mixtral), `qwen3moe` (qwen3 with experts, src/models/qwen3moe.cpp) and
`qwen2moe` (qwen2 with experts and a shared expert, src/models/qwen2moe.cpp) replace the FFN by build_moe_ffn
(models/moe.py). `build` is also mistral3's graph (models/mistral3.py): with `hp.f_attn_temp_scale`, Q after
RoPE is multiplied by its position's attention temperature (llm_graph_input_attn_temp)."""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX, ROPE_TYPE_NORM
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.graph_inputs import ForwardResult, attn_temp_scale
from llamactx.models.moe import build_moe_ffn, expert_tensor_shapes, shared_expert

# the architecture names this module runs, with their RoPE type (llama_model_rope_type): llama rotates adjacent
# pairs (NORM), the Qwens the two halves of each head (NEOX)
ARCHS = {"llama": ROPE_TYPE_NORM, "qwen2": ROPE_TYPE_NEOX, "qwen3": ROPE_TYPE_NEOX, "qwen3moe": ROPE_TYPE_NEOX,
         "qwen2moe": ROPE_TYPE_NEOX}
MOE_ARCHS = ("qwen3moe", "qwen2moe")  # the architectures that must have experts
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache


def arch_hparams(m: Meta, hp: dict) -> dict:
    """load_arch_hparams: llama's graph rotates the whole head; an expert's FFN width is `n_ff` for llama
    (Mixtral) and qwen3moe's / qwen2moe's `expert_feed_forward_length` (default n_ff / n_expert_used), which must
    have experts; qwen2moe's shared expert is `expert_shared_feed_forward_length` wide (default n_ff)."""
    if m.arch in ("llama", "qwen3moe", "qwen2moe") and hp["n_rot"] != hp["n_embd_head_k"]:
        raise HParamsError(f"'{m.arch}.rope.dimension_count' = {hp['n_rot']}: expected an even number equal to "
                           f"the head size {hp['n_embd_head_k']}")
    if m.arch in MOE_ARCHS:
        if not hp["n_expert"]:
            raise HParamsError(f"'{m.arch}.expert_count' is missing or 0: {m.arch} needs experts")
        fields = {"n_ff_exp": m.count("expert_feed_forward_length", hp["n_ff"] // hp["n_expert_used"])}
        if m.arch == "qwen2moe":
            fields["n_ff_shexp"] = m.count("expert_shared_feed_forward_length", hp["n_ff"])
        return fields
    return {"n_ff_exp": hp["n_ff"] if hp["n_expert"] else 0}


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_llama::load_arch_tensors: name -> (ggml shape, required). `output.weight` falls back to the
    token embeddings (tied weights)."""
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
        "rope_freqs.weight": ((hp.n_rot // 2,), False),  # Llama 3.1's frequency factors
    }
    qk_norm = hp.arch in ("qwen3", "qwen3moe")
    n_q = hp.n_embd_head_k * hp.n_head
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "attn_q.weight": ((hp.n_embd, n_q), True),
            b + "attn_k.weight": ((hp.n_embd, hp.n_embd_k_gqa), True),
            b + "attn_v.weight": ((hp.n_embd, hp.n_embd_v_gqa), True),
            b + "attn_output.weight": ((n_q, hp.n_embd), True),
            b + "attn_q.bias": ((n_q,), False),
            b + "attn_k.bias": ((hp.n_embd_k_gqa,), False),
            b + "attn_v.bias": ((hp.n_embd_v_gqa,), False),
            b + "attn_output.bias": ((hp.n_embd,), False),
            b + "attn_q_norm.weight": ((hp.n_embd_head_k,), qk_norm),
            b + "attn_k_norm.weight": ((hp.n_embd_head_k,), qk_norm),
            b + "ffn_norm.weight": ((hp.n_embd,), True),
        })
        if hp.n_expert:  # Mixtral's gate may be absent (llama_model_llama: TENSOR_NOT_REQUIRED)
            shapes.update(expert_tensor_shapes(hp, b, gate_required=hp.arch in MOE_ARCHS))
        else:
            shapes.update({
                b + "ffn_gate.weight": ((hp.n_embd, hp.n_ff), True),
                b + "ffn_up.weight": ((hp.n_embd, hp.n_ff), True),
                b + "ffn_down.weight": ((hp.n_ff, hp.n_embd), True),
            })
        if hp.n_ff_shexp:  # qwen2moe's shared expert, its gate a vector: one logit per token
            shapes.update({
                b + "ffn_gate_inp_shexp.weight": ((hp.n_embd,), True),
                b + "ffn_gate_shexp.weight": ((hp.n_embd, hp.n_ff_shexp), True),
                b + "ffn_up_shexp.weight": ((hp.n_embd, hp.n_ff_shexp), True),
                b + "ffn_down_shexp.weight": ((hp.n_ff_shexp, hp.n_embd), True),
            })
    return shapes


def output_weight_name(model) -> str:
    return "output.weight" if model.has_tensor("output.weight") else "token_embd.weight"


def linear(model, ops, x: np.ndarray, prefix: str) -> np.ndarray:
    """x @ W^T (+ bias when the model has one: Qwen2-style llama variants). (n, ne0) -> (n, ne1)"""
    return linears(model, ops, x, prefix)[0]


def linears(model, ops, x: np.ndarray, *prefixes: str) -> list[np.ndarray]:
    """`linear` for several weights of the same input (one kernel call where the ops can fuse them)."""
    ys = ops.matmuls(x, [model.weight(p + ".weight") for p in prefixes])
    biases = [model.tensors.get(p + ".bias") for p in prefixes]
    return [y if bias is None else y + bias for y, bias in zip(ys, biases, strict=True)]


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llm_build_llama), computed by `ops` as it is built or recorded. token (n,) or
    embd (n, n_embd); pos (n,); out_ids: indices into the ubatch of the rows whose output is wanted. With a
    graph-recording ops object the arrays are graph tensors (llamactx.ggml.graph)."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w = model.weight
    n = len(pos)
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    kq_scale = 1.0 / math.sqrt(hp.n_embd_head_k)
    attn_scale = None  # mistral3: build_inp_attn_scale, each token's Q factor (n, 1)
    if hp.f_attn_temp_scale:
        attn_scale = ops.pos_input(pos, 1, partial(attn_temp_scale, n_floor=hp.n_attn_temp_floor_scale,
                                                   f_scale=hp.f_attn_temp_scale, f_offset=hp.f_attn_temp_offset))
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, model.tensors[b + "attn_norm.weight"], hp.f_norm_rms_eps)  # (n, n_embd)
        q, k, v = linears(model, ops, cur, b + "attn_q", b + "attn_k", b + "attn_v")
        q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
        k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        if b + "attn_q_norm.weight" in model.tensors:  # qwen3, qwen3moe
            q = ops.rms_norm(q, model.tensors[b + "attn_q_norm.weight"], hp.f_norm_rms_eps)
            k = ops.rms_norm(k, model.tensors[b + "attn_k_norm.weight"], hp.f_norm_rms_eps)
        rp = rope.for_layer(False)
        q = ops.rope(q, pos, rp)
        k = ops.rope(k, pos, rp)
        if attn_scale is not None:  # ggml_mul(Qcur, inp_attn_scale): every element of a token's heads
            q = (q.reshape(n, -1) * attn_scale).reshape(n, hp.n_head, hp.n_embd_head_k)
        cur = attn(il, q, k, v, kq_scale)  # (n, n_head * n_embd_head_v)
        cur = linear(model, ops, cur, b + "attn_output")  # (n, n_embd)
        if il == hp.n_layer - 1:  # only the output rows go through the last FFN
            cur, x = cur[out_ids], x[out_ids]
        x = cur + x
        cur = ops.rms_norm(x, model.tensors[b + "ffn_norm.weight"], hp.f_norm_rms_eps)
        if hp.n_ff_shexp:  # qwen2moe: the routed experts' weights are not normalized
            x = build_moe_ffn(model, ops, cur, b, norm_w=False) + shared_expert(model, ops, cur, b) + x
        elif hp.n_expert:
            x = build_moe_ffn(model, ops, cur, b) + x  # (n, n_embd)
        else:
            gate, up = ops.matmuls(cur, [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])  # (n, n_ff) each
            x = ops.matmul(ops.swiglu(gate, up), w(b + "ffn_down.weight")) + x  # (n, n_embd)
    x = ops.rms_norm(x, model.tensors["output_norm.weight"], hp.f_norm_rms_eps)  # (n_out, n_embd)
    logits = ops.matmul(x, w(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)

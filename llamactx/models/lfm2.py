"""The `lfm2` architecture (Liquid AI's LFM2): src/models/lfm2.cpp, the hybrid llamactx runs.

Issue 11 asked for one hybrid architecture llama.cpp runs (granitehybrid, falcon-h1 or lfm2). LFM2 it is: its
recurrent layers are a short causal convolution (ggml_ssm_conv only, no selective scan), so it needs the
hybrid memory's two halves (a KV cache for the attention layers, a rolling conv state for the others) with the
least new arithmetic; and its tiny synthetic model with llama.cpp's logits was already made
(tests/data/tiny/tiny-lfm2.gguf; granitehybrid and falcon-h1 would add Mamba-2 layers plus their own
multipliers and MoE to the same memory).

A layer is `head_count_kv[il] == 0` ? short convolution : attention. Both are pre-normed (RMS) with a residual,
then a SwiGLU FFN. Attention RMS-norms q and k per head, NEOX RoPE, 1/sqrt(head) scale. The short convolution
projects to B | C | x, convolves B*x with the sequence's conv state (kernel l_cache, state l_cache - 1 tokens),
gates the result with C and projects back. The final norm is `token_embd_norm` (llama.cpp's name for LFM2's
output norm). LFM2-MoE (`lfm2moe`, src/models/lfm2moe.cpp, the same graph) keeps the dense FFN in its first
`leading_dense_block_count` layers and routes the others' tokens to experts (build_moe_ffn with the
`expert_gating_func` of the file, sigmoid for the released models, the selection bias `exp_probs_b` and weights
normalized to sum 1). The sliding-window variant is not supported.

The conv states are read and written through the input (RecurrentView.ssm_conv, the sequence sets looped there),
so FastOps records the forward as one compiled program (SSM_CONV_RS and products, the attention layers over the
hybrid memory's KV cache) where it has kernels for the weights (quantized files; not F16 ones).
"""

from __future__ import annotations

import math

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.graph_inputs import ForwardResult, RecurrentInput, RopeConfig
from llamactx.models.llama import output_weight_name
from llamactx.models.moe import build_moe_ffn, expert_tensor_shapes

ARCHS = {"lfm2": ROPE_TYPE_NEOX, "lfm2moe": ROPE_TYPE_NEOX}  # llama_model_rope_type
MEMORY = "hybrid"  # llama_model::create_memory: llama_memory_hybrid
LAYER_KINDS = ("short convolution", "attention")
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}  # llama_expert_gating_func_type (lfm2moe's key)


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_lfm2::load_arch_hparams: the short convolution's kernel length (the per-layer head_count_kv
    that marks its layers is read with the common keys, as MEMORY is hybrid); every layer dense. lfm2moe
    (llama_model_lfm2moe::load_arch_hparams): the dense leading layers (0 if absent), an expert's width and the
    router's gating function, both required, and experts for its other layers."""
    fields = {"n_shortconv_l_cache": m.count("shortconv.l_cache", lo=2), "n_layer_dense_lead": hp["n_layer"]}
    if m.arch != "lfm2moe":
        return fields
    n_dense = m.count("leading_dense_block_count", 0, lo=0, hi=hp["n_layer"])
    if n_dense < hp["n_layer"] and not hp["n_expert"]:  # load_arch_tensors: GGML_ASSERT(n_expert && n_expert_used)
        raise HParamsError(f"'{m.arch}.expert_count' is missing or 0: layers {n_dense}-{hp['n_layer'] - 1} are "
                           f"mixture-of-experts layers (leading_dense_block_count = {n_dense})")
    if n_dense and not hp["n_ff"]:
        raise HParamsError(f"'{m.arch}.feed_forward_length' is missing or 0: the {n_dense} leading dense layers "
                           f"need it")
    gating = m.get("expert_gating_func", int)
    if gating not in GATING:
        raise HParamsError(f"'{m.arch}.expert_gating_func' = {gating} is not supported (1 softmax, 2 sigmoid, "
                           f"3 softmax_weight)")
    return fields | {"n_layer_dense_lead": n_dense, "n_ff_exp": m.count("expert_feed_forward_length"),
                     "expert_gating_func": GATING[gating]}


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_lfm2::load_arch_tensors (dense layers): name -> (ggml shape, required)."""
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "token_embd_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "ffn_norm.weight": ((hp.n_embd,), True),
        })
        if il >= hp.n_layer_dense_lead:  # lfm2moe: routed experts and their selection bias
            shapes.update(expert_tensor_shapes(hp, b))
            shapes[b + "exp_probs_b.bias"] = ((hp.n_expert,), True)
        else:
            shapes.update({
                b + "ffn_gate.weight": ((hp.n_embd, hp.n_ff), True),
                b + "ffn_up.weight": ((hp.n_embd, hp.n_ff), True),
                b + "ffn_down.weight": ((hp.n_ff, hp.n_embd), True),
            })
        if hp.is_recr(il):
            shapes.update({
                b + "shortconv.conv.weight": ((hp.n_shortconv_l_cache, hp.n_embd), True),
                b + "shortconv.in_proj.weight": ((hp.n_embd, 3 * hp.n_embd), True),
                b + "shortconv.out_proj.weight": ((hp.n_embd, hp.n_embd), True),
            })
        else:
            shapes.update({
                b + "attn_q_norm.weight": ((hp.n_embd_head_k,), True),
                b + "attn_k_norm.weight": ((hp.n_embd_head_k,), True),
                b + "attn_q.weight": ((hp.n_embd, hp.n_embd), True),
                b + "attn_k.weight": ((hp.n_embd, hp.n_embd_k_gqa), True),
                b + "attn_v.weight": ((hp.n_embd, hp.n_embd_v_gqa), True),
                b + "attn_output.weight": ((hp.n_embd, hp.n_embd), True),
            })
    return shapes


def build(ops, params: GraphParams) -> ForwardResult:
    """One ubatch through the network (llama_model_lfm2::graph<false>). inp: attention for the attention layers,
    the recurrent view for the short-convolution layers."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    inp, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        if hp.is_recr(il):
            cur = shortconv_block(model, ops, inp.rs, cur, il)
        else:
            cur = attention_block(model, ops, inp.attn, cur, pos, rope, il)
        if il == hp.n_layer - 1:
            cur, x = cur[out_ids], x[out_ids]
        x = x + cur
        ffn = ops.rms_norm(x, t[b + "ffn_norm.weight"], eps)
        if il >= hp.n_layer_dense_lead:  # lfm2moe: expert_weights_scale is not read (0), weights normalized
            x = x + build_moe_ffn(model, ops, ffn, b, norm_w=True, gating=hp.expert_gating_func)  # (n, n_embd)
            continue
        gate, up = ops.matmuls(ffn, [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])  # (n, n_ff) each
        x = x + ops.matmul(ops.swiglu(gate, up), w(b + "ffn_down.weight"))  # (n, n_embd)
    x = ops.rms_norm(x, t["token_embd_norm.weight"], eps)  # (n_out, n_embd)
    logits = ops.matmul(x, w(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)


def attention_block(model, ops, attn, cur: np.ndarray, pos: np.ndarray, rope: RopeConfig, il: int) -> np.ndarray:
    hp = model.hparams
    w, t = model.weight, model.tensors
    b = f"blk.{il}."
    n = cur.shape[0]
    q, k, v = ops.matmuls(cur, [w(b + "attn_q.weight"), w(b + "attn_k.weight"), w(b + "attn_v.weight")])
    q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
    k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
    v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
    rp = rope.for_layer(False)
    q = ops.rope(ops.rms_norm(q, t[b + "attn_q_norm.weight"], hp.f_norm_rms_eps), pos, rp)
    k = ops.rope(ops.rms_norm(k, t[b + "attn_k_norm.weight"], hp.f_norm_rms_eps), pos, rp)
    cur = attn(il, q, k, v, 1.0 / math.sqrt(hp.n_embd_head_v))  # (n, n_head * n_embd_head_v)
    return ops.matmul(cur, w(b + "attn_output.weight"))  # (n, n_embd)


def shortconv_block(model, ops, rs: RecurrentInput, cur: np.ndarray, il: int) -> np.ndarray:
    """build_shortconv_block (causal): (n, n_embd) -> (n, n_embd), updating the conv state of each sequence set."""
    w, t = model.weight, model.tensors
    b = f"blk.{il}."
    n_embd = cur.shape[1]
    bcx = ops.matmul(cur, w(b + "shortconv.in_proj.weight"))  # (n, 3 * n_embd)
    bx = bcx[:, :n_embd] * bcx[:, 2 * n_embd :]  # (n, n_embd): B * x
    conv = rs.ssm_conv(ops, il, bx, t[b + "shortconv.conv.weight"])  # (n, n_embd), conv states updated
    y = bcx[:, n_embd : 2 * n_embd] * conv  # C * conv
    return ops.matmul(y, w(b + "shortconv.out_proj.weight"))  # (n, n_embd)

"""The `qwen3next` architecture (Qwen3-Next): src/models/qwen3next.cpp (llama_model_qwen3next) and
delta-net-base.cpp.

Qwen3.5's hybrid (llamactx.models.qwen35) in its first arrangement: every `full_attention_interval`-th layer (or
the flags of `attention.recurrent_layers`) is gated full attention, the others Gated DeltaNet layers, each with a
post-attention norm into a mixture-of-experts FFN. What differs from qwen35:

- The delta-net's beta and alpha come from one fused projection (`ssm_ba`): per key head, its value heads' beta
  logits then their alpha logits (the view of build_layer_attn_linear's mixed_ba_reshaped).
- q | k | v (`attn_qkv`, the converter's reordering of in_proj_qkvz) and z (`attn_gate`) as in qwen35; a key head
  serves its value heads as repeat_interleave does (value head h reads key head h // (H_v / H_k), llama.cpp's
  ggml_repeat_4d of a (S, 1, H_k) view), where qwen35 tiles them (h % H_k).
- The attention layers rotate n_rot dimensions with NEOX RoPE (not IMRoPE), kq scale 1 / sqrtf(head_dim) unless
  `attention.scale` is set.
- The FFN always has experts (build_moe_ffn: softmax router, the top n_expert_used weights normalized) plus the
  shared SwiGLU expert times sigmoid(`ffn_gate_inp_shexp` . x), as qwen35moe's.

The states are read and written through the input (RecurrentView.ssm_conv / gated_delta_net), so FastOps records
the forward as one compiled program with qwen35's nodes: the fused projection's halves are copies (cont nodes), the
repeated key heads concatenations (`_repeat_heads`).

The legacy GGUFs' fused `ssm_in` (q|k|v|z per key head) are refused at load: their converter predates the
attn_qkv / attn_gate split that current convert_hf_to_gguf.py writes. MTP blocks are not run.
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, Meta
from llamactx.models import qwen35
from llamactx.models.graph_inputs import ForwardResult, RecurrentInput, RopeConfig

ARCHS = {"qwen3next": ROPE_TYPE_NEOX}  # llama_model_rope_type: LLAMA_ROPE_TYPE_NEOX
MEMORY = "hybrid"  # llama_model::create_memory: llama_memory_hybrid
LAYER_KINDS = qwen35.LAYER_KINDS


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_qwen3next::load_arch_hparams: the delta-net's ssm.* keys (checked as for qwen35), which layers
    are recurrent, the experts' widths; experts required (load_arch_tensors refuses zero)."""
    out = qwen35.delta_net_hparams(m, hp)
    out.update(qwen35._expert_widths(m, hp))
    return out


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_qwen3next::load_arch_tensors (the trunk): qwen35moe's, with the fused `ssm_ba` in place of
    `ssm_beta` / `ssm_alpha`."""
    shapes = qwen35.tensor_shapes(hp)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        if hp.is_recr(il):
            del shapes[b + "ssm_beta.weight"], shapes[b + "ssm_alpha.weight"]
            shapes[b + "ssm_ba.weight"] = ((hp.n_embd, 2 * hp.ssm_dt_rank), True)
    return shapes


def refused_tensors(hp: HParams) -> dict[str, str]:
    """qwen35's, and a legacy fused q|k|v|z `ssm_in` (llama.cpp's build_qkvz legacy path)."""
    out = qwen35.refused_tensors(hp)
    for il in range(hp.n_layer):
        if hp.is_recr(il):
            out[f"blk.{il}.ssm_in.weight"] = ("a legacy fused q|k|v|z projection (ssm_in) is not supported: "
                                              "convert the model again (attn_qkv and attn_gate)")
    return out


def build(ops, params: GraphParams) -> ForwardResult:
    """One ubatch through the network (llama_model_qwen3next::graph): qwen35's trunk with qwen3next's delta-net
    and attention blocks (its FFN: experts + the sigmoid-gated shared expert, as qwen35moe)."""
    return qwen35.hybrid_trunk(ops, params, delta_net_block, attention_block)


def attention_block(model, ops, attn, cur: np.ndarray, pos: np.ndarray, rope: RopeConfig, il: int) -> np.ndarray:
    """build_layer_attn: gated-query attention with NEOX RoPE. (n, n_embd) -> (n, n_embd)"""
    hp = model.hparams
    w, t = model.weight, model.tensors
    b = f"blk.{il}."
    n, d = cur.shape[0], hp.n_embd_head_k
    q_full, k, v = ops.matmuls(cur, [w(b + "attn_q.weight"), w(b + "attn_k.weight"), w(b + "attn_v.weight")])
    q_full = q_full.reshape(n, hp.n_head, 2, d)  # per head: its query, then its gate
    gate = q_full[:, :, 1].reshape(n, hp.n_head * d)  # (n, n_head * d): ggml_cont_2d of the view
    q = ops.rms_norm(q_full[:, :, 0], t[b + "attn_q_norm.weight"], hp.f_norm_rms_eps)  # (n, n_head, d)
    k = ops.rms_norm(k.reshape(n, hp.n_head_kv, d), t[b + "attn_k_norm.weight"], hp.f_norm_rms_eps)
    v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
    rp = rope.for_layer(False)
    q = ops.rope(q, pos, rp)  # (n, n_head, d)
    k = ops.rope(k, pos, rp)  # (n, n_head_kv, d)
    kq_scale = hp.f_attention_scale or float(np.float32(1.0) / np.sqrt(np.float32(d)))
    out = attn(il, q, k, v, kq_scale)  # (n, n_head * d)
    out = out * ops.sigmoid(gate)  # (n, n_head * d)
    return ops.matmul(out, w(b + "attn_output.weight"))  # (n, n_embd)


def delta_net_block(model, ops, rs: RecurrentInput, cur: np.ndarray, il: int) -> np.ndarray:
    """build_layer_attn_linear: (n, n_embd) -> (n, n_embd), updating layer `il`'s conv and delta-rule states of
    every sequence set of the ubatch."""
    hp = model.hparams
    w, t = model.weight, model.tensors
    b = f"blk.{il}."
    n = cur.shape[0]
    head, n_k_heads, n_v_heads = hp.ssm_d_state, hp.ssm_n_group, hp.ssm_dt_rank
    ratio = n_v_heads // n_k_heads
    key_dim, value_dim = head * n_k_heads, head * n_v_heads
    qkv, z = ops.matmuls(cur, [w(b + "attn_qkv.weight"), w(b + "attn_gate.weight")])  # (n, conv_dim), (n, value_dim)
    ba = ops.matmul(cur, w(b + "ssm_ba.weight")).reshape(n, n_k_heads, 2, ratio)  # per key head: betas, alphas
    beta = ops.sigmoid(ba[:, :, 0].reshape(n, n_v_heads))  # (n, n_v_heads)
    alpha = ba[:, :, 1].reshape(n, n_v_heads) + t[b + "ssm_dt.bias"]  # (n, n_v_heads)
    g = ops.softplus(alpha) * t[b + "ssm_a"]  # (n, n_v_heads): the log-decay, -exp(A_log) * softplus

    conv = ops.silu(rs.ssm_conv(ops, il, qkv, t[b + "ssm_conv1d.weight"]))  # (n, conv_dim), conv states updated
    q = ops.l2_norm(conv[:, :key_dim].reshape(n, n_k_heads, head), hp.f_norm_rms_eps)  # (n, n_k_heads, head)
    k_ = ops.l2_norm(conv[:, key_dim : 2 * key_dim].reshape(n, n_k_heads, head), hp.f_norm_rms_eps)
    v = conv[:, 2 * key_dim :].reshape(n, n_v_heads, head)  # (n, n_v_heads, head)
    if ratio > 1:  # repeat_interleave: value head h reads key head h // ratio
        q, k_ = _repeat_heads(q, ratio), _repeat_heads(k_, ratio)  # (n, n_v_heads, head)
    y = rs.gated_delta_net(ops, il, q, k_, v, g, beta)  # (n, n_v_heads, head), delta-rule states updated
    y = ops.rms_norm(y, t[b + "ssm_norm.weight"], hp.f_norm_rms_eps)  # (n, n_v_heads, head)
    y = y * ops.silu(z.reshape(n, n_v_heads, head))  # build_norm_gated
    return ops.matmul(y.reshape(n, value_dim), w(b + "ssm_out.weight"))  # (n, n_embd)


def _repeat_heads(x: np.ndarray, ratio: int) -> np.ndarray:
    """Each head `ratio` times in a row (ggml_repeat_4d of the (S, 1, H_k) view): the head's values concatenated
    ratio times, seen as ratio heads, so a recorded graph copies them with concat nodes.
    (n, H_k, S) -> (n, H_k * ratio, S)"""
    n, h_k, s = x.shape
    out = x
    for _ in range(ratio - 1):
        out = np.concatenate([out, x], axis=-1)  # (n, H_k, S * repeats)
    return out.reshape(n, h_k * ratio, s)

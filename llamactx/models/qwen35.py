"""The `qwen35` and `qwen35moe` architectures (Qwen3.5 / 3.6, dense and mixture of experts): src/models/qwen35.cpp,
qwen35moe.cpp and delta-net-base.cpp.

A hybrid: every `full_attention_interval`-th layer (4 in the released models; or the flags of
`attention.recurrent_layers`) is full attention, the others Gated DeltaNet layers with a recurrent state. Each
layer is pre-normed (RMS) with a residual, then post-attention-normed into a SwiGLU FFN with its own residual.

- Gated DeltaNet (build_layer_attn_linear): one projection to q | k | v (`attn_qkv`) runs through a causal depthwise
  convolution (ggml_ssm_conv, its last d_conv - 1 inputs kept as the sequence's conv state) and SiLU; q and k are
  L2-normed per head; beta = sigmoid(`ssm_beta` x), the log-decay g = softplus(`ssm_alpha` x + `ssm_dt`) * `ssm_a`;
  the gated delta rule (ggml_gated_delta_net, llamactx.ggml.delta_net) updates each value head's S x S state
  token by token; the output is RMS-normed per head (`ssm_norm`), times SiLU(`attn_gate` x), and projected back.
  llama.cpp runs the fused op on a CPU for prompts and single tokens alike, so both take the same path here.
- Full attention (build_layer_attn): `attn_q` is twice as wide, each head's query then its output gate; q and k are
  RMS-normed per head, rotated by IMRoPE (llamactx.ggml.mrope: text positions), attend over the KV cache with
  scale 1 / sqrtf(head_dim), and the output is multiplied by sigmoid(gate) before `attn_output`.

qwen35moe's FFN is build_moe_ffn (softmax router, the top n_expert_used weights normalized; models/moe.py) plus a
shared SwiGLU expert times sigmoid(`ffn_gate_inp_shexp` . x) (ggml_sigmoid, unlike qwen2moe's silu(g) / g).

The recurrent states are read and written through the input (RecurrentView.ssm_conv / gated_delta_net, the
sets of sequences looped there), so FastOps records the whole forward as one compiled program (GraphRecurrent:
the conv and the delta rule update the states in place), op by op only where the executor lacks something.

The multi-token-prediction blocks (`nextn_predict_layers`, the last blocks of the file) are not run: like
llama.cpp's main graph, the forward uses the first block_count - nextn_predict_layers layers only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.graph_inputs import ForwardResult, RecurrentInput, RopeConfig
from llamactx.models.llama import output_weight_name
from llamactx.models.moe import build_moe_ffn, expert_tensor_shapes

# llama_model_rope_type is LLAMA_ROPE_TYPE_IMROPE; the forward applies its sections itself (rope_imrope), and a KV
# shift rotates M-RoPE keys as NEOX (llama_kv_cache::build_rope_shift), which this type gives the context
ARCHS = {"qwen35": ROPE_TYPE_NEOX, "qwen35moe": ROPE_TYPE_NEOX}
MEMORY = "hybrid"  # llama_model::create_memory: llama_memory_hybrid
LAYER_KINDS = ("gated delta net", "full attention")  # (recurrent, attention): `llamactx info`


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_qwen35::load_arch_hparams: the delta-net layers' keys (delta_net_hparams) and IMRoPE's
    sections; qwen35moe's expert widths."""
    out = delta_net_hparams(m, hp)
    out["rope_sections"] = _rope_sections(m, hp)
    if m.arch == "qwen35moe":
        out.update(_expert_widths(m, hp))
    return out


def delta_net_hparams(m: Meta, hp: dict) -> dict:
    """The ssm.* keys of the delta-net layers and which layers are recurrent (qwen35, qwen35moe and qwen3next
    alike), with the consistency the graph needs (d_inner = d_state * time_step_rank, value heads a multiple of key
    heads), each refused naming its key; the NextN / MTP blocks at the end are not run."""
    out = {"ssm_d_conv": m.count("ssm.conv_kernel", lo=2), "ssm_d_inner": m.count("ssm.inner_size"),
           "ssm_d_state": m.count("ssm.state_size"), "ssm_dt_rank": m.count("ssm.time_step_rank"),
           "ssm_n_group": m.count("ssm.group_count")}
    if out["ssm_d_inner"] != out["ssm_d_state"] * out["ssm_dt_rank"]:
        raise HParamsError(f"'{m.arch}.ssm.inner_size' = {out['ssm_d_inner']} must be ssm.state_size * "
                           f"ssm.time_step_rank = {out['ssm_d_state']} * {out['ssm_dt_rank']} (value heads of "
                           f"state_size)")
    if out["ssm_dt_rank"] % out["ssm_n_group"]:
        raise HParamsError(f"'{m.arch}.ssm.group_count' = {out['ssm_n_group']} does not divide "
                           f"'{m.arch}.ssm.time_step_rank' = {out['ssm_dt_rank']}")
    n_layer_all = hp["n_layer"]
    nextn = m.count("nextn_predict_layers", 0, lo=0, hi=n_layer_all - 1)
    n_layer = n_layer_all - nextn
    out.update(n_layer=n_layer, swa_layers=(False,) * n_layer)
    out["recurrent_layers"] = _recurrent_layers(m, n_layer, n_layer_all)
    return out


def _expert_widths(m: Meta, hp: dict) -> dict:
    """llama_model_qwen35moe::load_arch_hparams: an expert's width (expert_feed_forward_length, default n_ff /
    n_expert_used) and the shared expert's (expert_shared_feed_forward_length, default n_ff); experts required."""
    if not hp["n_expert"]:
        raise HParamsError(f"'{m.arch}.expert_count' is missing or 0: {m.arch} needs experts")
    return {"n_ff_exp": m.count("expert_feed_forward_length", hp["n_ff"] // hp["n_expert_used"]),
            "n_ff_shexp": m.count("expert_shared_feed_forward_length", hp["n_ff"])}


def _rope_sections(m: Meta, hp: dict) -> tuple[int, ...]:
    """rope.dimension_sections (required, up to 4 values): IMRoPE's (t, h, w, e) pair counts."""
    key = f"{m.arch}.rope.dimension_sections"
    value = m.meta.get(key)
    if value is None:
        raise HParamsError(f"GGUF metadata key '{key}' is missing")
    values = [value] if isinstance(value, int) else value
    kind = getattr(values, "dtype", None)
    if not (isinstance(values, list) or kind is not None and kind.kind in "iu") or not 1 <= len(values) <= 4 \
            or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in values):
        raise HParamsError(f"GGUF metadata key '{key}' = {value!r}: expected 1 to 4 counts >= 0")
    sections = tuple(int(v) for v in values) + (0,) * (4 - len(values))
    if not 0 < sum(sections) <= hp["n_embd_head_k"]:  # ggml_rope_multi: sect_dims <= ne0, some section > 0
        raise HParamsError(f"GGUF metadata key '{key}' = {list(sections)}: the sum must be in [1, "
                           f"{hp['n_embd_head_k']}] (the head size)")
    return sections


def _recurrent_layers(m: Meta, n_layer: int, n_layer_all: int) -> tuple[bool, ...]:
    """attention.recurrent_layers (one flag per block) if present, else every layer but each
    full_attention_interval-th (default 4) is recurrent."""
    key = f"{m.arch}.attention.recurrent_layers"
    flags = m.meta.get(key)
    if flags is not None:
        if getattr(flags, "dtype", None) is None or len(flags) != n_layer_all:
            raise HParamsError(f"GGUF metadata key '{key}': expected {n_layer_all} per-layer flags")
        return tuple(bool(f) for f in flags[:n_layer])
    interval = m.count("full_attention_interval", 4, lo=1)
    return tuple((il + 1) % interval != 0 for il in range(n_layer))


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_qwen35::load_arch_tensors (the trunk): name -> (ggml shape, required). The delta-net projections
    (attn_qkv, attn_gate) are optional to llama.cpp's loader but used by its graph: required here."""
    head, n_v_heads = hp.ssm_d_state, hp.ssm_dt_rank
    key_dim, value_dim = head * hp.ssm_n_group, head * n_v_heads
    conv_dim = 2 * key_dim + value_dim
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
            b + "post_attention_norm.weight": ((hp.n_embd,), True),
        })
        shapes.update(_ffn_shapes(hp, b))
        if hp.is_recr(il):
            shapes.update({
                b + "attn_qkv.weight": ((hp.n_embd, conv_dim), True),
                b + "attn_gate.weight": ((hp.n_embd, value_dim), True),
                b + "ssm_conv1d.weight": ((hp.ssm_d_conv, conv_dim), True),
                b + "ssm_dt.bias": ((n_v_heads,), True),
                b + "ssm_a": ((n_v_heads,), True),
                b + "ssm_beta.weight": ((hp.n_embd, n_v_heads), True),
                b + "ssm_alpha.weight": ((hp.n_embd, n_v_heads), True),
                b + "ssm_norm.weight": ((head,), True),
                b + "ssm_out.weight": ((value_dim, hp.n_embd), True),
            })
        else:
            shapes.update({
                b + "attn_q.weight": ((hp.n_embd, 2 * n_q), True),
                b + "attn_k.weight": ((hp.n_embd, hp.n_embd_k_gqa), True),
                b + "attn_v.weight": ((hp.n_embd, hp.n_embd_v_gqa), True),
                b + "attn_output.weight": ((n_q, hp.n_embd), True),
                b + "attn_q_norm.weight": ((hp.n_embd_head_k,), True),
                b + "attn_k_norm.weight": ((hp.n_embd_head_k,), True),
            })
    return shapes


def _ffn_shapes(hp: HParams, b: str) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A dense SwiGLU FFN (qwen35), or the router, the experts and the shared expert (qwen35moe)."""
    if not hp.n_expert:
        return {b + "ffn_gate.weight": ((hp.n_embd, hp.n_ff), True), b + "ffn_up.weight": ((hp.n_embd, hp.n_ff), True),
                b + "ffn_down.weight": ((hp.n_ff, hp.n_embd), True)}
    return {**expert_tensor_shapes(hp, b),
            b + "ffn_gate_inp_shexp.weight": ((hp.n_embd,), True),
            b + "ffn_gate_shexp.weight": ((hp.n_embd, hp.n_ff_shexp), True),
            b + "ffn_up_shexp.weight": ((hp.n_embd, hp.n_ff_shexp), True),
            b + "ffn_down_shexp.weight": ((hp.n_ff_shexp, hp.n_embd), True)}


def refused_tensors(hp: HParams) -> dict[str, str]:
    """What llama.cpp would also take and this forward does not compute: in an attention layer a fused attn_qkv or
    q/k/v biases (create_tensor_qkv), fused gate|up experts (create_tensor_gate_up_exps)."""
    out = {}
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        if hp.n_expert:
            out[b + "ffn_gate_up_exps.weight"] = "fused gate|up experts are not supported"
        if hp.is_recr(il):
            continue
        out[b + "attn_qkv.weight"] = "a fused q|gate|k|v projection in an attention layer is not supported"
        for part in ("qkv", "q", "k", "v"):
            out[f"{b}attn_{part}.bias"] = "attention biases are not supported for qwen35"
    return out


def build(ops, params: GraphParams) -> ForwardResult:
    """One ubatch through the network (llama_model_qwen35::graph). inp: attention for the attention layers, the
    recurrent view for the delta-net layers."""
    return hybrid_trunk(ops, params, delta_net_block, attention_block)


def hybrid_trunk(ops, params: GraphParams, delta_block, attn_block) -> ForwardResult:
    """The layers shared by qwen35, qwen35moe and qwen3next: a pre-norm delta-net or attention block (the
    architecture's own), the post-attention norm and ffn_block, residuals around each; the final norm on the output
    rows and the output head. params.inp: a HybridInput."""
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
            cur = delta_block(model, ops, inp.rs, cur, il)
        else:
            cur = attn_block(model, ops, inp.attn, cur, pos, rope, il)
        x = cur + x  # (n, n_embd)
        ffn = ops.rms_norm(x, t[b + "post_attention_norm.weight"], eps)
        x = ffn_block(model, ops, ffn, b) + x  # (n, n_embd)
    # embeddings_nextn_masked is off: the last layer runs on every token, the rows are picked after the norm
    x = ops.rms_norm(x, t["output_norm.weight"], eps)[out_ids]  # (n_out, n_embd)
    logits = ops.matmul(x, w(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)


def ffn_block(model, ops, cur: np.ndarray, b: str) -> np.ndarray:
    """build_layer_ffn: SwiGLU (qwen35), or routed experts plus the sigmoid-gated shared expert (qwen35moe).
    (n, n_embd) -> (n, n_embd)"""
    w = model.weight
    if not model.hparams.n_expert:
        gate, up = ops.matmuls(cur, [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])  # (n, n_ff) each
        return ops.matmul(ops.swiglu(gate, up), w(b + "ffn_down.weight"))  # (n, n_embd)
    moe = build_moe_ffn(model, ops, cur, b, norm_w=True)  # (n, n_embd); expert_weights_scale is not read: 0
    gate, up = ops.matmuls(cur, [w(b + "ffn_gate_shexp.weight"), w(b + "ffn_up_shexp.weight")])  # (n, n_ff_shexp)
    shexp = ops.matmul(ops.swiglu(gate, up), w(b + "ffn_down_shexp.weight"))  # (n, n_embd)
    vec = w(b + "ffn_gate_inp_shexp.weight")  # (n_embd,): ggml_mul_mat of a 1-D tensor, one output column
    g = ops.matmul(cur, dataclasses.replace(vec, shape=(vec.shape[0], 1), data=vec.data.reshape(1, -1)))  # (n, 1)
    return moe + shexp * ops.sigmoid(g)  # (n, n_embd)


def attention_block(model, ops, attn, cur: np.ndarray, pos: np.ndarray, rope: RopeConfig, il: int) -> np.ndarray:
    """build_layer_attn: gated-query attention with IMRoPE. (n, n_embd) -> (n, n_embd)"""
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
    q = ops.rope_imrope(q, pos, rp, hp.rope_sections)
    k = ops.rope_imrope(k, pos, rp, hp.rope_sections)
    kq_scale = float(np.float32(1.0) / np.sqrt(np.float32(d)))  # 1.0f / sqrtf(float(n_embd_head))
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
    key_dim, value_dim = head * n_k_heads, head * n_v_heads
    qkv, z = ops.matmuls(cur, [w(b + "attn_qkv.weight"), w(b + "attn_gate.weight")])  # (n, conv_dim), (n, value_dim)
    beta = ops.sigmoid(ops.matmul(cur, w(b + "ssm_beta.weight")))  # (n, n_v_heads)
    alpha = ops.matmul(cur, w(b + "ssm_alpha.weight")) + t[b + "ssm_dt.bias"]  # (n, n_v_heads)
    g = ops.softplus(alpha) * t[b + "ssm_a"]  # (n, n_v_heads): the log-decay, -exp(A_log) * softplus

    conv = ops.silu(rs.ssm_conv(ops, il, qkv, t[b + "ssm_conv1d.weight"]))  # (n, conv_dim), conv states updated
    q = ops.l2_norm(conv[:, :key_dim].reshape(n, n_k_heads, head), hp.f_norm_rms_eps)  # (n, n_k_heads, head)
    k_ = ops.l2_norm(conv[:, key_dim : 2 * key_dim].reshape(n, n_k_heads, head), hp.f_norm_rms_eps)
    v = conv[:, 2 * key_dim :].reshape(n, n_v_heads, head)  # (n, n_v_heads, head)
    y = rs.gated_delta_net(ops, il, q, k_, v, g, beta)  # (n, n_v_heads, head), delta-rule states updated
    y = ops.rms_norm(y, t[b + "ssm_norm.weight"], hp.f_norm_rms_eps)  # (n, n_v_heads, head)
    y = y * ops.silu(z.reshape(n, n_v_heads, head))  # build_norm_gated
    return ops.matmul(y.reshape(n, value_dim), w(b + "ssm_out.weight"))  # (n, n_embd)

"""The `deepseek2` architecture (DeepSeek-V2 / V2-Lite / V3, Kimi K2, GLM-4.7-Flash, GigaChat 3): src/models/
deepseek2.cpp (llama_model_deepseek2), with multi-head latent attention (MLA) in its absorbed form.

Attention: Q is low-rank (attn_q_a, its RMS norm attn_q_a_norm, attn_q_b; the Lite models a plain attn_q), each
head `key_length_mla` wide: a "nope" part and a RoPE part of n_rot. K and V come from one compressed latent per
token: attn_kv_a_mqa gives the latent (kv_lora_rank, RMS-normed by attn_kv_a_norm) and one RoPE key shared by all
heads. The cache stores only [latent | rope key] per token (llm_graph_input_attn_k: one KV head of
kv_lora_rank + n_rot, V a view of the latent; `hparams.is_mla()`). Each head's query is absorbed into the latent
space (attn_k_b, one (qk_nope -> kv_lora_rank) matrix per head: ggml_mul_mat of the 3-D weight, head by head), so
attention is MQA over the cache; each head's output is decompressed by attn_v_b (build_attn_mha's v_mla), then
attn_output. RoPE rotates adjacent pairs (NORM); the KQ scale is mscale^2 / sqrt(key_length_mla) with YaRN's
mscale. FFN: the first `leading_dense_block_count` layers are SwiGLU; the others route to experts (softmax or
sigmoid gating, DeepSeek-V3's selection bias exp_probs_b and expert groups, weight normalization and scaling) beside
`expert_shared_count` shared experts (one SwiGLU FFN). NextN (MTP) layers after the trunk are loaded and skipped.
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NORM
from llamactx.ggml.libm import libm as ggml_libm
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.graph_inputs import AttentionInput, ForwardResult, RopeConfig
from llamactx.models.llama import output_weight_name
from llamactx.models.moe import build_moe_ffn, expert_tensor_shapes

ARCHS = {"deepseek2": ROPE_TYPE_NORM}  # llama_model_rope_type
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache, K only (is_mla)
V_LENGTH_FREE = True  # value_length (kv_lora_rank) differs from key_length (kv_lora_rank + n_rot)

_F32 = np.float32
# llama_expert_gating_func_type: 0 (none) is softmax for DeepSeek V2 / V2.5 files written without the key
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_deepseek2::load_arch_hparams: the low ranks (q_lora_rank required except for the Lite layer
    counts; 0 = a plain attn_q), the MLA head sizes, dense leading layers, experts and their router, the YaRN log
    multiplier (written times 0.1 by the converter, divided back). Only the MLA layout is run: its cache is one KV
    head of key_length = kv_lora_rank + n_rot, value_length = kv_lora_rank."""
    n_layer_all = hp["n_layer"]
    n_vocab = hp["n_vocab"]
    is_lite = n_layer_all in (27, 26) or (n_layer_all == 48 and n_vocab == 128256)
    f = dict(n_lora_q=m.count("attention.q_lora_rank", 0 if is_lite else None, lo=0),
             n_lora_kv=m.count("attention.kv_lora_rank"),
             n_embd_head_k_mla=m.count("attention.key_length_mla", 0, lo=0),
             n_embd_head_v_mla=m.count("attention.value_length_mla", 0, lo=0))
    if not (f["n_embd_head_k_mla"] and f["n_embd_head_v_mla"]):
        raise HParamsError(f"'{m.arch}.attention.key_length_mla' / 'value_length_mla' are missing: a {m.arch} file "
                           f"without the split attn_k_b / attn_v_b (MLA) layout is not supported")
    for key, value, want in (("attention.key_length", hp["n_embd_head_k"], f["n_lora_kv"] + hp["n_rot"]),
                             ("attention.value_length", hp["n_embd_head_v"], f["n_lora_kv"]),
                             ("attention.head_count_kv", hp["n_head_kv"], 1)):
        if value != want:
            raise HParamsError(f"'{m.arch}.{key}' = {value}: MLA's cache needs {want} (kv_lora_rank = "
                               f"{f['n_lora_kv']}, rope.dimension_count = {hp['n_rot']})")
    if f["n_embd_head_k_mla"] <= hp["n_rot"]:
        raise HParamsError(f"'{m.arch}.attention.key_length_mla' = {f['n_embd_head_k_mla']}: must exceed "
                           f"rope.dimension_count = {hp['n_rot']}")
    f.update(deepseek_experts(m, hp))
    gating = m.get("expert_gating_func", int, 0)
    if gating == 0:
        gating = 2 if n_layer_all in (47, 48) and n_vocab == 154880 else 1  # GLM 4.7 Lite: sigmoid
    if gating not in GATING:
        raise HParamsError(f"'{m.arch}.expert_gating_func' = {gating} is not supported (1 softmax, 2 sigmoid, "
                           f"3 softmax_weight)")
    f["expert_gating_func"] = GATING[gating]
    if f"{m.arch}.rope.scaling.yarn_log_multiplier" in m.meta:  # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]
        f["rope_yarn_log_mul"] = float(_F32(hp["rope_yarn_log_mul"]) / _F32(0.1))
    if f"{m.arch}.attention.temperature_scale" in m.meta:
        raise HParamsError(f"'{m.arch}.attention.temperature_scale' (Mistral Large's attention temperature) is not "
                           f"supported for {m.arch}")
    return f


def deepseek_experts(m: Meta, hp: dict, n_ff_exp_default: int = 0) -> dict:
    """The keys of DeepSeek-style mixtures of experts (deepseek2, glm4moe): leading dense layers, the trunk
    without the NextN layers, an expert's width (`n_ff_exp_default` where the key holds 0: glm4moe's
    n_ff / n_expert_used) and the shared experts', the router's weight normalization and scale, expert groups
    (llama_model::load_hparams asserts them)."""
    n_layer_all = hp["n_layer"]
    n_nextn = m.count("nextn_predict_layers", 0, lo=0, hi=n_layer_all - 1)
    n_layer = n_layer_all - n_nextn
    if not hp["n_expert"]:
        raise HParamsError(f"'{m.arch}.expert_count' is missing or 0: {m.arch} needs experts")
    if isinstance(m.meta.get(f"{m.arch}.expert_feed_forward_length"), np.ndarray):
        raise HParamsError(f"'{m.arch}.expert_feed_forward_length' per layer is not supported (one width expected)")
    n_ff_exp = m.count("expert_feed_forward_length", lo=0 if n_ff_exp_default else 1) or n_ff_exp_default
    n_shared = m.count("expert_shared_count", lo=0)
    norm = m.meta.get(f"{m.arch}.expert_weights_norm", False)
    if not isinstance(norm, bool):
        raise HParamsError(f"GGUF metadata key '{m.arch}.expert_weights_norm': expected a bool, got {norm!r}")
    n_groups = m.count("expert_group_count", 0, lo=0)
    n_group_used = m.count("expert_group_used_count", 0, lo=0)
    if n_groups > 1:
        per = hp["n_expert"] // n_groups
        if n_groups >= hp["n_expert"] or hp["n_expert"] % n_groups or per < 2 or not 0 < n_group_used < n_groups:
            raise HParamsError(f"'{m.arch}.expert_group_count' = {n_groups}, expert_group_used_count = {n_group_used}: "
                               f"expected groups of at least 2 of the {hp['n_expert']} experts and 0 < used < groups")
    return dict(n_layer=n_layer, n_layer_nextn=n_nextn, swa_layers=hp["swa_layers"][:n_layer],
                n_layer_dense_lead=m.count("leading_dense_block_count", 0, lo=0, hi=n_layer),
                n_ff_exp=n_ff_exp, n_expert_shared=n_shared, n_ff_shexp=n_ff_exp * n_shared,
                expert_weights_norm=norm, expert_weights_scale=m.real("expert_weights_scale", 0.0, zero_ok=True),
                n_expert_groups=n_groups, n_group_used=n_group_used)


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_deepseek2::load_arch_tensors (the MLA layout; the NextN layers' tensors are not required and
    not read: TENSOR_SKIP without load_mtp)."""
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
    }
    n_nope = hp.n_embd_head_k_mla - hp.n_rot
    n_q = hp.n_head * hp.n_embd_head_k_mla
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "attn_kv_a_norm.weight": ((hp.n_lora_kv,), True),
            b + "attn_kv_a_mqa.weight": ((hp.n_embd, hp.n_lora_kv + hp.n_rot), True),
            b + "attn_k_b.weight": ((n_nope, hp.n_lora_kv, hp.n_head), True),
            b + "attn_v_b.weight": ((hp.n_lora_kv, hp.n_embd_head_v_mla, hp.n_head), True),
            b + "attn_output.weight": ((hp.n_head * hp.n_embd_head_v_mla, hp.n_embd), True),
        })
        if hp.n_lora_q:
            shapes.update({
                b + "attn_q_a_norm.weight": ((hp.n_lora_q,), True),
                b + "attn_q_a.weight": ((hp.n_embd, hp.n_lora_q), True),
                b + "attn_q_b.weight": ((hp.n_lora_q, n_q), True),
            })
        else:
            shapes[b + "attn_q.weight"] = ((hp.n_embd, n_q), True)
        shapes.update(ffn_tensor_shapes(hp, il))
    return shapes


def ffn_tensor_shapes(hp: HParams, il: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A layer's FFN norm and FFN: SwiGLU in the leading dense layers, else the experts, their optional selection
    bias and the shared experts (deepseek2, glm4moe)."""
    b = f"blk.{il}."
    shapes = {b + "ffn_norm.weight": ((hp.n_embd,), True)}
    if il < hp.n_layer_dense_lead:
        shapes.update({
            b + "ffn_gate.weight": ((hp.n_embd, hp.n_ff), True),
            b + "ffn_up.weight": ((hp.n_embd, hp.n_ff), True),
            b + "ffn_down.weight": ((hp.n_ff, hp.n_embd), True),
        })
        return shapes
    shapes.update(expert_tensor_shapes(hp, b))
    shapes[b + "exp_probs_b.bias"] = ((hp.n_expert,), False)
    if hp.n_ff_shexp:
        shapes.update({
            b + "ffn_gate_shexp.weight": ((hp.n_embd, hp.n_ff_shexp), True),
            b + "ffn_up_shexp.weight": ((hp.n_embd, hp.n_ff_shexp), True),
            b + "ffn_down_shexp.weight": ((hp.n_ff_shexp, hp.n_embd), True),
        })
    return shapes


def refused_tensors(hp: HParams) -> dict[str, str]:
    """Fused expert matrices (create_tensor_gate_up_exps would use them) and the legacy unsplit attn_kv_b."""
    refused = {}
    for il in range(hp.n_layer):
        refused[f"blk.{il}.ffn_gate_up_exps.weight"] = "fused gate+up experts are not supported"
        refused[f"blk.{il}.attn_kv_b.weight"] = ("the legacy unsplit attn_kv_b is not supported (MLA needs attn_k_b "
                                                 "/ attn_v_b)")
    return refused


def kq_scale(hp: HParams, rope: RopeConfig) -> float:
    """mscale^2 / sqrtf(key_length_mla), the YaRN magnitude pre-scaled into the KQ scale (TAG_DEEPSEEK2_YARN_LOG_
    MUL_FIX): attn_factor_org = attn_factor * (1 + 0.1 lnf(1 / freq_scale)), mscale = attn_factor_org *
    (1 + 0.1 log_mul lnf(1 / freq_scale)), in float with libm's logf and the fmaf GCC contracts them to."""
    libm = ggml_libm()
    rp = rope.full
    ln = libm.logf(libm.f32(1.0 / libm.f32(rp.freq_scale)))
    org = libm.f32(libm.f32(rp.attn_factor) * libm.fmaf(0.1, ln, 1.0))
    mscale = libm.f32(org * libm.fmaf(libm.f32(_F32(0.1) * _F32(hp.rope_yarn_log_mul)), ln, 1.0))
    return float(_F32(mscale * mscale) / np.sqrt(_F32(hp.n_embd_head_k_mla)))


def mla_attention(model, ops, cur: np.ndarray, b: str, il: int, pos: np.ndarray, attn: AttentionInput,
                  rope: RopeConfig, scale: float) -> np.ndarray:
    """deepseek2's self-attention with the absorption optimization. cur (n, n_embd) -> (n, n_embd)"""
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    n, n_rank, n_nope = len(pos), hp.n_lora_kv, hp.n_embd_head_k_mla - hp.n_rot
    if hp.n_lora_q:
        q = ops.matmul(cur, w(b + "attn_q_a.weight"))  # (n, q_lora_rank)
        q = ops.matmul(ops.rms_norm(q, t[b + "attn_q_a_norm.weight"], eps), w(b + "attn_q_b.weight"))
    else:
        q = ops.matmul(cur, w(b + "attn_q.weight"))  # (n, n_head * key_length_mla)
    q = q.reshape(n, hp.n_head, hp.n_embd_head_k_mla)
    kv_cmpr_pe = ops.matmul(cur, w(b + "attn_kv_a_mqa.weight"))  # (n, kv_lora_rank + n_rot)
    rp = rope.for_layer(False)
    k_pe = ops.rope(kv_cmpr_pe[:, n_rank:].copy().reshape(n, 1, hp.n_rot), pos, rp)  # (n, 1, n_rot)
    kv_cmpr = ops.rms_norm(kv_cmpr_pe[:, :n_rank].copy(), t[b + "attn_kv_a_norm.weight"], eps)  # (n, rank)
    q_pe = ops.rope(q[:, :, n_nope:].copy(), pos, rp)  # (n, n_head, n_rot)
    q_absorbed = ops.matmul_heads(q[:, :, :n_nope].copy(), w(b + "attn_k_b.weight"))  # (n, n_head, kv_lora_rank)
    q_cur = np.concatenate([q_absorbed, q_pe], axis=2)  # (n, n_head, kv_lora_rank + n_rot)
    k_cur = np.concatenate([kv_cmpr, k_pe.reshape(n, hp.n_rot)], axis=1).reshape(n, 1, -1)  # (n, 1, rank + n_rot)
    kqv = attn(il, q_cur, k_cur, kv_cmpr.reshape(n, 1, n_rank), scale)  # (n, n_head * kv_lora_rank)
    out = ops.matmul_heads(kqv.reshape(n, hp.n_head, n_rank), w(b + "attn_v_b.weight"))  # (n, n_head, v_mla)
    return ops.matmul(out.reshape(n, -1), w(b + "attn_output.weight"))  # (n, n_embd)


def ffn(model, ops, cur: np.ndarray, il: int) -> np.ndarray:
    """A dense leading layer's SwiGLU, or the routed experts plus the shared experts (build_ffn LLM_FFN_SILU,
    LLM_FFN_PAR), added. cur (n, n_embd) -> (n, n_embd)"""
    hp = model.hparams
    w = model.weight
    b = f"blk.{il}."
    if il < hp.n_layer_dense_lead:
        gate, up = ops.matmuls(cur, [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])  # (n, n_ff) each
        return ops.matmul(ops.swiglu(gate, up), w(b + "ffn_down.weight"))
    moe_out = build_moe_ffn(model, ops, cur, b, norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                            gating=hp.expert_gating_func)  # (n, n_embd)
    if not hp.n_ff_shexp:
        return moe_out
    gate, up = ops.matmuls(cur, [w(b + "ffn_gate_shexp.weight"), w(b + "ffn_up_shexp.weight")])
    return moe_out + ops.matmul(ops.swiglu(gate, up), w(b + "ffn_down_shexp.weight"))  # (n, n_embd)


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_deepseek2::graph): computed by `ops` as it is built, or recorded
    (the compiled graph has the per-head matmuls, the head slices and the concatenations MLA needs)."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    t = model.tensors
    eps = hp.f_norm_rms_eps
    scale = kq_scale(hp, rope)
    x = ops.get_rows(model.weight("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        cur = mla_attention(model, ops, cur, b, il, pos, attn, rope, scale)  # (n, n_embd)
        if il == hp.n_layer - 1:  # only the output rows go through the last FFN
            cur, x = cur[out_ids], x[out_ids]
        x = cur + x  # ffn_inp
        x = ffn(model, ops, ops.rms_norm(x, t[b + "ffn_norm.weight"], eps), il) + x  # (n, n_embd)
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = ops.matmul(x, model.weight(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)

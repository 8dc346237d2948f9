"""The `gemma4` architecture (Gemma 4 text models): src/models/gemma4.cpp (llama_model_gemma4).

Differences from gemma3: the sliding-window and the global layers have their own head size and KV head count
(`attention.key_length_swa`, `attention.head_count_kv` per layer), so the two KV caches of the iSWA memory have
rows of different widths; the global layers use "proportional" RoPE, all of their head rotated with
`rope_freqs.weight` as frequency factors (1e30 past the rotated fraction: those pairs keep angle ~0); the last
`attention.shared_kv_layers` layers compute no K/V and attend over the KV of the last sliding-window or global
layer that has one (llama_model::create_memory's `reuse`); V is RMS-normed without a weight; the attention scale is
1 (q is not scaled); a layer may end with a scalar `layer_output_scale`; without `attn_v` a layer uses its K
projection as V. The E models (E2B / E4B) add per-layer token embeddings: `per_layer_token_embd` rows (one slice per
layer) plus a projection of the input embeddings, and after each layer's FFN a GELU gate times its slice, projected
back and added. The MoE model (26B-A4B): every layer's dense GELU FFN beside n_expert GELU experts (their gate and
up fused in `ffn_gate_up_exps`, a per-expert scale `ffn_down_exps.scale`), each branch with its own norms, the
router reading the RMS-normed residual times 1/sqrt(n_embd) and `ffn_gate_inp.scale`. Embeddings scaled by
sqrt(n_embd); GELU-gated FFN; post-attention / post-FFN norms; the final logits soft-capped where
`final_logit_softcapping` is set.

Not computed (refused at load, naming the tensor): the fused `attn_qkv`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, HParamsError, Meta, swa_pattern
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import output_weight_name

ARCHS = {"gemma4": ROPE_TYPE_NEOX}  # llama_model_rope_type
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache_iswa with the shared layers' `reuse`
PER_LAYER_HEADS = True  # attention.head_count_kv may hold one value per layer (read_hparams)

_F32 = np.float32


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_gemma4::load_arch_hparams (and load_hparams' *_swa keys): the sliding window and its per-layer
    flags, the shared KV layers, the sliding-window layers' head size and rotated dimensions, the per-layer KV head
    counts, the per-layer embedding width and the logit soft-cap. The layers of one kind must agree on their KV
    head count (each kind's cache has one row width), and the shared layers need a sliding-window and a global
    layer with KV just before them (the layers `reuse` names)."""
    n_layer = hp["n_layer"]
    n_swa = m.count("attention.sliding_window")
    key = f"{m.arch}.attention.sliding_window_pattern"
    if getattr(m.meta.get(key), "dtype", None) is None:  # ml.get_arr: required, one flag per layer
        raise HParamsError(f"GGUF metadata key '{key}' must hold {n_layer} per-layer flags (got "
                           f"{m.meta.get(key)!r})")
    swa_layers = swa_pattern(m, n_layer, n_swa)
    n_shared = m.count("attention.shared_kv_layers", 0, lo=0, hi=max(0, n_layer - 2))
    n_kv_from_start = n_layer - n_shared
    if n_shared and not (swa_layers[n_kv_from_start - 2] and not swa_layers[n_kv_from_start - 1]):
        raise HParamsError(f"'{m.arch}.attention.shared_kv_layers' = {n_shared}: layers {n_kv_from_start - 2} and "
                           f"{n_kv_from_start - 1} must be a sliding-window and a global layer (the KV the shared "
                           f"layers read), the pattern says {swa_layers[n_kv_from_start - 2 : n_kv_from_start]}")
    head_swa = m.count("attention.key_length_swa")
    if m.count("attention.value_length_swa") != head_swa:
        raise HParamsError(f"'{m.arch}.attention.value_length_swa' differs from key_length_swa = {head_swa}; "
                           f"Gemma 4 requires them equal")
    n_rot_swa = m.count("rope.dimension_count_swa", head_swa, hi=head_swa)
    if n_rot_swa % 2:
        raise HParamsError(f"'{m.arch}.rope.dimension_count_swa' = {n_rot_swa}: expected an even number")
    n_head_kv_arr = _kv_heads(m, n_layer, swa_layers, hp["n_head_kv"])
    return dict(n_swa=n_swa, swa_layers=swa_layers, n_layer_kv_from_start=n_kv_from_start,
                n_embd_head_k_swa=head_swa, n_rot_swa=n_rot_swa, n_head_kv_arr=n_head_kv_arr,
                n_head_kv=n_head_kv_arr[swa_layers.index(False)] if False in swa_layers else hp["n_head_kv"],
                n_embd_per_layer=m.count("embedding_length_per_layer_input", lo=0),
                f_attention_scale=1.0,  # self.scaling = 1.0: attention with kq_scale 1, q not scaled
                f_final_logit_softcapping=m.real("final_logit_softcapping", 0.0, zero_ok=True),
                embd_scale=math.sqrt(hp["n_embd"]),
                n_ff_exp=m.count("expert_feed_forward_length", None if hp["n_expert"] else 0,
                                 lo=1 if hp["n_expert"] else 0))


def _kv_heads(m: Meta, n_layer: int, swa_layers: tuple[bool, ...], n_head_kv: int) -> tuple[int, ...]:
    """attention.head_count_kv per layer (one value for every layer if it is a number); one count per layer kind."""
    key = f"{m.arch}.attention.head_count_kv"
    value = m.meta.get(key)
    per_layer = tuple(int(v) for v in value) if getattr(value, "dtype", None) is not None else (n_head_kv,) * n_layer
    for kind in (True, False):
        counts = {v for v, swa in zip(per_layer, swa_layers, strict=True) if swa == kind}
        if len(counts) > 1:
            raise HParamsError(f"GGUF metadata key '{key}' = {list(per_layer)}: the "
                               f"{'sliding-window' if kind else 'global'} layers have different KV head counts "
                               f"{sorted(counts)}; llamactx keeps one KV row width per layer kind")
    return per_layer


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_gemma4::load_arch_tensors for the dense models: the output matrix may be absent (tied to the
    token embeddings); `rope_freqs.weight` (the global layers' proportional RoPE) is required once; a layer
    without KV needs no K projection or K norm, `attn_v` is optional (V = K), `layer_output_scale` optional; the
    E models' per-layer embedding tensors; each layer's FFN as wide as feed_forward_length says for it (a
    double-wide MLP in the shared KV layers)."""
    n_pl = hp.n_embd_per_layer
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
        "output_norm.weight": ((hp.n_embd,), True),
    }
    if not all(hp.swa_layers):
        shapes["rope_freqs.weight"] = ((hp.n_embd_head_k // 2,), True)
    if n_pl:
        shapes.update({
            "per_layer_token_embd.weight": ((n_pl * hp.n_layer, hp.n_vocab), True),
            "per_layer_model_proj.weight": ((hp.n_embd, n_pl * hp.n_layer), True),
            "per_layer_proj_norm.weight": ((n_pl,), True),
        })
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        head, n_q, n_gqa = hp.layer_head_size(il), hp.layer_head_size(il) * hp.n_head, hp.layer_n_embd_gqa(il)
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "attn_q.weight": ((hp.n_embd, n_q), True),
            b + "attn_k.weight": ((hp.n_embd, n_gqa), hp.has_kv(il)),
            b + "attn_v.weight": ((hp.n_embd, n_gqa), False),
            b + "attn_output.weight": ((n_q, hp.n_embd), True),
            b + "attn_q_norm.weight": ((head,), True),
            b + "attn_k_norm.weight": ((head,), hp.has_kv(il)),
            b + "post_attention_norm.weight": ((hp.n_embd,), True),
            b + "layer_output_scale.weight": ((1,), False),
            b + "ffn_norm.weight": ((hp.n_embd,), True),
            b + "ffn_gate.weight": ((hp.n_embd, hp.layer_n_ff(il)), True),
            b + "ffn_up.weight": ((hp.n_embd, hp.layer_n_ff(il)), True),
            b + "ffn_down.weight": ((hp.layer_n_ff(il), hp.n_embd), True),
            b + "post_ffw_norm.weight": ((hp.n_embd,), True),
        })
        if hp.n_expert:
            shapes.update(expert_tensor_shapes(hp, b))
        if n_pl:
            shapes.update({
                b + "inp_gate.weight": ((hp.n_embd, n_pl), True),
                b + "proj.weight": ((n_pl, hp.n_embd), True),
                b + "post_norm.weight": ((hp.n_embd,), True),
            })
    return shapes


def expert_tensor_shapes(hp: HParams, b: str) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A MoE layer's router (its weight and input scale), the experts' branch norms and the stacked experts: gate
    and up fused (`ffn_gate_up_exps`, as convert_hf_to_gguf.py writes Gemma 4), down, and down's per-expert scale
    (optional)."""
    return {
        b + "ffn_gate_inp.weight": ((hp.n_embd, hp.n_expert), True),
        b + "ffn_gate_inp.scale": ((hp.n_embd,), True),
        b + "pre_ffw_norm_2.weight": ((hp.n_embd,), True),
        b + "post_ffw_norm_1.weight": ((hp.n_embd,), True),
        b + "post_ffw_norm_2.weight": ((hp.n_embd,), True),
        b + "ffn_gate_up_exps.weight": ((hp.n_embd, 2 * hp.n_ff_exp, hp.n_expert), True),
        b + "ffn_down_exps.weight": ((hp.n_ff_exp, hp.n_embd, hp.n_expert), True),
        b + "ffn_down_exps.scale": ((hp.n_expert,), False),
    }


def refused_tensors(hp: HParams) -> dict[str, str]:
    """What llama_model_gemma4 would use but this module does not compute: a fused q/k/v matrix, separate expert
    gate / up matrices."""
    out = {}
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        out[b + "attn_qkv.weight"] = "the fused Q/K/V matrix of gemma4 is not implemented in llamactx"
        out[b + "ffn_gate_exps.weight"] = ("gemma4 experts with separate gate / up matrices are not implemented in "
                                           "llamactx (ffn_gate_up_exps is)")
    return out


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_gemma4::graph), computed by `ops` as it is built or recorded. The
    output rows are selected after the final norm (embeddings_nextn_masked is false by default)."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    n = len(pos)
    if token is not None:  # raw input embeddings are not scaled
        x = ops.get_rows(w("token_embd.weight"), token) * _F32(hp.embd_scale)  # (n, n_embd)
    else:
        x = embd
    # the global layers' proportional RoPE rotates their whole head with rope_freqs; the sliding-window layers
    # have their own width and base, and no frequency factors (get_rope_freq_base / build: freq_factors)
    rp_full = dataclasses.replace(rope.full, n_rot=hp.n_rot, freq_factors=t.get("rope_freqs.weight"))
    rp_swa = dataclasses.replace(rope.swa, n_rot=hp.n_rot_swa or hp.n_rot, freq_factors=None)
    per_layer = per_layer_inputs(model, ops, token, x, n) if hp.n_embd_per_layer else None  # (n, n_layer * n_pl)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        head, n_head_kv = hp.layer_head_size(il), hp.layer_n_head_kv(il)
        rp = rp_swa if hp.is_swa(il) else rp_full
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        names = ["attn_q"] + (["attn_k"] if hp.has_kv(il) else [])
        names += ["attn_v"] if hp.has_kv(il) and model.has_tensor(b + "attn_v.weight") else []
        proj = ops.matmuls(cur, [w(f"{b}{name}.weight") for name in names])
        q = ops.rms_norm(proj[0].reshape(n, hp.n_head, head), t[b + "attn_q_norm.weight"], eps)
        q = ops.rope(q, pos, rp)  # (n, n_head, head)
        if hp.has_kv(il):
            k = proj[1].reshape(n, n_head_kv, head)
            v = (proj[2] if len(proj) == 3 else proj[1]).reshape(n, n_head_kv, head)  # no attn_v: V = K
            k = ops.rope(ops.rms_norm(k, t[b + "attn_k_norm.weight"], eps), pos, rp)
            v = ops.rms_norm(v, np.ones(head, np.float32), eps)  # ggml_rms_norm without a weight
            cur = attn(il, q, k, v, 1.0)  # (n, n_head * head)
        else:  # the KV of layer hp.kv_reuse(il), which the memory maps this layer to
            cur = attn(il, q, None, None, 1.0)
        cur = ops.matmul(cur, w(b + "attn_output.weight"))  # (n, n_embd)
        attn_out = ops.rms_norm(cur, t[b + "post_attention_norm.weight"], eps) + x
        cur = ops.rms_norm(attn_out, t[b + "ffn_norm.weight"], eps)
        gate, up = ops.matmuls(cur, [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])  # (n, n_ff) each
        cur = ops.matmul(ops.geglu(gate, up), w(b + "ffn_down.weight"))  # (n, n_embd)
        if hp.n_expert:  # the dense FFN normed as a branch, beside the experts
            cur = ops.rms_norm(cur, t[b + "post_ffw_norm_1.weight"], eps) + moe_branch(model, ops, attn_out, b)
        cur = ops.rms_norm(cur, t[b + "post_ffw_norm.weight"], eps) + attn_out
        if per_layer is not None:
            cur = cur + per_layer_embedding(model, ops, cur, per_layer, il)
        if b + "layer_output_scale.weight" in t:  # ggml_mul by a one-element tensor
            cur = cur * _F32(t[b + "layer_output_scale.weight"][0])
        x = cur
    x = ops.rms_norm(x, t["output_norm.weight"], eps)[out_ids]  # (n_out, n_embd)
    logits = None
    if want_logits:
        logits = ops.matmul(x, w(output_weight_name(model)))  # (n_out, n_vocab)
        if hp.f_final_logit_softcapping:
            logits = ops.softcap(logits, hp.f_final_logit_softcapping)
    return ForwardResult(logits=logits, embd=x)


def per_layer_inputs(model, ops, token: np.ndarray | None, x: np.ndarray, n: int) -> np.ndarray:
    """build_inp_per_layer + project_per_layer_inputs: each token's per_layer_token_embd row (row 0, the padding
    token's, for raw embeddings) times sqrt(n_pl), plus the scaled input embeddings x projected by
    per_layer_model_proj, times 1/sqrt(n_embd), RMS-normed per layer slice; the sum times 1/sqrt(2).
    x (n, n_embd) -> (n, n_layer * n_pl): layer il's slice is columns [il * n_pl, (il + 1) * n_pl)"""
    hp = model.hparams
    n_pl, w = hp.n_embd_per_layer, model.weight
    ids = token if token is not None else np.zeros(n, np.int64)
    sel = ops.get_rows(w("per_layer_token_embd.weight"), ids) * (_F32(1.0) * np.sqrt(_F32(n_pl)))
    proj = ops.matmul(x, w("per_layer_model_proj.weight")) * (_F32(1.0) / np.sqrt(_F32(hp.n_embd)))
    proj = ops.rms_norm(proj.reshape(n, hp.n_layer, n_pl), model.tensors["per_layer_proj_norm.weight"],
                        hp.f_norm_rms_eps).reshape(n, hp.n_layer * n_pl)
    return (proj + sel) * (_F32(1.0) / np.sqrt(_F32(2.0)))  # (n, n_layer * n_pl)


def per_layer_embedding(model, ops, cur: np.ndarray, per_layer: np.ndarray, il: int) -> np.ndarray:
    """Layer il's per-layer embedding term (gemma4.cpp "per-layer embedding"): gelu(cur inp_gate) times the layer's
    slice, through `proj`, RMS-normed by post_norm. ggml_gelu then ggml_mul is geglu(gate, slice) (the same table;
    only the sign of a zero can differ, which no sum sees). cur (n, n_embd) -> (n, n_embd)"""
    b, n_pl = f"blk.{il}.", model.hparams.n_embd_per_layer
    gate = ops.matmul(cur, model.weight(b + "inp_gate.weight"))  # (n, n_pl)
    g = ops.geglu(gate, per_layer[:, il * n_pl : (il + 1) * n_pl])  # (n, n_pl)
    out = ops.matmul(g, model.weight(b + "proj.weight"))  # (n, n_embd)
    return ops.rms_norm(out, model.tensors[b + "post_norm.weight"], model.hparams.f_norm_rms_eps)


def moe_branch(model, ops, attn_out: np.ndarray, b: str) -> np.ndarray:
    """A MoE layer's expert branch (gemma4.cpp "Expert FFN"): the router's logits from
    rms_norm(attn_out) * 1/sqrt(n_embd) * ffn_gate_inp.scale; softmax, the top n_expert_used, their weights
    normalized (build_moe_ffn, w_scale 1); each expert's fused gate|up of the pre_ffw_norm_2-normed input, GELU-gated,
    down, times its ffn_down_exps.scale (build_lora_mm_id's w_s), then the weighted sum, normed by post_ffw_norm_2.
    attn_out (n, n_embd) -> (n, n_embd)"""
    hp, w, t = model.hparams, model.weight, model.tensors
    eps, n_ff = hp.f_norm_rms_eps, hp.n_ff_exp
    tmp = ops.rms_norm(attn_out, np.ones(hp.n_embd, np.float32), eps) * (_F32(1.0) / np.sqrt(_F32(hp.n_embd)))
    logits = ops.matmul(tmp * t[b + "ffn_gate_inp.scale"], w(b + "ffn_gate_inp.weight"))  # (n, n_expert)
    selected, weights = ops.moe_route(logits, hp.n_expert_used, "softmax", True, 1.0)  # (n, k) each
    cur = ops.rms_norm(attn_out, t[b + "pre_ffw_norm_2.weight"], eps)  # (n, n_embd)
    gate_up = ops.matmul_id(cur, w(b + "ffn_gate_up_exps.weight"), selected)  # (n, k, 2 n_ff): gate | up
    act = ops.geglu(gate_up[:, :, :n_ff], gate_up[:, :, n_ff:])  # (n, k, n_ff)
    experts = ops.matmul_id(act, w(b + "ffn_down_exps.weight"), selected)  # (n, k, n_embd)
    if b + "ffn_down_exps.scale" in t:
        experts = experts * t[b + "ffn_down_exps.scale"][selected][:, :, None]
    return ops.rms_norm(ops.moe_sum(experts, weights), t[b + "post_ffw_norm_2.weight"], eps)

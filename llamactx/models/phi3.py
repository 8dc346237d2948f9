"""The `phi3` architecture (Phi-3 / Phi-3.5 / Phi-4 mini): src/models/phi3.cpp.

Differences from llama: q, k and v come from one fused matmul (`attn_qkv`, create_tensor_qkv) as column views of
its output (build_qkv), unless the file has separate attn_q / attn_k / attn_v; the FFN's `ffn_up` holds the gate
and the up projection (2 * n_ff rows) and ggml_swiglu takes silu of the first half times the second; RoPE rotates
NEOX-style; q is scaled by 1/sqrt(head size) before attention (kq_scale 1). llama.cpp reads a sliding window but
turns it off for Phi-3 (llama_model_phi3::load_arch_hparams: "Phi SWA is currently disabled"), so every layer is
global here too. The 128k-context models (Phi-3.5-mini-128k, Phi-4-mini) carry LongRoPE frequency factors,
`rope_factors_long.weight` / `rope_factors_short.weight` (n_rot/2 each, a partial rotation's half for Phi-4-mini):
a context whose n_ctx_seq exceeds `rope.scaling.original_context_length` divides RoPE's angles by the long ones,
else by the short ones (llama_model::get_rope_factors, graph_inputs.rope_factors), and `rope.scaling.attn_factor`
(the converter's sqrt(1 + ln(scale) / ln(original length))) multiplies cos / sin (cparams' yarn_attn_factor).
Not supported: Phi-3.5-MoE's experts.
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import output_weight_name

ARCHS = {"phi3": ROPE_TYPE_NEOX}  # llama_model_rope_type
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache (its SWA is disabled)

_F32 = np.float32


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_phi3::load_arch_hparams: a sliding window in the file is read and dropped (n_swa = 0, every
    layer global), as llama.cpp does; experts are not supported."""
    if hp["n_expert"]:
        raise HParamsError(f"'{m.arch}.expert_count' = {hp['n_expert']}: phi3 with experts is not supported")
    m.count("attention.sliding_window", 0, lo=0)  # checked like llama.cpp's get_key, then disabled
    return {}


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_phi3::load_arch_tensors: name -> (ggml shape, required). q/k/v are either `attn_qkv` (fused:
    n_embd + 2 * n_embd_gqa outputs) or three separate weights; `output.weight` falls back to the embeddings; the
    LongRoPE factors are optional, n_rot/2 long."""
    n_q = hp.n_embd_head_k * hp.n_head
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
        # LongRoPE (128k models): one pair for every layer (llama.cpp's TENSOR_DUPLICATED after layer 0)
        "rope_factors_long.weight": ((hp.n_rot // 2,), False),
        "rope_factors_short.weight": ((hp.n_rot // 2,), False),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "attn_qkv.weight": ((hp.n_embd, n_q + hp.n_embd_k_gqa + hp.n_embd_v_gqa), False),
            b + "attn_qkv.bias": ((n_q + hp.n_embd_k_gqa + hp.n_embd_v_gqa,), False),
            b + "attn_q.weight": ((hp.n_embd, n_q), False),
            b + "attn_k.weight": ((hp.n_embd, hp.n_embd_k_gqa), False),
            b + "attn_v.weight": ((hp.n_embd, hp.n_embd_v_gqa), False),
            b + "attn_output.weight": ((n_q, hp.n_embd), True),
            b + "ffn_norm.weight": ((hp.n_embd,), True),
            b + "ffn_up.weight": ((hp.n_embd, 2 * hp.n_ff), True),
            b + "ffn_down.weight": ((hp.n_ff, hp.n_embd), True),
        })
    return shapes


def _qkv(model, ops, cur: np.ndarray, b: str, hp: HParams) -> tuple:
    """build_qkv: the fused attn_qkv matmul (+ bias) and its column views, or three separate matmuls."""
    n_q = hp.n_embd_head_k * hp.n_head
    if not model.has_tensor(b + "attn_qkv.weight"):
        names = [b + s for s in ("attn_q.weight", "attn_k.weight", "attn_v.weight")]
        missing = [name for name in names if not model.has_tensor(name)]
        if missing:
            raise HParamsError(f"tensor '{missing[0]}' is missing, and so is '{b}attn_qkv.weight'")
        return tuple(ops.matmuls(cur, [model.weight(name) for name in names]))
    qkv = ops.matmul(cur, model.weight(b + "attn_qkv.weight"))  # (n, n_q + 2 * n_embd_gqa)
    if b + "attn_qkv.bias" in model.tensors:
        qkv = qkv + model.tensors[b + "attn_qkv.bias"]
    n_k = n_q + hp.n_embd_k_gqa
    return qkv[:, :n_q], qkv[:, n_q:n_k], qkv[:, n_k:]


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_phi3::graph<false>), computed by `ops` as it is built or recorded."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    n = len(pos)
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    q_scale = _F32(1.0) / np.sqrt(_F32(hp.n_embd_head_k))  # 1.0f / sqrtf(float(n_embd_head))
    rp = rope.for_layer(False)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        q, k, v = _qkv(model, ops, cur, b, hp)
        q = ops.rope(q.reshape(n, hp.n_head, hp.n_embd_head_k), pos, rp)  # (n, n_head, head)
        k = ops.rope(k.reshape(n, hp.n_head_kv, hp.n_embd_head_k), pos, rp)  # (n, n_head_kv, head)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        q = q * q_scale
        cur = attn(il, q, k, v, 1.0)  # (n, n_head * n_embd_head_v)
        cur = ops.matmul(cur, w(b + "attn_output.weight"))  # (n, n_embd)
        if il == hp.n_layer - 1:  # only the output rows go through the last FFN
            cur, x = cur[out_ids], x[out_ids]
        x = cur + x
        cur = ops.rms_norm(x, t[b + "ffn_norm.weight"], eps)
        up = ops.matmul(cur, w(b + "ffn_up.weight"))  # (n, 2 * n_ff): gate, then up
        cur = ops.swiglu(up[:, : hp.n_ff], up[:, hp.n_ff :])  # ggml_swiglu: silu(first half) * second half
        x = x + ops.matmul(cur, w(b + "ffn_down.weight"))  # (n, n_embd)
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = ops.matmul(x, w(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)

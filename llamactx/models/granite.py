"""The `granite` architecture (IBM Granite 3.x dense models): src/models/granite.cpp.

Llama's graph with four scalars from the GGUF: the input embeddings times `embedding_scale` (llm_graph_context::
build_inp_embd), the softmax's kq scale `attention.scale` (default 1/sqrt(head size)), each block's attention and
FFN outputs times `residual_scale` before their residual adds, and the logits times 1/`logit_scale`. Every scale
is a ggml_scale: a float32 product. Optional attention-output and FFN biases; `rope.scaling.finetuned` false
turns RoPE off in every layer. Not supported: experts (granitemoe files are their own architecture in llama.cpp;
a `granite` file with experts is refused), LongRoPE factors, deepstack inputs (Granite Vision).
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NORM
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models import llama
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import linear, linears, output_weight_name

ARCHS = {"granite": ROPE_TYPE_NORM}  # llama_model_rope_type
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache

_F32 = np.float32


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_granite::load_arch_hparams: logit_scale (required), residual / embedding / attention scales
    (0 when absent: not applied, the default kq scale), `rope.scaling.finetuned` as the RoPE switch of every
    layer (default true). The graph asserts n_rot == the head size."""
    if hp["n_rot"] != hp["n_embd_head_k"]:
        raise HParamsError(f"'{m.arch}.rope.dimension_count' = {hp['n_rot']}: granite rotates whole heads, "
                           f"expected the head size {hp['n_embd_head_k']}")
    if hp["n_expert"]:
        raise HParamsError(f"'{m.arch}.expert_count' = {hp['n_expert']}: granite with experts is not supported")
    deepstack = m.meta.get(f"{m.arch}.deepstack_mapping")
    if deepstack is not None and any(int(v) >= 0 for v in deepstack):
        raise HParamsError(f"GGUF metadata key '{m.arch}.deepstack_mapping': deepstack inputs (Granite Vision) "
                           f"are not supported")
    key = f"{m.arch}.rope.scaling.finetuned"
    finetuned = m.meta.get(key, True)
    if not isinstance(finetuned, bool):
        raise HParamsError(f"GGUF metadata key '{key}': expected a bool, got {finetuned!r}")
    return dict(f_logit_scale=m.real("logit_scale"),
                f_residual_scale=m.real("residual_scale", 0.0, zero_ok=True),
                embd_scale=m.real("embedding_scale", 0.0, zero_ok=True),
                f_attention_scale=m.real("attention.scale", 0.0, zero_ok=True),
                rope_layers=(finetuned,) * hp["n_layer"])


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_granite::load_arch_tensors: llama's table (q/k/v and output biases optional, frequency
    factors `rope_freqs.weight` optional) without q/k norms, plus the optional FFN biases."""
    shapes = llama.tensor_shapes(hp)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        del shapes[b + "attn_q_norm.weight"], shapes[b + "attn_k_norm.weight"]
        shapes.update({
            b + "ffn_gate.bias": ((hp.n_ff,), False),
            b + "ffn_up.bias": ((hp.n_ff,), False),
            b + "ffn_down.bias": ((hp.n_embd,), False),
        })
    return shapes


def refused_tensors(hp: HParams) -> dict[str, str]:
    """A LongRoPE granite's factors (model.get_rope_factors) are not implemented: such a file is refused."""
    why = "LongRoPE frequency factors are not supported"
    return {"rope_factors_long.weight": why, "rope_factors_short.weight": why}


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_granite::graph), computed by `ops` as it is built or recorded."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    n = len(pos)
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    if hp.embd_scale:  # build_inp_embd: raw embeddings too (no deepstack layers)
        x = x * _F32(hp.embd_scale)
    # build_attention_layer: f_attention_scale, else 1.0f / sqrtf(n_embd_head)
    kq_scale = hp.f_attention_scale or float(_F32(1.0) / np.sqrt(_F32(hp.n_embd_head_k)))
    residual_scale = _F32(hp.f_residual_scale)
    rp = rope.for_layer(False)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        q, k, v = linears(model, ops, cur, b + "attn_q", b + "attn_k", b + "attn_v")
        q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
        k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        if hp.has_rope(il):
            q = ops.rope(q, pos, rp)
            k = ops.rope(k, pos, rp)
        cur = attn(il, q, k, v, kq_scale)  # (n, n_head * n_embd_head_v)
        cur = linear(model, ops, cur, b + "attn_output")  # (n, n_embd)
        if il == hp.n_layer - 1:  # only the output rows go through the last FFN
            cur, x = cur[out_ids], x[out_ids]
        # build_layer_ffn
        if residual_scale:
            cur = cur * residual_scale
        x = cur + x  # ffn_inp
        cur = ops.rms_norm(x, t[b + "ffn_norm.weight"], eps)
        up, gate = linears(model, ops, cur, b + "ffn_up", b + "ffn_gate")  # (n, n_ff) each
        cur = linear(model, ops, ops.swiglu(gate, up), b + "ffn_down")  # (n, n_embd)
        if residual_scale:
            cur = cur * residual_scale
        x = cur + x
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = None
    if want_logits:
        logits = ops.matmul(x, w(output_weight_name(model)))  # (n_out, n_vocab)
        logits = logits * (_F32(1.0) / _F32(hp.f_logit_scale))  # ggml_scale(cur, 1.0f / f_logit_scale)
    return ForwardResult(logits=logits, embd=x)

"""The `gemma3` architecture (Gemma 3 text models): src/models/gemma3.cpp (the iSWA graph).

Differences from llama: embeddings scaled by sqrt(n_embd); RMS-normed q and k per head; q scaled by
f_attention_scale and attention with kq_scale 1; post-attention and post-FFN norms; GELU-gated FFN; sliding-window
layers (every sixth layer is global) with their own RoPE base.
"""

from __future__ import annotations

import math

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, Meta, swa_pattern
from llamactx.models import llama
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import output_weight_name

ARCHS = {"gemma3": ROPE_TYPE_NEOX}  # llama_model_rope_type
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache_iswa (llama_kv_cache with swa_full)


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_gemma3::load_arch_hparams: the sliding window and its layer pattern, the logit soft-cap, the
    embedding scale sqrt(n_embd) and q's scale (the head size; n_embd / n_head for the 62-layer 27B)."""
    n_swa = m.count("attention.sliding_window", 0, lo=0)
    n_layer, n_embd = hp["n_layer"], hp["n_embd"]
    return dict(n_swa=n_swa, swa_layers=swa_pattern(m, n_layer, n_swa),
                f_attention_scale=1.0 / math.sqrt(n_embd // hp["n_head"] if n_layer == 62 else hp["n_embd_head_k"]),
                f_final_logit_softcapping=m.real("final_logit_softcapping", 0.0, zero_ok=True),
                embd_scale=math.sqrt(n_embd))


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_gemma3::load_arch_tensors: llama's table plus the q/k norms and the post-norms."""
    shapes = llama.tensor_shapes(hp)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_q_norm.weight": ((hp.n_embd_head_k,), True),
            b + "attn_k_norm.weight": ((hp.n_embd_head_k,), True),
            b + "post_attention_norm.weight": ((hp.n_embd,), True),
            b + "post_ffw_norm.weight": ((hp.n_embd,), True),
        })
    return shapes


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_gemma3::graph<iswa>), computed by `ops` as it is built or
    recorded."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    n = len(pos)
    if token is not None:  # raw input embeddings are not scaled
        x = ops.get_rows(w("token_embd.weight"), token) * np.float32(hp.embd_scale)  # (n, n_embd)
    else:
        x = embd
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        rp = rope.for_layer(hp.is_swa(il))
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        q, k, v = ops.matmuls(cur, [w(b + "attn_q.weight"), w(b + "attn_k.weight"), w(b + "attn_v.weight")])
        q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
        k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        q = ops.rope(ops.rms_norm(q, t[b + "attn_q_norm.weight"], eps), pos, rp)
        k = ops.rope(ops.rms_norm(k, t[b + "attn_k_norm.weight"], eps), pos, rp)
        q = q * np.float32(hp.f_attention_scale)
        cur = attn(il, q, k, v, 1.0)  # (n, n_head * n_embd_head_v)
        cur = ops.matmul(cur, w(b + "attn_output.weight"))  # (n, n_embd)
        if il == hp.n_layer - 1:
            cur, x = cur[out_ids], x[out_ids]
        x = ops.rms_norm(cur, t[b + "post_attention_norm.weight"], eps) + x  # sa_out
        cur = ops.rms_norm(x, t[b + "ffn_norm.weight"], eps)
        gate, up = ops.matmuls(cur, [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])  # (n, n_ff) each
        cur = ops.matmul(ops.geglu(gate, up), w(b + "ffn_down.weight"))  # (n, n_embd)
        x = ops.rms_norm(cur, t[b + "post_ffw_norm.weight"], eps) + x
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = None
    if want_logits:
        logits = ops.matmul(x, w(output_weight_name(model)))  # (n_out, n_vocab)
        if hp.f_final_logit_softcapping:
            logits = ops.softcap(logits, hp.f_final_logit_softcapping)
    return ForwardResult(logits=logits, embd=x)

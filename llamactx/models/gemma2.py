"""The `gemma2` architecture (Gemma 2): src/models/gemma2.cpp (the iSWA graph).

Differences from llama: the input embeddings (raw ones too) times sqrt(n_embd); q scaled by f_attention_scale
(1/sqrt(head size); n_embd / n_head for the 46-layer 27B) and attention with kq_scale 1; the attention logits
soft-capped, cap * tanh(kq / cap) with cap = `attn_logit_softcapping` (50 by default; build_attn_mha, or flash
attention's logit_softcap: KVAttention passes hparams.f_attn_logit_softcapping to the ops); post-attention and
post-FFN norms; GELU-gated FFN; every other layer a sliding-window one (sliding_window_pattern 2: even layers),
whose RoPE base is `rope.freq_base_swa` (default: the global base); the logits soft-capped by
`final_logit_softcapping` (30 by default in the file; llama.cpp scales by 1/cap unconditionally, so a file
without the key divides by its default 30 as well).
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import HParams, Meta, swa_pattern
from llamactx.models.graph_inputs import ForwardResult

ARCHS = {"gemma2": ROPE_TYPE_NEOX}  # llama_model_rope_type
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache_iswa (llama_kv_cache with swa_full)

_F32 = np.float32
N_SWA_DEFAULT = 4096  # llama_model_gemma2::load_arch_hparams: "default value of gemma 2"


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_gemma2::load_arch_hparams: the sliding window (default 4096) and its pattern (default 2), the
    two soft-caps (llama_hparams defaults 50 and 30), the SWA layers' RoPE base, q's scale and the embedding
    scale sqrtf(n_embd)."""
    n_swa = m.count("attention.sliding_window", N_SWA_DEFAULT, lo=0)
    n_layer, n_embd = hp["n_layer"], hp["n_embd"]
    head = n_embd // hp["n_head"] if n_layer == 46 else hp["n_embd_head_k"]  # LLM_TYPE_27B: n_embd / n_head
    return dict(n_swa=n_swa, swa_layers=_swa_layers(m, n_layer, n_swa),
                rope_freq_base_swa=m.real("rope.freq_base_swa", hp["rope_freq_base"]),
                f_attention_scale=float(_F32(1.0) / np.sqrt(_F32(head))),
                f_attn_logit_softcapping=m.real("attn_logit_softcapping", 50.0),
                f_final_logit_softcapping=m.real("final_logit_softcapping", 30.0),
                embd_scale=float(np.sqrt(_F32(n_embd))))


def _swa_layers(m: Meta, n_layer: int, n_swa: int) -> tuple[bool, ...]:
    """load_swa_pattern(ml, 2): gemma2's default pattern is 2 (layers 0, 2, 4, ... slide), not swa_pattern's 6."""
    key = f"{m.arch}.attention.sliding_window_pattern"
    if key in m.meta:
        return swa_pattern(m, n_layer, n_swa)
    return tuple(n_swa > 0 and il % 2 < 1 for il in range(n_layer))


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_gemma2::load_arch_tensors: the output matrix is always the token embeddings (TENSOR_DUPLICATED;
    an `output.weight` in the file is not used)."""
    n_q = hp.n_embd_head_k * hp.n_head
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "attn_q.weight": ((hp.n_embd, n_q), True),
            b + "attn_k.weight": ((hp.n_embd, hp.n_embd_k_gqa), True),
            b + "attn_v.weight": ((hp.n_embd, hp.n_embd_v_gqa), True),
            b + "attn_output.weight": ((n_q, hp.n_embd), True),
            b + "post_attention_norm.weight": ((hp.n_embd,), True),
            b + "ffn_norm.weight": ((hp.n_embd,), True),
            b + "ffn_gate.weight": ((hp.n_embd, hp.n_ff), True),
            b + "ffn_up.weight": ((hp.n_embd, hp.n_ff), True),
            b + "ffn_down.weight": ((hp.n_ff, hp.n_embd), True),
            b + "post_ffw_norm.weight": ((hp.n_embd,), True),
        })
    return shapes


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_gemma2::graph), computed by `ops` as it is built or recorded. The
    attention's soft-cap comes with the attention input (hparams)."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    n = len(pos)
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    x = x * _F32(hp.embd_scale)  # ggml_scale(inpL, sqrtf(n_embd))
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        rp = rope.for_layer(hp.is_swa(il))
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        q, k, v = ops.matmuls(cur, [w(b + "attn_q.weight"), w(b + "attn_k.weight"), w(b + "attn_v.weight")])
        q = ops.rope(q.reshape(n, hp.n_head, hp.n_embd_head_k), pos, rp)  # (n, n_head, head)
        k = ops.rope(k.reshape(n, hp.n_head_kv, hp.n_embd_head_k), pos, rp)  # (n, n_head_kv, head)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        q = q * _F32(hp.f_attention_scale)
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
        logits = ops.matmul(x, w("token_embd.weight"))  # (n_out, n_vocab): tied, always
        logits = ops.softcap(logits, hp.f_final_logit_softcapping)
    return ForwardResult(logits=logits, embd=x)

"""The `nemotron_h` architecture (NVIDIA Nemotron-H, Nemotron Nano 2): src/models/nemotron-h.cpp,
build_mamba2_layer of src/models/mamba-base.cpp.

Three kinds of layer, told apart by the per-layer `attention.head_count_kv` and `feed_forward_length` (as
convert_hf_to_gguf.py writes them from the `hybrid_override_pattern` "M", "*" and "-"): both 0 is a Mamba-2
layer (mamba2.py's `mamba2_layer`, its states in the hybrid memory's recurrent half), KV heads and no FFN an
attention-only layer (no RoPE, no q/k norms, 1/sqrt(head) scale, optional biases), an FFN width an FFN-only layer
(up, ReLU squared, down; optional biases). Every layer is RMS-pre-normed by its `attn_norm` and adds its output to
the residual; then the output norm and the LM head. The attention-only and FFN-only layers both count as
attention layers of the hybrid memory (llama.cpp's !is_recr), the FFN-only ones without using their cells.
The Mamba-2 layers' states are read and written through the input, so FastOps records the forward as one compiled
program (SSM_CONV_RS, SSM_SCAN_RS, a relu node for np.where(x > 0, x, 0)).
Not supported: the MoE variant (`nemotron_h_moe`, Nemotron 3 Nano) and MTP blocks (`nextn_predict_layers`).
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NORM
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models import mamba2
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import linear, linears, output_weight_name

ARCHS = {"nemotron_h": ROPE_TYPE_NORM}  # llama_model_rope_type: LLAMA_ROPE_TYPE_NONE, never used (no RoPE)
MEMORY = "hybrid"  # llama_model::create_memory: llama_memory_hybrid
FF_KEY = "feed_forward_length"


def common_meta(meta: dict[str, object]) -> dict[str, object]:
    """The metadata the common keys are read from (hparams.read_hparams): the per-layer `feed_forward_length`
    as its largest value (`arch_hparams` reads every layer's from the file's own metadata)."""
    arch = meta["general.architecture"]
    value = meta.get(f"{arch}.{FF_KEY}")
    if getattr(value, "dtype", None) is None or not len(value):
        return meta
    return meta | {f"{arch}.{FF_KEY}": int(max(value))}


def arch_hparams(file_meta: dict[str, object], m: Meta, hp: dict) -> dict:
    """llama_model_nemotron_h::load_arch_hparams: the ssm.* keys (mamba2's, with its checks), the LayerNorm
    epsilon (required there), and each layer's kind from the per-layer head_count_kv and feed_forward_length of
    `file_meta` (the file's metadata): a layer is recurrent iff both are 0. The FFN layers must share one width."""
    fields = mamba2.arch_hparams(m, hp)
    m.real("attention.layer_norm_epsilon")  # the MTP head's final norm: required by llama.cpp, not used here
    if m.count("nextn_predict_layers", 0, lo=0):
        raise HParamsError(f"GGUF metadata key '{m.arch}.nextn_predict_layers': MTP blocks are not supported")
    n_layer = hp["n_layer"]
    key = f"{m.arch}.{FF_KEY}"
    ff = file_meta.get(key)
    kv = m.meta.get(f"{m.arch}.attention.head_count_kv")
    if getattr(ff, "dtype", None) is None or getattr(kv, "dtype", None) is None:
        raise HParamsError(f"GGUF metadata keys '{key}' and '{m.arch}.attention.head_count_kv' must hold one value "
                           f"per layer (the layer pattern)")
    ff, kv = [int(v) for v in ff], [int(v) for v in kv]
    widths = sorted(set(ff) - {0})
    if len(ff) != n_layer or len(widths) > 1:
        raise HParamsError(f"GGUF metadata key '{key}' = {ff}: expected {n_layer} values, 0 for the Mamba-2 and "
                           f"attention layers and one common width for the FFN layers")
    both = [il for il in range(n_layer) if ff[il] and kv[il]]
    if both:
        raise HParamsError(f"GGUF metadata keys '{key}' and '{m.arch}.attention.head_count_kv': layer {both[0]} "
                           f"has both an FFN width and KV heads; a nemotron_h layer is one or the other")
    return fields | dict(n_ff=widths[0] if widths else 0, n_head_kv_arr=tuple(kv),
                         recurrent_layers=tuple(not f and not k for f, k in zip(ff, kv, strict=True)))


def layer_kind(hp: HParams, il: int) -> str:
    """"mamba2", "attention" or "ffn" (`llamactx info`)."""
    if hp.is_recr(il):
        return "mamba2"
    return "attention" if hp.layer_n_head_kv(il) else "ffn"


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_nemotron_h::load_arch_tensors (dense): name -> (ggml shape, required). The conv bias,
    optional there, is required here: build_mamba2_layer adds it unconditionally."""
    mamba = mamba2.tensor_shapes(hp)
    n_q, n_kv = hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes[b + "attn_norm.weight"] = ((hp.n_embd,), True)
        kind = layer_kind(hp, il)
        if kind == "mamba2":
            shapes.update({k: v for k, v in mamba.items() if k.startswith(b + "ssm_")})
        elif kind == "attention":
            for part, ne0, ne1 in (("q", hp.n_embd, n_q), ("k", hp.n_embd, n_kv), ("v", hp.n_embd, n_kv),
                                   ("output", n_q, hp.n_embd)):
                shapes[f"{b}attn_{part}.weight"] = ((ne0, ne1), True)
                shapes[f"{b}attn_{part}.bias"] = ((ne1,), False)
        else:
            for part, ne0, ne1 in (("up", hp.n_embd, hp.n_ff), ("down", hp.n_ff, hp.n_embd)):
                shapes[f"{b}ffn_{part}.weight"] = ((ne0, ne1), True)
                shapes[f"{b}ffn_{part}.bias"] = ((ne1,), False)
    return shapes


def build(ops, params: GraphParams) -> ForwardResult:
    """One ubatch through the network (llama_model_nemotron_h::graph). inp: attention for the attention layers,
    the recurrent view for the Mamba-2 layers; pos and rope are not used (no RoPE)."""
    model, token, embd = params.model, params.token, params.embd
    inp, out_ids, want_logits = params.inp, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        kind = layer_kind(hp, il)
        if kind == "mamba2":
            cur = mamba2.mamba2_layer(model, ops, inp.rs, cur, il)
        elif kind == "attention":
            cur = attention_layer(model, ops, inp.attn, cur, il)
        else:
            up = linear(model, ops, cur, b + "ffn_up")  # (n, n_ff)
            up = np.where(up > 0, up, np.float32(0))  # ggml_relu
            cur = linear(model, ops, up * up, b + "ffn_down")  # ggml_sqr, then (n, n_embd)
        if il == hp.n_layer - 1:
            cur, x = cur[out_ids], x[out_ids]
        x = cur + x
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = ops.matmul(x, w(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)


def attention_layer(model, ops, attn, cur: np.ndarray, il: int) -> np.ndarray:
    """build_attention_layer: (n, n_embd) -> (n, n_embd), no RoPE."""
    hp = model.hparams
    b = f"blk.{il}."
    n = cur.shape[0]
    q, k, v = linears(model, ops, cur, b + "attn_q", b + "attn_k", b + "attn_v")
    q = q.reshape(n, hp.n_head, hp.n_embd_head_k).copy()  # no RoPE to copy it out of the fused matmul's columns
    k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
    v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
    kq_scale = float(np.float32(1.0) / np.sqrt(np.float32(hp.n_embd_head_k)))  # 1.0f / sqrtf(n_embd_head)
    cur = attn(il, q, k, v, kq_scale)  # (n, n_head * n_embd_head_v)
    return linear(model, ops, cur, b + "attn_output")  # (n, n_embd)

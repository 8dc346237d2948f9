"""The `bert` architecture (BERT encoders: all-MiniLM, bge, e5 ...): src/models/bert.cpp, LLM_ARCH_BERT.

An encoder, run through `Context.encode` (llama_encode; a decode of such a model is an encode, as llama_decode does
for a model without memory): token + token-type (row 0, "sentence A") + absolute position embeddings, a
LayerNorm (ggml_norm with weight and bias), then per layer non-causal attention over the sequence's own tokens
with q/k/v and output biases, residual + LayerNorm, a GELU FFN (ggml_gelu: the f16 table), residual + LayerNorm
(post-norm). No output matrix, no logits: the hidden states are the embeddings, pooled as the model's
`bert.pooling_type` says unless the context asks otherwise. Not supported: the classifier head of a reranker
(`cls.*`: such a file is refused) and the fused `attn_qkv` layout.
"""

from __future__ import annotations

import numpy as np

from llamactx.ggml.inputs import ROPE_TYPE_NORM
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.graph_inputs import AttentionInput, ForwardResult, RopeConfig
from llamactx.models.llama import linear, linears

ARCHS = {"bert": ROPE_TYPE_NORM}  # llama_model_rope_type: LLAMA_ROPE_TYPE_NONE in llama.cpp (no RoPE applied)
MEMORY = "none"  # llama_model::create_memory: nullptr (no KV cache; every batch is encoded whole)

POOLING_TYPES = ("none", "mean", "cls", "last", "rank")  # enum llama_pooling_type 0..4


class EncoderPositionError(HParamsError):
    """A token position past the model's position embeddings (context_length)."""


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_bert::load_arch_hparams and the keys llama_model::load_hparams reads for it: the LayerNorm
    epsilon (required), `attention.causal` (default true, as llama.cpp; BERT files say false), `pooling_type`
    (default none) and the vocabulary's `tokenizer.ggml.token_type_count` (llama_model_bert::load_arch_tensors
    refuses 0). q, k and v must each be n_embd wide (the graph's wo is n_embd x n_embd)."""
    f_norm_eps = m.real("attention.layer_norm_epsilon")
    key = f"{m.arch}.attention.causal"
    causal = m.meta.get(key, True)
    if not isinstance(causal, bool):
        raise HParamsError(f"GGUF metadata key '{key}': expected a bool, got {causal!r}")
    pooling = m.count("pooling_type", 0, lo=0, hi=len(POOLING_TYPES) - 1)
    n_token_types = m.get("tokenizer.ggml.token_type_count", int, 0, arch_key=False)
    if n_token_types <= 0:
        raise HParamsError(f"GGUF metadata key 'tokenizer.ggml.token_type_count' = {n_token_types}: {m.arch} needs "
                           f"a token type count (llama.cpp: 'model needs to define token type count')")
    if hp["n_head_kv"] != hp["n_head"] or hp["n_embd_head_k"] * hp["n_head"] != hp["n_embd"]:
        raise HParamsError(f"'{m.arch}.attention.head_count' = {hp['n_head']} (head_count_kv {hp['n_head_kv']}, "
                           f"key_length {hp['n_embd_head_k']}): bert needs head_count_kv = head_count and "
                           f"head_count * key_length = embedding_length {hp['n_embd']}")
    if hp["n_expert"]:
        raise HParamsError(f"'{m.arch}.expert_count' = {hp['n_expert']}: bert with experts is not supported")
    return dict(f_norm_eps=f_norm_eps, causal_attn=causal, pooling_type=POOLING_TYPES[pooling],
                n_token_types=n_token_types)


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_bert::load_arch_tensors: name -> (ggml shape, required). The token-type embeddings are
    optional there too (without them nothing is added); the position embeddings are required."""
    n = hp.n_embd
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((n, hp.n_vocab), True),
        "token_types.weight": ((n, hp.n_token_types), False),
        "position_embd.weight": ((n, hp.n_ctx_train), True),
        "token_embd_norm.weight": ((n,), True),
        "token_embd_norm.bias": ((n,), True),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_q.weight": ((n, n), True),
            b + "attn_k.weight": ((n, hp.n_embd_k_gqa), True),
            b + "attn_v.weight": ((n, hp.n_embd_v_gqa), True),
            b + "attn_q.bias": ((n,), False),
            b + "attn_k.bias": ((hp.n_embd_k_gqa,), False),
            b + "attn_v.bias": ((hp.n_embd_v_gqa,), False),
            b + "attn_output.weight": ((n, n), True),
            b + "attn_output.bias": ((n,), False),
            b + "attn_output_norm.weight": ((n,), True),
            b + "attn_output_norm.bias": ((n,), True),
            b + "ffn_up.weight": ((n, hp.n_ff), True),
            b + "ffn_up.bias": ((hp.n_ff,), False),
            b + "ffn_down.weight": ((hp.n_ff, n), True),
            b + "ffn_down.bias": ((n,), False),
            b + "layer_output_norm.weight": ((n,), True),
            b + "layer_output_norm.bias": ((n,), True),
        })
    return shapes


def refused_tensors(hp: HParams) -> dict[str, str]:
    """A reranker's classifier head (build_pooling's cls / cls_out) and fused q/k/v are not implemented."""
    why = "the classifier head of a BERT reranker is not supported"
    refused = {name: why for name in ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")}
    for il in range(hp.n_layer):
        refused[f"blk.{il}.attn_qkv.weight"] = "fused attn_qkv is not supported for bert (separate q/k/v only)"
    return refused


def forward(model, ops, token: np.ndarray | None, embd: np.ndarray | None, pos: np.ndarray,
            attn: AttentionInput, rope: RopeConfig, out_ids: np.ndarray, want_logits: bool) -> ForwardResult:
    """One ubatch through the encoder: `build`'s graph computed by the ops (ggml_graph_compute)."""
    hp = model.hparams
    if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= hp.n_ctx_train):
        bad = int(pos.max()) if int(pos.max()) >= hp.n_ctx_train else int(pos.min())
        raise EncoderPositionError(f"position {bad} is outside the model's position embeddings [0, "
                                   f"{hp.n_ctx_train}) ('{hp.arch}.context_length')")
    return ops.compute_graph(build, model, token, embd, pos, attn, rope, out_ids, want_logits)


def build(model, ops, token: np.ndarray | None, embd: np.ndarray | None, pos: np.ndarray,
          attn: AttentionInput, rope: RopeConfig, out_ids: np.ndarray, want_logits: bool) -> ForwardResult:
    """The graph of one ubatch (llama_model_bert::graph), computed by `ops` as it is built. token (n,) or embd
    (n, n_embd); pos (n,); out_ids: the rows whose output is wanted. Returns no logits: embd is the last
    layer's output (res->t_embd)."""
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_eps
    n = len(pos)
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    if model.has_tensor("token_types.weight"):  # token types are hardcoded to zero ("Sentence A")
        x = x + ops.get_rows(w("token_types.weight"), np.zeros(1, np.int64))[0]  # (n, n_embd)
    x = ops.get_rows(w("position_embd.weight"), pos) + x  # (n, n_embd)
    x = ops.layer_norm(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"], eps)  # (n, n_embd)
    kq_scale = float(np.float32(1.0) / np.sqrt(np.float32(hp.n_embd_head_k)))  # 1.0f / sqrtf(float(n_embd_head))
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        q, k, v = linears(model, ops, x, b + "attn_q", b + "attn_k", b + "attn_v")  # (n, n_embd) each
        q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
        k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        cur = attn(il, q, k, v, kq_scale)  # (n, n_head * n_embd_head_v)
        cur = linear(model, ops, cur, b + "attn_output")  # (n, n_embd)
        if il == hp.n_layer - 1:  # only the output rows go on
            cur, x = cur[out_ids], x[out_ids]
        cur = cur + x  # re-add the layer input
        cur = ops.layer_norm(cur, t[b + "attn_output_norm.weight"], t[b + "attn_output_norm.bias"], eps)
        ffn_inp = cur  # (n_out, n_embd)
        cur = ops.gelu(linear(model, ops, cur, b + "ffn_up"))  # (n_out, n_ff): build_ffn GELU, LLM_FFN_SEQ
        cur = linear(model, ops, cur, b + "ffn_down") + ffn_inp  # (n_out, n_embd)
        x = ops.layer_norm(cur, t[b + "layer_output_norm.weight"], t[b + "layer_output_norm.bias"], eps)
    return ForwardResult(logits=None, embd=x)

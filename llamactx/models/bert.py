"""The `bert` and `nomic-bert` architectures (BERT encoders: all-MiniLM, bge, e5 ...; nomic-embed-text):
src/models/bert.cpp (LLM_ARCH_BERT, and the graph nomic-bert.cpp shares with it), src/models/nomic-bert.cpp.

An encoder, run through `Context.encode` (llama_encode; a decode of such a model is an encode, as llama_decode does
for a model without memory): token + token-type (row 0, "sentence A") + absolute position embeddings, a
LayerNorm (ggml_norm with weight and bias), then per layer non-causal attention over the sequence's own tokens
with q/k/v and output biases, residual + LayerNorm, a GELU FFN (ggml_gelu: the f16 table), residual + LayerNorm
(post-norm). No output matrix, no logits: the hidden states are the embeddings, pooled as the model's
`bert.pooling_type` says unless the context asks otherwise. A reranker (pooling rank: bge-reranker, ms-marco
MiniLM cross-encoders) scores the pooled state with its classifier head (`classifier_head`: cls, tanh, cls.output;
llama-graph.cpp build_pooling). q, k and v come from separate matmuls or one fused `attn_qkv` (build_qkv).

nomic-bert differs where bert.cpp's graph asks `model.arch`: no position embeddings, NEOX RoPE on q and k instead
(`nomic-bert.rope.freq_base`), and a SwiGLU FFN (ffn_gate, ffn_up, ffn_down: silu(gate) * up, LLM_FFN_PAR)
without biases (llama.cpp loads ffn_up / ffn_down biases if present, and its graph passes none). It has no
classifier head (llama.cpp would refuse a file holding one, as llamactx does).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NEOX, ROPE_TYPE_NORM
from llamactx.ggml.vecdot import FLOAT_TYPES, matmul_float
from llamactx.ggml.vecdot_bf16 import matmul_bf16
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import linear, linears

# llama_model_rope_type (bert applies none; nomic-bert rotates q and k NEOX-style)
ARCHS = {"bert": ROPE_TYPE_NORM, "nomic-bert": ROPE_TYPE_NEOX}
CLS_TENSORS = ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")
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
                n_token_types=n_token_types, **classifier_hparams(m))


def classifier_hparams(m: Meta) -> dict:
    """The classifier keys llama_model::load_hparams reads: `classifier.output_labels` (n_cls_out = its length,
    1 without it or when empty) and `classifier.pooling_type` (the pooling before the head under pooling rank;
    unspecified: the first token's state)."""
    key = f"{m.arch}.classifier.output_labels"
    labels = m.meta.get(key, [])
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise HParamsError(f"GGUF metadata key '{key}': expected an array of strings, got {labels!r:.80}")
    pooling_cls = "unspecified"
    if f"{m.arch}.classifier.pooling_type" in m.meta:
        pooling_cls = POOLING_TYPES[m.count("classifier.pooling_type", lo=0, hi=len(POOLING_TYPES) - 1)]
    return dict(n_cls_out=len(labels) or 1, pooling_type_cls=pooling_cls)


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_bert::load_arch_tensors and llama_model_nomic_bert's: name -> (ggml shape, required). The
    token-type embeddings are optional there too (without them nothing is added); bert's position embeddings are
    required, and every part of its classifier head optional (cls: n_embd -> n_embd, cls.output: n_embd ->
    n_cls_out, each with an optional bias). q/k/v are either `attn_qkv` (fused) or three weights
    (create_tensor_qkv: `build` names the missing one); nomic-bert's ffn_gate is required."""
    n = hp.n_embd
    n_qkv = n + hp.n_embd_k_gqa + hp.n_embd_v_gqa
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((n, hp.n_vocab), True),
        "token_types.weight": ((n, hp.n_token_types), False),
        "token_embd_norm.weight": ((n,), True),
        "token_embd_norm.bias": ((n,), True),
    }
    if hp.arch == "bert":
        shapes.update({
            "position_embd.weight": ((n, hp.n_ctx_train), True),
            "cls.weight": ((n, n), False),
            "cls.bias": ((n,), False),
            "cls.output.weight": ((n, hp.n_cls_out), False),
            "cls.output.bias": ((hp.n_cls_out,), False),
        })
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        if hp.arch == "nomic-bert":
            shapes[b + "ffn_gate.weight"] = ((n, hp.n_ff), True)
        shapes.update({
            b + "attn_qkv.weight": ((n, n_qkv), False),
            b + "attn_qkv.bias": ((n_qkv,), False),
            b + "attn_q.weight": ((n, n), False),
            b + "attn_k.weight": ((n, hp.n_embd_k_gqa), False),
            b + "attn_v.weight": ((n, hp.n_embd_v_gqa), False),
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
    """nomic-bert loads no classifier head: llama.cpp refuses a file with one (its tensor count is wrong)."""
    if hp.arch != "nomic-bert":
        return {}
    return {name: "nomic-bert has no classifier head (llama.cpp loads none)" for name in CLS_TENSORS}


def classifier_head(model, ops, cur: np.ndarray) -> np.ndarray:
    """build_pooling's classification head under pooling rank, on the pooled states: cls (ggml_mul_mat, + cls.bias
    when present, then ggml_tanh: libm tanhf per element), then cls.output (ggml_mul_mat, + cls.output.bias when
    present); each part only when the model has it (a model without cls.output, jina-reranker-v1-tiny, keeps
    cls's n_embd values; one without any head keeps the states). Plain ggml_mul_mat: no LoRA reaches the head, so
    `model` is the base model. cur (n_seqs, n_embd) -> (n_seqs, n_cls_out) (or n_embd without cls.output)"""
    t = model.tensors
    if model.has_tensor("cls.weight"):
        cur = _mul_mat(ops, cur, model.weight("cls.weight"))  # (n_seqs, n_embd)
        if "cls.bias" in t:
            cur = cur + t["cls.bias"]
        cur = ops.softcap(cur, 1.0)  # ggml_tanh: cap 1 scales by exactly 1.0 twice, leaving tanhf(x)
    if model.has_tensor("cls.output.weight"):
        cur = _mul_mat(ops, cur, model.weight("cls.output.weight"))  # (n_seqs, n_cls_out)
        if "cls.output.bias" in t:
            cur = cur + t["cls.output.bias"]
    return cur


def _mul_mat(ops, x: np.ndarray, weight) -> np.ndarray:
    """ggml_mul_mat with the kernel ggml picks for the shape, one pooled row included: llamafile_sgemm refuses
    n < 2, so one sequence's row takes ggml_vec_dot_f32 / _f16 / _bf16 (llama-server scores each pair alone). The
    layers' matmuls instead compute one row like several unless the ops say ggml_single_row.
    x (n_seqs, ne0) -> (n_seqs, ne1)"""
    if weight.ggml_type in FLOAT_TYPES:
        return matmul_float(x, weight, vec_dot_for_one=True)
    if weight.ggml_type == T.BF16:
        return matmul_bf16(x, weight, vec_dot_for_one=True)
    return ops.matmul(x, weight)  # the other types take llama.cpp's kernel for the shape already


def check_positions(hp: HParams, pos: np.ndarray) -> None:
    """bert's learned position embeddings have n_ctx_train rows: a position outside them raises
    EncoderPositionError before any op runs."""
    if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= hp.n_ctx_train):
        bad = int(pos.max()) if int(pos.max()) >= hp.n_ctx_train else int(pos.min())
        raise EncoderPositionError(f"position {bad} is outside the model's position embeddings [0, "
                                   f"{hp.n_ctx_train}) ('{hp.arch}.context_length')")


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_bert::graph, for bert and nomic-bert), computed by `ops` as it is
    built. token (n,) or embd (n, n_embd); pos (n,); out_ids: the rows whose output is wanted. Returns no logits:
    embd is the last layer's output (res->t_embd)."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids = params.inp, params.rope, params.out_ids
    if model.hparams.arch == "bert" and isinstance(pos, np.ndarray):  # (a recording's positions come at run time)
        check_positions(model.hparams, pos)
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_eps
    nomic = hp.arch == "nomic-bert"
    n = len(pos)
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    if model.has_tensor("token_types.weight"):  # token types are hardcoded to zero ("Sentence A")
        x = x + ops.get_rows(w("token_types.weight"), np.zeros(1, np.int64))[0]  # (n, n_embd)
    if not nomic:
        x = ops.get_rows(w("position_embd.weight"), pos) + x  # (n, n_embd)
    x = ops.layer_norm(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"], eps)  # (n, n_embd)
    kq_scale = float(np.float32(1.0) / np.sqrt(np.float32(hp.n_embd_head_k)))  # 1.0f / sqrtf(float(n_embd_head))
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        q, k, v = _qkv(model, ops, x, b)  # (n, n_embd) each
        q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
        k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        if nomic:
            q = ops.rope(q, pos, rope.for_layer(False))
            k = ops.rope(k, pos, rope.for_layer(False))
        cur = attn(il, q, k, v, kq_scale)  # (n, n_head * n_embd_head_v)
        cur = linear(model, ops, cur, b + "attn_output")  # (n, n_embd)
        if il == hp.n_layer - 1:  # only the output rows go on
            cur, x = cur[out_ids], x[out_ids]
        cur = cur + x  # re-add the layer input
        cur = ops.layer_norm(cur, t[b + "attn_output_norm.weight"], t[b + "attn_output_norm.bias"], eps)
        ffn_inp = cur  # (n_out, n_embd)
        if nomic:  # build_ffn SILU, LLM_FFN_PAR, no biases
            gate, up = ops.matmuls(cur, [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])  # (n_out, n_ff) each
            cur = ops.matmul(ops.swiglu(gate, up), w(b + "ffn_down.weight"))  # (n_out, n_embd)
        else:
            cur = ops.gelu(linear(model, ops, cur, b + "ffn_up"))  # (n_out, n_ff): build_ffn GELU, LLM_FFN_SEQ
            cur = linear(model, ops, cur, b + "ffn_down")  # (n_out, n_embd)
        cur = cur + ffn_inp  # (n_out, n_embd)
        x = ops.layer_norm(cur, t[b + "layer_output_norm.weight"], t[b + "layer_output_norm.bias"], eps)
    return ForwardResult(logits=None, embd=x)


def _qkv(model, ops, x: np.ndarray, b: str) -> tuple:
    """build_qkv: the fused attn_qkv matmul plus its bias (or, without one, the separate q / k / v biases when all
    three are there: ggml_concat of them) and its column views; else three matmuls, each plus its bias.
    x (n, n_embd) -> q (n, n_embd), k (n, n_embd_k_gqa), v (n, n_embd_v_gqa)"""
    hp = model.hparams
    parts = ("attn_q", "attn_k", "attn_v")
    if not model.has_tensor(b + "attn_qkv.weight"):
        missing = [b + p + ".weight" for p in parts if not model.has_tensor(b + p + ".weight")]
        if missing:
            raise HParamsError(f"tensor '{missing[0]}' is missing, and so is '{b}attn_qkv.weight'")
        return tuple(linears(model, ops, x, *(b + p for p in parts)))
    qkv = ops.matmul(x, model.weight(b + "attn_qkv.weight"))  # (n, n_embd + 2 * n_embd_gqa)
    biases = [model.tensors.get(b + p + ".bias") for p in parts]
    if b + "attn_qkv.bias" in model.tensors:
        qkv = qkv + model.tensors[b + "attn_qkv.bias"]
    elif all(bias is not None for bias in biases):
        qkv = qkv + np.concatenate(biases)
    n_q, n_k = hp.n_embd, hp.n_embd + hp.n_embd_k_gqa
    return qkv[:, :n_q], qkv[:, n_q:n_k], qkv[:, n_k:]

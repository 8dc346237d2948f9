"""The `smollm3` architecture (SmolLM3): src/models/smollm3.cpp.

Llama's graph, except that every fourth layer (il + 1 a multiple of n_no_rope_layer_step = 4, a constant of
llama_model_smollm3::load_arch_hparams that no GGUF key sets) attends without RoPE ("NoPE" layers). A context
shift leaves those layers' keys as they are (llama_kv_cache::build_graph_shift skips them: HParams.has_rope).
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NORM
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models import llama
from llamactx.models.graph_inputs import ForwardResult
from llamactx.models.llama import linears, output_weight_name

ARCHS = {"smollm3": ROPE_TYPE_NORM}  # llama_model_rope_type
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache
N_NO_ROPE_LAYER_STEP = 4  # llama_hparams::n_no_rope_layer_step, set by llama_model_smollm3::load_arch_hparams


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_smollm3::load_arch_hparams: the NoPE layers; the graph asserts n_rot == the head size."""
    if hp["n_rot"] != hp["n_embd_head_k"]:
        raise HParamsError(f"'{m.arch}.rope.dimension_count' = {hp['n_rot']}: smollm3 rotates whole heads, "
                           f"expected the head size {hp['n_embd_head_k']}")
    return dict(rope_layers=tuple((il + 1) % N_NO_ROPE_LAYER_STEP != 0 for il in range(hp["n_layer"])))


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_smollm3::load_arch_tensors: llama's table without the output bias, q/k norms and frequency
    factors (which smollm3 does not load); q/k/v biases stay optional (create_tensor_qkv)."""
    shapes = llama.tensor_shapes(hp)
    del shapes["rope_freqs.weight"]
    for il in range(hp.n_layer):
        for name in ("attn_output.bias", "attn_q_norm.weight", "attn_k_norm.weight"):
            del shapes[f"blk.{il}.{name}"]
    return shapes


def build(ops, params: GraphParams) -> ForwardResult:
    """The graph of one ubatch (llama_model_smollm3::graph), computed by `ops` as it is built or recorded."""
    model, token, embd, pos = params.model, params.token, params.embd, params.pos
    attn, rope, out_ids, want_logits = params.inp, params.rope, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    n = len(pos)
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    kq_scale = float(np.float32(1.0) / np.sqrt(np.float32(hp.n_embd_head_k)))  # 1.0f / sqrtf(n_embd_head)
    rp = rope.for_layer(False)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        cur = ops.rms_norm(x, t[b + "attn_norm.weight"], eps)  # (n, n_embd)
        q, k, v = linears(model, ops, cur, b + "attn_q", b + "attn_k", b + "attn_v")
        q = q.reshape(n, hp.n_head, hp.n_embd_head_k)
        k = k.reshape(n, hp.n_head_kv, hp.n_embd_head_k)
        v = v.reshape(n, hp.n_head_kv, hp.n_embd_head_v)
        if hp.has_rope(il):  # (il + 1) % 4 != 0
            q = ops.rope(q, pos, rp)
            k = ops.rope(k, pos, rp)
        cur = attn(il, q, k, v, kq_scale)  # (n, n_head * n_embd_head_v)
        cur = ops.matmul(cur, w(b + "attn_output.weight"))  # (n, n_embd)
        if il == hp.n_layer - 1:  # only the output rows go through the last FFN
            cur, x = cur[out_ids], x[out_ids]
        x = cur + x  # ffn_inp
        cur = ops.rms_norm(x, t[b + "ffn_norm.weight"], eps)
        gate, up = ops.matmuls(cur, [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")])  # (n, n_ff) each
        x = ops.matmul(ops.swiglu(gate, up), w(b + "ffn_down.weight")) + x  # (n, n_embd)
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = ops.matmul(x, w(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)


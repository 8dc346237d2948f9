"""The mixture-of-experts FFN block: llm_graph_context::build_moe_ffn (src/llama-graph.cpp), for the architectures
whose layers route each token to n_expert_used of n_expert SwiGLU experts (qwen3moe; qwen2moe, with a shared
expert; llama with experts, Mixtral; gpt-oss, whose router and experts have biases and whose experts gate with
swiglu_oai).

The graph, as llama.cpp builds it: router logits = ffn_gate_inp x; probabilities (softmax); the top
n_expert_used (ggml_argsort_top_k); their probabilities as weights, normalized to sum 1; gate and up of each
selected expert (ggml_mul_mat_id: each expert's rows together), SwiGLU, down; the outputs times their weights,
added slot by slot. With a selection bias (`exp_probs_b`, DeepSeek-V3) the choice is made on the biased
probabilities, and with expert groups among the best groups only; the weights stay unbiased. With biases
(gpt-oss) the router's bias is added to its logits (ggml_add) and each expert matmul's output gets its expert's
bias row (ggml_add_id). The ops (llamactx.ggml.moe) give each step llama.cpp's
bits.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from llamactx.hparams import HParams

SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0  # build_moe_ffn's LLM_FFN_SWIGLU_OAI_MOE constants


def expert_tensor_shapes(hp: HParams, b: str, gate_required: bool = True,
                         biases: bool = False) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A MoE layer's router and stacked expert tensors (ggml shapes: (ne0, ne1, n_expert)); with `biases`
    (gpt-oss) the router's bias (n_expert,) and each expert's output bias (ne1, n_expert), all required."""
    shapes = {
        b + "ffn_gate_inp.weight": ((hp.n_embd, hp.n_expert), True),
        b + "ffn_gate_exps.weight": ((hp.n_embd, hp.n_ff_exp, hp.n_expert), gate_required),
        b + "ffn_up_exps.weight": ((hp.n_embd, hp.n_ff_exp, hp.n_expert), True),
        b + "ffn_down_exps.weight": ((hp.n_ff_exp, hp.n_embd, hp.n_expert), True),
    }
    if biases:
        shapes.update({
            b + "ffn_gate_inp.bias": ((hp.n_expert,), True),
            b + "ffn_gate_exps.bias": ((hp.n_ff_exp, hp.n_expert), True),
            b + "ffn_up_exps.bias": ((hp.n_ff_exp, hp.n_expert), True),
            b + "ffn_down_exps.bias": ((hp.n_embd, hp.n_expert), True),
        })
    return shapes


def build_moe_ffn(model, ops, cur: np.ndarray, b: str, norm_w: bool = True, w_scale: float = 0.0,
                  gating: str = "softmax", act: str = "silu", biases: bool = False) -> np.ndarray:
    """build_moe_ffn for layer prefix `b`: act "silu" (LLM_FFN_SILU: SwiGLU, or SiLU without gate experts) or
    "swiglu_oai" (LLM_FFN_SWIGLU_OAI_MOE); `biases`: the router's and the experts' biases (gpt-oss's
    ffn_*.bias, `expert_tensor_shapes(biases=True)`). cur (n, n_embd) -> (n, n_embd)"""
    hp = model.hparams
    w = model.weight
    logits = ops.matmul(cur, w(b + "ffn_gate_inp.weight"))  # (n, n_expert)
    if biases:
        logits = logits + model.tensors[b + "ffn_gate_inp.bias"]
    probs_b = model.tensors.get(b + "exp_probs_b.bias")  # DeepSeek-V3's selection bias (deepseek2, glm4moe)
    if probs_b is None and hp.n_expert_groups <= 1:
        selected, weights = ops.moe_route(logits, hp.n_expert_used, gating, norm_w, w_scale)  # (n, k) each
    else:
        selected, weights = ops.moe_route(logits, hp.n_expert_used, gating, norm_w, w_scale, probs_b=probs_b,
                                          groups=(hp.n_expert_groups, hp.n_group_used))

    def experts_of(x, part: str) -> np.ndarray:  # ggml_mul_mat_id, then ggml_add_id of the bias rows
        y = ops.matmul_id(x, w(f"{b}ffn_{part}_exps.weight"), selected)  # (n, k, ne1)
        return ops.add_id(y, model.tensors[f"{b}ffn_{part}_exps.bias"], selected) if biases else y

    up = experts_of(cur, "up")  # (n, k, n_ff_exp)
    has_gate = model.has_tensor(b + "ffn_gate_exps.weight")
    gate = experts_of(cur, "gate") if has_gate else None  # (n, k, n_ff_exp)
    if act == "swiglu_oai":
        cur = ops.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)
    else:
        cur = ops.swiglu(gate, up) if has_gate else ops.silu(up)
    experts = experts_of(cur, "down")  # (n, k, n_embd)
    return ops.moe_sum(experts, weights)  # (n, n_embd)


def shared_expert(model, ops, cur: np.ndarray, b: str) -> np.ndarray:
    """qwen2moe's shared expert (src/models/qwen2moe.cpp, "FFN shared expert"): a SwiGLU FFN every token goes
    through, times a per-token gate sigmoid(ffn_gate_inp_shexp . cur), computed as ggml does: ggml_silu(g) / g.
    cur (n, n_embd) -> (n, n_embd)"""
    w = model.weight
    vec = w(b + "ffn_gate_inp_shexp.weight")  # (n_embd,): ggml_mul_mat of a 1-D tensor, one output column
    g = ops.matmul(cur, dataclasses.replace(vec, shape=(vec.shape[0], 1), data=vec.data.reshape(1, -1)))  # (n, 1)
    gate = ops.silu(g) / g  # (n, 1)
    gate_x, up = ops.matmuls(cur, [w(b + "ffn_gate_shexp.weight"), w(b + "ffn_up_shexp.weight")])
    return ops.matmul(ops.swiglu(gate_x, up), w(b + "ffn_down_shexp.weight")) * gate  # (n, n_embd)

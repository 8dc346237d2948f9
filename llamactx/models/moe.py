"""The mixture-of-experts FFN block: llm_graph_context::build_moe_ffn (src/llama-graph.cpp), for the architectures
whose layers route each token to n_expert_used of n_expert SwiGLU experts (qwen3moe; llama with experts, Mixtral).

The graph, as llama.cpp builds it: router logits = ffn_gate_inp x; probabilities (softmax); the top
n_expert_used (ggml_argsort_top_k); their probabilities as weights, normalized to sum 1; gate and up of each
selected expert (ggml_mul_mat_id: each expert's rows together), SwiGLU, down; the outputs times their weights,
added slot by slot. The ops (llamactx.ggml.moe) give each step llama.cpp's bits.
"""

from __future__ import annotations

import numpy as np

from llamactx.hparams import HParams


def expert_tensor_shapes(hp: HParams, b: str, gate_required: bool = True) -> dict[str, tuple[tuple[int, ...], bool]]:
    """A MoE layer's router and stacked expert tensors (ggml shapes: (ne0, ne1, n_expert))."""
    return {
        b + "ffn_gate_inp.weight": ((hp.n_embd, hp.n_expert), True),
        b + "ffn_gate_exps.weight": ((hp.n_embd, hp.n_ff_exp, hp.n_expert), gate_required),
        b + "ffn_up_exps.weight": ((hp.n_embd, hp.n_ff_exp, hp.n_expert), True),
        b + "ffn_down_exps.weight": ((hp.n_ff_exp, hp.n_embd, hp.n_expert), True),
    }


def build_moe_ffn(model, ops, cur: np.ndarray, b: str, norm_w: bool = True, w_scale: float = 0.0,
                  gating: str = "softmax") -> np.ndarray:
    """build_moe_ffn with LLM_FFN_SILU for layer prefix `b`. cur (n, n_embd) -> (n, n_embd)"""
    hp = model.hparams
    w = model.weight
    logits = ops.matmul(cur, w(b + "ffn_gate_inp.weight"))  # (n, n_expert)
    selected, weights = ops.moe_route(logits, hp.n_expert_used, gating, norm_w, w_scale)  # (n, k) each
    up = ops.matmul_id(cur, w(b + "ffn_up_exps.weight"), selected)  # (n, k, n_ff_exp)
    if model.has_tensor(b + "ffn_gate_exps.weight"):
        gate = ops.matmul_id(cur, w(b + "ffn_gate_exps.weight"), selected)  # (n, k, n_ff_exp)
        act = ops.swiglu(gate, up)
    else:
        act = ops.silu(up)
    experts = ops.matmul_id(act, w(b + "ffn_down_exps.weight"), selected)  # (n, k, n_embd)
    return ops.moe_sum(experts, weights)  # (n, n_embd)

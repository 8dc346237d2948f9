"""The ops interface: every operation a model builder calls, declared once (ggml.h's op constructors, as the
`llm_build_*` graphs of llama.cpp call them), and the parameters a graph is built from (llm_graph_params,
src/llama-graph.h).

A model builder (`build(ops, params)` in llamactx/models/*.py) computes one ubatch by calling the methods of `Ops`
on an ops object, and reads its inputs from a `GraphParams`. Three classes implement `Ops`
(tests/test_ops_interface.py checks that each has every method, with a compatible signature):

    backend/reference.py  ReferenceOps: each op computed as it is called, bit for bit llama.cpp's x86 kernels (the
                          oracle every faster path is tested against)
    backend/fast.py       FastOps: the same bits on the numba kernels; a build recorded once per ubatch shape and
                          run as one compiled program, op by op where the executor lacks an op
    ggml/graph.py         Graph: records the build as nodes (ggml_tensor) for ggml/kernels/compute.py to plan and
                          run; an op without an executor node raises GraphUnsupported, and the ubatch runs op by op

Adding an op (docs/architecture.md, "Adding an op"): declare it in `Ops` below with its shapes and the ggml
function it follows; compute it in `ReferenceOps` (the oracle: numpy plus the scalar routines of llamactx.ggml,
tested against llama.cpp's numbers); in `Graph`, record a node (and encode and run it in ggml/kernels/compute.py)
or raise GraphUnsupported until the executor has it. FastOps inherits the reference and overrides an op only
where a kernel computes it faster with the same bits.

The backend imports only llamactx.ggml, llamactx.gguf and llamactx.errors (tests/test_layout.py): what it needs of
the model side comes through the objects it is handed, as the small interfaces declared here (a KV cache view,
a compiled attention input, a LoRA-adapted weight).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from llamactx.ggml.inputs import RopeParams, VisibleCells


@dataclass(frozen=True, slots=True)
class GraphParams:
    """What one ubatch's graph is built from (llm_graph_params): made by the context for each ubatch
    (llama_context::process_ubatch) and handed, with the architecture's `build`, to `Ops.compute_graph`. A
    recording backend builds with a copy whose arrays are graph inputs (dataclasses.replace)."""

    model: Any  # the Model, or the context's AdaptedModel while LoRA adapters are set (llamactx.lora)
    token: np.ndarray | None  # (n,) token ids, or None when the ubatch carries embeddings
    embd: np.ndarray | None  # (n, n_embd) float32 input embeddings, or None
    pos: np.ndarray  # (n,) positions
    inp: Any  # the memory input (llm_graph_input_*): attention (models.graph_inputs), a recurrent view, or both
    rope: Any  # models.graph_inputs.RopeConfig: the full and sliding-window layers' RopeParams
    out_ids: np.ndarray  # (n_outputs,) the ubatch rows whose outputs are kept
    want_logits: bool  # False: only the final-normed hidden state (an encoder, embeddings)
    loras: tuple = ()  # the context's (adapter, scale) pairs (llm_graph_params::loras); their weights are in model


class KVCacheView(Protocol):
    """The KV cache as the attention ops read it: one ubatch's view (llamactx.memory.kv_cache.KVView), cells
    [0, n_kv) of a cache of kv_size cells."""

    type_k: str
    type_v: str
    n_embd_k_gqa: int
    n_kv: int
    kv_size: int
    idx: np.ndarray  # (n_tokens,) the ubatch's cells

    def k_rows(self, il: int) -> np.ndarray: ...  # (n_kv, n_embd_k_gqa) float32
    def v_rows(self, il: int) -> np.ndarray: ...  # (n_kv, n_embd_v_gqa) float32
    def k_stored(self, il: int) -> np.ndarray: ...  # (n_kv, row) as stored
    def v_stored(self, il: int) -> np.ndarray: ...  # (n_kv, row) as stored
    def k_layers(self) -> np.ndarray: ...  # (n_layers held, kv_size, row): every layer, as stored
    def v_layers(self) -> np.ndarray: ...
    def real_cells(self, cells: np.ndarray) -> np.ndarray: ...  # the cache cells of view cells


class CompiledAttentionInput(Protocol):
    """An attention input a compiled graph can bind at run time (models.graph_inputs.KVAttention): its views of
    the global and sliding-window caches, their visible cells, and each layer's row in the cache it reads. A
    backend tells one apart by its `layer_rows` (other inputs have none; a Protocol isinstance costs ~50 us)."""

    flash: bool
    view: KVCacheView
    view_swa: KVCacheView
    vis: VisibleCells
    vis_swa: VisibleCells

    def layer_rows(self) -> np.ndarray | None:
        """(n_layer,) int64: each layer's row in the cache it reads; None where the executor lacks this input
        (a quantized cache): the ubatch then runs op by op."""


class LoraAdaptedWeight:
    """A weight with a context's LoRA pairs (llamactx.lora.AdaptedWeight derives from this): `base`, the model's
    weight, and `loras`, ((pair with .a and .b weights, scale), ...) in the order they apply. The ops compute its
    matmul as build_lora_mm (`lora_matmuls`). A plain base class, so that telling one apart is one isinstance."""

    __slots__ = ()
    base: Any
    loras: tuple


def is_adapted(weights) -> bool:
    return any(isinstance(w, LoraAdaptedWeight) for w in weights)


def lora_matmuls(ops: Ops, x: np.ndarray, weights) -> list[np.ndarray]:
    """`ops.matmuls` of weights some of which are `LoraAdaptedWeight`s, as build_lora_mm (src/llama-graph.cpp):
    the base products first (fused where the ops can), then for each adapter res = res + (B (A x)) * scale, each
    step rounded to float32 like ggml_mul_mat, ggml_scale and ggml_add. (n, n_in) -> [(n, n_out_i)]"""
    ys = ops.matmuls(x, [w.base if isinstance(w, LoraAdaptedWeight) else w for w in weights])
    for i, w in enumerate(weights):
        if not isinstance(w, LoraAdaptedWeight):
            continue
        for lw, scale in w.loras:
            ab = ops.matmul(ops.matmul(x, lw.a), lw.b)  # (n, rank) -> (n, n_out)
            ys[i] = ys[i] + ab * scale
    return ys


class Ops(Protocol):
    """The ops a model builder calls. Arrays are float32 numpy arrays, or graph tensors under a recording
    backend (Graph); shapes are written row first, as the builders hold them (ggml's ne reversed)."""

    # -- the graph ------------------------------------------------------------------------------------------------

    def compute_graph(self, build: Callable, params: GraphParams):
        """Run `build(ops, params)` for one ubatch (ggml_graph_compute of llama_model::build_graph) ->
        models.graph_inputs.ForwardResult. Eager ops call it; a recording backend may replay a recorded graph."""

    def pos_input(self, pos: np.ndarray, cols: int, set_input: Callable) -> np.ndarray:
        """An input computed from the ubatch's positions (llm_graph_input_i::set_input): set_input(pos) ->
        (n, cols)."""

    # -- weights --------------------------------------------------------------------------------------------------

    def get_rows(self, weight, ids: np.ndarray) -> np.ndarray:
        """ggml_get_rows: embedding rows, dequantized. ids (n,) -> (n, ne0)"""

    def matmul(self, x: np.ndarray, weight) -> np.ndarray:
        """ggml_mul_mat(W, x), y = x W^T; a LoraAdaptedWeight adds its adapters (build_lora_mm).
        (n, ne0) -> (n, ne1)"""

    def matmuls(self, x: np.ndarray, weights) -> list[np.ndarray]:
        """`matmul` of one input by several weights (Q, K, V; gate, up), each output with its own bits."""

    def matmul_heads(self, x: np.ndarray, weight) -> np.ndarray:
        """ggml_mul_mat of a 3-D weight (ne0, ne1, n_head), each head's rows times its own matrix (deepseek2's
        absorbed attn_k_b / attn_v_b). (n, n_head, ne0) -> (n, n_head, ne1)"""

    # -- mixture of experts ---------------------------------------------------------------------------------------

    def moe_route(self, logits: np.ndarray, n_expert_used: int, gating: str, norm_w: bool, w_scale: float,
                  probs_b: np.ndarray | None = None, groups: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray]:
        """build_moe_ffn's router: (n, n_expert) -> (selected (n, k), weights (n, k))."""

    def matmul_id(self, x: np.ndarray, weight, selected: np.ndarray) -> np.ndarray:
        """ggml_mul_mat_id: x (n, ne0) or (n, k, ne0), weight (ne0, ne1, n_expert), selected (n, k) -> (n, k, ne1)"""

    def add_id(self, x: np.ndarray, bias: np.ndarray, selected: np.ndarray) -> np.ndarray:
        """ggml_add_id: each slot's row plus its expert's bias row. (n, k, m) -> (n, k, m)"""

    def swiglu_oai(self, gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
        """ggml_swiglu_oai: gpt-oss's clamped SwiGLU. (..., k) -> (..., k)"""

    def moe_sum(self, experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """The experts' outputs times their weights, slots added in order. (n, k, n_embd), (n, k) -> (n, n_embd)"""

    # -- norms and activations ------------------------------------------------------------------------------------

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """ggml_rms_norm then ggml_mul, over the last dimension. (..., n) -> (..., n)"""

    def layer_norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
        """ggml_norm, ggml_mul, ggml_add (build_norm LLM_NORM). (..., n) -> (..., n)"""

    def l2_norm(self, x: np.ndarray, eps: float) -> np.ndarray:
        """build_gdn_l2_norm (qwen35's delta net). (..., n) -> (..., n)"""

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """ggml_swiglu_split: silu(gate) * up."""

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """ggml_geglu_split: gelu(gate) * up (the f16 GELU table)."""

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """ggml_gelu (the f16 GELU table)."""

    def silu(self, x: np.ndarray) -> np.ndarray:
        """ggml_silu."""

    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        """ggml_sigmoid."""

    def softplus(self, x: np.ndarray) -> np.ndarray:
        """ggml_softplus."""

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """cap * tanh(x / cap): final logit soft-capping (ggml_scale, ggml_tanh, ggml_scale)."""

    # -- rope -----------------------------------------------------------------------------------------------------

    def rope(self, x: np.ndarray, pos: np.ndarray, rp: RopeParams) -> np.ndarray:
        """ggml_rope_ext. (n, n_head, head_dim) -> (n, n_head, head_dim)"""

    def rope_imrope(self, x: np.ndarray, pos: np.ndarray, rp: RopeParams, sections: tuple[int, ...]) -> np.ndarray:
        """ggml_rope_multi (GGML_ROPE_TYPE_IMROPE) of text tokens. (n, n_head, head_dim) -> same"""

    # -- recurrent layers -----------------------------------------------------------------------------------------

    def ssm_conv(self, conv_x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """ggml_ssm_conv of one sequence: (n_ch, d_conv - 1 + n_t), (n_ch, d_conv) -> (n_t, n_ch)"""

    def ssm_scan(self, state, x, dt, a, b, c) -> tuple[np.ndarray, np.ndarray]:
        """ggml_ssm_scan (Mamba-2) of one sequence -> (y (n_t, n_head, head_dim), the final state)"""

    def gated_delta_net(self, q, k, v, g, beta, state) -> tuple[np.ndarray, np.ndarray]:
        """ggml_gated_delta_net of one sequence -> (output (n_t, H_v, S), the final state (H_v, S, S)). `state` is
        the caller's own copy: a backend may update it in place and return it."""

    # -- attention (called by the attention inputs of models/graph_inputs.py) ---------------------------------------

    def attention_kv(self, q: np.ndarray, kv: KVCacheView, il: int, mask: np.ndarray, vis: VisibleCells,
                     kq_scale: float, flash: bool, n_threads: int = 1, softcap: float = 0.0,
                     sinks: np.ndarray | None = None) -> np.ndarray:
        """build_attn_mha over layer `il` of a KV cache view. q (n, n_head, d_k) -> (n, n_head * d_v)"""

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, kq_scale: float,
                  flash: bool, k_type: str = "f16", softcap: float = 0.0, sinks: np.ndarray | None = None,
                  v_type: str = "f16") -> np.ndarray:
        """build_attn_mha over K/V given as arrays (n_kv, n_head_kv, d). -> (n, n_head * d_v)"""

    def attention_no_cache(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, kq_scale: float,
                           flash: bool) -> np.ndarray:
        """build_attn_mha over the ubatch's own f32 K/V (an encoder). -> (n, n_head * d_v)"""

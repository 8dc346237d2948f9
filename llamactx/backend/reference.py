"""The ops layer: the few tensor operations a forward pass calls, with llama.cpp's precision choices.

`ReferenceOps` is the oracle the fast kernels are tested against: numpy plus plain scalar numba loops that follow,
operation for operation, the x86 kernel llama.cpp (ggml-cpu, AVX-512 build) runs for each op and shape, so that its
logits come out bit for bit (docs/numerics.md; llamactx.ggml.vecdot, .vecdot_k, .ggml_vec, .attention_exact). The model
code (`llamactx/models/*.py`) only calls these methods, the ops interface declared in backend/ops.py, so a faster
backend replaces them without touching it.
Where the numbers depend on how ggml computes, the method says which ggml function it follows.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.backend.ops import GraphParams, KVCacheView, LoraAdaptedWeight, is_adapted, lora_matmuls
from llamactx.ggml import delta_net as ggml_delta_net
from llamactx.ggml import ssm as ggml_ssm
from llamactx.ggml import vec as ggml_vec
from llamactx.ggml.attention import attention_f16, attention_f16_cells
from llamactx.ggml.cpu import arithmetic
from llamactx.ggml.flash_attn import flash_attn_f16_cells
from llamactx.ggml.inputs import ROPE_TYPE_NEOX, RopeParams, VisibleCells
from llamactx.ggml.moe import add_id as moe_add_id
from llamactx.ggml.moe import (
    argsort_desc,
    expert,
    group_by_expert,
    group_mask,
    norm_weights,
    sigmoid_rows,
    soft_max_rows,
)
from llamactx.ggml.moe import swiglu_oai as moe_swiglu_oai
from llamactx.ggml.mrope import imrope_text_cache
from llamactx.ggml.quants_cpu import fake_quant, vec_dot_type
from llamactx.ggml.vecdot import EXACT_TYPES, FLOAT_TYPES, matmul_exact, matmul_float
from llamactx.ggml.vecdot_bf16 import matmul_bf16
from llamactx.ggml.vecdot_k import is_exact_k, matmul_k
from llamactx.ggml.vecdot_kx import KX_TYPES, matmul_kx
from llamactx.ggml.vecdot_lowbit import matmul_lowbit
from llamactx.ggml.vecdot_nl import NL_TYPES, matmul_nl
from llamactx.gguf.quants import dequantize
from llamactx.gguf.quants_lowbit import LOWBIT_TYPES


class ReferenceOps:
    """Ops that follow ggml-cpu's arithmetic exactly enough to reproduce llama.cpp's logits."""

    name = "reference"

    def __init__(self, ggml_single_row: bool = False) -> None:
        """ggml_single_row: compute a matmul (F32 / F16 weights) or an attention with one row through ggml's
        single-row kernel (ggml_vec_dot_f32 / _f16), as llama.cpp does in single-token decode, and pick flash
        attention's kernel from the ubatch's shape as ggml does (fewer than 64 tokens: the f16-accumulating one,
        one token over 512+ cells: split over the threads). By default one row
        is computed in the same order as several, so a token's result does not depend on its ubatch (prompt
        caching and batched decode stay bit-reproducible). K-quant matmuls always take llama.cpp's kernel, which
        depends on the row count (llamactx.ggml.vecdot_k)."""
        self._gelu = ggml_vec.gelu_table()  # (65536,) float32
        self.ggml_single_row = ggml_single_row
        # flash attention's one-chunk kernel (ggml_single_row only) accumulates in half precision as ggml built
        # with AVX512-FP16 does: the target's choice (ggml.cpu.arithmetic), computed exactly on any CPU
        self.fp16_accumulator = bool(arithmetic()["fp16_accumulator"])

    # -- graphs -------------------------------------------------------------------------------------------------

    def compute_graph(self, build, params: GraphParams):
        """Run an architecture's `build(ops, params)` (models/*.py) for one ubatch. Here every op computes as it
        is called; a backend may instead record the graph once and rerun it (FastOps)."""
        return build(self, params)

    @staticmethod
    def pos_input(pos: np.ndarray, cols: int, set_input) -> np.ndarray:
        """A graph input computed from the ubatch's positions (an llm_graph_input_i's set_input: mistral3's
        attention temperature): set_input(pos) -> (n, cols) float32. A recording backend computes it per run."""
        return set_input(pos)

    # -- weights ------------------------------------------------------------------------------------------------

    def get_rows(self, weight, ids: np.ndarray) -> np.ndarray:
        """Embedding lookup (ggml_get_rows): the selected rows dequantized to f32. -> (n, ne0)"""
        rows = weight.data[ids]  # (n, row_bytes) or typed (n, ne0)
        return dequantize(_raw_bytes(rows), weight.ggml_type, (weight.shape[0], len(ids)))

    def matmul(self, x: np.ndarray, weight) -> np.ndarray:
        """y = x @ W^T (ggml_mul_mat(W, x)). Activations are first converted to the weight's vec_dot_type
        (Q8_0 / Q8_1 / Q8_K, or f16 / bf16), as ggml-cpu does before its dot products. The 32-block types, F32 /
        F16 (llamactx.ggml.vecdot), Q4_K / Q6_K (llamactx.ggml.vecdot_k), Q2_K / Q3_K / Q5_K / IQ4_XS (.vecdot_kx),
        IQ4_NL / MXFP4 and Q4_K with ne1 % 8 != 0 (.vecdot_nl, .vecdot_kx) and BF16 (.vecdot_bf16) follow the x86
        kernel llama.cpp runs for this shape bit for bit; what remains multiplies in float64 and rounds. A weight
        with a context's LoRA adapters is a `LoraAdaptedWeight` (backend/ops.py; llamactx.lora).
        (n, ne0) -> (n, ne1)"""
        if isinstance(weight, LoraAdaptedWeight):
            return lora_matmuls(self, x, [weight])[0]
        if x.shape[0] == 0:  # an ubatch without outputs reaches the last FFN with no rows
            return np.zeros((0, weight.n_rows), np.float32)
        if weight.ggml_type in EXACT_TYPES:
            return matmul_exact(x, weight)
        if weight.ggml_type in FLOAT_TYPES:
            return matmul_float(x, weight, self.ggml_single_row)
        if is_exact_k(weight):
            return matmul_k(x, weight)
        if weight.ggml_type in KX_TYPES or weight.ggml_type == T.Q4_K:  # Q4_K: not repacked (ne1 % 8 != 0)
            return matmul_kx(x, weight)
        if weight.ggml_type in NL_TYPES:
            return matmul_nl(x, weight)
        if weight.ggml_type == T.BF16:
            return matmul_bf16(x, weight, self.ggml_single_row)
        if weight.ggml_type in LOWBIT_TYPES:  # IQ1-IQ3 (tiled from 8 rows, else vec_dot), TQ1_0 / TQ2_0
            return matmul_lowbit(x, weight)
        w = dequantize(_raw_bytes(weight.data), weight.ggml_type, weight.shape)  # (ne1, ne0)
        xq = self.activations_for(x, weight.ggml_type)
        return (xq.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)

    def matmuls(self, x: np.ndarray, weights) -> list[np.ndarray]:
        """`matmul` of one input with several weights (Q, K, V; gate, up): separate ggml_mul_mat calls in
        llama.cpp, so a backend may run them as one as long as every output keeps its bits. -> [(n, ne1_i)]"""
        if is_adapted(weights):
            return lora_matmuls(self, x, weights)
        return [self.matmul(x, w) for w in weights]

    def matmul_rows(self, x: np.ndarray, weight) -> np.ndarray:
        """`matmul` with every row computed alone, as ggml_mul_mat_id runs an expert's rows: ggml_vec_dot with one
        row (or a repacked weight's gemv), whatever the row count. (n, ne0) -> (n, ne1)"""
        if weight.ggml_type in FLOAT_TYPES:
            return matmul_float(x, weight, each_row_alone=True)
        if weight.ggml_type in EXACT_TYPES or x.shape[0] <= 1:  # the 32-block types are row invariant
            return self.matmul(x, weight)
        if weight.ggml_type in LOWBIT_TYPES:  # per expert as for a matrix: tiled from 8 rows (tiled.cpp mmid), vec_dot
            return self.matmul(x, weight)
        # the other types' kernel depends on the row count (repacked gemm, tiled, tinyBLAS): one row at a time
        return np.concatenate([self.matmul(x[i : i + 1], weight) for i in range(x.shape[0])])

    def matmul_heads(self, x: np.ndarray, weight) -> np.ndarray:
        """ggml_mul_mat of a 3-D weight (ne0, ne1, n_head) by x (n, n_head, ne0): one 2-D product per head, as
        ggml_compute_forward_mul_mat runs them (deepseek2's attn_k_b / attn_v_b). -> (n, n_head, ne1)"""
        return np.stack([self.matmul(np.ascontiguousarray(x[:, h]), expert(weight, h))
                         for h in range(x.shape[1])], axis=1)

    # -- mixture of experts (llamactx.ggml.moe) -----------------------------------------------------------------

    @staticmethod
    def moe_route(logits: np.ndarray, n_expert_used: int, gating: str, norm_w: bool, w_scale: float,
                  probs_b: np.ndarray | None = None, groups: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray]:
        """build_moe_ffn's router: probabilities (ggml_soft_max, or ggml_sigmoid), the top n_expert_used by
        ggml_argsort_top_k (llama.cpp's tie order), their probabilities (re-softmaxed for "softmax_weight"),
        normalized to sum 1 (norm_w) and scaled (w_scale, unless 0 or 1). DeepSeek-V3's selection: probs_b
        (exp_probs_b, (n_expert,)) is added to the probabilities the choice is made on (not to the weights), and
        with groups = (n_expert_groups > 1, n_group_used) only the experts of each token's n_group_used groups of
        best top-2 sum compete (llamactx.ggml.moe.group_mask). logits (n, n_expert) ->
        (selected (n, k) int32, weights (n, k) float32)"""
        if gating == "softmax_weight":
            probs = np.ascontiguousarray(logits, np.float32)
        else:
            probs = soft_max_rows(logits) if gating == "softmax" else sigmoid_rows(logits)  # (n, n_expert)
        selection = probs if probs_b is None else np.add(probs, probs_b, dtype=np.float32)  # (n, n_expert)
        if groups[0] > 1 and len(selection):
            selection = group_mask(selection, *groups)
        selected = argsort_desc(selection, n_expert_used)  # (n, k)
        weights = np.take_along_axis(probs, selected, axis=1)  # ggml_get_rows: (n, k)
        if gating == "softmax_weight":
            weights = soft_max_rows(weights)
        if norm_w:
            weights = norm_weights(weights)
        if w_scale not in (0.0, 1.0):
            weights = weights * np.float32(w_scale)
        return selected, weights

    def matmul_id(self, x: np.ndarray, weight, selected: np.ndarray) -> np.ndarray:
        """ggml_mul_mat_id: each token's row times each of its experts (x (n, ne0), shared by the slots) or each
        slot's own row (x (n, k, ne0)), grouped per expert so that an expert's weights are read once.
        weight: ggml shape (ne0, ne1, n_expert); selected (n, k) -> (n, k, ne1)"""
        n, k = selected.shape
        out = np.empty((n, k, weight.shape[1]), np.float32)  # (n, k, ne1)
        tokens, slots, starts = group_by_expert(selected, int(weight.shape[2]))
        for e in np.flatnonzero(np.diff(starts)):
            t, s = tokens[starts[e] : starts[e + 1]], slots[starts[e] : starts[e + 1]]
            rows = x[t] if x.ndim == 2 else x[t, s]  # (m, ne0)
            out[t, s] = self.matmul_rows(rows, expert(weight, int(e)))
        return out

    @staticmethod
    def add_id(x: np.ndarray, bias: np.ndarray, selected: np.ndarray) -> np.ndarray:
        """ggml_add_id: each slot's row plus the bias row of its expert (gpt-oss's expert biases).
        x (n, k, m), bias (n_expert, m), selected (n, k) -> (n, k, m)"""
        return moe_add_id(x, bias, selected)

    @staticmethod
    def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
        """ggml_swiglu_oai: gpt-oss's clamped SwiGLU, x / (1 + expf(-alpha x)) * (y + 1) (llamactx.ggml.moe).
        (..., k) -> (..., k)"""
        return moe_swiglu_oai(gate, up, alpha, limit)

    @staticmethod
    def moe_sum(experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """ggml_mul(experts, weights), then the slots added in order, ((e0 + e1) + e2) + ...
        experts (n, k, n_embd), weights (n, k) -> (n, n_embd)"""
        weighted = experts * weights[:, :, None]  # (n, k, n_embd)
        out = weighted[:, 0]
        for i in range(1, weighted.shape[1]):
            out = out + weighted[:, i]
        return np.ascontiguousarray(out, np.float32)

    @staticmethod
    def activations_for(x: np.ndarray, weight_type: int) -> np.ndarray:
        """x as the weight's vec_dot kernel sees it. (n, k) float32 -> (n, k) float32"""
        vdt = vec_dot_type(weight_type)
        if vdt == T.F32:
            return np.ascontiguousarray(x, np.float32)
        if vdt in (T.F16, T.BF16):
            return x.astype(np.float16).astype(np.float32) if vdt == T.F16 else _round_bf16(x)
        return fake_quant(np.ascontiguousarray(x, np.float32), vdt)

    # -- elementwise --------------------------------------------------------------------------------------------

    @staticmethod
    def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """ggml_rms_norm then ggml_mul: squares summed in order in double, mean and scale in float.
        (..., n) -> (..., n)"""
        return ggml_vec.rms_norm(x, weight, eps)

    @staticmethod
    def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """silu(gate) * up (ggml_swiglu_split) with ggml's vectorized exp (ggml_vec_swiglu_f32)."""
        return ggml_vec.swiglu(gate, up)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """gelu(gate) * up with ggml's f16 GELU table (ggml_vec_geglu_f32 under GGML_GELU_FP16)."""
        return ggml_vec.geglu(gate, up, self._gelu)

    def gelu(self, x: np.ndarray) -> np.ndarray:
        """ggml_gelu with ggml's f16 GELU table (ggml_vec_gelu_f32 under GGML_GELU_FP16)."""
        return ggml_vec.gelu(x, self._gelu)

    @staticmethod
    def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
        """build_norm(LLM_NORM): ggml_norm (mean and variance sums in double, the variance's squares reduced per
        vector as ggml_vec_cvar_f32), then ggml_mul and ggml_add. (..., n) -> (..., n)"""
        return ggml_vec.layer_norm(x, weight, bias, eps)

    @staticmethod
    def softcap(x: np.ndarray, cap: float) -> np.ndarray:
        """cap * tanh(x / cap) as ggml_scale(1.0f / cap), ggml_tanh (libm tanhf), ggml_scale(cap): final logit
        soft-capping (ggml_vec.softcap)."""
        return ggml_vec.softcap(x, cap)

    @staticmethod
    def silu(x: np.ndarray) -> np.ndarray:
        """ggml_silu (ggml_vec_silu_f32), llamactx.ggml.ssm.silu. (..., k) -> (..., k)"""
        return ggml_ssm.silu(x)

    # -- state-space ops (llamactx.ggml.ssm) ----------------------------------------------------------------------

    @staticmethod
    def ssm_conv(conv_x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """ggml_ssm_conv of one sequence: conv_x (n_ch, d_conv - 1 + n_t), weight (n_ch, d_conv) -> (n_t, n_ch)"""
        return ggml_ssm.ssm_conv(conv_x, weight)

    @staticmethod
    def ssm_scan(state, x, dt, a, b, c) -> tuple[np.ndarray, np.ndarray]:
        """ggml_ssm_scan (Mamba-2) of one sequence: -> y (n_t, n_head, head_dim), the final state"""
        return ggml_ssm.ssm_scan(state, x, dt, a, b, c)

    # -- gated delta net (llamactx.ggml.delta_net: qwen35) --------------------------------------------------------

    @staticmethod
    def gated_delta_net(q, k, v, g, beta, state) -> tuple[np.ndarray, np.ndarray]:
        """ggml_gated_delta_net of one sequence: -> output (n_t, H_v, S), the final state (H_v, S, S)"""
        return ggml_delta_net.gated_delta_net(q, k, v, g, beta, state)

    @staticmethod
    def softplus(x: np.ndarray) -> np.ndarray:
        """ggml_softplus (libm expf / logf). (...) -> (...)"""
        return ggml_delta_net.softplus(x)

    @staticmethod
    def sigmoid(x: np.ndarray) -> np.ndarray:
        """ggml_sigmoid: 1 / (1 + expf(-x)), libm. (...) -> (...)"""
        return sigmoid_rows(x)

    @staticmethod
    def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
        """build_gdn_l2_norm: ggml_rms_norm(x, eps / n) scaled by 1 / sqrtf(n). (..., n) -> (..., n)"""
        return ggml_delta_net.l2_norm(x, eps)

    # -- rope ---------------------------------------------------------------------------------------------------

    @staticmethod
    def rope_cache(pos: np.ndarray, rp: RopeParams) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin of every (position, pair) as ggml_rope_cache_init: theta multiplied by theta_scale one pair at a
        time in float32, frequency factors and YaRN as rope_yarn, libm cosf / sinf. -> two (n, n_rot/2) float32"""
        return ggml_vec.rope_cache(pos, rp)

    def rope(self, x: np.ndarray, pos: np.ndarray, rp: RopeParams) -> np.ndarray:
        """ggml_rope_ext on (n, n_head, head_dim) float32. NORM rotates adjacent pairs (x[2i], x[2i+1]); NEOX
        rotates (x[i], x[i + n_rot/2]). Dimensions past n_rot pass through."""
        cos, sin = self.rope_cache(pos, rp)  # (n, n_rot/2)
        return ggml_vec.rope_rotate(x, cos, sin, rp.n_rot, rp.mode == ROPE_TYPE_NEOX)

    def rope_imrope(self, x: np.ndarray, pos: np.ndarray, rp: RopeParams, sections: tuple[int, ...]) -> np.ndarray:
        """ggml_rope_multi (GGML_ROPE_TYPE_IMROPE) of text tokens, whose t / h / w positions are `pos` and e is 0
        (llamactx.ggml.mrope); NEOX pairs. (n, n_head, head_dim) -> (n, n_head, head_dim)"""
        cos, sin = self.rope_cache(pos, rp)  # (n, n_rot/2)
        cos0, sin0 = self.rope_cache(np.zeros(1, np.int64), rp)  # (1, n_rot/2): the fourth section's angle 0
        cos, sin = imrope_text_cache(cos, sin, cos0, sin0, rp.n_rot, sections)
        return ggml_vec.rope_rotate(x, cos, sin, rp.n_rot, True)

    # -- attention ----------------------------------------------------------------------------------------------

    def attention_kv(self, q: np.ndarray, kv: KVCacheView, il: int, mask: np.ndarray, vis: VisibleCells,
                     kq_scale: float, flash: bool, n_threads: int = 1, softcap: float = 0.0,
                     sinks: np.ndarray | None = None) -> np.ndarray:
        """`attention` over cells [0, kv.n_kv) of layer `il`, through the memory's view of the KV cache
        (llamactx.memory.KVView): the cache is decoded to f32 first. vis: the cells `mask` leaves visible, in
        the order the sums run (by position). Flash attention over an f16 cache follows ggml's kernels bit for
        bit (llamactx.ggml.flash_attn; n_threads: the graph's threads, which split a single token's cells).
        softcap: the attention logit soft-cap (hparams.f_attn_logit_softcapping, gemma2; 0: none), as
        build_attn_mha applies it without flash attention and ggml_flash_attn_ext with it. sinks: the layer's
        attention sinks (n_head,) (attn_sinks.weight, gpt-oss; None: none), as ggml_soft_max_add_sinks and
        ggml_flash_attn_ext_add_sinks add them.
        q: (n, n_head, d_k) -> (n, n_head * d_v)"""
        n_head_kv = kv.n_embd_k_gqa // q.shape[-1]
        if flash and kv.type_k == "f16" and kv.type_v == "f16":
            return flash_attn_f16_cells(q, kv.k_stored(il), kv.v_stored(il), n_head_kv, vis, kq_scale, kv.kv_size,
                                        n_threads, self.ggml_single_row, self.fp16_accumulator, softcap, sinks)
        if kv.type_k == "f16" and not flash and q.shape[-1] % 16 == 0:
            return attention_f16_cells(q, kv.k_rows(il), kv.v_rows(il), n_head_kv, vis, kq_scale,
                                       self.ggml_single_row, softcap, sinks)
        k = kv.k_rows(il).reshape(kv.n_kv, n_head_kv, -1)  # (n_kv, n_head_kv, d_k)
        v = kv.v_rows(il).reshape(kv.n_kv, n_head_kv, -1)  # (n_kv, n_head_kv, d_v)
        return self.attention(q, k, v, mask, kq_scale, flash, kv.type_k, softcap, sinks, kv.type_v)

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        mask: np.ndarray,
        kq_scale: float,
        flash: bool,
        k_type: str = "f16",
        softcap: float = 0.0,
        sinks: np.ndarray | None = None,
        v_type: str = "f16",
    ) -> np.ndarray:
        """Multi-head attention with grouped KV heads (build_attn_mha).

        q: (n, n_head, d_k) float32; k: (n_kv, n_head_kv, d_k) and v: (n_kv, n_head_kv, d_v) as read from the cache
        (already f32); mask: (n, n_kv) float32 of 0 / -inf. Without flash attention ggml multiplies the f16 cache
        with f16-rounded q, and the softmax probabilities are rounded to f16 before P*V. With flash attention q is
        rounded like the K cache's vec_dot_type and P*V stays in f32. The f16 cache without flash attention follows
        ggml bit for bit (llamactx.ggml.attention); the other cases sum the products in float64 and round, so a
        token's result does not depend on the other tokens and cells. softcap, sinks: `attention_kv`'s. v_type: the
        V cache's type (a bf16 V rounds the probabilities to bf16 without flash attention, its vec_dot_type).
        -> (n, n_head * d_v)"""
        if k_type == "f16" and not flash and q.shape[-1] % 16 == 0:
            return attention_f16(q, k, v, mask, kq_scale, self.ggml_single_row, softcap, sinks)
        if k_type == "f16" and flash:  # k, v hold f16 values: ggml's flash_attn_ext over them as a cache
            n_kv, n_head_kv = k.shape[:2]
            k16 = k.astype(np.float16).reshape(n_kv, -1)  # (n_kv, n_head_kv * d_k)
            v16 = v.astype(np.float16).reshape(n_kv, -1)  # (n_kv, n_head_kv * d_v)
            return flash_attn_f16_cells(q, k16, v16, n_head_kv, VisibleCells.from_mask(mask), kq_scale, n_kv, 1,
                                        self.ggml_single_row, self.fp16_accumulator, softcap, sinks)
        n, n_head, _ = q.shape
        n_head_kv = k.shape[1]
        qc = self.activations_for(q.reshape(n * n_head, -1), _KV_TYPE_IDS[k_type]).reshape(q.shape)
        qg = qc.reshape(n, n_head_kv, n_head // n_head_kv, -1).transpose(1, 0, 2, 3)  # (n_head_kv, n, gqa, d_k)
        kt = k.transpose(1, 2, 0).astype(np.float64)  # (n_head_kv, d_k, n_kv)
        scores = np.matmul(qg.reshape(n_head_kv, -1, qg.shape[-1]).astype(np.float64), kt).astype(np.float32)
        if softcap:
            scores = ggml_vec.softcap(scores, softcap)
        scores = scores.reshape(n_head_kv, n, -1, k.shape[0]) * np.float32(kq_scale) + mask[None, :, None, :]
        sink = None if sinks is None else np.asarray(sinks, np.float32).reshape(n_head_kv, 1, -1, 1)
        probs = _softmax(scores, sink)  # (n_head_kv, n, gqa, n_kv)
        if not flash:
            probs = _round_bf16(probs) if v_type == "bf16" else probs.astype(np.float16).astype(np.float32)
        out = np.matmul(
            probs.reshape(n_head_kv, -1, k.shape[0]).astype(np.float64), v.transpose(1, 0, 2).astype(np.float64)
        ).astype(np.float32)  # (n_head_kv, n*gqa, d_v)
        out = out.reshape(n_head_kv, n, n_head // n_head_kv, -1).transpose(1, 0, 2, 3)  # (n, n_head_kv, gqa, d_v)
        return np.ascontiguousarray(out.reshape(n, -1), np.float32)


    def attention_no_cache(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, kq_scale: float,
                           flash: bool) -> np.ndarray:
        """build_attn_mha over the ubatch's own K/V (llm_graph_input_attn_no_cache: an encoder, llama_encode),
        with the kernel ggml picks for the ubatch's shape. Flash attention: K and V cast to f16 (ggml_cast),
        ggml_flash_attn_ext (one chunk below 64 rows, else tiled). Without: K and V stay f32; kq = ggml_mul_mat
        (ggml_vec_dot_f32: q is a permuted view), ggml_soft_max_ext (kq * scale + mask), kqv = ggml_mul_mat of
        the contiguous V^T and the probabilities (llamafile's tinyBLAS where it takes the shape).
        q: (n, n_head, d_k), k: (n_kv, n_head_kv, d_k), v: (n_kv, n_head_kv, d_v) float32 -> (n, n_head * d_v)"""
        n, n_head, _ = q.shape
        n_kv, n_head_kv, d_v = v.shape
        if flash:
            k16 = k.astype(np.float16).reshape(n_kv, -1)  # (n_kv, n_head_kv * d_k)
            v16 = v.astype(np.float16).reshape(n_kv, -1)  # (n_kv, n_head_kv * d_v)
            # the sums follow the cells' indices in the ubatch (ggml's tiles and lanes), other sequences' included
            vis = VisibleCells.on_lanes(mask, np.arange(n_kv)) or VisibleCells.from_mask(mask)
            return flash_attn_f16_cells(q, k16, v16, n_head_kv, vis, kq_scale, n_kv, 1, True, self.fp16_accumulator)
        out = np.empty((n, n_head, d_v), np.float32)  # (n, n_head, d_v)
        for h in range(n_head):
            hk = h // (n_head // n_head_kv)
            kq = matmul_float(q[:, h], F32Rows(k[:, hk]), vec_dot_for_one=True, each_row_alone=n > 1)  # (n, n_kv)
            probs = soft_max_rows(kq * np.float32(kq_scale) + mask)  # (n, n_kv)
            out[:, h] = matmul_float(probs, F32Rows(v[:, hk].T), vec_dot_for_one=True)  # (n, d_v)
        return out.reshape(n, -1)


_KV_TYPE_IDS = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1,
                "q5_0": T.Q5_0, "q5_1": T.Q5_1, "iq4_nl": T.IQ4_NL}


def _softmax(x: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """ggml_soft_max over the last axis: exp(x - max), the sum accumulated in double. sink (broadcast against
    x[..., :1]): one more logit per row without a value (attention sinks), in the max and the sum."""
    m = x.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)  # masked entries: exp(-inf) = 0
    s = e.astype(np.float64).sum(axis=-1, keepdims=True)
    if sink is not None:
        s = s + np.exp(sink - m).astype(np.float64)
    return (e * (1.0 / s).astype(np.float32)).astype(np.float32)


def _raw_bytes(data: np.ndarray) -> np.ndarray:
    """A weight's stored bytes as the 1-D uint8 array `dequantize` takes (F32 / F16 data is typed)."""
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


class F32Rows:
    """A float32 matrix seen as an F32 weight (rows of ne0), for the activation x activation products of
    attention without a cache (ggml_mul_mat of two f32 tensors)."""

    ggml_type = T.F32

    def __init__(self, rows: np.ndarray) -> None:
        self.data = np.ascontiguousarray(rows, np.float32)  # (n_rows, ne0)
        self.n_rows = self.data.shape[0]

"""FastOps: the ops layer on the numba kernels (llamactx.ggml.kernels). Same interface (backend/ops.py) and numbers as
`ReferenceOps` (reference.py): matmuls run on weights packed once per model, embedding rows come from the packed table,
attention reads the f16 cache in place (ggml/kernels/attention.py); norms, RoPE and the GLUs are ggml/vec.py's.
A forward pass runs as a graph recorded once per ubatch shape and executed in one compiled call (ggml/graph.py,
ggml/kernels/compute.py), op by op where the executor lacks an op it uses.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.backend.ops import (
    GraphParams,
    KVCacheView,
    LoraAdaptedWeight,
    is_adapted,
    lora_matmuls,
)
from llamactx.backend.reference import ReferenceOps
from llamactx.ggml.attention import sink_values
from llamactx.ggml.cpu import active_path, check_target, set_threads
from llamactx.ggml.graph import Graph, GraphAttention, GraphUnsupported
from llamactx.ggml.kernels import bf16
from llamactx.ggml.kernels.attention import attend
from llamactx.ggml.kernels.compute import WeightTable, plan_graph
from llamactx.ggml.kernels.delta_rule import gated_delta_net_
from llamactx.ggml.kernels.delta_rule import ssm_conv as ssm_conv_tokens
from llamactx.ggml.kernels.flash import flash_attend
from llamactx.ggml.kernels.get_rows import get_rows, get_rows_q8_0_packed
from llamactx.ggml.kernels.matmul import expert_order, matmul, matmul_id
from llamactx.ggml.kernels.repack import can_pack, pack_weight, pack_weights
from llamactx.ggml.moe import group_by_expert, stacked
from llamactx.ggml.vecdot import EXACT_TYPES, is_repacked_q4_0
from llamactx.ggml.vecdot_k import is_exact_k
from llamactx.ggml.vecdot_kx import is_repacked_kx
from llamactx.ggml.vecdot_nl import NL_TYPES, is_repacked_nl

_Q8_0 = int(T.Q8_0)
_KERNEL_EXACT = frozenset(int(t) for t in EXACT_TYPES)  # 32-block types: bit-identical to ggml in the kernels
_KERNEL_LOWBIT = frozenset(int(t) for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M))
_KERNEL_TILED = frozenset(int(t) for t in (T.Q3_K, T.Q5_K, T.IQ4_XS))  # never repacked by llama.cpp (x86)
_ORDERS: dict = {}  # (ggml_type, shape) -> FastOps._kernel_order's answer
_RANGES: dict = {}  # the weights' shapes -> _column_ranges' answer


class FastOps(ReferenceOps):
    """Kernel-backed ops for one context. Packed weights live on the model (`model.derived`), so every context
    of a model shares one packed copy; `threads` is set by the context before each decode. A forward runs as a
    compiled graph (llamactx.ggml.kernels.compute) where the executor has every op it uses, else op by op."""

    name = "fast"
    MAX_PLANS = 16  # graphs kept per context, by ubatch shape

    def __init__(self, model) -> None:
        check_target()  # an unusable NUMBA_CPU_NAME / NUMBA_CPU_FEATURES is a TargetError, before any compile
        super().__init__()
        self.model = model
        self.threads = 1
        self.kernel_path = active_path()
        self._plans: OrderedDict = OrderedDict()  # shape key -> (GraphPlan, result template), or None: eager
        self._arena = np.zeros(0, np.float32)  # (the largest plan's arena_size,) the plans' intermediates

    def set_threads(self, n_threads: int) -> None:
        # numba cannot start more threads than NUMBA_NUM_THREADS (the core count): more would only oversubscribe
        self.threads = min(n_threads, numba.config.NUMBA_NUM_THREADS)
        set_threads(self.threads)

    # -- graphs -------------------------------------------------------------------------------------------------

    def compute_graph(self, build, params: GraphParams):
        """`build(ops, params)` as one compiled program, planned on the first ubatch of its shape and rerun for
        the next ones (llama.cpp's graph reuse); op by op where the executor lacks something it uses."""
        # op by op: LoRA (lora_matmuls), and under ggml_single_row one token or flash attention (the reference
        # kernels pick ggml's order from the shape, the program's attention is the row-invariant one)
        inp = params.inp
        single = self.ggml_single_row and (len(params.pos) == 1 or getattr(inp, "flash", False))
        layer_rows = getattr(inp, "layer_rows", None)  # a CompiledAttentionInput (ops.py) has it; other inputs not
        rows = layer_rows() if layer_rows is not None else None
        if rows is None or params.loras or single:
            return build(self, params)
        key = (build, params.model, len(params.pos), len(params.out_ids), params.token is None, params.want_logits)
        if key not in self._plans:
            self._plans[key] = self._plan(build, params)
            while len(self._plans) > self.MAX_PLANS:
                self._plans.popitem(last=False)
        self._plans.move_to_end(key)
        entry = self._plans[key]
        if entry is None:
            return build(self, params)
        plan, result = entry
        if self._arena.size < plan.arena_size:
            self._arena = np.zeros(plan.arena_size, np.float32)
        logits, out_embd = plan.run(self, self._weight_table(), self._arena, params.token, params.embd, params.pos,
                                    inp, rows, params.out_ids)
        return dataclasses.replace(result, logits=logits, embd=out_embd)

    def _plan(self, build, params: GraphParams):
        """(GraphPlan, the build's result with tensors in place of arrays), or None if it cannot be a graph."""
        # F32 matrices (a MoE router) run in the program on the reference's exact float kernel
        g = Graph(supports=lambda w: not isinstance(w, LoraAdaptedWeight)
                  and (self._kernel_order(w) is not None or w.ggml_type == T.F32))
        n = len(params.pos)
        recorded = dataclasses.replace(  # the ubatch's arrays as the graph's inputs, bound at each run
            params,
            token=g.input("token", (n,)) if params.token is not None else None,
            embd=g.input("embd", params.embd.shape) if params.embd is not None else None,
            pos=g.input("pos", (n,)),
            inp=GraphAttention(g, params.model.hparams),
            out_ids=g.input("out_ids", (len(params.out_ids),)),
        )
        try:
            result = build(g, recorded)
            table = self._weight_table()
            plan = plan_graph(g, result.logits, result.embd,
                              lambda ws: table.index(tuple(w.name for w in ws), lambda: self._packed_stack(ws)),
                              self._kernel_order)
        except GraphUnsupported:
            return None
        return plan, result

    def _weight_table(self) -> WeightTable:
        return self.model.derived(("weight_table",), WeightTable)

    def _packed(self, weight):
        replaces = (weight.name,) if self.model.has_tensor(weight.name) else ()  # not an expert's view
        return self.model.derived(("packed", weight.name), lambda: pack_weight(weight), replaces=replaces)

    def matmul(self, x: np.ndarray, weight) -> np.ndarray:
        # The kernels reproduce ggml's vec_dot, and for the K-quants llama.cpp repacks or tiles (vecdot_k) its
        # order too (Q3_K/Q5_K/IQ4_XS, repacked Q2_K/IQ4_NL/MXFP4: kxquants), and BF16 in tinyBLAS's (kernels.bf16,
        # read in place); the other weights (F32/F16, BF16 off tinyBLAS's shapes, and Q2_K/IQ4_NL/MXFP4/Q4_K with
        # ne1 % 8 != 0) stay on the reference, which follows llama.cpp for them (vecdot_kx, vecdot_nl, vecdot_bf16).
        if isinstance(weight, LoraAdaptedWeight):  # LoRA: the base product on the kernels, then the adapters'
            return lora_matmuls(self, x, [weight])[0]
        order = self._kernel_order(weight)
        if x.shape[0] == 0 or order is None or self._vec_dot_bf16(x, [weight]):
            return super().matmul(x, weight)
        return matmul(x, self._packed(weight), self.threads, llama_order=order)

    def matmuls(self, x: np.ndarray, weights) -> list[np.ndarray]:
        # weights of one kernel type run as one matrix (rows stacked): one activation quantization and one thread
        # launch; every output row is computed as in its own matmul, so the bits do not change
        if is_adapted(weights):
            return lora_matmuls(self, x, weights)
        kinds = {self._kernel_order(w) for w in weights}
        types = {(w.ggml_type, w.shape[0]) for w in weights}
        if x.shape[0] == 0 or len(types) != 1 or len(kinds) != 1 or None in kinds or self._vec_dot_bf16(x, weights):
            return super().matmuls(x, weights)
        y = matmul(x, self._packed_stack(weights), self.threads, llama_order=kinds.pop())  # (n, sum of ne1)
        return [y[:, a:b] for a, b in _column_ranges(weights)]

    def matmul_id(self, x: np.ndarray, weight, selected: np.ndarray) -> np.ndarray:
        # the expert types the kernels run as ggml_mul_mat_id does (kernels.matmul.expert_order): one packed
        # matrix of all experts' rows, every expert's rows in one launch
        n_ff = int(weight.shape[1])
        if expert_order(weight.ggml_type, n_ff) < 0 or x.shape[0] == 0:
            return super().matmul_id(x, weight, selected)
        pw = self._packed(stacked(weight))
        t, s, starts = group_by_expert(selected, int(weight.shape[2]))
        rows = x[t] if x.ndim == 2 else x[t, s]  # (n * k, ne0) grouped by expert
        out = np.empty((*selected.shape, n_ff), np.float32)  # (n, k, ne1)
        out[t, s] = matmul_id(rows, pw, starts, n_ff, self.threads)
        return out

    def _packed_stack(self, weights):
        """One weight packed, or several (same type and k) as one matrix, rows stacked."""
        if len(weights) == 1:
            return self._packed(weights[0])
        names = tuple(w.name for w in weights)
        return self.model.derived(("packed", names), lambda: pack_weights(weights), replaces=names)

    def _vec_dot_bf16(self, x: np.ndarray, weights) -> bool:
        """One row by a BF16 weight under ggml_single_row: ggml_vec_dot_bf16's order (the reference), not
        tinyBLAS's."""
        return self.ggml_single_row and x.shape[0] == 1 and any(w.ggml_type == T.BF16 for w in weights)

    @staticmethod
    def _kernel_order(weight) -> bool | None:
        """llama_order for the kernels' matmul of this weight, None where the reference computes it: a function of
        its type and shape, cached (a decode step asks ~100 times)."""
        key = (weight.ggml_type, tuple(weight.shape))
        order = _ORDERS.get(key, _ORDERS)
        if order is _ORDERS:
            order = _ORDERS[key] = FastOps._order_of(weight)
        return order

    @staticmethod
    def _order_of(weight) -> bool | None:
        if weight.ggml_type in _KERNEL_EXACT:  # a repacked Q4_0 weight: llama.cpp's repacked gemm/gemv order
            return is_repacked_q4_0(weight)
        if weight.ggml_type in _KERNEL_TILED:  # ggml_vec_dot below 8 rows, the tiled kernel from 8 (kxquants)
            return True
        if weight.ggml_type == T.Q2_K:  # the kernels have its repacked order (ne1 % 8 == 0, an AVX-512 target)
            return True if is_repacked_kx(weight) else None
        if weight.ggml_type in NL_TYPES:  # the kernels have llama.cpp's repacked order only (ne1 % 8 == 0)
            return True if is_repacked_nl(weight) else None
        if weight.ggml_type in _KERNEL_LOWBIT:  # vec_dot's order below 8 rows, tiled from 8 (kernels.klowbit)
            return True
        if weight.ggml_type == T.BF16:  # tinyBLAS's order (llama.cpp's from 2 rows; one row like several, as F32)
            return True if bf16.supports(weight) else None
        return True if can_pack(weight.ggml_type) and is_exact_k(weight) else None

    def attention_kv(self, q, kv: KVCacheView, il, mask, vis, kq_scale, flash, n_threads=1, softcap=0.0, sinks=None):
        # an f16 cache is read in place, only the cells each token sees
        d_v = kv.v_stored(il).shape[1] // (kv.n_embd_k_gqa // q.shape[-1])
        # ggml's kernel picked from the ubatch's shape (vec_dot order for one token; flash attention's three
        # kernels): the reference has it
        single = self.ggml_single_row and (q.shape[0] == 1 or flash)
        # logit soft-capping (gemma2), and attention sinks (gpt-oss) with flash attention, are computed by the
        # reference kernels, exactly; the compiled kq / softmax / kqv kernel takes sinks itself
        if (kv.type_k != "f16" or kv.type_v != "f16" or q.shape[-1] % 16 or d_v % 16 or single or softcap
                or (flash and sinks is not None)):
            return super().attention_kv(q, kv, il, mask, vis, kq_scale, flash, n_threads, softcap, sinks)
        n, n_head, _ = q.shape
        out = np.empty((n, n_head * d_v), np.float32)  # (n, n_head * d_v)
        args = (np.ascontiguousarray(q, np.float32).reshape(n, -1), kv.k_stored(il).view(np.uint16),
                kv.v_stored(il).view(np.uint16), n_head, kv.n_embd_k_gqa // q.shape[-1], vis.cells, vis.n_cells,
                vis.mask_add, np.float32(kq_scale), out, self.threads)
        if flash:
            flash_attend(*args)
        else:
            attend(*args, sink_values(sinks, n_head))
        return out

    def ssm_conv(self, conv_x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        # the reference's sums; a token-major input (qwen35's) vectorized across channels (kernels.delta_rule)
        return ssm_conv_tokens(conv_x, weight)

    def gated_delta_net(self, q, k, v, g, beta, state):
        # the reference's bits, a row of the state at a time, in place in the caller's copy (ops.py) when it is a
        # writable float32 array (kernels.delta_rule)
        ok = isinstance(state, np.ndarray) and state.dtype == np.float32 and state.flags.c_contiguous
        s = state if ok and state.flags.writeable else np.array(state, np.float32)
        return gated_delta_net_(q, k, v, g, beta, s.reshape(v.shape[1], v.shape[2], v.shape[2])), s

    def get_rows(self, weight, ids: np.ndarray) -> np.ndarray:
        """Embedding rows. A Q8_0 table (SmolLM2's and Gemma's, tied to the output matrix) is read from its packed
        copy, so its file pages stay released: q * d is exact in float32, the same bits as dequantizing."""
        ids = np.asarray(ids)
        if weight.ggml_type != _Q8_0:
            return get_rows(weight, ids)
        return get_rows_q8_0_packed(self._packed(weight), ids)


def _column_ranges(weights) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each weight's outputs in the stacked matmul's columns (cached by the shapes)."""
    key = tuple(tuple(w.shape) for w in weights)
    ranges = _RANGES.get(key)
    if ranges is None:
        stops = np.cumsum([w.n_rows for w in weights]).tolist()
        ranges = _RANGES[key] = tuple(zip([0, *stops[:-1]], stops, strict=True))
    return ranges

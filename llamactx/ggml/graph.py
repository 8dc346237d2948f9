"""Compute graphs: the nodes a forward pass builds, for an executor to plan and run (ggml.c's graph building).

In llama.cpp the model code (`llm_build_llama`) calls ggml_mul_mat, ggml_rms_norm, ggml_rope_ext, ... which only
record `ggml_tensor` nodes; ggml-alloc places them in one buffer and ggml-cpu's `ggml_graph_compute` runs them on one
thread pool, and an unchanged ubatch shape reuses the graph (`llm_graph_result::can_reuse`). `Graph` plays ggml.c's
part: it implements the ops interface the forward passes call (llamactx/backend/ops.py; the same as `ReferenceOps`),
an op without an executor node raising GraphUnsupported, and its `Tensor`s support the
few numpy operations they use (+, * by a scalar, a per-row factor, a vector along the rows or a tensor of the same
shape, / of the same shape, reshape, rows by index, columns, one index of a 4-D head's parts, copy,
np.concatenate; converting one to an array raises GraphUnsupported naming the node),
so `models/*.py` build a graph with the code that computes eagerly on other ops. llamactx.ggml.kernels.compute
plans and runs it. A hybrid model's recurrent layers read their states through the input (GraphRecurrent records
ssm_conv / gated_delta_net / ssm_scan over the states the executor binds at run time, llm_graph_input_rs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llamactx.errors import LlamactxError
from llamactx.ggml.inputs import RopeParams
from llamactx.ggml.moe import expert, stacked
from llamactx.ggml.mrope import ImropeTable


class GraphUnsupported(LlamactxError, NotImplementedError):
    """The forward uses something the executor does not run (a weight type without a kernel, flash attention,
    ...): a documented limit, never shown to users, since the caller then computes the ubatch op by op."""


@dataclass(eq=False, slots=True)
class Tensor:
    """A graph node (ggml_tensor): `op` applied to `src` with `params`, of logical `shape` (n rows first). A view
    (reshape, one weight's columns of a stacked matmul) reads columns col0.. of `base`'s rows."""

    graph: Graph
    op: str
    src: tuple
    shape: tuple[int, ...]
    params: tuple = ()
    base: Tensor | None = None
    col0: int = 0
    index: int = field(default=-1)

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64))

    @property
    def storage(self) -> Tensor:
        """The node whose buffer holds this tensor's values."""
        return self.base if self.base is not None else self

    def __len__(self) -> int:
        return self.shape[0]

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """array + tensor and array * tensor are the tensor's own add / mul; any other ufunc of a graph tensor
        raises GraphUnsupported naming it (numpy would otherwise convert the tensor)."""
        if method == "__call__" and not kwargs and len(inputs) == 2 and ufunc in (np.add, np.multiply):
            other = inputs[0] if inputs[1] is self else inputs[1]
            return self.__add__(other) if ufunc is np.add else self.__mul__(other)
        raise GraphUnsupported(f"numpy.{ufunc.__name__} of a graph tensor ({self.op} node, shape {self.shape})")

    def __array__(self, *args, **kwargs):
        """A graph tensor has no values while recording: model code that converts one to numpy (np.asarray,
        np.ascontiguousarray, ...) cannot be recorded, and says where."""
        raise GraphUnsupported(f"numpy conversion of a graph tensor ({self.op} node, shape {self.shape})")

    def __array_function__(self, func, types, args, kwargs):
        """numpy functions over graph tensors: np.concatenate of two along the last axis (ggml_concat),
        np.where(t > 0, t, 0) (ggml_relu: nemotron_h's FFN), nothing else."""
        if func is np.concatenate:
            seq, axis = args[0], kwargs.get("axis", args[1] if len(args) > 1 else 0)
            if len(seq) == 2 and all(isinstance(t, Tensor) for t in seq) and axis in (-1, len(seq[0].shape) - 1):
                return self.graph.concat(seq[0], seq[1])
        if func is np.where and len(args) == 3 and not kwargs and isinstance(args[0], _Positive) \
                and args[0].tensor is args[1] and np.isscalar(args[2]) and args[2] == 0:
            return self.graph.node("relu", (args[1],), args[1].shape)
        raise GraphUnsupported(f"numpy.{func.__name__} of a graph tensor ({self.op} node, shape {self.shape})")

    def copy(self) -> Tensor:
        """A contiguous copy (ggml_cont): the tensor itself where it owns its storage."""
        if self.base is None:
            return self
        return self.graph.node("cont", (self,), self.shape, (1, 0, 0))

    def reshape(self, *shape: int) -> Tensor:
        """The same rows seen with other trailing dimensions: (n, a * b) <-> (n, a, b); -1 allowed once."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if shape[0] != self.rows:
            raise GraphUnsupported(f"reshape {self.shape} -> {shape} changes the rows")
        if -1 in shape[1:]:
            known = int(np.prod([s for s in shape[1:] if s != -1], dtype=np.int64))
            shape = tuple(self.cols // known if s == -1 else s for s in shape)
        if int(np.prod(shape[1:], dtype=np.int64)) != self.cols:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        return self.graph.view(self, shape, 0)

    def __add__(self, other) -> Tensor:
        if isinstance(other, Tensor):
            return self.graph.binary("add", self, other)
        vec = np.asarray(other, np.float32)
        if vec.shape != (self.cols,):
            raise GraphUnsupported(f"add of a {vec.shape} array to {self.shape}")
        return self.graph.node("add_row", (self,), self.shape, (self.graph.vector(vec),))

    __radd__ = __add__

    def __mul__(self, other) -> Tensor:
        if isinstance(other, Tensor) and other.shape == (self.rows, 1):  # each row by its own factor (ggml_mul)
            return self.graph.node("mul_col", (self, other), self.shape)
        if isinstance(other, Tensor):  # element by element (ggml_mul of one shape)
            return self.graph.binary("mul", self, other)
        if not np.isscalar(other):  # a vector along the last dimension (ggml_mul broadcasting rows)
            vec = np.asarray(other, np.float32)
            if vec.shape != (self.shape[-1],):
                raise GraphUnsupported(f"multiplication of {self.shape} by a {vec.shape} array")
            return self.graph.node("mul_row", (self,), self.shape, (self.graph.vector(vec),))
        return self.graph.node("scale", (self,), self.shape, (np.float32(other),))

    __rmul__ = __mul__

    def __gt__(self, other) -> _Positive:
        """t > 0, only as np.where's condition (ggml_relu's x > 0 ? x : 0)."""
        if not (np.isscalar(other) and other == 0):
            raise GraphUnsupported(f"comparison of a graph tensor with {other!r}")
        return _Positive(self)

    def __truediv__(self, other) -> Tensor:
        if not isinstance(other, Tensor):
            raise GraphUnsupported("division by an array")
        return self.graph.binary("div", self, other)

    def __getitem__(self, ids) -> Tensor:
        if isinstance(ids, tuple) and len(ids) == 2 and ids[0] == slice(None) and isinstance(ids[1], slice):
            return self._columns(ids[1])
        if (isinstance(ids, tuple) and len(ids) == 3 and len(self.shape) == 3 and ids[:2] == (slice(None),) * 2
                and isinstance(ids[2], slice)):
            return self._head_columns(ids[2])
        if (isinstance(ids, tuple) and len(ids) == 3 and len(self.shape) == 4 and ids[:2] == (slice(None),) * 2
                and isinstance(ids[2], (int, np.integer))):
            return self._head_part(int(ids[2]))
        if not (isinstance(ids, Tensor) and ids.op == "input" and ids.params[0] == "out_ids"):
            raise GraphUnsupported("indexing other than rows by the output ids")
        return self.graph.node("select", (self, ids), (ids.rows, *self.shape[1:]))

    def _columns(self, cols: slice) -> Tensor:
        """x[:, a:b] of a 2-D tensor: a view of its columns (ggml_view_2d of a fused matmul's output: phi3's
        q/k/v of attn_qkv, its gate and up halves of ffn_up)."""
        start, stop, step = cols.indices(self.cols)
        if len(self.shape) != 2 or step != 1 or stop <= start:
            raise GraphUnsupported(f"columns {cols} of a {self.shape} tensor")
        return self.graph.view(self, (self.rows, stop - start), start)

    def _head_columns(self, cols: slice) -> Tensor:
        """x[:, :, a:b] of a (n, n_head, d) tensor, copied (ggml_cont of a ggml_view_3d: deepseek2's q_nope /
        q_pe). -> (n, n_head, b - a)"""
        n, n_head, d = self.shape
        start, stop, step = cols.indices(d)
        if step != 1 or stop <= start:
            raise GraphUnsupported(f"columns {cols} of each head of a {self.shape} tensor")
        return self.graph.node("cont", (self,), (n, n_head, stop - start), (n_head, d, start))

    def _head_part(self, i: int) -> Tensor:
        """x[:, :, i] of a (n, n_head, m, d) tensor, copied (ggml_cont of a ggml_view_3d: qwen35's query and
        gate halves of each head). -> (n, n_head, d)"""
        n, n_head, m, d = self.shape
        if not 0 <= i < m:
            raise IndexError(f"index {i} of a dimension of {m}")
        return self.graph.node("cont", (self,), (n, n_head, d), (n_head, m * d, i * d))


@dataclass(frozen=True, slots=True)
class _Positive:
    """`tensor > 0` while recording: what np.where(tensor > 0, tensor, 0) turns into a relu node."""

    tensor: Tensor


class Graph:
    """Records a forward pass. `supports(weight)` says whether the executor has a matmul kernel for a weight;
    anything it cannot run raises GraphUnsupported while building."""

    def __init__(self, supports) -> None:
        self.nodes: list[Tensor] = []
        self.vectors: list[np.ndarray] = []  # 1-D float32 operands (norm weights, biases), by index
        self.weights: list[tuple] = []  # weight tuples of the matmuls (stacked rows), by index
        self.ropes: list[RopeParams | ImropeTable] = []
        self._supports = supports

    # -- nodes ----------------------------------------------------------------------------------------------------

    def node(self, op: str, src: tuple, shape: tuple[int, ...], params: tuple = ()) -> Tensor:
        t = Tensor(self, op, src, tuple(int(s) for s in shape), params, index=len(self.nodes))
        self.nodes.append(t)
        return t

    def view(self, t: Tensor, shape: tuple[int, ...], col0: int) -> Tensor:
        v = Tensor(self, "view", (t,), tuple(int(s) for s in shape), base=t.storage, col0=t.col0 + col0)
        v.index = len(self.nodes)
        self.nodes.append(v)
        return v

    def input(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """A graph input bound at each run: "token", "embd", "pos" or "out_ids"."""
        return self.node("input", (), shape, (name,))

    def pos_input(self, pos: Tensor, cols: int, set_input) -> Tensor:
        """An input the executor computes from the positions at each run, set_input(pos) -> (n, cols) float32, and
        places among the intermediates (llm_graph_input_attn_temp: mistral3's per-position Q scale)."""
        if not (isinstance(pos, Tensor) and pos.params == ("pos",)):
            raise GraphUnsupported("an input computed from other values than the ubatch's positions")
        return self.node("input", (), (pos.rows, cols), ("pos_input", set_input))

    def binary(self, op: str, a: Tensor, b: Tensor) -> Tensor:
        if a.shape != b.shape:
            raise ValueError(f"{op}: shapes {a.shape} and {b.shape} differ")
        return self.node(op, (a, b), a.shape)

    def vector(self, vec: np.ndarray) -> int:
        self.vectors.append(np.ascontiguousarray(vec, np.float32))
        return len(self.vectors) - 1

    # -- the ops interface (llamactx/backend/ops.py: Ops) -------------------------------------------------------

    def compute_graph(self, build, params) -> object:
        """A build called while recording: recorded inline, into this graph."""
        return build(self, params)

    def get_rows(self, weight, ids: Tensor) -> Tensor:
        if not (isinstance(ids, Tensor) and ids.params == ("token",)):
            raise GraphUnsupported("get_rows of other ids than the ubatch's tokens")
        return self.node("get_rows", (ids,), (ids.rows, weight.shape[0]), (weight,))

    def rms_norm(self, x: Tensor, weight: np.ndarray, eps: float) -> Tensor:
        """Over the last dimension (per head for (n, n_head, d))."""
        if weight.shape != (x.shape[-1],):
            raise ValueError(f"rms_norm: weight {weight.shape} for rows of {x.shape[-1]}")
        return self.node("rms_norm", (x,), x.shape, (self.vector(weight), x.shape[-1], np.float32(eps)))

    def matmul(self, x: Tensor, weight) -> Tensor:
        return self.matmuls(x, [weight])[0]

    def matmuls(self, x: Tensor, weights) -> list[Tensor]:
        """One mul_mat node per run of weights of the same type (rows stacked), each output a view of its
        columns."""
        for w in weights:
            if not self._supports(w) or w.shape[0] != x.cols:
                raise GraphUnsupported(f"no executor matmul for {w.name!r}")
        outs: list[Tensor] = []
        start = 0
        for end in range(1, len(weights) + 1):
            if end == len(weights) or weights[end].ggml_type != weights[start].ggml_type:
                outs += self._mul_mat(x, tuple(weights[start:end]))
                start = end
        return outs

    def _mul_mat(self, x: Tensor, weights: tuple) -> list[Tensor]:
        self.weights.append(weights)
        n_out = sum(int(w.shape[1]) for w in weights)
        y = self.node("mul_mat", (x,), (x.rows, n_out), (len(self.weights) - 1,))  # (n, sum of ne1)
        if len(weights) == 1:
            return [y]
        outs, col = [], 0
        for w in weights:
            outs.append(self.view(y, (x.rows, int(w.shape[1])), col))
            col += int(w.shape[1])
        return outs

    def rope(self, x: Tensor, pos: Tensor, rp: RopeParams) -> Tensor:
        """One table per RopeParams object (compared by identity: its frequency factors are an array); the
        executor computes it with vec.rope_cache, frequency factors and YaRN included, as the eager ops do."""
        if len(x.shape) != 3:
            raise GraphUnsupported("rope other than (n, n_head, d)")
        if self.ropes and rp.n_rot != self.ropes[0].n_rot:  # the executor stacks the tables: one width
            raise GraphUnsupported(f"RoPE over {rp.n_rot} and {self.ropes[0].n_rot} dimensions in one graph")
        index = next((i for i, r in enumerate(self.ropes) if r is rp), None)
        if index is None:
            self.ropes.append(rp)
            index = len(self.ropes) - 1
        return self.node("rope", (x, pos), x.shape, (index,))

    def rope_imrope(self, x: Tensor, pos: Tensor, rp: RopeParams, sections: tuple[int, ...]) -> Tensor:
        """IMRoPE of text tokens: a rope node over its own table (llamactx.ggml.mrope.ImropeTable, one per
        parameters and sections), NEOX pairs."""
        sections = tuple(int(s) for s in sections)
        table = next((r for r in self.ropes if isinstance(r, ImropeTable) and r.rp is rp
                      and r.sections == sections), None)
        return self.rope(x, pos, table or ImropeTable(rp, sections))

    def swiglu(self, gate: Tensor, up: Tensor) -> Tensor:
        if len(gate.shape) > 2 and gate.shape[-1] % 16:  # the executor's rows are whole: ggml's SIMD tail per row
            raise GraphUnsupported(f"swiglu over rows of {gate.shape[-1]} (not a multiple of 16)")
        return self.binary("swiglu", gate, up)

    def geglu(self, gate: Tensor, up: Tensor) -> Tensor:
        return self.binary("geglu", gate, up)

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        raise GraphUnsupported("final logit soft-capping")

    def silu(self, x: Tensor) -> Tensor:
        if x.base is not None and (x.col0 or x.storage.cols != x.cols):  # the executor's silu reads whole rows
            x = x.copy()
        return self.node("silu", (x,), x.shape)

    def sigmoid(self, x: Tensor) -> Tensor:
        return self.node("sigmoid", (x,), x.shape)

    def softplus(self, x: Tensor) -> Tensor:
        return self.node("softplus", (x,), x.shape)

    def l2_norm(self, x: Tensor, eps: float) -> Tensor:
        """build_gdn_l2_norm as llamactx.ggml.delta_net.l2_norm computes it: one rms_norm node (eps / n in float32)
        whose weights are all 1 / sqrtf(n): the node makes (x * scale) * w, the bits of ggml_rms_norm then
        ggml_scale."""
        n = np.float32(x.shape[-1])
        return self.rms_norm(x, np.full(x.shape[-1], np.float32(1.0) / np.sqrt(n), np.float32), np.float32(eps) / n)

    def ssm_conv_rs(self, il: int, x: Tensor, weight: np.ndarray) -> Tensor:
        """ggml_ssm_conv over each sequence set's conv state of layer `il` and its rows of x (n, n_ch), the states
        updated in place (the recurrent input bound at run time: GraphRecurrent). weight (n_ch, d_conv).
        -> (n, n_ch)"""
        n_ch, d_conv = weight.shape
        if x.shape != (x.rows, n_ch):
            raise ValueError(f"ssm_conv_rs: input {x.shape} for {n_ch} channels")
        return self.node("ssm_conv_rs", (x,), x.shape, (il, self.vector(np.asarray(weight).reshape(-1)), d_conv))

    def gated_delta_net_rs(self, il: int, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> Tensor:
        """ggml_gated_delta_net over each sequence set's delta-rule state of layer `il`, updated in place.
        q, k (n, H_k, S); v (n, H_v, S); g, beta (n, H_v). -> (n, H_v, S)"""
        n, h_v, s_v = v.shape
        if q.shape != k.shape or q.shape[2] != s_v or g.shape != (n, h_v) or beta.shape != (n, h_v):
            raise ValueError(f"gated_delta_net_rs: q {q.shape}, k {k.shape}, v {v.shape}, g {g.shape}, "
                             f"beta {beta.shape}")
        return self.node("gdn_rs", (q, k, v, g, beta), v.shape, (il,))

    def ssm_scan_rs(self, il: int, x: Tensor, dt: Tensor, a: np.ndarray, b: Tensor, c: Tensor) -> Tensor:
        """ggml_ssm_scan (Mamba-2: one decay per head) over each sequence set's SSM state of layer `il`, updated in
        place. x (n, n_head, head_dim); dt (n, n_head) before softplus; a (n_head,); b, c (n, n_group, d_state).
        -> (n, n_head, head_dim)"""
        n, n_head, _ = x.shape
        if dt.shape != (n, n_head) or b.shape != c.shape or b.shape[0] != n or n_head % b.shape[1] \
                or np.shape(a) != (n_head,):
            raise ValueError(f"ssm_scan_rs: x {x.shape}, dt {dt.shape}, a {np.shape(a)}, b {b.shape}, c {c.shape}")
        return self.node("ssm_scan_rs", (x, dt, b, c), x.shape, (il, self.vector(a)))

    def swiglu_oai(self, gate: Tensor, up: Tensor, alpha: float, limit: float) -> Tensor:
        raise GraphUnsupported("swiglu_oai")

    def add_id(self, x: Tensor, bias, selected: Tensor) -> Tensor:
        raise GraphUnsupported("add_id (per-expert biases)")

    def moe_route(self, logits: Tensor, n_expert_used: int, gating: str, norm_w: bool, w_scale: float,
                  probs_b=None, groups: tuple[int, int] = (0, 0)) -> tuple[Tensor, Tensor]:
        """One node of (n, 2k): each token's k experts (as floats, exact below 2^24) then their weights; the two
        halves are returned as views, (selected, weights), as the eager ops return them."""
        if gating not in ("softmax", "sigmoid"):
            raise GraphUnsupported(f"{gating} gating")
        k = int(n_expert_used)
        if gating == "softmax" and probs_b is None and groups[0] <= 1:
            route = self.node("moe_route", (logits,), (logits.rows, 2 * k), (k, bool(norm_w), np.float32(w_scale)))
        else:  # DeepSeek-V3's: sigmoid, the selection bias, expert groups (ggml.moe.route_row_biased)
            bias = self.vector(np.zeros(0, np.float32) if probs_b is None else probs_b)
            route = self.node("moe_route_sel", (logits,), (logits.rows, 2 * k),
                              (k, bool(norm_w), np.float32(w_scale), gating == "sigmoid", bias,
                               max(int(groups[0]), 1), int(groups[1])))
        return self.view(route, (route.rows, k), 0), self.view(route, (route.rows, k), k)

    def matmul_id(self, x: Tensor, weight, selected: Tensor) -> Tensor:
        """ggml_mul_mat_id: x (n, ne0) shared by a token's experts, or (n, k, ne0) one row per slot -> (n, k, ne1).
        The stacked experts are one matrix of n_expert * ne1 rows for the weight table. An expert's width must be
        a multiple of 16, so that the SwiGLU over a token's k outputs at once keeps each output's SIMD groups."""
        ne0, ne1 = int(weight.shape[0]), int(weight.shape[1])
        k = selected.cols
        if ne1 % 16 or x.shape[-1] != ne0:  # the executor's plan refuses expert types off its kernels
            raise GraphUnsupported(f"no executor mul_mat_id for {weight.name!r}")
        self.weights.append((stacked(weight),))
        return self.node("mul_mat_id", (x, selected.storage), (x.rows, k, ne1),
                         (len(self.weights) - 1, k, len(x.shape) == 2, ne0))

    def matmul_heads(self, x: Tensor, weight) -> Tensor:
        """ggml_mul_mat of a 3-D weight (ne0, ne1, n_head): one node, each head's rows times its own matrix (the
        WeightTable holds one entry per head). (n, n_head, ne0) -> (n, n_head, ne1)"""
        n, n_head, ne0 = x.shape
        if int(weight.shape[2]) != n_head or int(weight.shape[0]) != ne0:
            raise ValueError(f"matmul_heads: weight {weight.shape} for {x.shape}")
        heads = tuple(expert(weight, h) for h in range(n_head))
        if not all(self._supports(w) for w in heads):
            raise GraphUnsupported(f"no executor matmul for {weight.name!r}")
        self.weights.append(heads)
        return self.node("mul_mat_heads", (x,), (n, n_head, int(weight.shape[1])), (len(self.weights) - 1,))

    def concat(self, a: Tensor, b: Tensor) -> Tensor:
        """ggml_concat along the last dimension: (n, [h,] da), (n, [h,] db) -> (n, [h,] da + db)"""
        if a.shape[:-1] != b.shape[:-1] or len(a.shape) not in (2, 3):
            raise GraphUnsupported(f"concat of {a.shape} and {b.shape}")
        return self.node("concat", (a, b), (*a.shape[:-1], a.shape[-1] + b.shape[-1]))

    def moe_sum(self, experts: Tensor, weights: Tensor) -> Tensor:
        """The experts' outputs times their weights, added slot by slot. (n, k, n_embd) -> (n, n_embd)"""
        n, k, n_embd = experts.shape
        return self.node("moe_sum", (experts, weights.storage), (n, n_embd), (k,))

    def kv_attention(self, il: int, q: Tensor, k: Tensor, v: Tensor, kq_scale: float, swa: bool) -> Tensor:
        """Store the ubatch's K/V of layer `il` into its cells and attend over the cells each token sees (the
        attention input bound at run time: its view of the cache, its visible cells)."""
        n, n_head, d_k = q.shape
        n_head_kv, d_v = k.shape[1], v.shape[2]
        if d_k % 16 or d_v % 16:
            raise GraphUnsupported(f"attention with head sizes {d_k} / {d_v}")
        return self.node("attn", (q, k, v), (n, n_head * d_v), (il, swa, n_head, n_head_kv, np.float32(kq_scale)))

    # -- ops the executor has no node for: the ubatch runs op by op -------------------------------------------------

    def layer_norm(self, x: Tensor, weight, bias, eps: float) -> Tensor:
        raise GraphUnsupported("layer_norm")


    def gelu(self, x: Tensor) -> Tensor:
        raise GraphUnsupported("gelu")


    def ssm_conv(self, conv_x, weight) -> Tensor:
        raise GraphUnsupported("ssm_conv")

    def ssm_scan(self, state, x, dt, a, b, c) -> tuple[Tensor, Tensor]:
        raise GraphUnsupported("ssm_scan")

    def gated_delta_net(self, q, k, v, g, beta, state) -> tuple[Tensor, Tensor]:
        raise GraphUnsupported("gated_delta_net")

    def attention_kv(self, q: Tensor, kv, il: int, mask, vis, kq_scale: float, flash: bool, n_threads: int = 1,
                     softcap: float = 0.0, sinks=None) -> Tensor:
        """Attention in a recorded graph is `kv_attention`, through the GraphAttention input."""
        raise GraphUnsupported("attention_kv outside a GraphAttention input")

    def attention(self, q: Tensor, k: Tensor, v: Tensor, mask, kq_scale: float, flash: bool, k_type: str = "f16",
                  softcap: float = 0.0, sinks=None, v_type: str = "f16") -> Tensor:
        raise GraphUnsupported("attention without a KV cache")

    def attention_no_cache(self, q: Tensor, k: Tensor, v: Tensor, mask, kq_scale: float, flash: bool) -> Tensor:
        raise GraphUnsupported("attention without a KV cache")


class GraphAttention:
    """The attention input a forward sees while its graph is built: records `Graph.kv_attention` nodes for the
    attention input the executor binds at run time (models.graph_inputs.KVAttention)."""

    def __init__(self, graph: Graph, hparams) -> None:
        self.graph, self.hparams = graph, hparams

    @property
    def attn(self) -> GraphAttention:
        """A hybrid model reads its input as llm_graph_input_mem_hybrid: the attention part (this one) ..."""
        return self

    @property
    def rs(self) -> GraphRecurrent:
        """... and the recurrent part (models.graph_inputs.HybridInput)."""
        return GraphRecurrent(self.graph)

    def __call__(self, il: int, q: Tensor, k: Tensor, v: Tensor, kq_scale: float, sinks=None) -> Tensor:
        if self.hparams.f_attn_logit_softcapping:
            raise GraphUnsupported("attention logit soft-capping")
        if sinks is not None:
            raise GraphUnsupported("attention sinks")
        if k is None:
            raise GraphUnsupported("attention over an earlier layer's KV (shared KV layers)")
        return self.graph.kv_attention(il, q, k, v, kq_scale, self.hparams.is_swa(il))


class GraphRecurrent:
    """The recurrent input a hybrid forward sees while its graph is built (llm_graph_input_rs): records the
    state-reading ops as nodes over the sequence sets and state slots the executor binds at run time
    (llamactx.memory.recurrent.RecurrentView.bind). Reading a state directly cannot be recorded."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def ssm_conv(self, ops, il: int, x: Tensor, weight: np.ndarray) -> Tensor:
        return self.graph.ssm_conv_rs(il, x, weight)

    def gated_delta_net(self, ops, il: int, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> Tensor:
        return self.graph.gated_delta_net_rs(il, q, k, v, g, beta)

    def ssm_scan(self, ops, il: int, x: Tensor, dt: Tensor, a: np.ndarray, b: Tensor, c: Tensor) -> Tensor:
        return self.graph.ssm_scan_rs(il, x, dt, a, b, c)

    @property
    def sets(self):
        raise GraphUnsupported("the sequence sets of a recurrent input (bound at run time)")

    def conv_state(self, il: int, k: int):
        raise GraphUnsupported("reading a conv state while recording")

    def ssm_state(self, il: int, k: int):
        raise GraphUnsupported("reading an SSM state while recording")

    def store_conv(self, il: int, k: int, r) -> None:
        raise GraphUnsupported("storing a conv state while recording")

    def store_ssm(self, il: int, k: int, s) -> None:
        raise GraphUnsupported("storing an SSM state while recording")

"""Running a recorded graph (llamactx.ggml.graph) in one compiled call: ggml-alloc's placement of the nodes in one
buffer and ggml-cpu's `ggml_graph_compute`.

`plan_graph` turns the nodes into a program: one row of ints (and two floats) per node that computes, with every
intermediate placed in one float32 arena whose regions are reused once their last reader has run (ggml_gallocr),
and the outputs (logits, the final hidden state) in their own arrays. `GraphPlan.run` binds a ubatch's inputs
(tokens or embeddings, positions, output ids, the attention input's cells; Graph.pos_input's values, computed from
the positions into their arena regions) and `run_program` executes the rows in
order, calling the same kernels as the eager ops (so the bits are the same): one Python call per ubatch instead of
a dozen per layer, RoPE tables computed once per ubatch, no allocation per node. Matmuls and attention run on the
thread pool (one parallel region each); small elementwise nodes run on the calling thread. A hybrid's recurrent
layers (qwen35's conv and gated delta rule, Mamba-2's scan: kernels.ssm_scan) update the memory's state arrays in
place, per sequence set (RecurrentView.bind: the sets' rows and state slots, bound at each run).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import carray, njit, prange, types
from numba.extending import intrinsic, overload

from llamactx.ggml import vec as ggml_vec
from llamactx.ggml.cpu import F32_EPR, PATH_PORTABLE, PATH_VNNI
from llamactx.ggml.delta_net import _softplus as softplus_vec
from llamactx.ggml.graph import Graph, GraphUnsupported, Tensor
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.ggml.intrinsics import f16_bits
from llamactx.ggml.kernels.attention import attend
from llamactx.ggml.kernels.bf16 import gemm as gemm_bf16
from llamactx.ggml.kernels.delta_rule import _gated_delta_net as gated_delta_net_heads
from llamactx.ggml.kernels.delta_rule import ssm_conv_sets
from llamactx.ggml.kernels.experts import decode_experts, streams_one
from llamactx.ggml.kernels.flash import flash_attend
from llamactx.ggml.kernels.get_rows import rows_bf16, rows_nl, rows_q4_x4, rows_q8_0_x4
from llamactx.ggml.kernels.kblocks import rows_q4_k, rows_q6_k
from llamactx.ggml.kernels.matmul import (
    BF16,
    F32,
    IQ4_NL,
    MXFP4,
    Q4_0,
    Q4_1,
    Q4_K,
    Q6_K,
    Q8_0,
    expert_order,
    matmul_id_portable,
    matmul_id_vnni,
    matmul_portable,
    matmul_vnni,
)
from llamactx.ggml.kernels.repack import units
from llamactx.ggml.kernels.simd import PORTABLE, VNNI, TagType
from llamactx.ggml.kernels.ssm_scan import ssm_scan_rs_node
from llamactx.ggml.kernels.tinyblas import sgemm
from llamactx.ggml.moe import _sigmoid as sigmoid_vec
from llamactx.ggml.moe import route_row, route_row_biased
from llamactx.ggml.mrope import ImropeTable
from llamactx.ggml.ssm import silu_rows
from llamactx.ggml.vecdot import matmul_float_rows
from llamactx.gguf.quants_iq import KVALUES_IQ4NL, KVALUES_MXFP4

# ops
(GET_ROWS, RMS_NORM, MUL_MAT, ADD, ADD_ROW, SCALE, ROPE, SWIGLU, GEGLU, ATTN, SELECT, MOE_ROUTE, MUL_MAT_ID,
 MOE_SUM, SILU, DIV, MUL_COL) = range(1, 18)
_OPS = {"get_rows": GET_ROWS, "rms_norm": RMS_NORM, "mul_mat": MUL_MAT, "add": ADD, "add_row": ADD_ROW,
        "scale": SCALE, "rope": ROPE, "swiglu": SWIGLU, "geglu": GEGLU, "attn": ATTN, "select": SELECT,
        "moe_route": MOE_ROUTE, "mul_mat_id": MUL_MAT_ID, "moe_sum": MOE_SUM, "silu": SILU, "div": DIV,
        "mul_col": MUL_COL}
CONT, CONCAT, MUL_MAT_HEADS = 40, 41, 42  # deepseek2's MLA: head slices, concatenations, per-head matmuls
MOE_ROUTE_SEL = 43  # DeepSeek-V3's router: sigmoid, selection bias, expert groups (deepseek2, glm4moe)
_OPS.update({"cont": CONT, "concat": CONCAT, "mul_mat_heads": MUL_MAT_HEADS, "moe_route_sel": MOE_ROUTE_SEL})
# Gated DeltaNet hybrids (qwen35, qwen35moe): unary ops, products, and the recurrent ops over the bound states
SIGMOID, SOFTPLUS, MUL, MUL_ROW, SSM_CONV_RS, GDN_RS = range(44, 50)
_OPS.update({"sigmoid": SIGMOID, "softplus": SOFTPLUS, "mul": MUL, "mul_row": MUL_ROW, "ssm_conv_rs": SSM_CONV_RS,
             "gdn_rs": GDN_RS})
SSM_SCAN_RS, RELU = 50, 51  # Mamba-2 layers (mamba2, granitehybrid, nemotron_h); nemotron_h's ReLU-squared FFN
_OPS.update({"ssm_scan_rs": SSM_SCAN_RS, "relu": RELU})
# buffers
ARENA, OUT_LOGITS, OUT_EMBD, IN_EMBD = range(4)
# program columns: op, destination (buffer, offset, row stride), rows, cols, sources a, b, c, params, sources d, e
OP, DB, DO, DL, NR, NC, AB, AO, AL, BB, BO, BL, CB, CO, CL, P0, P1, P2, P3, P4 = range(20)
EB, EO, EL, FB, FO, FL = range(20, 26)  # the fourth and fifth sources (the delta rule's g and beta)
N_COLS = 26
_ALIGN = 16  # floats: regions start on 64-byte lines
PAR_ROWS = 8  # elementwise nodes of at least this many rows run on the thread pool
PAR_ELEMS = 32768  # ... and rms_norm / rope / glu / add only from this many elements: a smaller node (a few
# sequences' decode step) costs less than the pool's wake-up and barrier, and on a shared core far less


# --- the weights a program reads --------------------------------------------------------------------------------

_SLOTS = ("qs", "qh", "sc", "mn", "d", "m")  # PackedWeight's arrays: four uint8, two float32, each 2-D C-contiguous
_HUGE_MIN = 4 << 20  # bytes: numpy madvises arrays from this size for transparent huge pages (MADV_HUGEPAGE)
_SLAB = 16 << 20  # bytes of each buffer the smaller arrays are copied into


class WeightTable:
    """The packed matrices of one model, indexed by the programs of every context: `meta` (n, 6, 3) int64 holds
    each matrix's arrays as (address, rows, columns) in `_SLOTS` order, `kind` (n,) its ggml type. The table keeps
    the arrays alive; a program views them by address (`_weight`), since numba types a list argument element by
    element on every call but an int64 array at once. Entries are added under a lock as
    graphs reference them."""

    def __init__(self) -> None:
        self.meta = np.zeros((0, len(_SLOTS), 3), np.int64)
        self.kind = np.zeros(0, np.int64)
        self._arrays: list[np.ndarray] = []  # every array `meta` points into
        self._index: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()
        self._slab, self._slab_used = np.zeros(0, np.uint8), 0

    def index(self, names: tuple[str, ...], packed) -> int:
        """The entry of a (stacked) matrix, `packed()` making its PackedWeight on first use."""
        with self._lock:
            if names not in self._index:
                pw = packed()
                row = np.zeros((1, len(_SLOTS), 3), np.int64)
                for j, slot in enumerate(_SLOTS):
                    a = getattr(pw, slot)
                    want = np.uint8 if j < 4 else np.float32
                    if a.ndim != 2 or a.dtype != want or not a.flags.c_contiguous:
                        raise GraphUnsupported(f"packed {slot} of {names[0]!r}: {a.dtype} {a.shape}")
                    a = self._in_huge_pages(a)
                    self._arrays.append(a)
                    row[0, j] = (a.ctypes.data, a.shape[0], a.shape[1])
                self.meta = np.concatenate([self.meta, row])
                self.kind = np.append(self.kind, pw.ggml_type)
                self._index[names] = len(self._index)
            return self._index[names]

    def _in_huge_pages(self, a: np.ndarray) -> np.ndarray:
        """`a`, or where it is under 4 MiB a read-only copy in a slab of 16 MiB (on a 64-byte line): numpy gives
        huge pages to arrays of 4 MiB and more only, and a small matrix in 4 KiB pages (an attention matrix of a
        1B model, a MoE router's F32 rows read in place from the file) streams 15-30% slower (a page walk per
        4 KiB, the hardware prefetcher stopping at each page: bench/membw.py)."""
        if a.nbytes == 0 or a.nbytes >= _HUGE_MIN:
            return a
        start = self._slab_used + (-(self._slab.ctypes.data + self._slab_used)) % 64
        if start + a.nbytes > self._slab.nbytes:
            self._slab = np.empty(_SLAB, np.uint8)
            start = (-self._slab.ctypes.data) % 64
        self._slab_used = start + a.nbytes
        copy = self._slab[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
        copy[...] = a
        copy.flags.writeable = False
        return copy


@intrinsic
def _pointer_at(typingctx, address, dtype):
    """The pointer to `dtype` scalars (np.uint8, np.float32) at an int64 address."""
    sig = types.CPointer(dtype.dtype)(types.int64, dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@njit(cache=True)
def _slot(meta, i, j, dtype):
    """Array j of WeightTable entry i (a view of memory the table keeps alive)."""
    return carray(_pointer_at(meta[i, j, 0], dtype), (meta[i, j, 1], meta[i, j, 2]))


@njit(cache=True)
def _weight(meta, i):
    """Entry i of a WeightTable's `meta` as its six arrays (`_SLOTS`)."""
    u8, f32 = np.uint8, np.float32
    return (_slot(meta, i, 0, u8), _slot(meta, i, 1, u8), _slot(meta, i, 2, u8), _slot(meta, i, 3, u8),
            _slot(meta, i, 4, f32), _slot(meta, i, 5, f32))


# --- planning (ggml-alloc) ------------------------------------------------------------------------------------


class GraphPlan:
    """A graph placed and encoded for `run_program`, rerun for every ubatch of its shape."""

    def __init__(self, prog, fprm, arena_size, vectors, ropes, logits: Tensor | None, embd: Tensor,
                 pos_inputs: tuple = ()):
        self.prog, self.fprm = prog, fprm  # (n_nodes, N_COLS) int64, (n_nodes, 1) float32
        self.pos_inputs = pos_inputs  # (arena offset, floats, set_input) of each Graph.pos_input
        self.arena_size = max(arena_size, 1)  # floats of the buffer every intermediate lives in
        self.vectors = vectors  # (total,) float32: norm weights and biases, at the offsets the program names
        self.ropes = ropes  # RopeParams of each RoPE table
        self.logits_shape = logits.shape if logits is not None else None
        self.embd_shape = embd.shape

    def run(self, ops, table: WeightTable, arena: np.ndarray, token, embd, pos, attn, layer_rows, out_ids):
        """One ubatch: bind the inputs and run, the intermediates in `arena` (at least arena_size floats; one
        buffer serves every plan of a context, as they run one at a time); layer_rows (n_layer,): each layer's
        row in the cache it reads. -> (logits (n_out, n_vocab) or None, embd (n_out, n_embd))"""
        pos = np.ascontiguousarray(pos, np.int64)
        cos, sin = _rope_tables(self.ropes, pos)
        for off, size, set_input in self.pos_inputs:  # llm_graph_input_i::set_input, into its arena region
            arena[off : off + size] = np.asarray(set_input(pos), np.float32).reshape(-1)
        logits = np.empty(self.logits_shape or (0, 0), np.float32)
        out_embd = np.empty(self.embd_shape, np.float32)
        rs = getattr(attn, "rs", None)  # a hybrid's recurrent view (a recurrent-only model's input is its own)
        r_states, s_states, rs_slots, rs_starts, rs_rows = rs.bind() if rs is not None else _NO_STATES
        PROGRAMS[ops.kernel_path](
            self.prog, self.fprm, arena, logits.reshape(-1), out_embd.reshape(-1),
            np.ascontiguousarray(embd, np.float32).reshape(-1) if embd is not None else arena[:0],
            np.ascontiguousarray(token, np.int64) if token is not None else pos[:0], pos,
            np.ascontiguousarray(out_ids, np.int64), self.vectors, ops._gelu, cos, sin,
            table.meta, table.kind, ops.threads, getattr(attn, "flash", False), layer_rows, *_kv_binding(attn),
            r_states, s_states, rs_slots, rs_starts, rs_rows,
        )
        if rs is not None:
            rs.spread()  # a set's new states to every sequence of it
        return (logits if self.logits_shape is not None else None), out_embd


_NO_STATES = (np.zeros((0, 0, 0), np.float32), np.zeros((0, 0, 0), np.float32), np.zeros(0, np.int64),
              np.zeros(1, np.int64), np.zeros(0, np.int64))
_NO_KV = (np.zeros((0, 0, 0), np.uint16), np.zeros((0, 0, 0), np.uint16), np.zeros(0, np.int64),
          np.zeros((0, 0), np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.float32))


def _kv_binding(attn) -> tuple:
    """The attention input's caches, cells and visible cells, global then sliding-window, as the program reads
    them; empty for a recurrent-only model's input (mamba2: no attention layers)."""
    if not hasattr(attn, "view"):
        return _NO_KV + _NO_KV
    view, view_swa = attn.view, attn.view_swa
    return (view.k_layers().view(np.uint16), view.v_layers().view(np.uint16), np.ascontiguousarray(view.idx, np.int64),
            attn.vis.cells, attn.vis.n_cells, attn.vis.mask_add,
            view_swa.k_layers().view(np.uint16), view_swa.v_layers().view(np.uint16),
            np.ascontiguousarray(view_swa.idx, np.int64),
            np.ascontiguousarray(view_swa.real_cells(attn.vis_swa.cells), np.int64), attn.vis_swa.n_cells,
            attn.vis_swa.mask_add)


def _rope_tables(ropes, pos):
    """cos / sin of every RoPE parameter set of the graph: (n_tables, n, n_rot/2) float32 each."""
    if not ropes:
        return np.zeros((0, len(pos), 0), np.float32), np.zeros((0, len(pos), 0), np.float32)
    tables = [rp.cache(pos) if isinstance(rp, ImropeTable) else ggml_vec.rope_cache(pos, rp) for rp in ropes]
    return np.stack([c for c, _ in tables]), np.stack([s for _, s in tables])


def plan_graph(graph: Graph, logits: Tensor | None, embd: Tensor, weight_index, kernel_order) -> GraphPlan:
    """Place every node and encode the program. weight_index(weights) -> the WeightTable entry of a matmul's
    (stacked) weights; kernel_order(weight) -> its llama_order. Raises GraphUnsupported for what the program
    cannot express."""
    nodes = [t for t in graph.nodes if t.op not in ("view", "input")]
    if len({rp.n_rot for rp in graph.ropes}) > 1:
        raise GraphUnsupported("RoPE tables of different n_rot")
    last_use: dict[int, int] = {}
    for t in nodes:
        for s in t.src:
            last_use[id(s.storage)] = t.index
    place: dict[int, tuple[int, int]] = {}  # id(storage) -> (buffer, offset)
    outputs = {}
    if logits is not None:
        outputs[id(logits.storage)] = OUT_LOGITS
    outputs[id(embd.storage)] = OUT_EMBD
    for t in graph.nodes:
        if t.op == "input" and t.params[0] == "embd":
            place[id(t)] = (IN_EMBD, 0)
    arena = _Arena()
    pos_inputs = []  # computed per run into regions placed before any node's, freed after their last reader
    for t in graph.nodes:
        if t.op == "input" and t.params[0] == "pos_input":
            place[id(t)] = (ARENA, arena.alloc(t.rows * t.cols))
            pos_inputs.append((place[id(t)][1], t.rows * t.cols, t.params[1]))
            if id(t) not in last_use:
                arena.free(place[id(t)][1], t.rows * t.cols)
    prog = np.zeros((len(nodes), N_COLS), np.int64)
    fprm = np.zeros((len(nodes), 1), np.float32)
    vec_offsets = np.cumsum([0] + [v.size for v in graph.vectors])
    if logits is not None and logits.shape != logits.storage.shape:
        raise GraphUnsupported("logits that are part of a larger matmul")
    for row, t in enumerate(nodes):
        if id(t) in outputs:
            place[id(t)] = (outputs[id(t)], 0)
        else:
            place[id(t)] = (ARENA, arena.alloc(t.rows * t.cols))
        _encode(prog[row], fprm[row], t, place, vec_offsets, weight_index, kernel_order)
        for s in {id(s.storage): s.storage for s in t.src}.values():
            if last_use.get(id(s)) == t.index and place.get(id(s), (None,))[0] == ARENA:
                arena.free(place[id(s)][1], s.rows * s.cols)
        if id(t) not in last_use and place[id(t)][0] == ARENA:  # computed, never read
            arena.free(place[id(t)][1], t.rows * t.cols)
    vectors = np.concatenate(graph.vectors) if graph.vectors else np.zeros(0, np.float32)
    return GraphPlan(prog, fprm, arena.high, vectors, list(graph.ropes), logits, embd, tuple(pos_inputs))


class _Arena:
    """First-fit placement of regions in one float32 buffer (ggml_dyn_tallocr, simplified): `high` is the size
    the buffer needs."""

    def __init__(self) -> None:
        self.free_list: list[tuple[int, int]] = []  # (offset, size), sorted, coalesced
        self.top = 0  # end of the regions in use or free-listed
        self.high = 0

    def alloc(self, n: int) -> int:
        n = -(-max(n, 1) // _ALIGN) * _ALIGN
        for i, (off, size) in enumerate(self.free_list):
            if size >= n:
                if size == n:
                    del self.free_list[i]
                else:
                    self.free_list[i] = (off + n, size - n)
                return off
        off, self.top = self.top, self.top + n
        self.high = max(self.high, self.top)
        return off

    def free(self, off: int, n: int) -> None:
        n = -(-max(n, 1) // _ALIGN) * _ALIGN
        merged: list[tuple[int, int]] = []
        for o, s in sorted([*self.free_list, (off, n)]):
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        if merged and merged[-1][0] + merged[-1][1] == self.top:  # the last region returns to the top
            self.top = merged.pop()[0]
        self.free_list = merged


def _encode(row, frow, t: Tensor, place, vec_offsets, weight_index, kernel_order) -> None:
    """One program row for node t."""
    row[OP] = _OPS[t.op]
    row[DB], row[DO] = place[id(t)]
    row[DL], row[NR], row[NC] = t.cols, t.rows, t.cols
    cols = ((AB, AO, AL), (BB, BO, BL), (CB, CO, CL), (EB, EO, EL), (FB, FO, FL))
    for s, (cb, co, cl) in zip(t.src, cols[: len(t.src)], strict=True):
        if s.op == "input" and s.params[0] in ("token", "pos", "out_ids"):  # bound as their own arrays
            continue
        row[cb], off = place[id(s.storage)]
        row[co], row[cl] = off + s.col0, s.storage.cols
    p = t.params
    if t.op == "get_rows":
        w = p[0]
        if w.ggml_type not in (Q8_0, Q4_0, Q4_1, BF16, IQ4_NL, MXFP4, Q4_K, Q6_K, F32):
            raise GraphUnsupported(f"get_rows of a {w.type_name} table")
        row[P0] = weight_index((w,))
    elif t.op == "rms_norm":
        row[P0], row[P1], frow[0] = vec_offsets[p[0]], p[1], p[2]
    elif t.op == "mul_mat":
        ws = t.graph.weights[p[0]]
        if t.src[0].col0 or row[AL] != t.src[0].cols:
            raise GraphUnsupported("a matmul of a strided view")
        row[P0], row[P1], row[P2] = weight_index(ws), bool(kernel_order(ws[0])), ws[0].ggml_type
    elif t.op == "mul_mat_id":
        (w,) = t.graph.weights[p[0]]
        order = expert_order(w.ggml_type, t.shape[2])
        straddle = w.ggml_type == Q4_K and t.shape[2] % 8  # groups of eight rows across experts: no n_expert here
        if t.src[0].col0 or row[AL] != t.src[0].cols or order < 0 or straddle:
            raise GraphUnsupported(f"a mul_mat_id of a strided view or of {w.type_name} experts")
        row[P0], row[P1], row[P2], row[P3] = weight_index((w,)), p[1], int(p[2]) + 2 * order, p[3]
        row[P4] = units(w.ggml_type, t.shape[2])  # packed units of one expert
    elif t.op == "moe_route":
        row[P0], row[P1], row[P2], frow[0] = p[0], p[1], t.src[0].cols, p[2]
    elif t.op == "moe_sum":
        row[P0] = p[0]
    elif t.op == "silu":  # over rows of the last dimension
        if t.src[0].col0 or row[AL] != t.cols:
            raise GraphUnsupported("silu of a strided view")
        row[P0] = t.shape[-1]
    elif t.op in ("add_row", "mul_row"):  # P1: the vector's length (a mul_row's repeats along the row)
        row[P0], row[P1] = vec_offsets[p[0]], t.graph.vectors[p[0]].size
    elif t.op == "ssm_conv_rs":  # P0 the layer, P1 the weight (n_ch, d_conv) in `vectors`, P2 d_conv
        row[P0], row[P1], row[P2] = p[0], vec_offsets[p[1]], p[2]
    elif t.op == "gdn_rs":  # P0 the layer, P1..P3 H_k, H_v, S; the scale 1 / sqrtf(S)
        row[P0], row[P1], row[P2], row[P3] = p[0], t.src[0].shape[1], t.shape[1], t.shape[2]
        frow[0] = np.float32(1.0) / np.sqrt(np.float32(t.shape[2]))
    elif t.op == "ssm_scan_rs":  # P0 the layer, P1 A in `vectors`, P2 n_group, P3 d_state, P4 head_dim
        row[P0], row[P1], row[P2], row[P3], row[P4] = p[0], vec_offsets[p[1]], *t.src[2].shape[1:], t.shape[2]
    elif t.op == "scale":
        frow[0] = p[0]
    elif t.op == "rope":
        rp = t.graph.ropes[p[0]]
        row[P0], row[P1], row[P2], row[P3], row[P4] = p[0], t.shape[1], t.shape[2], rp.n_rot, rp.mode == ROPE_TYPE_NEOX
    elif t.op == "moe_route_sel":  # P1: norm_w, sigmoid, the groups used and the groups, as bit fields
        k, norm_w, w_scale, sigmoid, bias, n_groups, n_group_used = p
        if n_groups >= 1 << 20 or n_group_used >= 1 << 10:
            raise GraphUnsupported(f"{n_groups} expert groups")
        row[P0], row[P2], frow[0] = k, t.src[0].cols, w_scale
        row[P1] = int(norm_w) | int(sigmoid) << 1 | n_group_used << 2 | n_groups << 12
        row[P3], row[P4] = vec_offsets[bias], t.graph.vectors[bias].size
    elif t.op == "cont":  # P0 heads of P1 columns each, columns P2.. of each copied
        row[P0], row[P1], row[P2] = p
    elif t.op == "concat":
        a, b = t.src
        row[P0] = 1 if len(t.shape) == 2 else t.shape[1]
        row[P1], row[P2] = a.shape[-1], b.shape[-1]
    elif t.op == "mul_mat_heads":
        ws = t.graph.weights[p[0]]
        first = weight_index(ws[:1])
        if ws[0].ggml_type in (F32, BF16) or any(weight_index((w,)) != first + h for h, w in enumerate(ws)):
            raise GraphUnsupported(f"per-head matmul of {ws[0].name!r}")
        row[P0], row[P1], row[P2], row[P3] = first, bool(kernel_order(ws[0])), len(ws), t.src[0].shape[2]
    elif t.op == "attn":
        q = t.src[0]
        if q.col0 or row[AL] != q.cols:
            raise GraphUnsupported("attention of a strided query")
        il, swa, n_head, n_head_kv, kq_scale = p
        row[P0], row[P1], row[P2], row[P3], frow[0] = il, swa, n_head, n_head_kv, kq_scale


# --- the program (ggml_graph_compute) -----------------------------------------------------------------------


def _matmul(path, n_tasks, kind, llama_order, x, qs, qh, sc, mn, d, m, out):
    """matmul_vnni or matmul_portable, chosen at compile time by the path tag."""


@overload(_matmul, jit_options={"cache": True})
def _matmul_impl(path, n_tasks, kind, llama_order, x, qs, qh, sc, mn, d, m, out):
    if not isinstance(path, TagType):
        return None
    if path.tag_name == "vnni":

        def vnni(path, n_tasks, kind, llama_order, x, qs, qh, sc, mn, d, m, out):
            matmul_vnni(n_tasks, kind, llama_order, x, qs, qh, sc, mn, d, m, out)

        return vnni

    def portable(path, n_tasks, kind, llama_order, x, qs, qh, sc, mn, d, m, out):
        matmul_portable(n_tasks, kind, llama_order, x, qs, qh, sc, mn, d, m, out)

    return portable


def _matmul_id(path, n_tasks, kind, per_row, x, starts, unit, qs, qh, sc, mn, d, m, out):
    """matmul_id_vnni or matmul_id_portable, chosen at compile time by the path tag."""


@overload(_matmul_id, jit_options={"cache": True})
def _matmul_id_impl(path, n_tasks, kind, per_row, x, starts, unit, qs, qh, sc, mn, d, m, out):
    if not isinstance(path, TagType):
        return None
    if path.tag_name == "vnni":

        def vnni(path, n_tasks, kind, per_row, x, starts, unit, qs, qh, sc, mn, d, m, out):
            matmul_id_vnni(n_tasks, kind, per_row, x, starts, unit, qs, qh, sc, mn, d, m, out)

        return vnni

    def portable(path, n_tasks, kind, per_row, x, starts, unit, qs, qh, sc, mn, d, m, out):
        matmul_id_portable(n_tasks, kind, per_row, x, starts, unit, qs, qh, sc, mn, d, m, out)

    return portable


@njit(cache=True, inline="always")
def _on_pool(n, cols):
    """Whether an elementwise node of n rows of cols runs on the thread pool (PAR_ROWS, PAR_ELEMS)."""
    return n >= PAR_ROWS and n * cols >= PAR_ELEMS


@njit(cache=True)
def _rms_norm_node(x, xo, xl, n, cols, group, w, eps, y, yo, yl):
    for r in range(n):
        for g in range(0, cols, group):
            ggml_vec.rms_norm_row(x, xo + r * xl + g, group, w, eps, y, yo + r * yl + g)


@njit(parallel=True, cache=True)
def _rms_norm_node_par(x, xo, xl, n, cols, group, w, eps, y, yo, yl):
    for r in prange(n):
        for g in range(0, cols, group):
            ggml_vec.rms_norm_row(x, xo + r * xl + g, group, w, eps, y, yo + r * yl + g)


@njit(cache=True)
def _rope_node(x, xo, xl, n, n_head, d, cos, sin, n_rot, neox, y, yo, yl):
    for t in range(n):
        ggml_vec.rope_row(x, xo + t * xl, n_head, d, cos, sin, t, n_rot, neox, y, yo + t * yl)


@njit(parallel=True, cache=True)
def _rope_node_par(x, xo, xl, n, n_head, d, cos, sin, n_rot, neox, y, yo, yl):
    for t in prange(n):
        ggml_vec.rope_row(x, xo + t * xl, n_head, d, cos, sin, t, n_rot, neox, y, yo + t * yl)


@njit(cache=True)
def _glu_node(gelu_table, g, go, gl, u, uo, ul, n, k, y, yo, yl):
    for r in range(n):
        if gelu_table.shape[0]:
            ggml_vec.geglu_row(g, go + r * gl, u, uo + r * ul, k, gelu_table, y, yo + r * yl)
        else:
            ggml_vec.swiglu_row(g, go + r * gl, u, uo + r * ul, k, y, yo + r * yl)


@njit(parallel=True, cache=True)
def _glu_node_par(gelu_table, g, go, gl, u, uo, ul, n, k, y, yo, yl):
    for r in prange(n):
        if gelu_table.shape[0]:
            ggml_vec.geglu_row(g, go + r * gl, u, uo + r * ul, k, gelu_table, y, yo + r * yl)
        else:
            ggml_vec.swiglu_row(g, go + r * gl, u, uo + r * ul, k, y, yo + r * yl)


@njit(cache=True)
def _route_node(a, ao, al, n, n_expert, k, norm_w, w_scale, y, yo, yl):  # pragma: no cover - compiled
    """MOE_ROUTE: each token's experts (as floats) and weights, ggml.moe.route_row."""
    probs = np.empty(n_expert, np.float32)
    idx = np.empty(n_expert, np.int32)
    for r in range(n):
        route_row(a[ao + r * al : ao + r * al + n_expert], k, norm_w, w_scale, probs, idx,
                  y[yo + r * yl : yo + r * yl + 2 * k])


@njit(parallel=True, cache=True)
def _route_node_par(a, ao, al, n, n_expert, k, norm_w, w_scale, y, yo, yl):  # pragma: no cover - compiled
    probs = np.empty((n, n_expert), np.float32)  # a row of scratch per token
    idx = np.empty((n, n_expert), np.int32)
    for r in prange(n):
        route_row(a[ao + r * al : ao + r * al + n_expert], k, norm_w, w_scale, probs[r], idx[r],
                  y[yo + r * yl : yo + r * yl + 2 * k])


@njit(cache=True)
def _mul_mat_id_node(path, n_threads, kind, w, x, xo, xl, shared, per_row, ne0, ids, io, il, n, k, n_ff, unit,
                     y, yo, yl):  # pragma: no cover - compiled
    """MUL_MAT_ID: the rows routed to each expert gathered (grouped by expert, in token order within each, as
    ggml's matrix_row_counts), every expert's rows in one parallel region (matmul.matmul_id_*), the outputs
    scattered back to (token, slot)."""
    qs, qh, sc, mn, d, m = w
    n_expert = qs.shape[0] // unit
    count = np.zeros(n_expert + 1, np.int64)
    for t in range(n):
        for s in range(k):
            count[int(ids[io + t * il + s]) + 1] += 1
    for e in range(n_expert):
        count[e + 1] += count[e]
    order = np.empty(n * k, np.int64)  # (token * k + slot), grouped by expert
    fill = count[:n_expert].copy()
    for t in range(n):
        for s in range(k):
            e = int(ids[io + t * il + s])
            order[fill[e]] = t * k + s
            fill[e] += 1
    xs = np.empty((n * k, ne0), np.float32)
    out = np.empty((n * k, n_ff), np.float32)
    if n >= PAR_ROWS:  # a prompt: the copies on the thread pool too (serial, they held the other threads idle)
        _gather_rows_par(x, xo, xl, shared, order, k, xs)
    else:
        _gather_rows(x, xo, xl, shared, order, k, xs)
    _matmul_id(path, n_threads, kind, per_row, xs, count, unit, qs, qh, sc, mn, d, m, out)
    if n >= PAR_ROWS:
        _scatter_rows_par(out, order, k, y, yo, yl)
    else:
        _scatter_rows(out, order, k, y, yo, yl)


@njit(cache=True)
def _mul_mat_id_one(path, n_threads, prog, s, bufs, w_meta, w_kind):  # pragma: no cover - compiled
    """MUL_MAT_ID row s for one token whose experts experts.decode_experts streams in place, with row s + 1 in
    the same stream when that is the same FFN's up beside this gate (the same input and experts). -> the rows
    done: 0 (not such a node: the caller runs it), 1 or 2."""
    i, k, cols, unit = prog[s, P0], prog[s, P1], prog[s, NC], prog[s, P4]
    n_ff, ne0, shared = cols // k, prog[s, P3], prog[s, P2] & 1 != 0
    if prog[s, NR] != 1 or not streams_one(w_kind[i], n_ff, prog[s, P2] >> 1 != 0):
        return 0
    a, ao, b, bo = bufs[prog[s, AB]], prog[s, AO], bufs[prog[s, BB]], prog[s, BO]
    x = a[ao : ao + (1 if shared else k) * ne0].reshape((1 if shared else k, ne0))
    y, yo = bufs[prog[s, DB]], prog[s, DO]
    out0 = y[yo : yo + k * n_ff].reshape((k, n_ff))
    t = s + 1
    fused = (shared and t < prog.shape[0] and prog[t, OP] == MUL_MAT_ID and prog[t, NR] == 1
             and prog[t, P2] == prog[s, P2] and prog[t, P1] == k and prog[t, NC] == cols and prog[t, P4] == unit
             and prog[t, AB] == prog[s, AB] and prog[t, AO] == ao and prog[t, BB] == prog[s, BB]
             and prog[t, BO] == bo and w_kind[prog[t, P0]] == w_kind[i])
    W0 = _weight(w_meta, i)
    W1, out1 = W0, out0
    if fused:
        W1 = _weight(w_meta, prog[t, P0])
        y1, yo1 = bufs[prog[t, DB]], prog[t, DO]
        out1 = y1[yo1 : yo1 + k * n_ff].reshape((k, n_ff))
    decode_experts(path, n_threads, w_kind[i], W0[:3], W1[:3], fused, x, shared, b[bo : bo + k], k, unit, out0,
                   out1)
    return 2 if fused else 1


@njit(cache=True)
def _gather_row(x, xo, xl, shared, order, k, xs, r):  # pragma: no cover - compiled
    """xs[r] = the input row of (token, slot) order[r] (the token's row when `shared`)."""
    ne0 = xs.shape[1]
    t, s = order[r] // k, order[r] % k
    src = xo + t * xl + (0 if shared else s * ne0)
    xs[r] = x[src : src + ne0]


@njit(cache=True)
def _gather_rows(x, xo, xl, shared, order, k, xs):  # pragma: no cover - compiled
    for r in range(xs.shape[0]):
        _gather_row(x, xo, xl, shared, order, k, xs, r)


@njit(parallel=True, cache=True)
def _gather_rows_par(x, xo, xl, shared, order, k, xs):  # pragma: no cover - compiled
    for r in prange(xs.shape[0]):
        _gather_row(x, xo, xl, shared, order, k, xs, r)


@njit(cache=True)
def _scatter_row(out, order, k, y, yo, yl, r):  # pragma: no cover - compiled
    """out[r] to (token, slot) order[r] of y."""
    n_ff = out.shape[1]
    t, s = order[r] // k, order[r] % k
    dst = yo + t * yl + s * n_ff
    y[dst : dst + n_ff] = out[r]


@njit(cache=True)
def _scatter_rows(out, order, k, y, yo, yl):  # pragma: no cover - compiled
    for r in range(out.shape[0]):
        _scatter_row(out, order, k, y, yo, yl, r)


@njit(parallel=True, cache=True)
def _scatter_rows_par(out, order, k, y, yo, yl):  # pragma: no cover - compiled
    for r in prange(out.shape[0]):
        _scatter_row(out, order, k, y, yo, yl, r)


@njit(cache=True)
def _moe_sum_row(a, ao, al, route, ro, rl, r, k, cols, y, yo, yl):  # pragma: no cover - compiled
    """MOE_SUM of token r: ggml_mul by each slot's weight, then the slots added in order (slot after slot over
    the row: each element's products and sums as ggml's, the row in vector lanes)."""
    x0, d0, w0 = ao + r * al, yo + r * yl, route[ro + r * rl + k]
    for j in range(cols):
        y[d0 + j] = a[x0 + j] * w0
    for s in range(1, k):
        ws, xs = route[ro + r * rl + k + s], x0 + s * cols
        for j in range(cols):
            y[d0 + j] = y[d0 + j] + a[xs + j] * ws


@njit(cache=True)
def _moe_sum_node(a, ao, al, route, ro, rl, n, k, cols, y, yo, yl):  # pragma: no cover - compiled
    for r in range(n):
        _moe_sum_row(a, ao, al, route, ro, rl, r, k, cols, y, yo, yl)


@njit(parallel=True, cache=True)
def _moe_sum_node_par(a, ao, al, route, ro, rl, n, k, cols, y, yo, yl):  # pragma: no cover - compiled
    for r in prange(n):
        _moe_sum_row(a, ao, al, route, ro, rl, r, k, cols, y, yo, yl)


@njit(cache=True)
def _add_one_row(a, ao, al, b, bo, bl, r, cols, y, yo, yl):  # pragma: no cover - compiled
    """ADD of row r (two inputs of the same shape)."""
    for j in range(cols):
        y[yo + r * yl + j] = a[ao + r * al + j] + b[bo + r * bl + j]


@njit(cache=True)
def _add_node(a, ao, al, b, bo, bl, n, cols, y, yo, yl):  # pragma: no cover - compiled
    for r in range(n):
        _add_one_row(a, ao, al, b, bo, bl, r, cols, y, yo, yl)


@njit(parallel=True, cache=True)
def _add_node_par(a, ao, al, b, bo, bl, n, cols, y, yo, yl):  # pragma: no cover - compiled
    for r in prange(n):
        _add_one_row(a, ao, al, b, bo, bl, r, cols, y, yo, yl)


@njit(cache=True)
def _route_sel_node(a, ao, al, n, n_expert, k, flags, w_scale, probs_b, y, yo, yl):  # pragma: no cover - compiled
    """MOE_ROUTE_SEL: each token's experts (as floats) and weights, ggml.moe.route_row_biased."""
    probs = np.empty(n_expert, np.float32)
    sel = np.empty(n_expert, np.float32)
    idx = np.empty(n_expert, np.int32)
    for r in range(n):
        route_row_biased(a[ao + r * al : ao + r * al + n_expert], k, flags >> 1 & 1 != 0, probs_b, flags >> 12,
                         flags >> 2 & 1023, flags & 1 != 0, w_scale, probs, sel, idx,
                         y[yo + r * yl : yo + r * yl + 2 * k])


@njit(cache=True)
def _cont_node(a, ao, al, n, n_head, hw, start, cols, y, yo, yl):  # pragma: no cover - compiled
    """CONT: columns start.. of each of n_head heads hw wide (one head of the row: n_head 1, hw 0), copied."""
    wd = cols // n_head
    for r in range(n):
        for h in range(n_head):
            src, dst = ao + r * al + h * hw + start, yo + r * yl + h * wd
            y[dst : dst + wd] = a[src : src + wd]


@njit(cache=True)
def _concat_node(a, ao, al, b, bo, bl, n, n_head, da, db, y, yo, yl):  # pragma: no cover - compiled
    """CONCAT: each head's a then b columns."""
    for r in range(n):
        for h in range(n_head):
            dst = yo + r * yl + h * (da + db)
            y[dst : dst + da] = a[ao + r * al + h * da : ao + r * al + (h + 1) * da]
            y[dst + da : dst + da + db] = b[bo + r * bl + h * db : bo + r * bl + (h + 1) * db]


@njit(cache=True)
def _mul_mat_heads_node(path, n_threads, w_meta, w_kind, first, llama_order, n_head, ne0, a, ao, al, n, cols,
                        y, yo, yl):  # pragma: no cover - compiled
    """MUL_MAT_HEADS: head h's rows (n, ne0) times WeightTable entry first + h, as its own matmul."""
    ne1 = cols // n_head
    xs = np.empty((n, ne0), np.float32)
    out = np.empty((n, ne1), np.float32)
    for h in range(n_head):
        for r in range(n):
            xs[r] = a[ao + r * al + h * ne0 : ao + r * al + (h + 1) * ne0]
        i = first + h
        qs, qh, sc, mn, d, m = _weight(w_meta, i)
        _matmul(path, n_threads, w_kind[i], llama_order, xs, qs, qh, sc, mn, d, m, out)
        for r in range(n):
            y[yo + r * yl + h * ne1 : yo + r * yl + (h + 1) * ne1] = out[r]


@njit(cache=True)
def _latent_values(k, d_v, cells, n_cells):  # pragma: no cover - compiled
    """An MLA cache's V (no V storage): the first d_v values of the K rows of every cell up to the last one a
    token sees, contiguous (KVView.v_stored, llama_graph's ggml_view of K in build_attn)."""
    m = 0
    for t in range(n_cells.shape[0]):
        for j in range(n_cells[t]):
            m = max(m, cells[t, j] + 1)
    v = np.empty((m, d_v), np.uint16)
    for c in range(m):
        v[c] = k[c, :d_v]
    return v


@njit(cache=True)
def _ssm_conv_rs_node(states, slots, starts, rows, x, xo, xl, w, y, yo, yl):  # pragma: no cover - compiled
    """SSM_CONV_RS: each sequence set's rows of x after its conv state (n_ch, d_conv - 1) through delta_rule's conv
    (the eager op's sums); the state becomes the last d_conv - 1 inputs, in place."""
    ssm_conv_sets(states, slots, starts, rows, x, xo, xl, w, y, yo, yl)


@njit(cache=True)
def _gather_heads(x, xo, xl, rows, r0, n_t, n_head, d):  # pragma: no cover - compiled
    """Rows rows[r0:r0 + n_t] of a (n, n_head * d) buffer region, contiguous. -> (n_t, n_head, d)"""
    out = np.empty((n_t, n_head, d), np.float32)
    for t in range(n_t):
        src = xo + rows[r0 + t] * xl
        out[t] = x[src : src + n_head * d].reshape((n_head, d))
    return out


@njit(cache=True)
def _gdn_rs_node(states, slots, starts, rows, q, qo, ql, k, ko, kl, v, vo, vl, g, go, gl, beta, bo, bl, h_k, h_v,
                 s_v, scale, y, yo, yl):  # pragma: no cover - compiled
    """GDN_RS: each sequence set's rows through the gated delta rule (kernels.delta_rule, the eager op's kernel)
    on its state (H_v, S, S), updated in place."""
    for j in range(slots.shape[0]):
        r0, n_t = starts[j], starts[j + 1] - starts[j]
        qs = _gather_heads(q, qo, ql, rows, r0, n_t, h_k, s_v)
        ks = _gather_heads(k, ko, kl, rows, r0, n_t, h_k, s_v)
        vs = _gather_heads(v, vo, vl, rows, r0, n_t, h_v, s_v)
        gs = _gather_heads(g, go, gl, rows, r0, n_t, h_v, 1).reshape((n_t, h_v))
        bs = _gather_heads(beta, bo, bl, rows, r0, n_t, h_v, 1).reshape((n_t, h_v))
        out = np.empty((n_t, h_v, s_v), np.float32)
        gated_delta_net_heads(qs, ks, vs, gs, bs, states[slots[j]].reshape((h_v, s_v, s_v)), scale, out)
        for t in range(n_t):
            dst = yo + rows[r0 + t] * yl
            y[dst : dst + h_v * s_v] = out[t].reshape(-1)


@njit(cache=True)
def _store_kv(cache, il, cells, x, xo, xl, n, cols):
    """ggml_set_rows: the ubatch's rows rounded to f16 into its cells of layer il (cache: uint16 bits)."""
    for t in range(n):
        for j in range(cols):
            cache[il, cells[t], j] = f16_bits(x[xo + t * xl + j])


@njit(cache=True)
def _run(path, prog, fprm, arena, out_logits, out_embd, in_embd, tokens, pos, out_ids, vectors, gelu,
                cos, sin, w_meta, w_kind, n_threads, flash, layer_rows,
                k_cache, v_cache, kv_cells, cells, n_cells, mask_add,
                swa_k_cache, swa_v_cache, swa_kv_cells, swa_cells, swa_n_cells, swa_mask_add,
                r_states, s_states, rs_slots, rs_starts, rs_rows):  # pragma: no cover
    """Execute `prog` (module docstring) in order, with the matmul kernel of `path`. The attention of a layer
    stores into and reads its cache (the SWA one for sliding-window layers: the same arrays when one cache holds
    every layer) at row layer_rows[il]; `flash`: ggml's flash attention (kernels.flash) instead of
    kq / softmax / kqv. A recurrent layer il reads and updates its conv / delta-rule states in place, in row
    layer_rows[il] of r_states / s_states (n_layer_rs, n_seq, n_embd_r / n_embd_s): sequence set k's rows are
    rs_rows[rs_starts[k]:rs_starts[k + 1]], its state that of sequence rs_slots[k]."""
    bufs = (arena, out_logits, out_embd, in_embd)
    no_table = gelu[:0]
    skip = -1  # a row an earlier row computed with its own (MUL_MAT_ID's up beside its gate)
    for s in range(prog.shape[0]):
        if s == skip:
            continue
        op, n, cols = prog[s, OP], prog[s, NR], prog[s, NC]
        y, yo, yl = bufs[prog[s, DB]], prog[s, DO], prog[s, DL]
        a, ao, al = bufs[prog[s, AB]], prog[s, AO], prog[s, AL]
        b, bo, bl = bufs[prog[s, BB]], prog[s, BO], prog[s, BL]
        if op == MUL_MAT:
            i = prog[s, P0]
            x = a[ao : ao + n * al].reshape((n, al))
            out = y[yo : yo + n * cols].reshape((n, cols))
            qs, qh, sc, mn, d, m = _weight(w_meta, i)
            if w_kind[i] == F32:  # vecdot.matmul_float's row-invariant order: tinyBLAS where the shape allows
                wf = qs.view(np.float32)  # (rows, k)
                if al % F32_EPR == 0 and cols % 4 == 0:
                    sgemm(wf, x, n_threads, out)  # its lanes in register tiles (kernels/tinyblas.py)
                else:
                    matmul_float_rows(wf, x, False, False, out)
            elif w_kind[i] == BF16:  # tinyBLAS's order on the stored rows (kernels/bf16.py)
                gemm_bf16(qs.view(np.uint16), x, n_threads, out)
            else:
                _matmul(path, n_threads, w_kind[i], prog[s, P1] != 0, x, qs, qh, sc, mn, d, m, out)
        elif op == ATTN:
            row, n_head, n_head_kv = layer_rows[prog[s, P0]], prog[s, P2], prog[s, P3]
            c, co, cl = bufs[prog[s, CB]], prog[s, CO], prog[s, CL]
            q = a[ao : ao + n * al].reshape((n, al))
            out = y[yo : yo + n * cols].reshape((n, cols))
            if prog[s, P1]:
                _store_kv(swa_k_cache, row, swa_kv_cells, b, bo, bl, n, swa_k_cache.shape[2])
                _store_kv(swa_v_cache, row, swa_kv_cells, c, co, cl, n, swa_v_cache.shape[2])
                if flash:
                    flash_attend(q, swa_k_cache[row], swa_v_cache[row], n_head, n_head_kv, swa_cells, swa_n_cells,
                                 swa_mask_add, fprm[s, 0], out, n_threads)
                else:
                    attend(q, swa_k_cache[row], swa_v_cache[row], n_head, n_head_kv, swa_cells, swa_n_cells,
                           swa_mask_add, fprm[s, 0], out, n_threads)
            else:
                _store_kv(k_cache, row, kv_cells, b, bo, bl, n, k_cache.shape[2])
                _store_kv(v_cache, row, kv_cells, c, co, cl, n, v_cache.shape[2])
                vr = v_cache[row]
                if v_cache.shape[2] == 0:  # an MLA cache (K only): V is each K row's latent
                    vr = _latent_values(k_cache[row], cols // n_head, cells, n_cells)
                if flash:
                    flash_attend(q, k_cache[row], vr, n_head, n_head_kv, cells, n_cells, mask_add,
                                 fprm[s, 0], out, n_threads)
                else:
                    attend(q, k_cache[row], vr, n_head, n_head_kv, cells, n_cells, mask_add, fprm[s, 0],
                           out, n_threads)
        elif op == RMS_NORM:
            w = vectors[prog[s, P0] : prog[s, P0] + prog[s, P1]]
            if _on_pool(n, cols):
                _rms_norm_node_par(a, ao, al, n, cols, prog[s, P1], w, fprm[s, 0], y, yo, yl)
            else:
                _rms_norm_node(a, ao, al, n, cols, prog[s, P1], w, fprm[s, 0], y, yo, yl)
        elif op == ROPE:
            ti = prog[s, P0]
            if _on_pool(n, cols):
                _rope_node_par(a, ao, al, n, prog[s, P1], prog[s, P2], cos[ti], sin[ti], prog[s, P3],
                               prog[s, P4] != 0, y, yo, yl)
            else:
                _rope_node(a, ao, al, n, prog[s, P1], prog[s, P2], cos[ti], sin[ti], prog[s, P3], prog[s, P4] != 0,
                           y, yo, yl)
        elif op == SWIGLU or op == GEGLU:
            table = gelu if op == GEGLU else no_table
            if _on_pool(n, cols):
                _glu_node_par(table, a, ao, al, b, bo, bl, n, cols, y, yo, yl)
            else:
                _glu_node(table, a, ao, al, b, bo, bl, n, cols, y, yo, yl)
        elif op == ADD:
            if _on_pool(n, cols):
                _add_node_par(a, ao, al, b, bo, bl, n, cols, y, yo, yl)
            else:
                _add_node(a, ao, al, b, bo, bl, n, cols, y, yo, yl)
        elif op == ADD_ROW:
            vo = prog[s, P0]
            for r in range(n):
                for j in range(cols):
                    y[yo + r * yl + j] = a[ao + r * al + j] + vectors[vo + j]
        elif op == SCALE:
            for r in range(n):
                for j in range(cols):
                    y[yo + r * yl + j] = a[ao + r * al + j] * fprm[s, 0]
        elif op == DIV:
            for r in range(n):
                for j in range(cols):
                    y[yo + r * yl + j] = a[ao + r * al + j] / b[bo + r * bl + j]
        elif op == MUL_COL:
            for r in range(n):
                for j in range(cols):
                    y[yo + r * yl + j] = a[ao + r * al + j] * b[bo + r * bl]
        elif op == SILU:  # ggml_vec_silu_f32 per row of the last dimension, P0 long (llamactx.ggml.ssm.silu)
            m = n * cols // prog[s, P0]
            silu_rows(a[ao : ao + n * cols].reshape((m, prog[s, P0])), y[yo : yo + n * cols].reshape((m, prog[s, P0])))
        elif op == SIGMOID or op == SOFTPLUS:  # ggml_sigmoid / ggml_softplus element by element (libm expf)
            for r in range(n):
                if op == SIGMOID:
                    sigmoid_vec(a[ao + r * al : ao + r * al + cols], y[yo + r * yl : yo + r * yl + cols])
                else:
                    softplus_vec(a[ao + r * al : ao + r * al + cols], y[yo + r * yl : yo + r * yl + cols])
        elif op == MUL:
            for r in range(n):
                for j in range(cols):
                    y[yo + r * yl + j] = a[ao + r * al + j] * b[bo + r * bl + j]
        elif op == MUL_ROW:  # by a vector along the last dimension, P1 = its length
            vo, vn = prog[s, P0], prog[s, P1]
            for r in range(n):
                for j in range(cols):
                    y[yo + r * yl + j] = a[ao + r * al + j] * vectors[vo + j % vn]
        elif op == SSM_CONV_RS:
            d_conv = prog[s, P2]
            w = vectors[prog[s, P1] : prog[s, P1] + cols * d_conv].reshape((cols, d_conv))
            _ssm_conv_rs_node(r_states[layer_rows[prog[s, P0]]], rs_slots, rs_starts, rs_rows, a, ao, al, w,
                              y, yo, yl)
        elif op == GDN_RS:
            c, co, cl = bufs[prog[s, CB]], prog[s, CO], prog[s, CL]
            e, eo, el = bufs[prog[s, EB]], prog[s, EO], prog[s, EL]
            f, fo, fl = bufs[prog[s, FB]], prog[s, FO], prog[s, FL]
            _gdn_rs_node(s_states[layer_rows[prog[s, P0]]], rs_slots, rs_starts, rs_rows, a, ao, al, b, bo, bl,
                         c, co, cl, e, eo, el, f, fo, fl, prog[s, P1], prog[s, P2], prog[s, P3], fprm[s, 0],
                         y, yo, yl)
        elif op == SSM_SCAN_RS:
            c, co, cl = bufs[prog[s, CB]], prog[s, CO], prog[s, CL]
            e, eo, el = bufs[prog[s, EB]], prog[s, EO], prog[s, EL]
            head_dim = prog[s, P4]
            ssm_scan_rs_node(s_states[layer_rows[prog[s, P0]]], rs_slots, rs_starts, rs_rows, a, ao, al, b, bo, bl,
                             c, co, cl, e, eo, el, vectors[prog[s, P1] : prog[s, P1] + cols // head_dim], head_dim,
                             prog[s, P2], prog[s, P3], y, yo, yl)
        elif op == RELU:  # ggml_relu: x > 0 ? x : 0
            for r in range(n):
                for j in range(cols):
                    v = a[ao + r * al + j]
                    y[yo + r * yl + j] = v if v > 0 else np.float32(0.0)
        elif op == SELECT:
            for r in range(n):
                for j in range(cols):
                    y[yo + r * yl + j] = a[ao + out_ids[r] * al + j]
        elif op == MOE_ROUTE:
            if n >= PAR_ROWS:
                _route_node_par(a, ao, al, n, prog[s, P2], prog[s, P0], prog[s, P1] != 0, fprm[s, 0], y, yo, yl)
            else:
                _route_node(a, ao, al, n, prog[s, P2], prog[s, P0], prog[s, P1] != 0, fprm[s, 0], y, yo, yl)
        elif op == MUL_MAT_ID:
            i, k = prog[s, P0], prog[s, P1]
            done = _mul_mat_id_one(path, n_threads, prog, s, bufs, w_meta, w_kind)
            skip = s + 1 if done == 2 else skip
            if done == 0:
                _mul_mat_id_node(path, n_threads, w_kind[i], _weight(w_meta, i), a, ao, al, prog[s, P2] & 1 != 0,
                                 prog[s, P2] >> 1 != 0, prog[s, P3], b, bo, bl, n, k, cols // k, prog[s, P4], y, yo, yl)
        elif op == MOE_SUM:
            if n >= PAR_ROWS:
                _moe_sum_node_par(a, ao, al, b, bo, bl, n, prog[s, P0], cols, y, yo, yl)
            else:
                _moe_sum_node(a, ao, al, b, bo, bl, n, prog[s, P0], cols, y, yo, yl)
        elif op == MOE_ROUTE_SEL:
            _route_sel_node(a, ao, al, n, prog[s, P2], prog[s, P0], prog[s, P1], fprm[s, 0],
                            vectors[prog[s, P3] : prog[s, P3] + prog[s, P4]], y, yo, yl)
        elif op == CONT:
            _cont_node(a, ao, al, n, prog[s, P0], prog[s, P1], prog[s, P2], cols, y, yo, yl)
        elif op == CONCAT:
            _concat_node(a, ao, al, b, bo, bl, n, prog[s, P0], prog[s, P1], prog[s, P2], y, yo, yl)
        elif op == MUL_MAT_HEADS:
            _mul_mat_heads_node(path, n_threads, w_meta, w_kind, prog[s, P0], prog[s, P1] != 0, prog[s, P2],
                                prog[s, P3], a, ao, al, n, cols, y, yo, yl)
        elif op == GET_ROWS:
            i = prog[s, P0]
            qs, _, sc, _, dw, _ = _weight(w_meta, i)
            if w_kind[i] == BF16:
                rows_bf16(qs, tokens, y[yo : yo + n * cols].reshape((n, cols)))
            elif w_kind[i] == F32:  # the rows as stored (an F32 table: mamba2's tiny model)
                wf = qs.view(np.float32)
                for r in range(n):
                    y[yo + r * cols : yo + (r + 1) * cols] = wf[tokens[r]]
            elif w_kind[i] == Q6_K:  # ggml's blocks (kblocks.py): a Q4_K_M's tied embeddings / output head
                rows_q6_k(qs, tokens, y[yo : yo + n * cols].reshape((n, cols)))
            elif w_kind[i] == Q4_K:
                rows_q4_k(qs, tokens, y[yo : yo + n * cols].reshape((n, cols)))
            elif w_kind[i] == Q4_0 or w_kind[i] == Q4_1:  # a Q4_0 file's embeddings (repack.py's groups of four)
                rows_q4_x4(qs, sc, w_kind[i] == Q4_1, tokens, y[yo : yo + n * cols].reshape((n, cols)))
            elif w_kind[i] == IQ4_NL or w_kind[i] == MXFP4:
                rows_nl(qs, dw, KVALUES_IQ4NL if w_kind[i] == IQ4_NL else KVALUES_MXFP4, tokens,
                        y[yo : yo + n * cols].reshape((n, cols)))
            else:
                rows_q8_0_x4(qs, sc, tokens, y[yo : yo + n * cols].reshape((n, cols)))


# One entry point per path, the path a global constant (a Tag argument would cost the dispatcher a Python typeof).


@njit(cache=True)
def run_program_vnni(*args):  # pragma: no cover - compiled
    """`_run` on the VNNI path."""
    return _run(VNNI, *args)


@njit(cache=True)
def run_program_portable(*args):  # pragma: no cover - compiled
    """`_run` on the portable path."""
    return _run(PORTABLE, *args)


PROGRAMS = {PATH_VNNI: run_program_vnni, PATH_PORTABLE: run_program_portable}

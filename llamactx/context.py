"""Context: one stateful session over a shared, read-only model (`llama_context`, src/llama-context.*).

A context owns its resolved parameters, its memory (the KV cache), the compute ops, its output buffers and the
LoRA adapters applied to its forward passes (`set_adapters_lora`; the model and the adapters stay shared, read-only).
`decode(batch)` validates the batch, splits it into ubatches, places each in the KV cache, runs the architecture's
forward pass and keeps the outputs the batch asked for. Any failure leaves the memory as it was.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.backend.reference import F32Rows
from llamactx.batch import AllocatedBatch, Batch, BatchAllocator, DecodeError, UBatch
from llamactx.cparams import ContextParams, ResolvedParams
from llamactx.ggml.vecdot import matmul_float
from llamactx.lora import AdaptedModel, LoraAdapter, LoraError
from llamactx.memory.hybrid import HybridView
from llamactx.memory.recurrent import RecurrentView
from llamactx.model import Model
from llamactx.models import arch_module
from llamactx.models.graph_inputs import (
    BatchAttention,
    HybridInput,
    KVAttention,
    LayerMappedAttention,
    rope_config,
    rope_factors,
)
from llamactx.state import load_file, read_state, save_file, write_state
from llamactx.state_io import StateError


class DecodeStatus(IntEnum):
    """What `decode` returns (llama_decode's 0 / 1 / 2; still equal to those ints). An invalid batch (-1) raises
    `DecodeError` instead."""

    OK = 0
    NO_SLOT = 1  # no free KV cells for the batch; memory unchanged
    ABORTED = 2  # abort_callback returned True; memory unchanged


@dataclass(frozen=True, slots=True)
class Outputs:
    """The last decode's output buffers (llama_context's output_ids, logits, embd)."""

    output_ids: np.ndarray  # (n_batch_tokens,) int32: batch index -> output row, -1 = not an output
    logits: np.ndarray  # (n_outputs, n_vocab) float32
    embd: np.ndarray  # (n_outputs, n_embd) float32


@dataclass(slots=True)
class Perf:
    """`llama_perf_context_data`: prompt (multi-token) and generation (single-token) decode timings."""

    t_start_ms: float = 0.0
    t_load_ms: float = 0.0
    t_p_eval_ms: float = 0.0
    t_eval_ms: float = 0.0
    n_p_eval: int = 0
    n_eval: int = 0
    n_reused: int = 0


class Context:
    """A session over `model`: `Context(model, ContextParams(...))`. Use as a context manager or call `close()`."""

    def __init__(self, model: Model, params: ContextParams | None = None, *, ops=None):
        t0 = time.perf_counter()
        params = dataclasses.replace(params) if params is not None else ContextParams()
        self.model = model
        self.params: ResolvedParams = params.resolve(model.hparams)
        hp = model.hparams
        p = self.params
        self.memory = model.create_memory(p)
        self.ops = ops if ops is not None else _fast_ops(model)
        self._arch = arch_module(model.arch)
        self._rope = rope_config(hp, p, rope_factors(model.tensors, hp, p))
        self._loras: tuple[tuple[LoraAdapter, float], ...] = ()  # (adapter, user scale), in the order set
        self._forward_model = model  # the model, or an AdaptedModel while adapters are set
        self._balloc = BatchAllocator(hp.n_vocab, hp.n_embd, p.n_seq_max, p.n_batch)
        self._lock = threading.Lock()
        self._closed = False
        self._logits = np.zeros((0, hp.n_vocab), np.float32)  # (n_outputs, n_vocab)
        self._embd = np.zeros((0, hp.n_embd), np.float32)  # (n_outputs, n_embd)
        self._embd_seq: dict[int, np.ndarray] = {}  # seq_id -> (n_embd,) pooled
        self._output_ids = np.zeros(0, np.int32)  # (n_batch_tokens,) batch index -> output row or -1
        self._perf = Perf(t_start_ms=time.time() * 1000)
        self._perf.t_load_ms = (time.perf_counter() - t0) * 1000

    # -- decode / encode ----------------------------------------------------------------------------------------

    def decode(self, batch: Batch) -> DecodeStatus:
        """Run `batch` through the model, appending to the memory. Returns DecodeStatus.OK (0), NO_SLOT (1: no
        free KV cells for the batch; memory unchanged) or ABORTED (2: by `abort_callback`; memory unchanged).
        Raises `DecodeError` (code -1) for an invalid batch, with memory unchanged. A model without memory (an
        encoder: bert) encodes the batch instead, as llama_decode does; it produces embeddings, never logits."""
        if self.memory is None:  # llama_context::decode: "cannot decode batches with this context (calling encode())"
            return self.encode(batch)
        with self._lock:
            self._check_open()
            t0 = time.perf_counter()
            mem = self.memory
            alloc = self._balloc.init(batch, mem.seq_pos_max, self.params.embeddings)
            broken = mem.check_coupled(alloc.seq_ids)
            if broken:
                raise DecodeError(broken)
            self._set_threads(alloc.n_tokens)
            mem.update(self._rope_shift)
            ubatches = mem.split(alloc, self.params.n_ubatch)
            placement = mem.prepare(ubatches)
            if placement is None:
                return DecodeStatus.NO_SLOT
            try:
                outputs = self._run(ubatches, placement)
            except BaseException:
                mem.rollback(placement)
                raise
            if outputs is None:
                mem.rollback(placement)
                return DecodeStatus.ABORTED
            self._store_outputs(alloc, *outputs)
            self._count(alloc.n_tokens, time.perf_counter() - t0)
            return DecodeStatus.OK

    def encode(self, batch: Batch) -> DecodeStatus:
        """Run `batch` without memory (`llama_encode`): attention only within the batch (causal unless
        attention_type is non_causal), every token an output; fills the embeddings outputs. Returns 0 or 2."""
        with self._lock:
            self._check_open()
            t0 = time.perf_counter()
            alloc = self._balloc.init(batch, lambda s: -1, True)
            self._set_threads(alloc.n_tokens)
            if self._arch.MEMORY in ("recurrent", "hybrid"):
                raise DecodeError(f"encode: {self.model.arch} keeps a recurrent state; use decode")
            if alloc.n_tokens > self.params.n_ubatch:
                raise DecodeError(f"encode: {alloc.n_tokens} tokens exceed n_ubatch = {self.params.n_ubatch}")
            if self._aborted():
                return DecodeStatus.ABORTED
            ub = alloc.split_simple(alloc.n_tokens)[0]
            attn = BatchAttention(self.model.hparams, self.params, self.ops, ub)
            res = self._forward(ub, attn, np.arange(ub.n_tokens), want_logits=False)
            self._store_outputs(alloc, None, res.embd)
            self._count(alloc.n_tokens, time.perf_counter() - t0)
            return DecodeStatus.OK

    def _run(self, ubatches: list[UBatch], placement):
        """Each ubatch in order: occupy its cells, run the forward through the memory's view. None if aborted."""
        logits_parts, embd_parts = [], []
        for ub, slot in zip(ubatches, placement.slots, strict=True):
            if self._aborted():
                return None
            view = self.memory.apply(ub, slot)
            res = self._forward(ub, self._memory_input(view, ub), np.flatnonzero(ub.output), want_logits=True)
            logits_parts.append(res.logits)
            embd_parts.append(res.embd)
        if len(logits_parts) == 1:  # one ubatch: its outputs are fresh arrays already (no 1 MiB copy per token)
            return logits_parts[0], embd_parts[0] if self.params.embeddings else None
        logits = np.concatenate(logits_parts)
        embd = np.concatenate(embd_parts) if self.params.embeddings else None
        return logits, embd

    def _memory_input(self, view, ub: UBatch):
        """What the forward reads the memory through: attention over the KV view, the recurrent view itself, or
        both (llm_graph_input_attn_kv / llm_graph_input_rs / llm_graph_input_mem_hybrid)."""
        if isinstance(view, RecurrentView):
            return view
        if isinstance(view, HybridView):
            attn = KVAttention(self.model.hparams, self.params, self.ops, view.kv, ub)
            return HybridInput(LayerMappedAttention(attn, self.memory.attn_layers), view.rs)
        return KVAttention(self.model.hparams, self.params, self.ops, view, ub)

    def _forward(self, ub: UBatch, inp, out_ids: np.ndarray, want_logits: bool):
        """One ubatch through the architecture's graph (llama_context::process_ubatch -> build_graph): its `build`
        and the graph params, computed by the ops (eagerly, or as a recorded graph)."""
        params = GraphParams(model=self._forward_model, token=ub.token, embd=ub.embd, pos=ub.pos, inp=inp,
                             rope=self._rope, out_ids=out_ids, want_logits=want_logits, loras=self._loras)
        return self.ops.compute_graph(self._arch.build, params)

    def _rope_shift(self, rows: np.ndarray, shift: np.ndarray, il: int) -> np.ndarray:
        hp = self.model.hparams
        if not hp.has_rope(il):  # llama_kv_cache::build_graph_shift leaves a layer without RoPE as it is
            return rows
        k = rows.reshape(len(shift), hp.n_head_kv, hp.n_embd_head_k)
        return self.ops.rope(k, shift, self._rope.for_layer(hp.is_swa(il))).reshape(rows.shape)

    def _set_threads(self, n_tokens: int) -> None:
        """n_threads for single-token steps, n_threads_batch for batches (llama_context::graph_compute)."""
        if hasattr(self.ops, "set_threads"):
            self.ops.set_threads(self.params.n_threads if n_tokens == 1 else self.params.n_threads_batch)

    def _aborted(self) -> bool:
        cb = self.params.abort_callback
        return bool(cb is not None and cb())

    # -- LoRA adapters --------------------------------------------------------------------------------------------

    def set_adapters_lora(self, adapters, scales) -> None:
        """Apply exactly these adapters at these scales to the next decodes (llama_set_adapters_lora): adapters
        with scale 0 are dropped; an empty list removes all. Other contexts of the model are not affected. Raises
        LoraError (nothing changed) for an adapter of another model, a repeated adapter, or a scale that is not a
        finite number."""
        adapters, scales = list(adapters), [float(s) for s in scales]
        if len(adapters) != len(scales):
            raise LoraError(f"set_adapters_lora: {len(adapters)} adapters but {len(scales)} scales")
        for adapter, scale in zip(adapters, scales, strict=True):
            if adapter.model is not self.model:
                raise LoraError(f"adapter {adapter.path.name!r} was loaded for {adapter.model!r}, not this "
                                f"context's {self.model!r}")
            if not np.isfinite(scale):
                raise LoraError(f"adapter {adapter.path.name!r}: scale {scale} is not a finite number")
        if len(set(map(id, adapters))) != len(adapters):
            raise LoraError("set_adapters_lora: an adapter is given twice")
        loras = tuple((a, s) for a, s in zip(adapters, scales, strict=True) if s != 0.0)
        with self._lock:
            self._loras = loras
            self._forward_model = AdaptedModel(self.model, loras) if loras else self.model

    def set_adapter_lora(self, adapter: LoraAdapter, scale: float = 1.0) -> None:
        """Add `adapter` at `scale`, or change its scale (llama.cpp's older llama_set_adapter_lora)."""
        current = dict((id(a), (a, s)) for a, s in self._loras)
        current[id(adapter)] = (adapter, scale)
        self.set_adapters_lora([a for a, _ in current.values()], [s for _, s in current.values()])

    def rm_adapter_lora(self, adapter: LoraAdapter) -> bool:
        """Stop applying `adapter` (llama_rm_adapter_lora); False if it was not applied."""
        rest = [(a, s) for a, s in self._loras if a is not adapter]
        if len(rest) == len(self._loras):
            return False
        self.set_adapters_lora([a for a, _ in rest], [s for _, s in rest])
        return True

    def clear_adapter_lora(self) -> None:
        """Remove every adapter from this context (llama_clear_adapter_lora)."""
        self.set_adapters_lora([], [])

    @property
    def adapters_lora(self) -> tuple[tuple[LoraAdapter, float], ...]:
        """The (adapter, scale) pairs applied, in the order they were set."""
        return self._loras

    # -- outputs ------------------------------------------------------------------------------------------------

    def _store_outputs(self, alloc: AllocatedBatch, logits: np.ndarray | None, embd: np.ndarray | None) -> None:
        out_rows = np.flatnonzero(alloc.output)
        self._output_ids = np.full(alloc.n_tokens, -1, np.int32)
        self._output_ids[out_rows] = np.arange(out_rows.size, dtype=np.int32)
        self._logits = logits if logits is not None else np.zeros((0, self.model.hparams.n_vocab), np.float32)
        self._embd = embd if embd is not None else np.zeros((0, self.model.hparams.n_embd), np.float32)
        self._embd_seq = self._pool(alloc, out_rows) if embd is not None else {}

    def outputs(self) -> Outputs:
        """The last decode's output buffers, read-only (what a state blob saves)."""
        return Outputs(_readonly(self._output_ids), _readonly(self._logits), _readonly(self._embd))

    def set_outputs(self, output_ids: np.ndarray, logits: np.ndarray, embd: np.ndarray) -> None:
        """Replace the output buffers (a state load; the caller has checked their shapes)."""
        self._output_ids, self._logits, self._embd, self._embd_seq = output_ids, logits, embd, {}

    def _pool(self, alloc: AllocatedBatch, out_rows: np.ndarray) -> dict[int, np.ndarray]:
        """Per-sequence pooled embeddings (LLAMA_POOLING_TYPE_MEAN / CLS / LAST / RANK) over the batch's tokens,
        the sequences in ascending seq_id order (the ubatch's seq_idx)."""
        pooling = self.params.pooling_type
        if pooling == "none":
            return {}
        seqs = sorted({s for ids in alloc.seq_ids for s in ids})
        seq_rows = [[self._output_ids[i] for i in out_rows if s in alloc.seq_ids[i]] for s in seqs]
        if pooling == "rank":
            return self._rank(seqs, seq_rows)
        if pooling == "mean":
            return dict(zip(seqs, _mean_pool(self._embd, seq_rows), strict=True))
        picked = [rows[0] if pooling == "cls" else rows[-1] for rows in seq_rows]
        return dict(zip(seqs, self._embd[picked], strict=True))  # build_inp_cls + ggml_get_rows: (n_seqs, n_embd)

    def _rank(self, seqs: list[int], seq_rows: list[list[int]]) -> dict[int, np.ndarray]:
        """LLAMA_POOLING_TYPE_RANK as llama-graph.cpp `build_pooling` builds it: each sequence's first token's
        state (its last for a causal model, as llm_graph_input_cls::set_input picks; the mean of its states when
        the model's classifier.pooling_type is mean), through the architecture's classifier head when it has one
        (bert: cls, tanh, cls.output). Then llama_context's RANK extraction: sequence j's scores are the
        hparams.n_cls_out floats at offset n_cls_out * j of the pooled tensor, read as one flat buffer (so for a
        model whose head does not end in n_cls_out values, sequence j > 0 reads row 0's values j, j + 1 ..., as
        llama.cpp does). -> seq_id -> (n_cls_out,)"""
        hp = self.model.hparams
        if hp.pooling_type_cls == "mean":
            cur = _mean_pool(self._embd, seq_rows)  # (n_seqs, n_embd)
        else:
            picked = [rows[-1] if self.params.causal_attn else rows[0] for rows in seq_rows]
            cur = self._embd[picked]  # (n_seqs, n_embd)
        head = getattr(self._arch, "classifier_head", None)
        if head is not None:
            cur = head(self.model, self.ops, cur)  # (n_seqs, n_cls_out)
        flat = np.ascontiguousarray(cur, np.float32).reshape(-1)  # (n_seqs * n_out,)
        n = hp.n_cls_out
        return {s: flat[n * j : n * (j + 1)].copy() for j, s in enumerate(seqs)}

    def _output_row(self, i: int, kind: str) -> int:
        n_outputs = int((self._output_ids >= 0).sum())
        if i < 0:
            if -i > n_outputs:
                raise IndexError(f"{kind}: index {i} is out of range for {n_outputs} outputs")
            return n_outputs + i
        if i >= self._output_ids.size or self._output_ids[i] < 0:
            raise IndexError(f"{kind}: batch index {i} has no output (the batch flagged {n_outputs} of "
                             f"{self._output_ids.size} tokens)")
        return int(self._output_ids[i])

    def get_logits(self) -> np.ndarray:
        """Logits of the last decode's output tokens, in batch order. (n_outputs, n_vocab) float32, read-only."""
        return _readonly(self._logits)

    def get_logits_ith(self, i: int) -> np.ndarray:
        """Logits of batch token `i` (negative: counted back from the last output). (n_vocab,) float32.
        Raises IndexError for a token that was not an output."""
        if self._logits.shape[0] == 0:
            raise IndexError("get_logits_ith: the last decode produced no logits")
        return _readonly(self._logits[self._output_row(i, "get_logits_ith")])

    def get_embeddings(self) -> np.ndarray:
        """Per-token embeddings of the last decode's outputs. (n_outputs, n_embd) float32."""
        return _readonly(self._embd)

    def get_embeddings_ith(self, i: int) -> np.ndarray:
        if self._embd.shape[0] == 0:
            raise IndexError("get_embeddings_ith: no embeddings (set ContextParams(embeddings=True))")
        return _readonly(self._embd[self._output_row(i, "get_embeddings_ith")])

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray:
        """Pooled embedding of `seq_id` from the last decode (pooling mean | cls | last: (n_embd,) float32; rank:
        the (hparams.n_cls_out,) scores)."""
        if seq_id not in self._embd_seq:
            raise KeyError(f"get_embeddings_seq: no pooled embedding for seq_id {seq_id} "
                           f"(pooling_type = {self.params.pooling_type!r})")
        return _readonly(self._embd_seq[seq_id])

    # -- state ----------------------------------------------------------------------------------------------------

    def state_get_data(self) -> bytes:
        """The whole context state (KV cells of every sequence + last outputs) as bytes."""
        with self._lock:
            self._check_state()
            return write_state(self, seq_id=None)

    def state_set_data(self, data: bytes) -> None:
        """Restore a state from `state_get_data`; raises `StateError` with memory unchanged if it does not fit."""
        with self._lock:
            self._check_state()
            read_state(self, data, dest_seq_id=None)

    def state_seq_get_data(self, seq_id: int) -> bytes:
        with self._lock:
            self._check_state()
            self.memory.check_seq(seq_id)
            return write_state(self, seq_id=seq_id)

    def state_seq_set_data(self, data: bytes, dest_seq_id: int) -> None:
        with self._lock:
            self._check_state()
            self.memory.check_seq(dest_seq_id)
            read_state(self, data, dest_seq_id=dest_seq_id)

    def state_save_file(self, path, tokens) -> None:
        save_file(path, self.state_get_data(), tokens)

    def state_load_file(self, path, n_token_capacity: int | None = None) -> list[int]:
        data, tokens = load_file(path, n_token_capacity or self.params.n_ctx, self.model.hparams.n_vocab)
        self.state_set_data(data)
        return tokens

    def state_seq_save_file(self, path, seq_id: int, tokens) -> None:
        save_file(path, self.state_seq_get_data(seq_id), tokens)

    def state_seq_load_file(self, path, dest_seq_id: int, n_token_capacity: int | None = None) -> list[int]:
        data, tokens = load_file(path, n_token_capacity or self.params.n_ctx, self.model.hparams.n_vocab)
        self.state_seq_set_data(data, dest_seq_id)
        return tokens

    # -- misc -----------------------------------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.params.n_ctx

    def _count(self, n_tokens: int, seconds: float) -> None:
        if self.params.no_perf:
            return
        if n_tokens == 1:
            self._perf.t_eval_ms += seconds * 1000
            self._perf.n_eval += 1
        else:
            self._perf.t_p_eval_ms += seconds * 1000
            self._perf.n_p_eval += n_tokens

    def perf(self) -> Perf:
        """Timings like `llama_perf_context`: t_p_eval_ms / n_p_eval (prompt), t_eval_ms / n_eval (generation)."""
        return dataclasses.replace(self._perf)

    def perf_reset(self) -> None:
        self._perf = Perf(t_start_ms=time.time() * 1000)

    def memory_breakdown(self) -> dict[str, int]:
        """Bytes this context holds beyond the shared weights: KV arrays and cells (per cache for iSWA: "base.k",
        "swa.k", ...), recurrent states (rs), output buffers."""
        mem = self.memory.memory_breakdown() if self.memory is not None else {}
        rs = {name: n for name, n in mem.items() if name.rsplit(".", 1)[-1] in ("r", "s")}
        cells = sum(n for name, n in mem.items() if name.rsplit(".", 1)[-1] == "cells")
        kv = sum(mem.values()) - cells - sum(rs.values())
        out = {"kv": kv, "kv_cells": cells} if kv or cells else {}
        if rs:
            out["rs"] = sum(rs.values())
        out["outputs"] = self._logits.nbytes + self._embd.nbytes + self._output_ids.nbytes
        return out

    def _check_state(self) -> None:
        if self.memory is None:
            raise StateError(f"model '{self.model.arch}' is an encoder without memory: there is no state to save or "
                             f"restore")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this context was closed")

    def close(self) -> None:
        """Free the memory and outputs (`llama_free`); the model stays loaded for other contexts."""
        with self._lock:
            self._closed = True
            self.memory = None  # type: ignore[assignment]
            self._logits = self._embd = None  # type: ignore[assignment]

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def _mean_pool(embd: np.ndarray, seq_rows: list[list[int]]) -> np.ndarray:
    """build_pooling MEAN: ggml_mul_mat(ggml_cont(ggml_transpose(embd)), inp_mean), inp_mean's column s holding
    1.0f/n_s at sequence s's rows and 0 elsewhere: float dots over every output row, zeros included
    (ggml_vec_dot_f32 for one sequence, tinyBLAS where it takes the shape for several).
    embd (n_outputs, n_embd) -> (n_seqs, n_embd)"""
    inp_mean = np.zeros((len(seq_rows), embd.shape[0]), np.float32)  # (n_seqs, n_outputs)
    for j, rows in enumerate(seq_rows):
        inp_mean[j, rows] = np.float32(1.0) / np.float32(len(rows))
    return matmul_float(inp_mean, F32Rows(embd.T), vec_dot_for_one=True)  # (n_seqs, n_embd)


def _fast_ops(model: Model):
    """The default ops: the numba kernels, imported on first use (an import of llamactx compiles nothing)."""
    from llamactx.backend.fast import FastOps

    return FastOps(model)

"""The KV cache: one implementation of `Memory` (src/llama-kv-cache.*).

Per layer it stores the keys and values of every cell in `type_k` / `type_v` (f16 by default; bf16 and the block
types q8_0 / q4_0 / q4_1 / q5_0 / q5_1 / iq4_nl keep ggml's bytes (llamactx.ggml.quants_kv), f32 plain floats).
A multi-head latent attention model (deepseek2, `hparams.is_mla()`) has
K-only storage: each K row is the KV latent then the rope key, and V is a view of the latent (`v_of_k`). Cell
bookkeeping lives in `KVCells`. All layers share one set of cells, so a sequence's tokens sit in the same cells in
every layer, and sequences share cells after `seq_cp`.

The cache owns placement, as `llama_kv_cache::prepare` / `apply_ubatch` do: `prepare(ubatches)` finds cells for
every ubatch of a decode before anything is computed, `apply(ubatch, slot)` occupies them and hands the forward a
`KVView` (the cells it may attend to and where its K/V go), and `rollback(placement)` undoes a decode that failed.
Nothing outside memory/ reads or writes the cells.

With `kv_unified=False` llama.cpp gives each sequence its own stream of `n_ctx_seq` cells. Here all sequences share
one pool (so `seq_cp` shares a prefix instead of copying it), and `n_ctx_seq` is enforced as a per-sequence limit:
no placement, `seq_cp` or state load gives a sequence more than `n_ctx_seq` cells.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.batch import UBatch
from llamactx.errors import LlamactxError
from llamactx.ggml.quants_kv import KV_QUANTIZE
from llamactx.gguf.quants import block_format, dequantize
from llamactx.memory.base import Memory, MemoryOpError
from llamactx.memory.kv_cells import CellsSnapshot, KVCells
from llamactx.state_io import StateError, StateReader, pack_str

POS_MAX = int(np.iinfo(np.int32).max)  # llama_pos is int32_t
KV_GGML_TYPES = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1,
                 "q5_0": T.Q5_0, "q5_1": T.Q5_1, "iq4_nl": T.IQ4_NL}
_QUANTIZE = KV_QUANTIZE  # bf16 and the block types are stored as bytes

# (n, n_embd_gqa) float32 rows, shift (n,), layer -> rotated rows: supplied by the context's forward (K-shift)
RopeShift = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


class KVCacheAllocError(LlamactxError, MemoryError):
    """The K/V arrays of the requested size cannot be allocated; the message gives the size and what to change."""


def kv_row_nbytes(type_name: str, n: int) -> int:
    fmt = block_format(KV_GGML_TYPES[type_name])
    return n // fmt.block_size * fmt.type_size


def _alloc_shape(type_name: str, n_layer: int, size: int, n: int) -> tuple[tuple[int, int, int], np.dtype]:
    """Shape and dtype of the storage of `size` cells of `n` values per layer."""
    if type_name in _QUANTIZE:
        return (n_layer, size, kv_row_nbytes(type_name, n)), np.dtype(np.uint8)
    return (n_layer, size, n), np.dtype(np.float32 if type_name == "f32" else np.float16)


def _encode(type_name: str, x: np.ndarray) -> np.ndarray:
    """f32 rows -> the cache type, with ggml's rounding (ggml_set_rows / ggml_cpy)."""
    if type_name in _QUANTIZE:
        return _QUANTIZE[type_name](np.ascontiguousarray(x, np.float32))
    return x


def _decode(type_name: str, rows: np.ndarray, n: int) -> np.ndarray:
    """Stored rows -> float32 (n_rows, n)."""
    if type_name in _QUANTIZE:
        return dequantize(rows.reshape(-1), KV_GGML_TYPES[type_name], (n, rows.shape[0]))
    return rows.astype(np.float32)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where each ubatch of one decode goes (`slot_info_vec_t`), and the cells as they were before it."""

    slots: tuple[np.ndarray, ...]  # per ubatch: (n_tokens,) cell indices
    before: CellsSnapshot


class KVView:
    """What one ubatch's forward sees of the cache (the inputs of llm_graph_input_attn_kv): cells [0, n_kv) with
    their positions and sequences, and the store of the ubatch's own K/V into its cells `idx`."""

    __slots__ = ("_cache", "idx", "n_kv", "kv_size", "cell_pos", "_cell_seq", "type_k", "type_v", "n_embd_k_gqa")

    def __init__(self, cache: KVCache, idx: np.ndarray, n_kv: int, cell_pos: np.ndarray, cell_seq: np.ndarray):
        self._cache = cache
        self.idx = idx  # (n_tokens,) the ubatch's cells
        self.n_kv = n_kv
        self.kv_size = cache.size  # the cache's cells (n_kv is at most this)
        self.cell_pos = cell_pos  # (n_kv,) int32, -1 = empty; a copy
        self._cell_seq = cell_seq  # (n_kv, n_seq_max) bool; a copy
        self.type_k, self.type_v, self.n_embd_k_gqa = cache.type_k, cache.type_v, cache.n_embd_k_gqa

    def has_seq(self, seq_id: np.ndarray) -> np.ndarray:
        """(n_tokens, n_kv) bool: whether each cell holds each token's sequence `seq_id[t]`."""
        return self._cell_seq[:, seq_id].T

    def views(self) -> tuple[KVView, KVView]:
        """The views of the global and of the sliding-window layers: both this one (one cache holds every layer);
        an iSWA memory hands out two."""
        return self, self

    def store(self, il: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write the ubatch's keys (n, n_embd_k_gqa) and values (n, n_embd_v_gqa) of model layer `il`. An MLA
        cache stores only K (build_attn of llm_graph_input_attn_k never calls cpy_v): its V is part of K."""
        c = self._cache
        i = c.layer_index[il]
        c.k[i, self.idx] = _encode(c.type_k, k)
        if not c.v_of_k:
            c.v[i, self.idx] = _encode(c.type_v, v)

    def k_rows(self, il: int) -> np.ndarray:
        """Keys of cells [0, n_kv) of model layer `il` as float32 (n_kv, n_embd_k_gqa)."""
        return _decode(self.type_k, self.k_stored(il), self.n_embd_k_gqa)

    def v_rows(self, il: int) -> np.ndarray:
        """Values of cells [0, n_kv) of model layer `il` as float32 (n_kv, n_embd_v_gqa)."""
        return _decode(self.type_v, self.v_stored(il), self._cache.v_of_k or self._cache.n_embd_v_gqa)

    def k_stored(self, il: int) -> np.ndarray:
        """Keys of cells [0, n_kv) of layer `il` as stored (read in place by kernels that decode it themselves)."""
        return self._cache.k[self._cache.layer_index[il], : self.n_kv]

    def v_stored(self, il: int) -> np.ndarray:
        """Values as stored; an MLA cache's are a contiguous copy of each K row's first v_of_k values (the latent:
        llama_graph's ggml_view_4d of K in build_attn with llm_graph_input_attn_k)."""
        c = self._cache
        if c.v_of_k:
            return np.ascontiguousarray(self.k_stored(il)[:, : kv_row_nbytes(c.type_k, c.v_of_k)
                                                          if c.type_k in _QUANTIZE else c.v_of_k])
        return c.v[c.layer_index[il], : self.n_kv]

    def k_layers(self) -> np.ndarray:
        """Keys of every layer of this cache and every cell as stored, (n_layers held, size, n_embd_k_gqa): for a
        compiled forward that stores and reads the ubatch's layers itself (cells `idx`; visible cells are below
        n_kv, at `real_cells`; model layer il in row `layer_row(il)`)."""
        return self._cache.k

    def layer_row(self, il: int) -> int:
        """The row of k_layers() / v_layers() that holds model layer `il`, -1 if this cache does not hold it."""
        return self._cache.layer_index.get(il, -1)

    def real_cells(self, cells: np.ndarray) -> np.ndarray:
        """The cache cells of this view's cells [0, n_kv) (the same here; a rotated view maps them)."""
        return cells

    def v_layers(self) -> np.ndarray:
        return self._cache.v


@dataclass(slots=True)
class KVState:
    """A parsed, validated state section, not yet applied (so that a blob is checked whole before any write)."""

    pos: np.ndarray  # (n_cells,) int32
    seq: np.ndarray | None  # (n_cells, n_seq_max) bool: whole-cache states only
    k: np.ndarray  # (n_layer, n_cells, k row)
    v: np.ndarray  # (n_layer, n_cells, v row)


class KVCache(Memory):
    """Keys and values of `size` cells for `n_layer` layers, shared by up to `n_seq_max` sequences."""

    def __init__(self, n_layer: int, size: int, n_seq_max: int, n_embd_k_gqa: int, n_embd_v_gqa: int,
                 type_k: str = "f16", type_v: str = "f16", can_shift: bool = True, n_ctx_seq: int | None = None,
                 layers: Sequence[int] | None = None, v_of_k: int = 0):
        """`v_of_k` > 0: an MLA cache (llama_kv_cache with hparams.is_mla()): no V storage (n_embd_v_gqa must be
        0), V is the first v_of_k values of each K row and the RoPE'd values follow them (K-shift).
        `n_ctx_seq`: the most cells one sequence may hold (llama.cpp's per-sequence stream with kv_unified=False);
        None = `size` (unified: any sequence may use every cell). `layers`: the model layers this cache holds,
        in order (llama.cpp's layer filter; an iSWA memory splits them between two caches); None = 0..n_layer-1.
        Raises KVCacheAllocError (a MemoryError) naming the sizes when the K/V arrays cannot be allocated."""
        for name, t, n in (("type_k", type_k, n_embd_k_gqa), ("type_v", type_v, n_embd_v_gqa)):
            if t not in KV_GGML_TYPES:
                raise ValueError(f"{name} = {t!r} is not one of {', '.join(KV_GGML_TYPES)}")
            if n % block_format(KV_GGML_TYPES[t]).block_size:
                raise ValueError(f"{name} = {t!r} needs a row width that is a multiple of its block size, got {n}")
        if v_of_k and (n_embd_v_gqa or type_v != type_k or v_of_k >= n_embd_k_gqa
                       or v_of_k % block_format(KV_GGML_TYPES[type_k]).block_size):
            raise ValueError(f"an MLA cache (v_of_k = {v_of_k}) needs type_v = type_k (got {type_k}/{type_v}), no V "
                             f"storage and a latent of whole blocks inside the K row of {n_embd_k_gqa}")
        self.v_of_k = v_of_k
        self.layers = tuple(range(n_layer)) if layers is None else tuple(layers)
        if len(self.layers) != n_layer:
            raise ValueError(f"layers lists {len(self.layers)} layers, n_layer = {n_layer}")
        self.layer_index = {il: i for i, il in enumerate(self.layers)}  # model layer -> row of k / v
        self.n_layer = n_layer
        self.size = size
        self.n_seq_max = n_seq_max
        self.n_embd_k_gqa = n_embd_k_gqa
        self.n_embd_v_gqa = n_embd_v_gqa
        self.type_k = type_k
        self.type_v = type_v
        self._can_shift = can_shift
        self.n_ctx_seq = size if n_ctx_seq is None else min(n_ctx_seq, size)
        (k_shape, k_dtype), (v_shape, v_dtype) = (_alloc_shape(type_k, n_layer, size, n_embd_k_gqa),
                                                  _alloc_shape(type_v, n_layer, size, n_embd_v_gqa))
        try:
            self.cells = KVCells(size, n_seq_max)
            self.k = np.zeros(k_shape, k_dtype)  # (n_layer, size, k row)
            self.v = np.zeros(v_shape, v_dtype)  # (n_layer, size, v row)
        except MemoryError:
            nbytes = math.prod(k_shape) * k_dtype.itemsize + math.prod(v_shape) * v_dtype.itemsize
            raise KVCacheAllocError(f"KV cache: {n_layer} layers x {size} cells of {type_k} K / {type_v} V = "
                                    f"{nbytes / 2**30:.1f} GiB could not be allocated; use a smaller n_ctx") from None

    # -- placement (llama_kv_cache::prepare / apply_ubatch) -----------------------------------------------------

    def room(self, seq_id: int) -> int:
        """How many new tokens of `seq_id` would find cells now: the free cells (all sequences share them), up to
        what the sequence may still take of its `n_ctx_seq`."""
        self.check_seq(seq_id)
        return max(0, min(self.cells.n_free, self.n_ctx_seq - self.cells.n_seq(seq_id)))

    def prepare(self, ubatches: Sequence[UBatch]) -> Placement | None:
        """Find cells for every ubatch before computing any; None when they do not all fit, or would give a
        sequence more than `n_ctx_seq` cells. Memory is left as it was (the placement is simulated on the cells,
        then undone)."""
        before = self.cells.snapshot()
        slots = []
        try:
            for ub in ubatches:
                idx = self.cells.find_slot(ub.n_tokens)
                if idx is None:
                    return None
                self.cells.apply(idx, ub.pos, ub.seq_ids)
                slots.append(idx)
            if self._seq_over_limit(self.cells.seq) is not None:
                return None
            return Placement(tuple(slots), before)
        finally:
            self.cells.restore(before)

    def _seq_over_limit(self, seq: np.ndarray) -> int | None:
        """The first sequence of the sets `seq` (n_cells, n_seq_max) that holds more than n_ctx_seq cells, or None."""
        if self.n_ctx_seq >= self.size:
            return None
        over = np.flatnonzero(seq.sum(axis=0) > self.n_ctx_seq)
        return int(over[0]) if over.size else None

    def apply(self, ub: UBatch, slot: np.ndarray) -> KVView:
        """Occupy the cells `prepare` chose for `ub` and return the view its forward attends through."""
        self.cells.apply(slot, ub.pos, ub.seq_ids)
        n_kv = self.cells.used_max_p1
        return KVView(self, slot, n_kv, self.cells.pos[:n_kv].copy(), self.cells.seq[:n_kv].copy())

    def rollback(self, placement: Placement) -> None:
        """Undo the `apply`s of a decode that failed or was aborted: the cells are as before `prepare`."""
        self.cells.restore(placement.before)

    def update(self, rope_shift: RopeShift) -> None:
        """Pending work before a decode (`llama_kv_cache::update`): re-rotate the keys of shifted cells by their
        pending shift, then forget the shifts (RoPE is a rotation: rotating by delta moves a key from pos to
        pos + delta)."""
        shifted = self.cells.take_shifts()
        if shifted is None:
            return
        idx, shift = shifted
        for i, il in enumerate(self.layers):
            rows = _decode(self.type_k, self.k[i, idx], self.n_embd_k_gqa)
            if self.v_of_k:  # MLA: the rope key follows the latent (build_graph_shift's n_embd_nope offset)
                rows = np.roll(rope_shift(np.roll(rows, -self.v_of_k, axis=1), shift, il), self.v_of_k, axis=1)
            else:
                rows = rope_shift(rows, shift, il)
            self.k[i, idx] = _encode(self.type_k, rows)

    # -- Memory -----------------------------------------------------------------------------------------------

    def clear(self, data: bool = True) -> None:
        self.cells.clear()
        if data:
            self.k[:] = 0
            self.v[:] = 0

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self.check_seq(seq_id, allow_all=True)
        self.cells.rm(seq_id, p0, p1)
        return True

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        """Share positions [p0, p1) of the source with the destination; MemoryOpError (memory unchanged) if that
        would give the destination more than n_ctx_seq cells."""
        self.check_seq(seq_id_src)
        self.check_seq(seq_id_dst)
        if seq_id_src == seq_id_dst:
            return
        n_dst = int(np.count_nonzero(self.cells.seq[:, seq_id_dst] | self.cells.range_mask(seq_id_src, p0, p1)))
        if n_dst > self.n_ctx_seq:
            raise MemoryOpError(f"seq_cp: seq_id {seq_id_dst} would hold {n_dst} cells, more than n_ctx_seq = "
                                f"{self.n_ctx_seq}")
        self.cells.cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.check_seq(seq_id)
        self.cells.keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions; cells shared with other sequences (seq_cp) are first copied, so that the others keep
        their positions (llama.cpp would move them too)."""
        self.check_seq(seq_id)
        self._check_shift("seq_add")
        if delta == 0 or (p0 >= 0 and p0 == p1):
            return
        moved = self.cells.pos[self.cells.range_mask(seq_id, p0, p1)]
        if moved.size and int(moved.max()) + delta > POS_MAX:
            raise MemoryOpError(f"seq_add: position {int(moved.max())} + {delta} is past the largest position "
                                f"{POS_MAX}")
        self._unshare(seq_id, p0, p1)
        self.cells.add(seq_id, p0, p1, max(delta, -POS_MAX - 1))  # further down frees the same cells

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.check_seq(seq_id)
        self._check_shift("seq_div")
        if d < 1:
            raise MemoryOpError(f"seq_div: d = {d} must be >= 1")
        if d != 1:
            self._unshare(seq_id, p0, p1)
            self.cells.div(seq_id, p0, p1, d)

    def _unshare(self, seq_id: int, p0: int, p1: int) -> None:
        try:
            moved = self.cells.split_shared(seq_id, self.cells.range_mask(seq_id, p0, p1))
        except ValueError as e:
            raise MemoryOpError(str(e)) from None
        if moved is not None:
            old, new = moved
            self.k[:, new] = self.k[:, old]
            self.v[:, new] = self.v[:, old]

    def _check_shift(self, op: str) -> None:
        if not self._can_shift:
            raise MemoryOpError(f"{op}: this memory cannot shift positions (can_shift is False)")

    def seq_pos_min(self, seq_id: int) -> int:
        self.check_seq(seq_id)
        return self.cells.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        self.check_seq(seq_id)
        return self.cells.seq_pos_max(seq_id)

    @property
    def can_shift(self) -> bool:
        return self._can_shift

    @property
    def used(self) -> int:
        return self.cells.used

    def memory_breakdown(self) -> dict[str, int]:
        return {"k": self.k.nbytes, "v": self.v.nbytes, "cells": self.cells.nbytes}

    # -- state (llama_kv_cache::state_write / state_read) --------------------------------------------------------

    def state_write(self, seq_id: int | None, p0: int = 0) -> bytes:
        """The cells of every sequence (seq_id None: positions, sequence sets, K, V) or of one sequence (positions,
        K, V) as bytes: str type_k | str type_v | u32 n_layer, n_embd_k_gqa, n_embd_v_gqa, n_seq_max, n_cells |
        i32 pos[n_cells] | seq bitsets (whole cache only) | K rows of every layer | V rows of every layer. `p0`:
        only the cells at positions >= p0 (a sliding window's context checkpoint)."""
        idx = self.cells.seq_cells(-1 if seq_id is None else seq_id)  # (n_cells,) in position order
        idx = idx[self.cells.pos[idx] >= p0] if p0 > 0 else idx
        parts = [pack_str(self.type_k), pack_str(self.type_v),
                 struct.pack("<IIIII", self.n_layer, self.n_embd_k_gqa, self.n_embd_v_gqa, self.n_seq_max, idx.size),
                 self.cells.pos[idx].astype("<i4").tobytes()]
        if seq_id is None:
            parts.append(np.packbits(self.cells.seq[idx], axis=1).tobytes())
        parts += [np.ascontiguousarray(self.k[:, idx]).tobytes(), np.ascontiguousarray(self.v[:, idx]).tobytes()]
        return b"".join(parts)

    def state_read(self, r: StateReader, whole: bool) -> KVState:
        """Parse and check a section written by `state_write` (whole cache or one sequence); nothing is written
        to memory. Raises StateError naming the first problem."""
        type_k, type_v = r.string("type_k"), r.string("type_v")
        if (type_k, type_v) != (self.type_k, self.type_v):
            raise StateError(f"state KV types {type_k}/{type_v} differ from this context's {self.type_k}/{self.type_v}")
        n_layer, n_k, n_v, n_seq_bits, n_cells = struct.unpack("<IIIII", r.take(20, "dimensions"))
        if (n_layer, n_k, n_v) != (self.n_layer, self.n_embd_k_gqa, self.n_embd_v_gqa):
            raise StateError(f"state KV shape {n_layer}x{n_k}/{n_v} differs from this context's "
                             f"{self.n_layer}x{self.n_embd_k_gqa}/{self.n_embd_v_gqa}")
        if n_cells > self.size:
            raise StateError(f"state holds {n_cells} cells, more than this context's n_ctx = {self.size}")
        pos = _read_positions(r, n_cells)
        seq = self._read_seq_sets(r, n_seq_bits, n_cells) if whole else None
        k_row, v_row = self.k.shape[2], self.v.shape[2]
        k = r.array(self.k.dtype, n_layer * n_cells * k_row, "K rows").reshape(n_layer, n_cells, k_row)
        v = r.array(self.v.dtype, n_layer * n_cells * v_row, "V rows").reshape(n_layer, n_cells, v_row)
        _check_finite(self.type_k, k, self.n_embd_k_gqa, "K")
        _check_finite(self.type_v, v, self.n_embd_v_gqa, "V")
        return KVState(pos, seq, k, v)

    def _read_seq_sets(self, r: StateReader, n_seq_bits: int, n_cells: int) -> np.ndarray:
        if n_seq_bits < 1 or n_seq_bits > 256:
            raise StateError(f"state n_seq_max {n_seq_bits} is outside [1, 256]")
        n_bytes = (n_seq_bits + 7) // 8
        packed = r.array(np.uint8, n_cells * n_bytes, "sequence sets").reshape(n_cells, n_bytes)
        bits = np.unpackbits(packed, axis=1)[:, :n_seq_bits].astype(bool)  # (n_cells, n_seq_bits)
        if bits[:, self.n_seq_max :].any():
            raise StateError(f"state uses seq_id {int(np.flatnonzero(bits.any(0))[-1])}, this context has "
                             f"n_seq_max = {self.n_seq_max}")
        seq = np.zeros((n_cells, self.n_seq_max), bool)
        seq[:, : min(n_seq_bits, self.n_seq_max)] = bits[:, : self.n_seq_max]
        if n_cells and not seq.any(axis=1).all():
            raise StateError("state has a cell without any sequence")
        return seq

    def state_check_fits(self, state: KVState, dest_seq_id: int | None) -> None:
        """Raise StateError if `state` cannot be loaded: a sequence would hold more than n_ctx_seq cells, or a
        sequence state does not find its cells free (or its own)."""
        if dest_seq_id is None:
            over = self._seq_over_limit(state.seq)
            if over is not None:
                raise StateError(f"state gives seq_id {over} {int(state.seq[:, over].sum())} cells, more than this "
                                 f"context's n_ctx_seq = {self.n_ctx_seq}")
            return
        self.check_seq(dest_seq_id)
        if state.pos.size > self.n_ctx_seq:
            raise StateError(f"sequence state holds {state.pos.size} cells, more than this context's n_ctx_seq = "
                             f"{self.n_ctx_seq}")
        available = self.cells.n_free + self.cells.n_only(dest_seq_id)
        if state.pos.size > available:
            raise StateError(f"sequence state needs {state.pos.size} cells, only {available} are free for "
                             f"seq_id {dest_seq_id}")

    def state_apply(self, state: KVState, dest_seq_id: int | None) -> None:
        """Load a state checked by `state_read` and `state_check_fits`: the whole cache (dest_seq_id None)
        or, replacing what it held, one sequence."""
        n = state.pos.size
        if dest_seq_id is None:
            self.clear(data=False)
            idx = np.arange(n)
            self.cells.load(idx, state.pos, state.seq)
        else:
            self.cells.rm(dest_seq_id, -1, -1)
            idx = self.cells.find_slot(n)
            self.cells.apply(idx, state.pos, [(dest_seq_id,)] * n)
        self.k[:, idx] = state.k
        self.v[:, idx] = state.v


def _check_finite(type_name: str, rows: np.ndarray, n: int, what: str) -> None:
    """Refuse stored rows (n_layer, n_cells, row) holding NaN or inf: loaded, they would poison every later
    request that shares those cells (a corrupt or hostile state file)."""
    for il, layer in enumerate(rows):  # one layer decoded at a time: bounded scratch
        finite = np.isfinite(_decode(type_name, layer, n)).all(axis=1) if layer.shape[0] else np.ones(0, bool)
        if not finite.all():
            cell = int(np.flatnonzero(~finite)[0])
            raise StateError(f"state {what} rows hold a non-finite value (layer {il}, cell {cell}); refused")


def _read_positions(r: StateReader, n_cells: int) -> np.ndarray:
    """The cells' positions: >= 0 and in the order `state_write` writes them (by position). Duplicates (seq_div's
    grouped positions) and gaps (seq_rm of a middle range) are states the cache reaches itself, so they load."""
    pos = r.array("<i4", n_cells, "positions").astype(np.int32)  # (n_cells,)
    if (pos < 0).any():
        raise StateError(f"state has a negative position {int(pos.min())}")
    back = np.flatnonzero(np.diff(pos) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise StateError(f"state cell {i} has position {int(pos[i])} after {int(pos[i - 1])}: cells must be in "
                         f"position order, as state_write writes them")
    return pos

"""The KV cache: one implementation of `Memory` (src/llama-kv-cache.*).

Per layer it stores the keys and values of every cell in `type_k` / `type_v` (f16 by default; q8_0 and q4_0 keep
quantized ggml blocks, f32 plain floats). Cell bookkeeping lives in `KVCells`. All layers share one set of cells,
so a sequence's tokens sit in the same cells in every layer, and sequences share cells after `seq_cp`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.ggml.quants_cpu import quantize_q4_0, quantize_q8_0
from llamactx.gguf.quants import block_format, dequantize
from llamactx.memory.base import Memory
from llamactx.memory.kv_cells import KVCells

KV_GGML_TYPES = {"f32": T.F32, "f16": T.F16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}
_QUANTIZE = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}

# (n, n_embd_gqa) float32 rows, shift (n,), layer -> rotated rows: supplied by the context's forward (K-shift)
RopeShift = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


def kv_row_nbytes(type_name: str, n: int) -> int:
    fmt = block_format(KV_GGML_TYPES[type_name])
    return n // fmt.block_size * fmt.type_size


def _alloc(type_name: str, n_layer: int, size: int, n: int) -> np.ndarray:
    if type_name == "f32":
        return np.zeros((n_layer, size, n), np.float32)
    if type_name == "f16":
        return np.zeros((n_layer, size, n), np.float16)
    return np.zeros((n_layer, size, kv_row_nbytes(type_name, n)), np.uint8)


class KVCache(Memory):
    """Keys and values of `size` cells for `n_layer` layers, shared by up to `n_seq_max` sequences."""

    def __init__(self, n_layer: int, size: int, n_seq_max: int, n_embd_k_gqa: int, n_embd_v_gqa: int,
                 type_k: str = "f16", type_v: str = "f16", can_shift: bool = True):
        for name, t, n in (("type_k", type_k, n_embd_k_gqa), ("type_v", type_v, n_embd_v_gqa)):
            if t not in KV_GGML_TYPES:
                raise ValueError(f"{name} = {t!r} is not one of {', '.join(KV_GGML_TYPES)}")
            if n % block_format(KV_GGML_TYPES[t]).block_size:
                raise ValueError(f"{name} = {t!r} needs a row width that is a multiple of its block size, got {n}")
        self.n_layer = n_layer
        self.size = size
        self.n_seq_max = n_seq_max
        self.n_embd_k_gqa = n_embd_k_gqa
        self.n_embd_v_gqa = n_embd_v_gqa
        self.type_k = type_k
        self.type_v = type_v
        self._can_shift = can_shift
        self.cells = KVCells(size, n_seq_max)
        self.k = _alloc(type_k, n_layer, size, n_embd_k_gqa)  # (n_layer, size, k row)
        self.v = _alloc(type_v, n_layer, size, n_embd_v_gqa)  # (n_layer, size, v row)

    # -- storage ----------------------------------------------------------------------------------------------

    def store(self, il: int, idx: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Write the ubatch's keys (n, n_embd_k_gqa) and values (n, n_embd_v_gqa) of layer `il` into cells `idx`
        (ggml_set_rows / ggml_cpy: f32 -> the cache type, with ggml's rounding)."""
        self.k[il, idx] = self._encode(self.type_k, k)
        self.v[il, idx] = self._encode(self.type_v, v)

    @staticmethod
    def _encode(type_name: str, x: np.ndarray) -> np.ndarray:
        if type_name in _QUANTIZE:
            return _QUANTIZE[type_name](np.ascontiguousarray(x, np.float32))
        return x

    def k_rows(self, il: int, n_kv: int) -> np.ndarray:
        """Keys of cells [0, n_kv) of layer `il` as float32 (n_kv, n_embd_k_gqa)."""
        return self._decode(self.type_k, self.k[il, :n_kv], self.n_embd_k_gqa)

    def v_rows(self, il: int, n_kv: int) -> np.ndarray:
        """Values of cells [0, n_kv) of layer `il` as float32 (n_kv, n_embd_v_gqa)."""
        return self._decode(self.type_v, self.v[il, :n_kv], self.n_embd_v_gqa)

    @staticmethod
    def _decode(type_name: str, rows: np.ndarray, n: int) -> np.ndarray:
        if type_name in _QUANTIZE:
            return dequantize(rows.reshape(-1), KV_GGML_TYPES[type_name], (n, rows.shape[0]))
        return rows.astype(np.float32)

    def apply_k_shift(self, rope_shift: RopeShift) -> None:
        """Re-rotate the keys of shifted cells by their pending shift, then forget the shifts (the K-shift of
        `llama_kv_cache::update`: RoPE is a rotation, so rotating by delta moves a key from pos to pos + delta)."""
        if not self.cells.has_shift:
            return
        idx = np.flatnonzero((self.cells.shift != 0) & (self.cells.pos >= 0))
        if idx.size:
            shift = self.cells.shift[idx]
            for il in range(self.n_layer):
                rows = self._decode(self.type_k, self.k[il, idx], self.n_embd_k_gqa)
                self.k[il, idx] = self._encode(self.type_k, rope_shift(rows, shift, il))
        self.cells.shift[:] = 0
        self.cells.has_shift = False

    # -- Memory -----------------------------------------------------------------------------------------------

    def _check_seq(self, seq_id: int, allow_all: bool = False) -> None:
        lo = -1 if allow_all else 0
        if not lo <= seq_id < self.n_seq_max:
            raise ValueError(f"seq_id {seq_id} is outside [{lo}, n_seq_max = {self.n_seq_max})")

    def clear(self, data: bool = True) -> None:
        self.cells.clear()
        if data:
            self.k[:] = 0
            self.v[:] = 0

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        self._check_seq(seq_id, allow_all=True)
        self.cells.rm(seq_id, p0, p1)
        return True

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        self._check_seq(seq_id_src)
        self._check_seq(seq_id_dst)
        if seq_id_src != seq_id_dst:
            self.cells.cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self._check_seq(seq_id)
        self.cells.keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self._check_seq(seq_id)
        self._check_shift("seq_add")
        if delta != 0 and not (p0 >= 0 and p0 == p1):
            self.cells.add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self._check_seq(seq_id)
        self._check_shift("seq_div")
        if d < 1:
            raise ValueError(f"seq_div: d = {d} must be >= 1")
        if d != 1:
            self.cells.div(seq_id, p0, p1, d)

    def _check_shift(self, op: str) -> None:
        if not self._can_shift:
            raise ValueError(f"{op}: this memory cannot shift positions (can_shift is False)")

    def seq_pos_min(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return self.cells.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return self.cells.seq_pos_max(seq_id)

    @property
    def can_shift(self) -> bool:
        return self._can_shift

    @property
    def used(self) -> int:
        return self.cells.used

    def memory_breakdown(self) -> dict[str, int]:
        return {"k": self.k.nbytes, "v": self.v.nbytes,
                "cells": self.cells.pos.nbytes + self.cells.seq.nbytes + self.cells.shift.nbytes}

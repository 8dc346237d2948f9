"""The interleaved sliding-window KV cache (`llama_kv_cache_iswa`, src/llama-kv-cache-iswa.*).

Two KV caches behind one `Memory`: the base cache holds the global layers (`!hparams.is_swa(il)`) for the whole
context, the SWA cache holds the sliding-window layers and only what their window can still see. llama.cpp sizes
the SWA cache `GGML_PAD(min(size_base, n_swa * n_seq_max + n_ubatch), 256)` cells (llama_kv_cache_iswa's
constructor, with kv_unified; llamactx's cells are always one pool), so Gemma 3 at n_ctx 32768 keeps 1024 cells
in 15 of its 18 layers instead of 32768.

The SWA cache places tokens as llama.cpp's `llama_kv_cache::find_slot` / `apply_ubatch` do with n_swa > 0: the
search starts at a moving head and wraps, and a cell can be taken when it is empty or when its only sequence's
next token no longer sees it (`llama_hparams::is_masked_swa(n_swa, pos_cell, seq_pos_max + 1)`). Overwriting a
cell of position p purges every position <= p of that sequence from the SWA cache, so each sequence holds a
contiguous range there and `seq_pos_min` rises as the window slides. For one sequence the cells are therefore the
very cells llama.cpp uses, which is what lets attention reproduce ggml's cell-indexed sums (docs/numerics.md).

What the SWA cache no longer holds is gone: `seq_rm` still answers True (llama.cpp's llama_kv_cache::seq_rm
always does), and a caller that keeps a prefix [0, n) must check `can_continue(seq_id, n)` (llama-server compares
`seq_pos_min` with `n - n_swa`) and reprocess otherwise. K-shifts (`seq_add` / `seq_div`) need both caches to be
the same size (`get_can_shift`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llamactx.batch import UBatch
from llamactx.memory.base import Memory, MemoryOpError
from llamactx.memory.kv_cache import KVCache, KVView, Placement, RopeShift
from llamactx.memory.kv_cells import CellsSnapshot
from llamactx.state_io import StateError, StateReader

SWA_PAD = 256  # the SWA cache is always padded to 256 cells (llama.cpp issue 17037)


def swa_cache_size(n_ctx: int, n_swa: int, n_seq_max: int, n_ubatch: int) -> int:
    """Cells of the SWA cache: GGML_PAD(min(n_ctx, n_swa * n_seq_max + n_ubatch), 256)."""
    n = min(n_ctx, n_swa * n_seq_max + n_ubatch)
    return (n + SWA_PAD - 1) // SWA_PAD * SWA_PAD


@dataclass(frozen=True, slots=True)
class SWAPlacement:
    """A placement in the SWA cache: the cells of each ubatch, the cells and the head as they were."""

    slots: tuple[np.ndarray, ...]
    before: CellsSnapshot
    head: int


class RotatedKVView(KVView):
    """A KVView whose cells [0, n_kv) are shown from cell `start` on, wrapping: a sequence whose cells wrap around
    the end of the SWA cache is seen in consecutive cells, which the attention kernel reads vectorized. Only for
    attention whose sums follow positions (they do not depend on where cells sit); K/V are stored in the real
    cells, and read as a rotated copy."""

    __slots__ = ("perm",)

    def __init__(self, cache: KVCache, idx: np.ndarray, n_kv: int, start: int):
        self.perm = (start + np.arange(n_kv)) % n_kv  # (n_kv,) the real cell of each cell shown
        super().__init__(cache, idx, n_kv, cache.cells.pos[self.perm], cache.cells.seq[self.perm])

    def k_stored(self, il: int) -> np.ndarray:
        return self._cache.k[self._cache.layer_index[il]][self.perm]  # (n_kv, k row) a copy

    def v_stored(self, il: int) -> np.ndarray:
        return self._cache.v[self._cache.layer_index[il]][self.perm]

    def real_cells(self, cells: np.ndarray) -> np.ndarray:
        return self.perm[cells]


class SWAKVCache(KVCache):
    """A KV cache for sliding-window layers whose cells are reused once out of every window (llama_kv_cache with
    n_swa > 0, LLAMA_SWA_TYPE_STANDARD)."""

    def __init__(self, *args, n_swa: int, rotate: bool = False, **kwargs):
        """`rotate`: hand a ubatch whose sequence wraps around the cache a `RotatedKVView` (attention that does not
        follow absolute cell indices)."""
        super().__init__(*args, **kwargs)
        self.n_swa = n_swa
        self.rotate = rotate
        self.head = 0  # where the next cell search starts (llama_kv_cache::v_heads)

    # -- placement (find_slot / apply_ubatch with n_swa > 0) ----------------------------------------------------

    def _usable(self) -> np.ndarray:
        """(size,) bool: empty cells, and cells of one sequence that its next token would mask."""
        c = self.cells
        pos = c.pos  # (size,)
        single = c.seq.sum(axis=1) == 1  # (size,)
        owner = np.argmax(c.seq, axis=1)  # (size,) the sequence of a single-sequence cell
        pos_max = np.where(c.seq, pos[:, None], -1).max(axis=0, initial=-1)  # (n_seq_max,)
        masked = single & (pos_max[owner] + 1 - pos >= self.n_swa)
        return (pos < 0) | masked

    def find_slot(self, n_tokens: int) -> np.ndarray | None:
        """The first `n_tokens` usable cells from the head on, wrapping (find_slot with cont = false); None when
        fewer are usable."""
        if n_tokens > self.size:
            return None
        head = self.head
        if head > self.cells.used + 2 * n_tokens:  # enough unused cells before the head: fill from the start
            head = 0
        order = (head + np.arange(self.size)) % self.size  # (size,)
        found = order[self._usable()[order]]
        return found[:n_tokens] if found.size >= n_tokens else None

    def place(self, idx: np.ndarray, ub: UBatch) -> None:
        """Occupy cells `idx` with `ub` (llama_kv_cache::apply_ubatch): a sequence whose cell of position p is
        overwritten loses every position <= p here, and the head moves past the last cell."""
        self._occupy(idx, ub.pos, ub.seq_ids)
        self.head = int(idx[-1]) + 1

    def _occupy(self, idx: np.ndarray, pos: np.ndarray, seq_ids) -> None:
        """Cells `idx` hold `pos` of `seq_ids` now; a sequence that had one of them loses its positions up to it."""
        c = self.cells
        taken = idx[c.pos[idx] >= 0]
        rm_max: dict[int, int] = {}
        for cell in taken:
            s = int(np.argmax(c.seq[cell]))
            rm_max[s] = max(rm_max.get(s, -1), int(c.pos[cell]))
        c.apply(idx, pos, seq_ids)
        for s, p in rm_max.items():
            p_min = c.seq_pos_min(s)
            if 0 <= p_min <= p:
                c.rm(s, p_min, p + 1)

    def prepare(self, ubatches: Sequence[UBatch]) -> SWAPlacement | None:
        before = self.cells.snapshot()
        head = self.head
        slots = []
        try:
            for ub in ubatches:
                idx = self.find_slot(ub.n_tokens)
                if idx is None:
                    return None
                self.place(idx, ub)
                slots.append(idx)
            return SWAPlacement(tuple(slots), before, head)
        finally:
            self.cells.restore(before)
            self.head = head

    def apply(self, ub: UBatch, slot: np.ndarray) -> KVView:
        self.place(slot, ub)
        n_kv = self.cells.used_max_p1
        start = self._wrap_start(int(ub.seq_id0[0]), n_kv) if self.rotate and ub.n_tokens >= 2 else 0
        if start:
            return RotatedKVView(self, slot, n_kv, start)
        return KVView(self, slot, n_kv, self.cells.pos[:n_kv].copy(), self.cells.seq[:n_kv].copy())

    def _wrap_start(self, seq_id: int, n_kv: int) -> int:
        """The cell of `seq_id`'s first position when its cells, in position order, wrap around (0 otherwise)."""
        cells = self.cells.seq_cells(seq_id)  # (n,) in position order
        if cells.size < 2 or (np.diff(cells) > 0).all():
            return 0
        return int(cells[0]) if cells[0] < n_kv else 0

    def rollback(self, placement: SWAPlacement) -> None:
        self.cells.restore(placement.before)
        self.head = placement.head

    def room(self, seq_id: int) -> int:
        """Cells a ubatch of `seq_id` could take now: empty and masked ones."""
        self.check_seq(seq_id)
        return int(np.count_nonzero(self._usable()))

    # -- sequence operations move the head back to the first freed cell -----------------------------------------

    def _freed_since(self, occupied: np.ndarray) -> int | None:
        freed = np.flatnonzero(occupied & (self.cells.pos < 0))
        return int(freed[0]) if freed.size else None

    def clear(self, data: bool = True) -> None:
        super().clear(data)
        self.head = 0

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        occupied = self.cells.pos >= 0
        res = super().seq_rm(seq_id, p0, p1)
        first = self._freed_since(occupied)
        if first is not None and first < self.head:
            self.head = first
        return res

    def seq_keep(self, seq_id: int) -> None:
        occupied = self.cells.pos >= 0
        super().seq_keep(seq_id)
        first = self._freed_since(occupied)
        if first is not None and first < self.head:
            self.head = first

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        occupied = self.cells.pos >= 0
        super().seq_add(seq_id, p0, p1, delta)
        if delta != 0 and not (p0 >= 0 and p0 == p1):
            first = self._freed_since(occupied)
            self.head = 0 if first is None else first

    # -- a sequence's state takes usable cells, as a ubatch does (llama_kv_cache::state_read_meta's find_slot) --

    def _usable_for(self, seq_id: int) -> np.ndarray:
        """(size,) bool: the cells a state loaded into `seq_id` may take: usable ones and its own."""
        c = self.cells
        return self._usable() | (c.seq[:, seq_id] & (c.seq.sum(axis=1) == 1))

    def state_check_fits(self, state, dest_seq_id: int | None) -> None:
        if dest_seq_id is None:
            return super().state_check_fits(state, dest_seq_id)
        self.check_seq(dest_seq_id)
        available = int(np.count_nonzero(self._usable_for(dest_seq_id)))
        if state.pos.size > available:
            raise StateError(f"sequence state needs {state.pos.size} cells, only {available} of the sliding-window "
                             f"cache are free or masked for seq_id {dest_seq_id}")

    def state_apply(self, state, dest_seq_id: int | None) -> None:
        """The whole cache as KVCache's; one sequence's cells go where `find_slot` puts a ubatch (empty cells, and
        cells whose sequence no longer sees them), from the head on, and the head moves past them."""
        if dest_seq_id is None:
            super().state_apply(state, dest_seq_id)
            self.head = 0
            return
        self.cells.rm(dest_seq_id, -1, -1)
        idx = self.find_slot(state.pos.size)  # state_check_fits made sure there are enough
        self._occupy(idx, state.pos, [(dest_seq_id,)] * state.pos.size)
        self.k[:, idx] = state.k
        self.v[:, idx] = state.v
        if idx.size:
            self.head = int(idx[-1]) + 1


@dataclass(frozen=True, slots=True)
class ISWAPlacement:
    """Where each ubatch goes in both caches; `slots` pairs them per ubatch for `apply`."""

    slots: tuple[tuple[np.ndarray, np.ndarray], ...]
    base: Placement
    swa: SWAPlacement


class ISWAView:
    """What one ubatch's forward sees: the base cache's view for the global layers, the SWA cache's for the
    sliding-window layers (llm_graph_input_attn_kv_iswa)."""

    __slots__ = ("base", "swa")

    def __init__(self, base: KVView, swa: KVView):
        self.base, self.swa = base, swa

    def views(self) -> tuple[KVView, KVView]:
        return self.base, self.swa


class KVCacheISWA(Memory):
    """A base KV cache for the global layers and a sliding-window one for the others (llama_kv_cache_iswa)."""

    def __init__(self, hparams, n_ctx: int, n_seq_max: int, n_ubatch: int, type_k: str = "f16",
                 type_v: str = "f16", n_ctx_seq: int | None = None, layout_exact: bool = False,
                 swa_full: bool = False, n_embd_gqa_swa: int = 0, reuse: dict[int, int] | None = None,
                 k_shift: bool = True):
        """`n_ctx` cells in the base cache (per-sequence limit `n_ctx_seq`), `swa_cache_size(...)` in the SWA
        cache (`n_ctx` with `swa_full`). `layout_exact`: attention follows absolute cell indices
        (ContextParams.kv_layout_exact), so the SWA cache's views are never rotated. gemma4:
        `n_embd_gqa_swa` the SWA cache's K/V row width where it differs from the global layers'
        (hparams.n_embd_k_gqa); `reuse` the layers without KV of their own -> the layer whose KV they read
        (llama_kv_cache's `reuse` callback: map_layer_ids); `k_shift` False where layers differ in head size or
        RoPE (K-shift rotates every layer alike). Raises KVCacheAllocError when the arrays cannot be allocated."""
        hp = hparams
        reuse = reuse or {}
        self.n_seq_max = n_seq_max
        self.n_swa = hp.n_swa
        self.k_shift = k_shift
        layers_base = [il for il in range(hp.n_layer) if not hp.is_swa(il) and il not in reuse]
        layers_swa = [il for il in range(hp.n_layer) if hp.is_swa(il) and il not in reuse]
        size_swa = n_ctx if swa_full else swa_cache_size(n_ctx, hp.n_swa, n_seq_max, n_ubatch)
        common = dict(n_seq_max=n_seq_max, type_k=type_k, type_v=type_v)
        self.base = KVCache(len(layers_base), n_ctx, n_ctx_seq=n_ctx_seq, layers=layers_base,
                            n_embd_k_gqa=hp.n_embd_k_gqa, n_embd_v_gqa=hp.n_embd_v_gqa, **common)
        n_swa_k, n_swa_v = (n_embd_gqa_swa, n_embd_gqa_swa) if n_embd_gqa_swa else (hp.n_embd_k_gqa, hp.n_embd_v_gqa)
        self.swa = SWAKVCache(len(layers_swa), size_swa, layers=layers_swa, n_swa=hp.n_swa,
                              rotate=not layout_exact, n_embd_k_gqa=n_swa_k, n_embd_v_gqa=n_swa_v, **common)
        for il, il_reuse in reuse.items():
            cache = self.swa if hp.is_swa(il) else self.base
            cache.layer_index[il] = cache.layer_index[il_reuse]

    @property
    def size(self) -> int:
        return self.base.size

    @property
    def used(self) -> int:
        return self.base.used

    # -- placement ----------------------------------------------------------------------------------------------

    def room(self, seq_id: int) -> int:
        """The base cache's room: the SWA cache is sized so that a ubatch finds cells once the window has
        moved on, so it only bounds one ubatch (a decode that does not fit there returns NO_SLOT)."""
        return self.base.room(seq_id)

    def update(self, rope_shift: RopeShift) -> None:
        self.base.update(rope_shift)
        self.swa.update(rope_shift)

    def prepare(self, ubatches: Sequence[UBatch]) -> ISWAPlacement | None:
        base = self.base.prepare(ubatches)
        if base is None:
            return None
        swa = self.swa.prepare(ubatches)
        if swa is None:
            return None
        return ISWAPlacement(tuple(zip(base.slots, swa.slots, strict=True)), base, swa)

    def apply(self, ub: UBatch, slot: tuple[np.ndarray, np.ndarray]) -> ISWAView:
        return ISWAView(self.base.apply(ub, slot[0]), self.swa.apply(ub, slot[1]))

    def rollback(self, placement: ISWAPlacement) -> None:
        self.base.rollback(placement.base)
        self.swa.rollback(placement.swa)

    # -- sequences ----------------------------------------------------------------------------------------------

    def clear(self, data: bool = True) -> None:
        self.base.clear(data)
        self.swa.clear(data)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Both caches; True as in llama.cpp even where the SWA cache no longer held the range (see
        `can_continue`)."""
        res = self.base.seq_rm(seq_id, p0, p1)
        return self.swa.seq_rm(seq_id, p0, p1) and res

    def can_continue(self, seq_id: int, n_past: int) -> bool:
        """Whether `seq_id` cut to positions [0, n_past) would still hold everything a token at `n_past` attends
        to: the SWA cache, which holds one contiguous range per sequence, must reach from that token's window
        start (n_past - n_swa + 1) to n_past - 1 (llama-server's `pos_min` test before it reuses a slot's cache,
        server-context.cpp). The base cache holds every position that was not removed."""
        self.check_seq(seq_id)
        if n_past <= 0:
            return True
        lo, hi = self.swa.seq_pos_min(seq_id), self.swa.seq_pos_max(seq_id)
        return 0 <= lo <= max(0, n_past - self.n_swa + 1) and hi >= n_past - 1

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.check_seq(seq_id_src)
        self.check_seq(seq_id_dst)
        self.base.seq_cp(seq_id_src, seq_id_dst, p0, p1)
        self.swa.seq_cp(seq_id_src, seq_id_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.base.seq_keep(seq_id)
        self.swa.seq_keep(seq_id)

    def _check_shift(self, op: str) -> None:
        if not self.k_shift:
            raise MemoryOpError(f"{op}: positions cannot shift in a model whose layers have different head sizes "
                                f"(can_shift is False)")
        if not self.can_shift:
            raise MemoryOpError(f"{op}: the SWA cache ({self.swa.size} cells) is smaller than the base cache "
                                f"({self.base.size}), so positions cannot shift (can_shift is False; swa_full "
                                f"keeps both the same size)")

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.check_seq(seq_id)
        self._check_shift("seq_add")
        self.base.seq_add(seq_id, p0, p1, delta)
        self.swa.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.check_seq(seq_id)
        self._check_shift("seq_div")
        self.base.seq_div(seq_id, p0, p1, d)
        self.swa.seq_div(seq_id, p0, p1, d)

    def seq_pos_min(self, seq_id: int) -> int:
        """From the SWA cache, whose range is within the base cache's (llama_kv_cache_iswa::seq_pos_min)."""
        return self.swa.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return self.swa.seq_pos_max(seq_id)

    @property
    def can_shift(self) -> bool:
        """llama_kv_cache_iswa::get_can_shift: both caches can shift and are the same size."""
        return (self.base.can_shift and self.swa.can_shift and self.base.size == self.swa.size
                and self.k_shift)

    def memory_breakdown(self) -> dict[str, int]:
        out = {}
        for name, cache in (("base", self.base), ("swa", self.swa)):
            out.update({f"{name}.{k}": v for k, v in cache.memory_breakdown().items()})
        return out

    # -- context checkpoints: the window of the SWA cache (state_write with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) ---

    @property
    def needs_checkpoints(self) -> bool:
        """The SWA cache forgets positions once they leave the window, unless it is as large as the base cache
        (swa_full). Not with `layout_exact` (views never rotated): a restored window sits in other cells than a
        fresh prefill's, and that mode promises llama.cpp's cells."""
        return self.swa.size < self.base.size and self.swa.rotate

    def checkpoint_write(self, seq_id: int) -> bytes:
        """The SWA cells of `seq_id` that the token after its last one attends to (positions > n_past - 1 - n_swa;
        llama.cpp's checkpoint holds the whole SWA range, of which the rest is never read again). The base cache
        keeps every position, so it is not part of a checkpoint."""
        self.check_seq(seq_id)
        n_past = self.swa.seq_pos_max(seq_id) + 1
        return self.swa.state_write(seq_id, p0=max(0, n_past - self.n_swa + 1))

    def checkpoint_load(self, seq_id: int, data: bytes, n_past: int) -> None:
        """Put `seq_id` back to holding [0, n_past): the base cache cut there, the SWA cache's cells of the seq
        replaced by the checkpoint's window. Raises StateError, memory unchanged, for a blob that is not the window
        ending at n_past - 1, a base cache that no longer holds [0, n_past), or no free SWA cells for it."""
        self.check_seq(seq_id)
        r = StateReader(data)
        state = self.swa.state_read(r, whole=False)
        pos = state.pos
        if r.remaining():
            raise StateError(f"checkpoint has {r.remaining()} trailing bytes")
        start = max(0, n_past - self.n_swa + 1)
        if not pos.size or pos[-1] != n_past - 1 or pos[0] > start or (np.diff(pos) != 1).any():
            span = f"[{pos[0]}, {pos[-1]}]" if pos.size else "nothing"
            raise StateError(f"checkpoint holds positions {span}, not the window [{start}, {n_past - 1}] of "
                             f"n_past = {n_past}")
        if self.base.seq_pos_min(seq_id) != 0 or self.base.seq_pos_max(seq_id) < n_past - 1:
            raise StateError(f"seq {seq_id}: the base cache holds [{self.base.seq_pos_min(seq_id)}, "
                             f"{self.base.seq_pos_max(seq_id)}], not all of [0, {n_past})")
        self.swa.state_check_fits(state, seq_id)
        self.base.seq_rm(seq_id, n_past, -1)
        self.swa.state_apply(state, seq_id)

    # -- state: the base cache's section, then the SWA cache's (llama_kv_cache_iswa::state_write) ---------------

    def state_write(self, seq_id: int | None) -> bytes:
        return self.base.state_write(seq_id) + self.swa.state_write(seq_id)

    def state_read(self, r: StateReader, whole: bool):
        """Both sections, each checked against its cache (layer count, cells), before anything is loaded."""
        return self.base.state_read(r, whole), self.swa.state_read(r, whole)

    def state_check_fits(self, state, dest_seq_id: int | None) -> None:
        self.base.state_check_fits(state[0], dest_seq_id)
        self.swa.state_check_fits(state[1], dest_seq_id)

    def state_apply(self, state, dest_seq_id: int | None) -> None:
        self.base.state_apply(state[0], dest_seq_id)
        self.swa.state_apply(state[1], dest_seq_id)

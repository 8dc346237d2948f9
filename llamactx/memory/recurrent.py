"""Recurrent memory: one fixed-size state per sequence (`llama_memory_recurrent`, src/llama-memory-recurrent.cpp).

A recurrent layer (Mamba's SSM, LFM2's short convolution) does not keep its past tokens, only a state that each
new token updates: per layer a rolling conv state `r` (n_embd_r floats) and an SSM state `s` (n_embd_s floats).
So a sequence is one cell holding the state after its last position, and the memory answers like llama.cpp's:

- `seq_pos_min` = `seq_pos_max` = that last position (-1 when the sequence is empty);
- `seq_rm` can only forget a whole sequence: a range that ends before the last position removes nothing and
  returns True (the state keeps no per-token record to remove), a range that starts inside the sequence and
  reaches its end returns False (the state cannot be rolled back: llama.cpp's n_rs_seq = 0), and seq_id -1
  returns False (llama.cpp checks `(uint32_t) seq_id >= n_seq_max` first);
- `seq_cp` copies the whole state whatever the range (llama.cpp shares the cell and copies it on the next write);
- `seq_add` / `seq_div` move the last position when it is in range (`can_shift` is True).

Unlike llama.cpp, cells are indexed by seq_id (it keeps n_seq_max cells plus a tail index per sequence and
shuffles them into a contiguous range per ubatch: bookkeeping for its graph that changes no result), and a cell
shared by `seq_cp` is copied at once, so a later seq_add of one sequence does not move the other's position.

`partial_prefix` is False: the engine's prompt cache reuses a slot's state only when its whole history is a
prefix of the new prompt, else it reprocesses the prompt.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llamactx.batch import AllocatedBatch, UBatch
from llamactx.memory.base import Memory, MemoryOpError
from llamactx.state_io import StateError, StateReader

POS_MAX = int(np.iinfo(np.int32).max)


def split_by_sequence_sets(ubatches: Sequence[UBatch]) -> list[UBatch]:
    """Cut ubatches so that within each one every sequence belongs to a single sequence set (the tokens of
    `(0, 1)` and of `(0,)` go to different ubatches), as llama.cpp's split_equal keeps them apart: each set's
    tokens then run through one state, in order. Batch order is kept."""
    out = []
    for ub in ubatches:
        start, owner = 0, {}  # seq_id -> the set it belongs to in the current piece
        for i, ids in enumerate(ub.seq_ids):
            if any(owner.get(s, ids) != ids for s in ids):
                out.append(_slice(ub, start, i))
                start, owner = i, {}
            owner.update(dict.fromkeys(ids, ids))
        out.append(_slice(ub, start, ub.n_tokens))
    return out


def _slice(ub: UBatch, a: int, b: int) -> UBatch:
    if (a, b) == (0, ub.n_tokens):
        return ub
    sl = slice(a, b)
    return UBatch(token=None if ub.token is None else ub.token[sl], embd=None if ub.embd is None else ub.embd[sl],
                  pos=ub.pos[sl], seq_ids=ub.seq_ids[sl], seq_id0=ub.seq_id0[sl], output=ub.output[sl],
                  batch_index=ub.batch_index[sl])


@dataclass(frozen=True, slots=True)
class SeqSet:
    """The tokens of one sequence set in a ubatch: they continue the state of `seq_ids[0]`, and the result
    becomes the state of every sequence of the set."""

    seq_ids: tuple[int, ...]
    idx: np.ndarray  # (n_t,) indices into the ubatch, in order


@dataclass(frozen=True, slots=True)
class RecurrentPlacement:
    """The sequence sets of each ubatch, and what their sequences held before the decode (for rollback). A
    decode of one ubatch keeps no copy of the states (a decode aborts between ubatches, so one of a single ubatch
    never changes them; the copy would move every state once more each step)."""

    slots: tuple[tuple[SeqSet, ...], ...]  # per ubatch: its sequence sets
    seqs: np.ndarray  # (k,) the sequences the decode writes
    pos: np.ndarray  # (n_seq_max,) int32 before
    r: np.ndarray | None  # (n_layer_rs, k, n_embd_r) before; None for one ubatch
    s: np.ndarray | None  # (n_layer_rs, k, n_embd_s) before; None for one ubatch


class RecurrentView:
    """What one ubatch's forward sees of the recurrent memory (llm_graph_input_rs): its sequence sets, and per
    layer the state each set starts from and where its new state goes."""

    __slots__ = ("_mem", "sets")

    def __init__(self, mem: RecurrentMemory, sets: tuple[SeqSet, ...]):
        self._mem = mem
        self.sets = sets

    def layer_row(self, il: int) -> int:
        """The row of the state arrays that holds layer `il`, -1 if the memory has none for it."""
        return self._mem._index.get(il, -1)

    def conv_state(self, il: int, k: int) -> np.ndarray:
        """Set `k`'s rolling state of layer `il` (a copy). -> (n_embd_r,) float32"""
        return self._mem.r[self._mem.layer_index(il), self.sets[k].seq_ids[0]].copy()

    def ssm_state(self, il: int, k: int) -> np.ndarray:
        """Set `k`'s SSM state of layer `il` (a copy). -> (n_embd_s,) float32"""
        return self._mem.s[self._mem.layer_index(il), self.sets[k].seq_ids[0]].copy()

    def store_conv(self, il: int, k: int, r: np.ndarray) -> None:
        self._mem.r[self._mem.layer_index(il), list(self.sets[k].seq_ids)] = r.reshape(-1)

    def store_ssm(self, il: int, k: int, s: np.ndarray) -> None:
        self._mem.s[self._mem.layer_index(il), list(self.sets[k].seq_ids)] = s.reshape(-1)

    # -- the ops a gated delta-net layer reads its states through (build_rs; the graph records the same) --------

    def ssm_conv(self, ops, il: int, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """ggml_ssm_conv of each set's rows of x (n, n_ch) after its conv state (n_ch, d_conv - 1) of layer `il`,
        the state then its last d_conv - 1 inputs. weight (n_ch, d_conv). -> (n, n_ch)"""
        n, n_ch = x.shape
        d_st = weight.shape[1] - 1
        whole = len(self.sets) == 1 and len(self.sets[0].idx) == n  # one set: every row in order, no gathers
        out = np.empty((n, n_ch), np.float32)
        for k, st in enumerate(self.sets):
            rows = slice(None) if whole else st.idx
            xt = np.empty((d_st + len(st.idx), n_ch), np.float32)  # the conv input, token-major
            xt[:d_st] = self.conv_state(il, k).reshape(n_ch, d_st).T
            xt[d_st:] = x[rows]
            self.store_conv(il, k, np.ascontiguousarray(xt[len(st.idx) :].T))  # its last d_conv - 1 columns
            out[rows] = ops.ssm_conv(xt.T, weight)  # conv_x (n_ch, d_conv - 1 + n_t): a view
        return out

    def gated_delta_net(self, ops, il: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                        beta: np.ndarray) -> np.ndarray:
        """ggml_gated_delta_net of each set's rows from its delta-rule state (H_v, S, S) of layer `il`, which
        becomes the state after its last row. q, k (n, H_k, S); v (n, H_v, S); g, beta (n, H_v). -> (n, H_v, S)"""
        n, h_v, s_v = v.shape
        whole = len(self.sets) == 1 and len(self.sets[0].idx) == n
        y = np.empty((n, h_v, s_v), np.float32)
        for j, st in enumerate(self.sets):
            rows = slice(None) if whole else st.idx
            state = self.ssm_state(il, j).reshape(h_v, s_v, s_v)  # a copy: the op may update it in place
            y[rows], state = ops.gated_delta_net(q[rows], k[rows], v[rows], g[rows], beta[rows], state)
            self.store_ssm(il, j, state)
        return y

    def ssm_scan(self, ops, il: int, x: np.ndarray, dt: np.ndarray, a: np.ndarray, b: np.ndarray,
                 c: np.ndarray) -> np.ndarray:
        """ggml_ssm_scan (Mamba-2) of each set's rows from its SSM state (n_head, head_dim, d_state) of layer `il`,
        which becomes the state after its last row. x (n, n_head, head_dim); dt (n, n_head); a (n_head,); b, c
        (n, n_group, d_state). -> (n, n_head, head_dim)"""
        n, n_head, head_dim = x.shape
        whole = len(self.sets) == 1 and len(self.sets[0].idx) == n
        y = np.empty((n, n_head, head_dim), np.float32)
        for j, st in enumerate(self.sets):
            rows = slice(None) if whole else st.idx
            state = self.ssm_state(il, j).reshape(n_head, head_dim, b.shape[2])
            y[rows], state = ops.ssm_scan(state, x[rows], dt[rows], a, b[rows], c[rows])
            self.store_ssm(il, j, state)
        return y

    # -- a compiled graph's binding (llamactx.ggml.kernels.compute): states updated in place ---------------------

    @property
    def rs(self) -> RecurrentView:
        """A recurrent-only model's input is its recurrent part (as a hybrid's HybridInput.rs)."""
        return self

    def layer_rows(self) -> np.ndarray | None:
        """(n_layer,) int64: each layer's row in the state arrays, where every layer is recurrent (mamba2), for a
        compiled graph (backend.fast); None otherwise."""
        index = self._mem._index
        rows = np.array([index.get(il, -1) for il in range(max(index, default=-1) + 1)], np.int64)
        return rows if rows.size and (rows >= 0).all() else None

    def bind(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The memory's state arrays (n_layer_rs, n_seq, n_embd_r / n_embd_s), which the program updates in
        place, and the sets: each one's sequence (its first), the offsets of its rows in the third array, the
        rows. -> r, s, slots (n_sets,), starts (n_sets + 1,), rows (n,) int64"""
        slots = np.array([st.seq_ids[0] for st in self.sets], np.int64)
        starts = np.cumsum([0] + [len(st.idx) for st in self.sets]).astype(np.int64)
        rows = np.concatenate([st.idx for st in self.sets]).astype(np.int64)
        return self._mem.r, self._mem.s, slots, starts, rows

    def spread(self) -> None:
        """After a program ran: each set's new states copied to its other sequences (store_conv's and
        store_ssm's rows)."""
        for st in self.sets:
            if len(st.seq_ids) > 1:
                src, dst = st.seq_ids[0], list(st.seq_ids[1:])
                self._mem.r[:, dst] = self._mem.r[:, src : src + 1]
                self._mem.s[:, dst] = self._mem.s[:, src : src + 1]


@dataclass(slots=True)
class RecurrentState:
    """A parsed state section, not yet applied."""

    seq_ids: np.ndarray  # (n_cells,) the sequence of each cell (whole states; the destination otherwise)
    pos: np.ndarray  # (n_cells,) int32
    r: np.ndarray  # (n_layer_rs, n_cells, n_embd_r)
    s: np.ndarray  # (n_layer_rs, n_cells, n_embd_s)


class RecurrentMemory(Memory):
    """Per-sequence recurrent states of the layers `layers` (all of a mamba2 model, the short-convolution layers
    of lfm2), float32 as llama.cpp's default type_r / type_s."""

    partial_prefix = False

    def __init__(self, layers: Sequence[int], n_seq_max: int, n_embd_r: int, n_embd_s: int):
        self.layers = tuple(layers)
        self._index = {il: i for i, il in enumerate(self.layers)}
        self.n_seq_max = n_seq_max
        self.size = max(1, n_seq_max)  # llama_model::create_memory: one cell per sequence
        self.n_embd_r, self.n_embd_s = n_embd_r, n_embd_s
        self.pos = np.full(self.size, -1, np.int32)  # (size,) last position of each sequence, -1 = empty
        self.r = np.zeros((len(self.layers), self.size, n_embd_r), np.float32)  # (n_layer_rs, size, n_embd_r)
        self.s = np.zeros((len(self.layers), self.size, n_embd_s), np.float32)  # (n_layer_rs, size, n_embd_s)

    def layer_index(self, il: int) -> int:
        return self._index[il]

    # -- placement ----------------------------------------------------------------------------------------------

    def split(self, alloc: AllocatedBatch, n_ubatch: int) -> list[UBatch]:
        return split_by_sequence_sets(alloc.split_simple(n_ubatch))

    def room(self, seq_id: int) -> int:
        """A state has a fixed size: any number of tokens fits, up to the largest position."""
        self.check_seq(seq_id)
        return POS_MAX - max(int(self.pos[seq_id]), -1) - 1

    def update(self, rope_shift) -> None:
        """Nothing is pending: a recurrent memory never updates (llama_memory_recurrent::init_update)."""

    def prepare(self, ubatches: Sequence[UBatch]) -> RecurrentPlacement:
        """Every ubatch fits (a state per sequence is always there); remember what the decode will overwrite."""
        sets = tuple(_sequence_sets(ub) for ub in ubatches)
        seqs = np.array(sorted({s for ub in ubatches for ids in ub.seq_ids for s in ids}), np.int64)
        if len(ubatches) == 1:
            return RecurrentPlacement(sets, seqs, self.pos.copy(), None, None)
        return RecurrentPlacement(sets, seqs, self.pos.copy(), self.r[:, seqs].copy(), self.s[:, seqs].copy())

    def apply(self, ub: UBatch, sets: tuple[SeqSet, ...]) -> RecurrentView:
        """Give each sequence set its state (zero for an empty sequence, as llama.cpp's rs_z), move its sequences
        to the set's last position, and return the view the forward reads and writes the states through."""
        for st in sets:
            src = st.seq_ids[0]
            if self.pos[src] < 0:
                self.r[:, src] = 0
                self.s[:, src] = 0
            self.pos[list(st.seq_ids)] = ub.pos[st.idx[-1]]
        return RecurrentView(self, sets)

    def rollback(self, placement: RecurrentPlacement) -> None:
        """The states and positions before the decode. Without a copy (one ubatch), a forward that raised part way
        may have updated some layers' states: the sequences it started are then forgotten (empty), not left
        half-updated."""
        if placement.r is not None:
            self.r[:, placement.seqs] = placement.r
            self.s[:, placement.seqs] = placement.s
        else:
            started = placement.seqs[self.pos[placement.seqs] != placement.pos[placement.seqs]]
            placement.pos[started] = -1
            self.r[:, started] = 0
            self.s[:, started] = 0
        self.pos[:] = placement.pos

    # -- sequences ----------------------------------------------------------------------------------------------

    def clear(self, data: bool = True) -> None:
        self.pos[:] = -1
        if data:
            self.r[:] = 0
            self.s[:] = 0

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Forget `seq_id` if [p0, p1) holds its last position and starts at 0; True if [p0, p1) misses it; False
        when only a tail would go (no rollback) or for seq_id -1 (as llama.cpp answers)."""
        self.check_seq(seq_id, allow_all=True)
        if seq_id < 0:
            return False
        p0, p1 = max(p0, 0), (POS_MAX if p1 < 0 else p1)
        pos = int(self.pos[seq_id])
        if pos >= 0 and 0 < p0 <= pos < p1:
            return False
        if p0 <= pos < p1:
            self.pos[seq_id] = -1
        return True

    def seq_cp(self, seq_id_src: int, seq_id_dst: int, p0: int = -1, p1: int = -1) -> None:
        """The destination gets a copy of the source's whole state and position (the range is not used)."""
        self.check_seq(seq_id_src)
        self.check_seq(seq_id_dst)
        if seq_id_src == seq_id_dst:
            return
        self.pos[seq_id_dst] = self.pos[seq_id_src]
        self.r[:, seq_id_dst] = self.r[:, seq_id_src]
        self.s[:, seq_id_dst] = self.s[:, seq_id_src]

    def seq_keep(self, seq_id: int) -> None:
        self.check_seq(seq_id)
        keep = self.pos[seq_id]
        self.pos[:] = -1
        self.pos[seq_id] = keep

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.check_seq(seq_id)
        if self._in_range(seq_id, p0, p1):
            new = int(self.pos[seq_id]) + delta
            if new > POS_MAX:
                raise MemoryOpError(f"seq_add: position {int(self.pos[seq_id])} + {delta} is past the largest "
                                    f"position {POS_MAX}")
            self.pos[seq_id] = max(new, -1)  # below 0 the sequence is gone, as a KV cell would be

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.check_seq(seq_id)
        if d < 1:
            raise MemoryOpError(f"seq_div: d = {d} must be >= 1")
        if self._in_range(seq_id, p0, p1):
            self.pos[seq_id] //= d

    def _in_range(self, seq_id: int, p0: int, p1: int) -> bool:
        p0, p1 = max(p0, 0), (POS_MAX if p1 < 0 else p1)
        return p0 < p1 and p0 <= int(self.pos[seq_id]) < p1

    def seq_pos_min(self, seq_id: int) -> int:
        self.check_seq(seq_id)
        return int(self.pos[seq_id])

    def seq_pos_max(self, seq_id: int) -> int:
        self.check_seq(seq_id)
        return int(self.pos[seq_id])

    @property
    def can_shift(self) -> bool:
        return True

    @property
    def used(self) -> int:
        return int((self.pos >= 0).sum())

    def memory_breakdown(self) -> dict[str, int]:
        return {"r": self.r.nbytes, "s": self.s.nbytes}

    # -- state ----------------------------------------------------------------------------------------------------

    def state_write(self, seq_id: int | None) -> bytes:
        """u32 n_layer_rs, n_embd_r, n_embd_s, n_cells | per cell i32 seq_id, i32 pos | r rows of every layer |
        s rows of every layer. A whole state has a cell per non-empty sequence, a sequence state 0 or 1."""
        if seq_id is None:
            seqs = np.flatnonzero(self.pos >= 0)
        else:
            seqs = np.array([seq_id] if self.pos[seq_id] >= 0 else [], np.int64)
        head = struct.pack("<IIII", len(self.layers), self.n_embd_r, self.n_embd_s, seqs.size)
        cells = np.stack([seqs, self.pos[seqs]], axis=1).astype("<i4")  # (n_cells, 2)
        return b"".join([head, cells.tobytes(), np.ascontiguousarray(self.r[:, seqs]).tobytes(),
                         np.ascontiguousarray(self.s[:, seqs]).tobytes()])

    def checkpoint_write(self, seq_id: int) -> bytes:
        """The whole state of `seq_id` (a recurrent state is all non-rollbackable): its sequence state blob."""
        self.check_seq(seq_id)
        return self.state_write(seq_id)

    def checkpoint_load(self, seq_id: int, data: bytes, n_past: int) -> None:
        """Load a `checkpoint_write` blob into `seq_id`; its state must end at position n_past - 1."""
        self.check_seq(seq_id)
        state = self.state_read(StateReader(data), whole=False)
        if state.pos.tolist() != [n_past - 1]:
            raise StateError(f"checkpoint ends at positions {state.pos.tolist()}, expected [{n_past - 1}]")
        self.state_apply(state, seq_id)

    def state_read(self, r: StateReader, whole: bool) -> RecurrentState:
        n_layer, n_r, n_s, n_cells = struct.unpack("<IIII", r.take(16, "recurrent dimensions"))
        if (n_layer, n_r, n_s) != (len(self.layers), self.n_embd_r, self.n_embd_s):
            raise StateError(f"state recurrent shape {n_layer}x{n_r}/{n_s} differs from this context's "
                             f"{len(self.layers)}x{self.n_embd_r}/{self.n_embd_s}")
        if n_cells > (self.size if whole else 1):
            raise StateError(f"state holds {n_cells} recurrent cells, more than {self.size if whole else 1}")
        cells = r.array("<i4", 2 * n_cells, "recurrent cells").reshape(n_cells, 2).astype(np.int64)
        if (cells[:, 1] < 0).any():
            raise StateError(f"state has a negative position {int(cells[:, 1].min())}")
        bad_seq = (cells[:, 0] < 0) | (cells[:, 0] >= self.n_seq_max)
        if whole and (len(set(cells[:, 0].tolist())) != n_cells or bad_seq.any()):
            raise StateError(f"state recurrent cells name sequences {cells[:, 0].tolist()}: each must be unique and "
                             f"in [0, n_seq_max = {self.n_seq_max})")
        rs = r.array(np.float32, n_layer * n_cells * n_r, "r states").reshape(n_layer, n_cells, n_r)
        ss = r.array(np.float32, n_layer * n_cells * n_s, "s states").reshape(n_layer, n_cells, n_s)
        if not (np.isfinite(rs).all() and np.isfinite(ss).all()):
            raise StateError("state recurrent rows hold a non-finite value; refused")
        return RecurrentState(cells[:, 0], cells[:, 1].astype(np.int32), rs, ss)

    def state_check_fits(self, state: RecurrentState, dest_seq_id: int | None) -> None:
        if dest_seq_id is not None:
            self.check_seq(dest_seq_id)

    def state_apply(self, state: RecurrentState, dest_seq_id: int | None) -> None:
        if dest_seq_id is None:
            self.clear(data=True)
            seqs = state.seq_ids
        else:
            self.pos[dest_seq_id] = -1
            seqs = np.full(state.pos.size, dest_seq_id, np.int64)
        self.pos[seqs] = state.pos
        self.r[:, seqs] = state.r
        self.s[:, seqs] = state.s


def _sequence_sets(ub: UBatch) -> tuple[SeqSet, ...]:
    """The sequence sets of a ubatch (split_by_sequence_sets made them disjoint), in order of first token."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, ids in enumerate(ub.seq_ids):
        groups.setdefault(ids, []).append(i)
    return tuple(SeqSet(ids, np.array(idx, np.int64)) for ids, idx in groups.items())

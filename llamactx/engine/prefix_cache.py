"""Which tokens each context sequence (slot) holds, and the sharing of prefixes between them (llama-server's slot
selection by longest common prefix and `cache_prompt`; vLLM's prefix caching).

Every slot is one `seq_id` of the shared context. A running `Sequence` holds a slot; when it ends, the slot keeps
its tokens in memory (an idle cache) for the next request that starts with them. A new request takes the idle slot
whose cache shares the longest prefix with its prompt; when *another* slot (busy or idle) holds a longer common
prefix, those cells are shared into the new slot with `seq_cp`: computed once, stored once. Cells are never
written after their token is decoded, so sharing is copy-on-write by construction. Idle caches are evicted least
recently used when memory runs short.

A memory that cannot keep a partial prefix (recurrent, hybrid) reuses a slot's whole history, or else the latest
context checkpoint (engine/checkpoints.py) that starts the new prompt: its state is restored (from this slot, or
from another slot whose cells are shared up to it) and only the rest of the prompt is decoded.

With a session tier (engine/session_tier.py), what a slot loses (evicted, or cut back for a prompt that diverges
from it) is first stored there, and a prompt that starts with a stored state longer than anything the cells give
it gets that state back and decodes only the rest.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from llamactx.engine.checkpoints import Checkpoint, CheckpointParams, Checkpoints, checkpoint_tails
from llamactx.engine.sequence import Sequence
from llamactx.engine.session_tier import SessionTier
from llamactx.memory import Memory
from llamactx.state_io import StateError

MIN_SHARED = 16  # a shorter common prefix with another slot is not worth a seq_cp


@dataclass(slots=True)
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what memory holds for seq_id, in position order
    holder: Sequence | None = None  # the running sequence, None when idle
    last_used: int = 0
    checkpoints: Checkpoints = field(default_factory=lambda: Checkpoints(CheckpointParams(n_max=0)))

    @property
    def held(self) -> list[int]:
        """The tokens in memory now (a running sequence's decoded tokens)."""
        return self.holder.tokens[: self.holder.n_past] if self.holder is not None else self.tokens


def common_prefix(a: Seq[int], b: Seq[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """The slots of one context and the tokens each holds. Acts on the memory only through seq_rm / seq_cp."""

    def __init__(self, memory: Memory, n_slots: int, checkpoints: CheckpointParams | None = None,
                 tier: SessionTier | None = None, n_batch: int = 2048, n_ubatch: int = 512):
        """`tier`: where the states of evicted slots go and come back from (None: they are dropped). `n_batch`,
        `n_ubatch`: the context's, which place the checkpoints near a prompt's end (checkpoint_tails)."""
        self.memory = memory
        self.tier = tier
        self.ckpt_params = checkpoints or CheckpointParams()
        self.tails = checkpoint_tails(n_batch, n_ubatch)
        self.slots = [Slot(i, checkpoints=Checkpoints(self.ckpt_params)) for i in range(n_slots)]
        self._tick = itertools.count(1)

    @property
    def checkpointing(self) -> bool:
        """Whether prompts leave checkpoints: they are on and the memory can lose a prefix's state (recurrent,
        hybrid, a sliding window: Memory.needs_checkpoints)."""
        return self.ckpt_params.n_max > 0 and self.memory.needs_checkpoints

    def checkpoint_at(self, seq: Sequence) -> int:
        """Where `seq`'s next prompt chunk should end at the latest: at the next of the tail points (`tails`
        tokens before the end of its prompt), so that a checkpoint holds all but the prompt's last tokens; else
        its end."""
        if self.checkpointing:
            for tail in self.tails:
                if seq.n_past < seq.n_prompt - tail:
                    return seq.n_prompt - tail
        return len(seq.tokens)

    def checkpoint(self, seq: Sequence) -> None:
        """Snapshot `seq`'s memory before its next prompt chunk is decoded (llama-server's create_checkpoint, made
        before llama_decode): the state holding tokens[:n_past]. Away from the prompt's end and its last user
        message, not within `min_step` tokens of the slot's last checkpoint (--checkpoint-min-step)."""
        if not self.checkpointing or not 0 < seq.n_past < seq.n_prompt:
            return
        ckpts = self.slots[seq.seq_id].checkpoints
        if ckpts.items and ckpts.items[-1].n_tokens == seq.n_past:
            return  # restored from it, or already taken
        near_end = seq.n_prompt - seq.n_past <= self.tails[0] or seq.user_starts[-1:] == (seq.n_past,)
        if not near_end and ckpts.items and seq.n_past < ckpts.items[-1].n_tokens + self.ckpt_params.min_step:
            return
        data = self.memory.checkpoint_write(seq.seq_id)
        if data is not None:
            ckpts.add(seq.tokens[: seq.n_past], data)

    def forget_checkpoints(self, seq_id: int) -> None:
        """`seq_id`'s positions moved (a context shift): its checkpoints no longer match its memory."""
        self.slots[seq_id].checkpoints.clear()

    @property
    def n_free(self) -> int:
        return sum(s.holder is None for s in self.slots)

    def best_prefix(self, prompt: Seq[int]) -> int:
        """The longest prefix of `prompt` that some slot holds in memory now."""
        return max((common_prefix(prompt, s.held) for s in self.slots), default=0)

    def n_reused(self, prompt: Seq[int], cache_prompt: bool = True) -> int:
        """How many of `prompt`'s tokens `acquire` would find in cells memory holds already: the longest prefix a
        slot holds, or none when the session tier has a longer one (its state is loaded into new cells)."""
        if not cache_prompt:
            return 0
        have = self.best_prefix(prompt)
        return 0 if self.tier is not None and self.tier.find(prompt, len(prompt) - 1) > have else have

    def acquire(self, seq: Sequence, id_slot: int = -1, cache_prompt: bool = True) -> None:
        """Give `seq` an idle slot (`id_slot` if >= 0) and the longest cached prefix of its tokens: its own
        slot's cache, cells shared from another slot, a checkpoint, or a state from the session tier. Sets
        seq.seq_id, n_past and n_cached. The last token of the prompt is always left to decode, so that its
        logits exist. Raises ValueError if no slot is idle."""
        prompt = seq.tokens
        limit = len(prompt) - 1
        slot = self._choose(prompt, id_slot)
        if not cache_prompt or common_prefix(prompt, slot.tokens) < len(slot.tokens):
            self._store(slot)  # the slot is about to lose some of what it holds
        n_keep = self._reusable(prompt, slot, slot.tokens, limit) if cache_prompt else 0
        donor, n_shared = self._donor(prompt, slot, limit) if cache_prompt else (None, 0)
        src, ckpt = self._checkpoint(prompt, slot, limit) if cache_prompt else (None, None)
        mem = self.memory
        n_cells = max(n_keep, n_shared, ckpt.n_tokens if ckpt is not None else 0)
        n_tier = 0
        if self.tier is not None and cache_prompt:  # a stored state longer than what the cells give, if any
            n_tier = self.tier.restore(slot.seq_id, prompt, n_cells, limit)
        if n_tier:
            n_keep = n_tier
            slot.checkpoints.clear()
        elif ckpt is not None and ckpt.n_tokens > max(n_keep, n_shared):
            n_keep = self._restore(slot, src, ckpt)
        elif donor is not None and n_shared >= max(n_keep + 1, MIN_SHARED):
            mem.seq_rm(slot.seq_id)
            mem.seq_cp(donor.seq_id, slot.seq_id, 0, n_shared)
            n_keep = n_shared
            slot.checkpoints.items = list(donor.checkpoints.items)  # truncated to n_keep below
        elif not mem.seq_rm(slot.seq_id, n_keep, -1):  # a memory that cannot drop only a suffix: start over
            mem.seq_rm(slot.seq_id)
            n_keep = 0
        slot.checkpoints.truncate(n_keep)
        slot.tokens = []
        slot.holder = seq
        seq.seq_id = slot.seq_id
        seq.n_past = seq.n_cached = n_keep

    def _checkpoint(self, prompt: Seq[int], slot: Slot, limit: int) -> tuple[Slot | None, Checkpoint | None]:
        """The slot and its latest checkpoint that start `prompt` with the most tokens (at most `limit`), `slot`'s
        own first among equals; (None, None) without one."""
        best: tuple[Slot | None, Checkpoint | None] = (None, None)
        if not self.checkpointing:
            return best
        for other in sorted(self.slots, key=lambda s: s is not slot):
            c = other.checkpoints.best(prompt, limit)
            if c is not None and (best[1] is None or c.n_tokens > best[1].n_tokens):
                best = (other, c)
        return best

    def _restore(self, slot: Slot, src: Slot, ckpt: Checkpoint) -> int:
        """Put `slot` at checkpoint `ckpt` of `src` (its own or another slot's, whose cells up to it are shared
        first) and return how many tokens it holds then: ckpt.n_tokens, or 0 when the state did not fit (then the
        prompt is reprocessed; the slot is emptied)."""
        mem, n = self.memory, ckpt.n_tokens
        if src is not slot:
            mem.seq_rm(slot.seq_id)
            mem.seq_cp(src.seq_id, slot.seq_id, 0, n)
            slot.checkpoints.items = [c for c in src.checkpoints.items if c.n_tokens <= n]
        try:
            mem.checkpoint_load(slot.seq_id, ckpt.data, n)
        except StateError:
            mem.seq_rm(slot.seq_id)
            return 0
        return n

    def _choose(self, prompt: Seq[int], id_slot: int) -> Slot:
        idle = [s for s in self.slots if s.holder is None]
        if id_slot >= 0:
            chosen = [s for s in idle if s.seq_id == id_slot]
            if not chosen:
                raise ValueError(f"id_slot {id_slot} is busy or does not exist")
            return chosen[0]
        if not idle:
            raise ValueError("no idle slot")
        # the longest common prefix first; among equals an empty slot, then the least recently used
        return max(idle, key=lambda s: (common_prefix(prompt, s.tokens), not s.tokens, -s.last_used))

    def _donor(self, prompt: Seq[int], slot: Slot, limit: int) -> tuple[Slot | None, int]:
        best, n_best = None, 0
        for other in self.slots:
            if other is slot:
                continue
            n = self._reusable(prompt, other, other.held, limit)
            if n > n_best:
                best, n_best = other, n
        return best, n_best

    def _reusable(self, prompt: Seq[int], slot: Slot, held: Seq[int], limit: int) -> int:
        """How much of `held` (what `slot` holds) a request for `prompt` can reuse: the common prefix (at most
        `limit`), or, for a memory without partial prefixes (a recurrent state), all of `held` or nothing; and
        nothing where the memory no longer holds what the next token would attend to (an iSWA cache whose
        sliding window has moved past that prefix: llama-server reprocesses then too)."""
        n = min(common_prefix(prompt, held), limit)
        if not self.memory.partial_prefix and n < len(held):
            return 0
        if n and not self.memory.can_continue(slot.seq_id, n):
            return 0
        return n

    def release(self, seq: Sequence, keep: bool = True) -> None:
        """`seq` leaves its slot; with `keep`, what it decoded stays in memory as the slot's idle cache."""
        slot = self.slots[seq.seq_id]
        if slot.holder is not seq:
            return
        slot.holder = None
        slot.last_used = next(self._tick)
        if keep:
            slot.tokens = seq.tokens[: seq.n_past]
        else:
            slot.tokens = []
            slot.checkpoints.clear()
            self.memory.seq_rm(slot.seq_id)

    def evict_one(self) -> bool:
        """Forget the least recently used idle cache (its cells return to the pool unless shared). False when
        there is none."""
        idle = [s for s in self.slots if s.holder is None and s.tokens]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.last_used)
        self._store(slot)
        self.memory.seq_rm(slot.seq_id)
        slot.tokens = []
        slot.checkpoints.clear()
        return True

    def _store(self, slot: Slot) -> None:
        """Keep an idle slot's state in the session tier before its cells go, where it can be continued at its
        end (long enough ones only: the tier's min_tokens)."""
        n, seq_id = len(slot.tokens), slot.seq_id
        if self.tier is None or slot.holder is not None or not n:
            return
        if self.memory.seq_pos_max(seq_id) == n - 1 and self.memory.can_continue(seq_id, n):
            self.tier.store(seq_id, slot.tokens)

    def clear_slot(self, seq_id: int) -> None:
        """Forget an idle slot's cache (POST /slots/{id}?action=erase)."""
        slot = self.slots[seq_id]
        if slot.holder is not None:
            raise ValueError(f"slot {seq_id} is busy")
        self.memory.seq_rm(seq_id)
        slot.tokens = []
        slot.checkpoints.clear()

    def set_tokens(self, seq_id: int, tokens: list[int]) -> None:
        """An idle slot now holds `tokens` (a restored slot file)."""
        slot = self.slots[seq_id]
        slot.tokens = list(tokens)
        slot.checkpoints.clear()
        slot.last_used = next(self._tick)

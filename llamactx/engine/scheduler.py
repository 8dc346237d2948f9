"""The scheduler decides what the next step decodes (llama-server's `update_slots` batching policy, nano-vllm's
`Scheduler`): one token for every generating sequence, then chunks of prompts up to `n_batch` tokens, admitting
waiting requests in FIFO order while a slot is free and their prompt fits the memory.

It only decides; the engine builds the batch, decodes and samples. With speculative decoding a generating sequence's
token may bring a draft to verify (the engine's `drafter` proposes it); drafts take what the batch and the memory
have left after every generating sequence's token, before prompt chunks (llama-server adds them first too), and
never make room by evicting or preempting. A request is admitted when the cells its uncached prompt needs fit
beside what the running requests still need, so prefills never starve each other.
When generating requests run out of cells it frees room in this order: idle slots' caches (least recently used
first), then the youngest running request, which goes back to the front of the queue and is recomputed later
(vLLM's preemption by recomputation): a full memory never fails a request that could still run.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from llamactx.engine.checkpoints import CheckpointParams, user_break
from llamactx.engine.prefix_cache import PrefixCache, common_prefix
from llamactx.engine.sequence import Sequence, SequenceStatus
from llamactx.engine.session_tier import SessionTier
from llamactx.memory import Memory


@dataclass(frozen=True, slots=True)
class Scheduled:
    """`n_tokens` of `seq.pending` go into this step's batch; `sample` when they reach its end (logits needed).
    With a `draft`, the batch holds the pending token and then the draft (n_tokens = 1 + len(draft)), each with
    logits, to be verified."""

    seq: Sequence
    n_tokens: int
    sample: bool
    draft: tuple[int, ...] = ()

    @classmethod
    def of(cls, seq: Sequence, n_tokens: int) -> Scheduled:
        return cls(seq, n_tokens, n_tokens == len(seq.pending))


class Scheduler:
    """Waiting and running queues over `n_slots` context sequences sharing one memory."""

    def __init__(self, memory: Memory, n_slots: int, n_batch: int, n_ubatch: int | None = None,
                 drafter: Callable[[Sequence, int, int, int], list[int]] | None = None,
                 checkpoints: CheckpointParams | None = None, tier: SessionTier | None = None):
        """`drafter(seq, n_max, n_gen, used)`: at most n_max draft tokens to verify after a generating sequence's
        pending token, in a step of n_gen generating sequences with `used` rows so far (None: no speculative
        decoding). Drafts are kept within the first `n_ubatch` tokens of the batch, so that a
        sequence's verified tokens are placed in one ubatch (an iSWA cache then never reuses a cell that its next
        token, after a rejection, still attends to). `checkpoints`: the slots' context checkpoints (None: the
        defaults); while they are taken, a prompt chunk ends where one is due (PrefixCache.checkpoint_at).
        `tier`: the session tier evicted slots' states go to (None: none)."""
        self.memory = memory
        self.n_slots = n_slots
        self.n_batch = n_batch
        self.n_ubatch = n_batch if n_ubatch is None else min(n_ubatch, n_batch)
        self.drafter = drafter
        self.cache = PrefixCache(memory, n_slots, checkpoints, tier, self.n_batch, self.n_ubatch)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the youngest
        self.n_preempted = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Scheduled]:
        """This step's work: generating sequences first (one token each), then prompt chunks. Empty when
        nothing can run."""
        plan: list[Scheduled] = []
        for seq in list(self.running):
            if seq.is_generating and len(plan) < self.n_batch and self._make_room(len(plan) + 1, seq):
                plan.append(Scheduled.of(seq, 1))
        used = len(plan)
        if self.drafter is not None:
            plan, used = self._drafts(plan, used)
        for seq in self.running:
            if seq.is_generating or used >= self.n_batch:  # asking the memory costs a scan of its cells
                continue
            room = min(self.n_batch - used, self.memory.room(seq.seq_id) - used)
            if room > 0:
                n = min(len(seq.pending), room, self._chunk_end(seq) - seq.n_past)
                plan.append(Scheduled.of(seq, n))
                used += n
        while used < self.n_batch and self.waiting and self.cache.n_free and self._admit(self.waiting[0]):
            seq = self.running[-1]
            n = min(len(seq.pending), self.n_batch - used, self._chunk_end(seq) - seq.n_past)
            plan.append(Scheduled.of(seq, n))
            used += n
        if not plan and self.running:  # prefills that cannot move: make room for the oldest
            self.preempt(self.running[-1])
        return plan

    def _chunk_end(self, seq: Sequence) -> int:
        """Where `seq`'s next prompt chunk ends at the latest: at a checkpoint's tail point (PrefixCache.
        checkpoint_at) or, while checkpoints are taken, at the next user message that gets one (user_break)."""
        end = self.cache.checkpoint_at(seq)
        if seq.user_starts and self.cache.checkpointing:
            items = self.cache.slots[seq.seq_id].checkpoints.items
            pos = user_break(seq.user_starts, seq.n_past, items[-1].n_tokens if items else None,
                             self.cache.ckpt_params.min_step)
            if pos is not None:
                end = min(end, pos)
        return end

    def _drafts(self, plan: list[Scheduled], used: int) -> tuple[list[Scheduled], int]:
        """Give each scheduled generating sequence the draft its drafter proposes, within the room left in the
        first ubatch and in memory (cells beyond this step's other tokens)."""
        out = []
        for s in plan:
            n_max = max(0, min(self.n_ubatch - used, self.memory.room(s.seq.seq_id) - used))
            draft = tuple(self.drafter(s.seq, n_max, len(plan), used))[:n_max]
            out.append(Scheduled(s.seq, 1 + len(draft), True, draft) if draft else s)
            used += len(draft)
        return out, used

    def _make_room(self, n_tokens: int, seq: Sequence) -> bool:
        """Free cells until this step's `n_tokens` fit: idle caches first, then preempt the youngest running
        sequence. False if `seq` itself had to go."""
        while not self.memory.can_fit(n_tokens, seq.seq_id):
            if self.cache.evict_one():
                continue
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Take `seq`'s slot and cells away; it waits at the front of the queue and is recomputed from its tokens
        (its sampler and output so far are kept, so the result does not change)."""
        self.running.remove(seq)
        self.cache.release(seq, keep=False)
        seq.n_past = 0
        seq.seq_id = -1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.n_preempted += 1

    def _admit(self, seq: Sequence) -> bool:
        """Give the head of the queue a slot if the cells its uncached prompt needs fit beside what the running
        sequences still need (evicting idle caches if that makes it fit; a state the session tier restores takes
        new cells). A request whose prompt starts with what a running request is still prefilling waits for that
        prefill, then shares its cells."""
        if seq.options.id_slot >= 0 and self.cache.slots[seq.options.id_slot].holder is not None:
            return False  # the slot it asked for is busy: it waits for it
        have = self.cache.best_prefix(seq.tokens) if seq.options.cache_prompt else 0
        if any(not other.is_generating and common_prefix(seq.tokens, other.tokens) > have + 1
               for other in self.running):
            return False
        needed = sum(len(s.pending) for s in self.running) + len(seq.tokens)
        while not self.memory.can_fit(needed - self.cache.n_reused(seq.tokens, seq.options.cache_prompt), 0):
            if not self.cache.evict_one():
                return False
        self.cache.acquire(seq, seq.options.id_slot, seq.options.cache_prompt)
        if seq.t_admitted is None:
            seq.t_admitted = time.perf_counter()
        self.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return True

    def finish(self, seq: Sequence) -> None:
        """`seq` is done (finished or aborted): its slot becomes an idle cache of what it decoded."""
        if seq in self.running:
            self.running.remove(seq)
            self.cache.release(seq, keep=True)
        elif seq in self.waiting:
            self.waiting.remove(seq)

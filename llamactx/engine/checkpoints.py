"""Context checkpoints: snapshots of a slot's non-rollbackable memory at prompt positions (llama-server's
`--ctx-checkpoints`, `create_checkpoint` and the restore in `update_slots`, tools/server/server-context.cpp;
ggml-org/llama.cpp PR #15293).

A recurrent state (mamba2) or the recurrent half of a hybrid memory (lfm2) cannot be cut back to a shorter prefix
(`Memory.partial_prefix` False), and an iSWA cache (Gemma 3) forgets the positions that left its sliding window, so
without checkpoints a prompt that diverges from what a slot holds (for iSWA: before the window) is decoded again
from its start (`Memory.needs_checkpoints`). While a prompt is processed the engine snapshots its sequence's state
before each prompt chunk (`Memory.checkpoint_write`: the blob of llama.cpp's LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, a
recurrent state or the SWA cells the next token attends to); the scheduler ends chunks at llama-server's tail
points, 4 + n_ubatch and 4 tokens before the prompt's end (`checkpoint_tails`), so that snapshots sit right before
its last tokens. A prompt chunk also ends where a user message starts (`Sequence.user_starts`, the message spans
llama-server finds with the chat template's delimiters: chat_spans.py; `user_break`), so that a checkpoint holds
the conversation up to each message: a request that edits a message, or continues from an earlier turn, restores
the state at the start of the message where it differs. A later prompt that shares at least a checkpoint's tokens
restores the latest such checkpoint (`Memory.checkpoint_load`) and decodes only the rest; checkpoints past the
divergence are dropped.

Each slot keeps at most `n_max` checkpoints and `max_bytes` bytes of them, oldest dropped first; away from the
prompt's end and the last user message a snapshot within `min_step` tokens of the last one is skipped, and a chunk
ends at a user message only at the last one, when the slot has no checkpoint, or more than `min_step` tokens past
its latest (server-context.cpp). Unlike llama-server, chunk starts away from messages and the prompt's end take a
checkpoint too (subject to `min_step`, whose default here is 0 where llama-server's is 8192), so that a raw prompt
without messages keeps one per `n_batch` tokens. `n_max = 0` turns them off, and so
does `max_bytes = 0` (no snapshot fits): such prompts are reprocessed in full, as before (never different tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llamactx.engine.sequence import EngineError

CHECKPOINT_TAIL = 4  # llama-server's last checkpoint, 4 tokens before the end of the prompt (PR #20288)


def checkpoint_tails(n_batch: int, n_ubatch: int) -> tuple[int, ...]:
    """How many tokens before a prompt's end its chunks stop for a checkpoint, farthest first: llama-server's
    `checkpoint_offsets` {4 + n_ubatch, 4}, each at most n_batch."""
    return tuple(sorted({min(n_batch, CHECKPOINT_TAIL + n_ubatch), min(n_batch, CHECKPOINT_TAIL)}, reverse=True))


def user_break(user_starts, n_past: int, last: int | None, min_step: int) -> int | None:
    """Where a prompt chunk starting at `n_past` ends for a user message, None for nowhere (llama-server's
    update_slots: it stops filling the batch at a user message's start when that is the last user message, the slot
    has no checkpoint (`last` None), or it lies more than `min_step` tokens past the latest checkpoint, `last`)."""
    if not user_starts:
        return None
    for pos in user_starts:
        if pos > n_past and (pos == user_starts[-1] or last is None or pos > last + min_step):
            return pos
    return None


@dataclass(frozen=True, slots=True)
class CheckpointParams:
    """How many checkpoints a slot keeps (`--ctx-checkpoints`, 0 = off), their byte budget per slot, and the
    least spacing in tokens of those taken away from a prompt's end (`--checkpoint-min-step`, 0 = none)."""

    n_max: int = 8
    max_bytes: int = 256 << 20
    min_step: int = 0

    def __post_init__(self):
        for name, value in (("n_ctx_checkpoints", self.n_max), ("checkpoint max_bytes", self.max_bytes),
                            ("checkpoint_min_step", self.min_step)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EngineError(f"{name} = {value!r} must be an integer >= 0")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The memory state of a sequence holding exactly `tokens` (positions [0, len(tokens)))."""

    tokens: tuple[int, ...]
    data: bytes

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


@dataclass(slots=True)
class Checkpoints:
    """One slot's checkpoints, in increasing n_tokens."""

    params: CheckpointParams
    items: list[Checkpoint] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(len(c.data) for c in self.items)

    def add(self, tokens, data: bytes) -> None:
        """Keep a snapshot of the state holding `tokens`, replacing one at the same length and any past it (they
        belong to an older history), then drop the oldest while over `n_max` or `max_bytes`."""
        n = len(tokens)
        self.items = [c for c in self.items if c.n_tokens < n]
        self.items.append(Checkpoint(tuple(tokens), data))
        while self.items and (len(self.items) > self.params.n_max or self.nbytes > self.params.max_bytes):
            self.items.pop(0)

    def best(self, prompt, limit: int) -> Checkpoint | None:
        """The latest checkpoint whose tokens start `prompt` and number at least 1 and at most `limit`."""
        for c in reversed(self.items):
            if 0 < c.n_tokens <= limit and tuple(prompt[: c.n_tokens]) == c.tokens:
                return c
        return None

    def truncate(self, n_tokens: int) -> None:
        """Forget the checkpoints past the first `n_tokens` tokens (the slot's history diverges there)."""
        self.items = [c for c in self.items if c.n_tokens <= n_tokens]

    def clear(self) -> None:
        self.items = []

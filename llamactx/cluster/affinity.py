"""Prefix affinity: which replica most likely holds a prompt's prefix in its KV cells (Ray Serve LLM's
`PrefixCacheAffinityRouter`, ray/llm/_internal/serve/routing_policies/prefix_aware; vLLM's chained block hashes for
its prefix cache; SGLang's cache-aware router). No Ray here: the Ray router (router.py) asks this table.

A prompt is its rendered text's UTF-8 bytes (the chat template applied: what the engine decodes), cut into blocks
of BLOCK_BYTES; block i's key hashes block i together with key i-1, so two prompts share key i exactly when their
first i + 1 blocks are equal. Only the first MAX_BLOCKS blocks count: a prompt's tail never decides its replica.

    keys = prefix_keys(prompt_bytes)                 # (n_blocks,) chained 64-bit hashes
    ranks = table.rank(keys, candidates)             # [[holders of the longest match], [others]] or [candidates]
    table.record(keys, replica)                      # after the request was sent there

`rank` finds the longest prefix of `keys` that was sent to a replica still running. A prefix that only one prompt
continued so far (a conversation's history) ranks its holders first and the others after: the conversation sticks
to its replica. A prefix that prompts have branched from (a system prompt that many conversations start with) ranks
every candidate together, its holders first: it goes to the least loaded replica, which then holds it too, so a
shared prefix is replicated by load instead of piling every new conversation onto the first replica that saw it.
With no match, every candidate. Ray's request router takes the least loaded replica of a rank that has room (a tie:
the first) and falls through to the next rank when the whole rank is full (`max_ongoing_requests`): a saturated
holder spills over to the others. The table remembers where prefixes were *sent*, not what each replica still
holds (its slots may have been reused since): a miss costs a recompute there (or a read from the shared session
tier), never a wrong answer.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BLOCK_BYTES = 64  # about 16 tokens of English text: the granularity of a match
MAX_BLOCKS = 256  # the first 16 KiB of a prompt decide its replica
MAX_KEYS = 200_000  # keys remembered (least recently used dropped): about 3000 prompts of 16 KiB


def prefix_keys(data: bytes, block_bytes: int = BLOCK_BYTES, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Chained hashes of the first whole blocks of `data` (a trailing partial block has none): key i stands for
    data[: (i + 1) * block_bytes]. blake2b, not hash(): the same in every process."""
    keys, prev = [], b""
    for i in range(min(len(data) // block_bytes, max_blocks)):
        prev = hashlib.blake2b(prev + data[i * block_bytes : (i + 1) * block_bytes], digest_size=8).digest()
        keys.append(int.from_bytes(prev, "little"))
    return tuple(keys)


@dataclass(slots=True)
class _Entry:
    holders: set[str]  # the replicas that were sent this prefix
    child: int | None = None  # the key of the block that first followed it
    branched: bool = False  # another block followed it too: prompts share this prefix and go on differently


class AffinityTable:
    """Key -> the replicas that were sent a prompt with that prefix, and whether prompts branched from it; least
    recently used keys dropped past `max_keys`. Replica ids are opaque strings."""

    def __init__(self, max_keys: int = MAX_KEYS):
        if max_keys < 1:
            raise ValueError(f"max_keys = {max_keys} must be >= 1")
        self.max_keys = max_keys
        self._entries: OrderedDict[int, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, keys: Sequence[int], candidates: Iterable[str]) -> tuple[int, set[str]]:
        """(n_blocks, replicas): the longest prefix of `keys` held by any of `candidates`, and those of them that
        hold it; (0, empty) when none holds even the first block."""
        alive = set(candidates)
        for n in range(len(keys), 0, -1):
            entry = self._entries.get(keys[n - 1])
            if entry is not None and entry.holders & alive:
                return n, entry.holders & alive
        return 0, set()

    def rank(self, keys: Sequence[int], candidates: Sequence[str]) -> list[list[str]]:
        """The candidates in order of preference (see the module's docstring): [[holders], [others]] for a
        prefix only one prompt continued, [holders + others] for one prompts branched from, [candidates] for no
        match."""
        n, holders = self.match(keys, candidates)
        if not n:
            return [list(candidates)]
        holders_first = sorted(holders)
        others = [c for c in candidates if c not in holders]
        if n < len(keys) and self._entries[keys[n - 1]].branched:
            return [holders_first + others]
        return [holders_first, others] if others else [holders_first]

    def record(self, keys: Sequence[int], replica: str) -> None:
        """`replica` was sent a prompt with these keys: it is now a holder of each (the most recently used)."""
        for i, key in enumerate(keys):
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry({replica})
            else:
                entry.holders.add(replica)
                self._entries.move_to_end(key)
            if i + 1 < len(keys):
                if entry.child is None:
                    entry.child = keys[i + 1]
                elif entry.child != keys[i + 1]:
                    entry.branched = True
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)

    def forget(self, replica: str) -> None:
        """`replica` is gone (died, scaled down): it holds nothing any more."""
        for key in [k for k, e in self._entries.items() if replica in e.holders]:
            entry = self._entries[key]
            entry.holders.discard(replica)
            if not entry.holders:
                del self._entries[key]

"""Prefix affinity: which replica most likely holds a prompt's prefix in its KV cells or its session tier (Ray Serve
LLM's `PrefixCacheAffinityRouter`, ray/llm/_internal/serve/routing_policies/prefix_aware; vLLM's chained block
hashes for its prefix cache; SGLang's cache-aware router). No Ray here: the Ray router (router.py) asks this table.

A prompt is its rendered text's UTF-8 bytes (the chat template applied: what the engine decodes), cut into blocks
of BLOCK_BYTES; block i's key hashes block i together with key i-1, so two prompts share key i exactly when their
first i + 1 blocks are equal. Only the first MAX_BLOCKS blocks count: a prompt's tail never decides its replica.

    keys = prefix_keys(prompt_bytes)                 # (n_blocks,) chained 64-bit hashes
    keys = prefix_keys(history_bytes(vocab, tokens)) # the same keys for a replica's history (token ids)
    ranks = table.rank(keys, candidates)             # [[holders], [spread...]] or [[spread...]]
    table.record(keys, replica, at)                  # after the request was sent there (time.time())
    table.reconcile(replica, held_keys, at)          # what the replica reported it still holds at time `at`

`rank` finds the longest prefix of `keys` that a running replica holds. When that prefix is a whole prompt sent
before (its last key ends a prompt the holder was sent: the next turn of a conversation, or the same prompt
again), its holders rank first and the others after: the conversation sticks to its replica. Otherwise the
prompt starts a new history (nothing in common, or only a shared prefix such as a system prompt, or an edited
turn), and it goes where the fewest histories are: one rank per replica, the one holding the fewest histories
first (ties drawn at random), so that new conversations spread over the replicas even when no request is in
flight and every replica's load is 0. Ray's request router takes the first rank with room (a rank of several:
its least loaded replica) and falls through to the next when the whole rank is full (`max_ongoing_requests`): a
saturated holder spills over to the others.

The table records where prompts were *sent*; each replica reports the keys of the histories it still holds (its
slots and its session tier's RAM: replica.py), and `reconcile` drops the replica from every key it no longer
holds that was sent to it before the report (GRACE_S before, so a request still on its way is not dropped). A
conversation whose history its replica evicted is then routed as a new one, by the histories each replica holds.
A wrong guess costs a recompute (or a read from a shared session tier), never a wrong answer.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence

from llamactx.vocab.special import ATTR_CONTROL, ATTR_UNKNOWN, ATTR_USER_DEFINED

BLOCK_BYTES = 64  # about 16 tokens of English text: the granularity of a match
MAX_BLOCKS = 256  # the first 16 KiB of a prompt decide its replica
MAX_KEYS = 200_000  # keys remembered (least recently used dropped): about 3000 prompts of 16 KiB
SPREAD_RANKS = 4  # a new history's first choices, one replica per rank; the rest form one rank (by load)
SPECIAL_ATTRS = ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED  # the tokens tokenize() takes out of a text whole
GRACE_S = 10.0  # a report does not drop what was sent to the replica less than this long before it


def prefix_keys(data: bytes, block_bytes: int = BLOCK_BYTES, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Chained hashes of the first whole blocks of `data` (a trailing partial block has none): key i stands for
    data[: (i + 1) * block_bytes]. blake2b, not hash(): the same in every process."""
    keys, prev = [], b""
    for i in range(min(len(data) // block_bytes, max_blocks)):
        prev = hashlib.blake2b(prev + data[i * block_bytes : (i + 1) * block_bytes], digest_size=8).digest()
        keys.append(int.from_bytes(prev, "little"))
    return tuple(keys)


def history_bytes(vocab, tokens) -> bytes:
    """The text `tokens` were tokenized from, as the ingress keys it: each token's piece with special tokens
    written out, less what the tokenizer adds by itself (a BOS when the model asks for one, and an SPM model's
    space before the text that starts the prompt or follows a special token: vocab/vocab.py `tokenize`). So a
    replica's history (its slot's tokens, a state in its session tier) and the rendered prompt it came from have
    the same keys; a completion's prompt given as token ids gets its keys this way too."""
    tokens = list(tokens)
    if tokens and vocab.add_bos and tokens[0] == vocab.bos:
        tokens = tokens[1:]
    strip_space = vocab.vocab_type == "spm" and vocab.add_space_prefix
    pieces, after_special = [], True
    for t in tokens:
        piece = vocab.token_to_piece(t, special=True)
        special = bool(vocab.token_get_attr(t) & SPECIAL_ATTRS)
        if strip_space and after_special and not special and piece[:1] == b" ":
            piece = piece[1:]
        pieces.append(piece)
        after_special = special
    return b"".join(pieces)


class AffinityTable:
    """Key -> {replica: when it was sent a prompt with that prefix (time.time())}, least recently used keys dropped
    past `max_keys`; and per replica the histories it holds (the last key of each prompt it was sent that no
    longer prompt extends). Replica ids are opaque strings."""

    def __init__(self, max_keys: int = MAX_KEYS, seed: int | None = None):
        if max_keys < 1:
            raise ValueError(f"max_keys = {max_keys} must be >= 1")
        self.max_keys = max_keys
        self._holders: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._sent: dict[str, dict[int, float]] = {}  # the same, by replica: key -> when (reports scan only theirs)
        self._histories: dict[str, set[int]] = {}
        self._random = random.Random(seed)

    def __len__(self) -> int:
        return len(self._holders)

    def n_histories(self, replica: str) -> int:
        """How many histories (conversations) `replica` was sent and holds, as far as the table knows."""
        return len(self._histories.get(replica, ()))

    def match(self, keys: Sequence[int], candidates: Iterable[str]) -> tuple[int, set[str]]:
        """(n_blocks, replicas): the longest prefix of `keys` held by any of `candidates`, and those of them that
        hold it; (0, empty) when none holds even the first block."""
        alive = set(candidates)
        for n in range(len(keys), 0, -1):
            holders = self._holders.get(keys[n - 1])
            if holders is not None and holders.keys() & alive:
                return n, set(holders.keys() & alive)
        return 0, set()

    def rank(self, keys: Sequence[int], candidates: Sequence[str]) -> list[list[str]]:
        """The candidates in order of preference (module docstring): [[holders], others spread] for a prompt that
        continues a whole prompt its holders were sent, else every candidate spread."""
        n, holders = self.match(keys, candidates)
        sticky = {h for h in holders if keys[n - 1] in self._histories.get(h, ())} if n else set()
        if not sticky:
            return self.spread(candidates)
        others = [c for c in candidates if c not in sticky]
        return [sorted(sticky, key=self.n_histories), *self.spread(others)]

    def spread(self, candidates: Sequence[str]) -> list[list[str]]:
        """Ranks for a new history: one replica each, fewest histories first (ties at random), the ones past
        SPREAD_RANKS together."""
        order = sorted(candidates, key=lambda c: (self.n_histories(c), self._random.random()))
        ranks = [[c] for c in order[:SPREAD_RANKS]]
        return ranks + [order[SPREAD_RANKS:]] if len(order) > SPREAD_RANKS else ranks

    def record(self, keys: Sequence[int], replica: str, at: float) -> None:
        """`replica` was sent a prompt with these keys at time `at`: it holds each of them (now the most recently
        used), and the prompt is one of its histories in place of any history it extends."""
        if not keys:
            return
        sent = self._sent.setdefault(replica, {})
        for key in keys:
            holders = self._holders.get(key)
            if holders is None:
                self._holders[key] = {replica: at}
            else:
                holders[replica] = at
                self._holders.move_to_end(key)
            sent[key] = at
        histories = self._histories.setdefault(replica, set())
        histories.difference_update(keys[:-1])
        histories.add(keys[-1])
        while len(self._holders) > self.max_keys:
            key, holders = self._holders.popitem(last=False)
            for r in holders:
                self._sent[r].pop(key, None)
                self._histories[r].discard(key)

    def reconcile(self, replica: str, held: Collection[int], at: float) -> int:
        """`replica` reported at time `at` that it holds the prefixes `held` (keys): it no longer holds any key it
        was sent before at - GRACE_S that is not among them. Returns how many keys it was dropped from."""
        cutoff = at - GRACE_S
        gone = [k for k, sent in self._sent.get(replica, {}).items() if sent < cutoff and k not in held]
        for key in gone:
            self._drop(key, replica)
        return len(gone)

    def forget(self, replica: str) -> None:
        """`replica` is gone (died, scaled down): it holds nothing any more."""
        for key in list(self._sent.get(replica, ())):
            self._drop(key, replica)
        self._sent.pop(replica, None)
        self._histories.pop(replica, None)

    def _drop(self, key: int, replica: str) -> None:
        holders = self._holders[key]
        del holders[replica]
        if not holders:
            del self._holders[key]
        del self._sent[replica][key]
        self._histories[replica].discard(key)

"""The n-gram drafters: draft tokens looked up in a sequence's own history, no draft model (llama.cpp's
common/ngram-map.cpp `common_ngram_simple_draft` and `common_ngram_map_*` with key_only, common/ngram-mod.cpp
and the `common_speculative_impl_ngram_*` states of common/speculative.cpp; ngram-backoff is llamactx's own,
ngram-simple with shorter keys and loops drafted through).

Every drafter answers `draft(seq_id, prompt, sampled)`: `prompt` is what the slot holds (the prompt and the output
so far, llama-server's `slot.prompt.tokens`), `sampled` the token sampled last, not yet decoded; the answer is the
tokens expected to follow `sampled`, possibly none. `begin(seq_id, prompt)` starts a request on a slot (after its
prompt is processed), `accept(seq_id, n_accepted, is_other)` reports how many of a verified draft were accepted
(`is_other`: another drafter's draft). State lives per slot (`seq_id`), as in llama.cpp, or for ngram-mod in one
table shared by all slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF
LCG_FACTOR = 2654435761  # ngram-map.cpp: the 32-bit hash of an n-gram
NGRAM_MAX_VALUE_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT
NGRAM_HASH_MAP_SIZE = 262144  # COMMON_NGRAM_HASH_MAP_SIZE
MOD_FACTOR = 6364136223846793005  # ngram-mod.cpp: the 64-bit hash of an n-gram
MOD_SIZE = 4 * 1024 * 1024  # entries of ngram-mod's table (common_speculative_impl_ngram_mod)
MOD_EMPTY = -1


def _rfind_aligned(hay: bytes, needle: bytes, start: int, end: int) -> int:
    """The last token index j with hay's tokens [j, j + len) == needle inside tokens [start, end), or -1 (int32
    tokens as bytes: bytes.rfind is the search, a hit must start on a token boundary)."""
    lo, hi = 4 * start, 4 * end
    while True:
        i = hay.rfind(needle, lo, hi)
        if i < 0 or i % 4 == 0:
            return i // 4 if i >= 0 else -1
        hi = i + len(needle) - 1


class NgramSimple:
    """ngram-simple: the last `size_n` tokens (ending with the sampled one) are looked up in the history, latest
    occurrence first; the draft is the up to `size_m` tokens that followed it (common_ngram_simple_draft)."""

    def __init__(self, size_n: int, size_m: int):
        self.size_n = size_n
        self.size_m = size_m

    def begin(self, seq_id: int, prompt: list[int]) -> None:
        pass

    def draft(self, seq_id: int, prompt: list[int], sampled: int) -> list[int]:
        n, m = self.size_n, self.size_m
        cur_len = len(prompt)
        if cur_len <= n + m + 1:  # at least n + m + 1 tokens
            return []
        hay = np.asarray(prompt, np.int32).tobytes()
        pattern = np.asarray([*prompt[cur_len - n + 1 :], sampled], np.int32).tobytes()  # (n,) tokens
        # j from cur_len - n - 1 down to 1 (position 0 means "no match"): the match ends before the pattern's start
        match_pos = _rfind_aligned(hay, pattern, 1, cur_len - 1)
        if match_pos <= 0:
            return []
        copy_max = min(m, cur_len - (match_pos + n))
        if copy_max < n:
            return []
        return prompt[match_pos + n : match_pos + n + copy_max]

    def accept(self, seq_id: int, n_accepted: int, is_other: bool) -> None:
        pass


class NgramBackoff:
    """ngram-backoff, llamactx's own (llama.cpp 0c1e570 has no such type): ngram-simple's lookup, latest match
    first, with the key shortened (size_n, size_n // 2, ... down to MIN_KEY tokens) when the longer key occurs
    nowhere, and a draft that goes on through a loop. ngram-simple cannot draft the two places where a small
    model copies most (issue #48, SmolLM2, `bench/spec_bench.py --trace`): the first size_n tokens after any edit
    of the copied text (its key then holds a token the text does not), and its own loops: the latest match of the
    key is one period back, so ngram-simple's draft is the period less one token, and none where the period is
    shorter than size_n (common_ngram_simple_draft refuses a draft shorter than its key). Here the text after the
    match, where it reaches the present, continues with the draft itself (the match one period back predicts the
    next period), so a loop of any period is drafted size_m tokens long. Shorter keys match wrongly more often;
    the draft budget (draft_budget.py) verifies no more than the slot's acceptance pays for.

    A model that copies a text with a few edits (a proofread paragraph, a code edit) leaves the text for a token
    or two and comes back to it: a comma inserted, a word replaced, a word dropped. Each slot keeps a cursor,
    where in the history its last draft came from; when no key of SHORT_KEY or more tokens matches (the few
    tokens after an edit), the sampled token is looked up near where the cursor expects it (within RESYNC
    tokens before or after it, the nearest first), and where the keys find only a short match elsewhere, the
    cursor's place wins if the sampled token is what it expects. So the copy is drafted again from the first
    token after the edit that the text holds, not only once a 3-token key is back. Asking for a draft twice for
    the same history gives the same draft (the cursor moves to where the draft comes from, as a draft always
    would)."""

    MIN_KEY, SHORT_KEY, CURSOR_MAX = 3, 6, 16
    RESYNC = (0, -1, 1)  # where a token is looked up around the cursor's place for it, nearest first

    def __init__(self, size_n: int, size_m: int):
        self.sizes = [size_n]  # the key lengths tried, longest first
        while self.sizes[-1] // 2 >= self.MIN_KEY:
            self.sizes.append(self.sizes[-1] // 2)
        self.size_m = size_m
        # seq_id -> (h, src): the history token at index h was drafted from (copied from) history index src
        self._cursor: dict[int, tuple[int, int]] = {}

    def begin(self, seq_id: int, prompt: list[int]) -> None:
        self._cursor.pop(seq_id, None)

    def draft(self, seq_id: int, prompt: list[int], sampled: int) -> list[int]:
        cur_len = len(prompt)
        hay = np.asarray(prompt, np.int32).tobytes()
        for n in self.sizes:
            if n < self.SHORT_KEY and (near := self._near(seq_id, prompt, sampled, exact=True)) is not None:
                return self._from(seq_id, prompt, sampled, near)
            if cur_len < n + 1:
                continue
            pattern = np.asarray([*prompt[cur_len - n + 1 :], sampled], np.int32).tobytes()  # (n,) tokens
            match_pos = _rfind_aligned(hay, pattern, 1, cur_len - 1)  # as ngram-simple: position 0 is no match
            if match_pos > 0:
                return self._from(seq_id, prompt, sampled, match_pos + n)
        near = self._near(seq_id, prompt, sampled, exact=False)
        return [] if near is None else self._from(seq_id, prompt, sampled, near)

    def _near(self, seq_id: int, prompt: list[int], sampled: int, exact: bool) -> int | None:
        """Where the copy goes on after `sampled` if it came from near the cursor's place for it: the history
        index after the nearest occurrence of `sampled` within RESYNC of that place (`exact`: at the place only);
        None where the slot has no recent cursor or `sampled` is not there."""
        cursor = self._cursor.get(seq_id)
        if cursor is None or not 0 <= len(prompt) + 1 - cursor[0] <= self.CURSOR_MAX:  # tokens since its draft
            return None
        e = cursor[1] + len(prompt) - cursor[0]  # where the sampled token (history index len(prompt)) would be
        for j in (e,) if exact else (e + d for d in self.RESYNC):
            if 0 < j < len(prompt) and prompt[j] == sampled:
                return j + 1
        return None

    def _from(self, seq_id: int, prompt: list[int], sampled: int, start: int) -> list[int]:
        self._cursor[seq_id] = (len(prompt) + 1, start)
        return self._continue(prompt, sampled, start)

    def _continue(self, prompt: list[int], sampled: int, start: int) -> list[int]:
        """size_m tokens from history position `start` on (the history: `prompt` then `sampled`); past the
        history's end the draft repeats itself with the period `start` lies back from the end."""
        period = len(prompt) + 1 - start
        out = prompt[start : start + self.size_m]
        if len(out) < self.size_m and start + len(out) == len(prompt):
            out.append(sampled)
        while len(out) < self.size_m:
            out.append(out[len(out) - period])
        return out

    def accept(self, seq_id: int, n_accepted: int, is_other: bool) -> None:
        pass


def _hash32(tokens, start: int, n: int) -> int:
    """common_ngram_map_hash: the LCG hash of tokens[start:start + n] in uint32 arithmetic."""
    h = 0
    for t in tokens[start : start + n]:
        h = (h * LCG_FACTOR + t) & MASK32
    return h


@dataclass(slots=True)
class _Key:
    """common_ngram_map_key with key_only: only values[0].n_accepted is used."""

    key_idx: int  # where the key n-gram occurs in the history
    key_num: int = 0  # its hits
    n_accepted: int = 0  # tokens accepted at its last draft (starts at size_m)


@dataclass(slots=True)
class _MapState:
    """common_ngram_map: one slot's keys and the hash -> index map over its history."""

    keys: list[_Key] = field(default_factory=list)
    key_map: np.ndarray = field(default_factory=lambda: np.zeros(NGRAM_HASH_MAP_SIZE, np.uint32))
    key_map_last_idx: int = 0
    size_last_begin: int = 0
    idx_last_check: int = 0
    last_key: int = -1  # the key of the last draft, -1: none (last_draft_created false)


class NgramMapK:
    """ngram-map-k: like ngram-simple, but the key n-gram's occurrences are indexed once (a hash map from n-gram
    to its first indexed position, then a scan of the new positions) and a key's next draft is cut to what was
    accepted of its last one (common_ngram_map_draft with key_only = true)."""

    def __init__(self, size_n: int, size_m: int):
        self.size_n = size_n
        self.size_m = size_m
        self.states: dict[int, _MapState] = {}

    def begin(self, seq_id: int, prompt: list[int]) -> None:
        """common_ngram_map_begin: a history shorter than the last one seen (a new request on the slot) drops what
        was indexed past the old request's start."""
        st = self.states.setdefault(seq_id, _MapState())
        size_begin = len(prompt)
        cleanup = st.size_last_begin
        if cleanup > size_begin:
            nm = self.size_n + self.size_m
            cleanup = size_begin - nm if size_begin > nm else 0
        if size_begin < st.idx_last_check:
            st.key_map[st.key_map >= max(cleanup, 1)] = 0
            st.key_map_last_idx = max(cleanup - 1, 0)
            st.keys = [k for k in st.keys if k.key_idx < cleanup]
        st.idx_last_check = size_begin
        st.size_last_begin = size_begin

    def draft(self, seq_id: int, prompt: list[int], sampled: int) -> list[int]:
        st = self.states.setdefault(seq_id, _MapState())
        st.last_key = -1
        n, m = self.size_n, self.size_m
        cur_len = len(prompt)
        if cur_len < 2 * n + m:
            return []
        st.idx_last_check = cur_len
        key = [*prompt[cur_len - n + 1 :], sampled]  # (n,) the key n-gram
        match_pos = self._lookup(st, prompt, key)
        self._index(st, prompt)
        if match_pos == 0:
            return []
        i = next((i for i, k in enumerate(st.keys) if prompt[k.key_idx : k.key_idx + n] == key), len(st.keys))
        if i == len(st.keys):
            st.keys.append(_Key(match_pos, 0, m))
        k = st.keys[i]
        k.key_num = min(k.key_num + 1, NGRAM_MAX_VALUE_COUNT)
        st.last_key = i
        return prompt[match_pos + n : match_pos + n + min(m, k.n_accepted)]

    def _lookup(self, st: _MapState, prompt: list[int], key: list[int]) -> int:
        """The key's position: the hash map's entry if it matches, else a descending scan of the positions not
        indexed yet; 0 when not found."""
        n, m = self.size_n, self.size_m
        cur_len = len(prompt)
        idx = int(st.key_map[_hash32(key, 0, n) % NGRAM_HASH_MAP_SIZE])
        if idx != 0 and idx < cur_len - n - m - 1 and prompt[idx : idx + n] == key:
            return idx
        for lo, hi in self._unindexed(st, cur_len):
            for j in range(hi, lo, -1):
                if prompt[j : j + n] == key:
                    return j
        return 0

    def _unindexed(self, st: _MapState, cur_len: int) -> list[tuple[int, int]]:
        """The (exclusive low, high) ranges of key positions that the hash map does not hold, scanned high to low:
        those before the request's start, then those after it."""
        nm1 = self.size_n + self.size_m + 1
        out = []
        if st.size_last_begin > nm1:
            out.append((st.key_map_last_idx, st.size_last_begin - nm1))
        out.append((max(st.size_last_begin, st.key_map_last_idx), cur_len - nm1))
        return out

    def _index(self, st: _MapState, prompt: list[int]) -> None:
        """Add the new positions' n-grams to the hash map (a taken entry keeps its older position)."""
        n = self.size_n
        for lo, hi in self._unindexed(st, len(prompt)):
            for j in range(hi, lo, -1):
                h = _hash32(prompt, j, n) % NGRAM_HASH_MAP_SIZE
                if st.key_map[h] == 0:
                    st.key_map[h] = j
        st.key_map_last_idx = max(len(prompt) - n - self.size_m - 1, st.key_map_last_idx)

    def accept(self, seq_id: int, n_accepted: int, is_other: bool) -> None:
        """common_ngram_map_accept: the key's next draft is at most n_accepted long."""
        st = self.states.get(seq_id)
        if st is not None and st.last_key >= 0:
            st.keys[st.last_key].n_accepted = n_accepted


@dataclass(slots=True)
class _ModSeq:
    i_last: int = 0  # the history up to here is in the table
    n_draft_last: int = 0
    n_low: int = 0  # consecutive drafts with less than a quarter accepted


class NgramMod:
    """ngram-mod: one hash table, shared by every slot, from an n_match-gram to the token that followed it last;
    a draft chains lookups from the last n_match tokens, up to n_max tokens, none if fewer than n_min
    (common_speculative_impl_ngram_mod, common/ngram-mod.cpp). A table over a quarter full is cleared at the
    next begin, and five poor drafts in a row clear it too."""

    def __init__(self, n_match: int, n_min: int, n_max: int, size: int = MOD_SIZE):
        self.n = n_match
        self.n_min = n_min
        self.n_max = n_max
        self.entries = np.full(size, MOD_EMPTY, np.int32)  # (size,) next token by n-gram hash
        self.used = 0
        self.seqs: dict[int, _ModSeq] = {}

    def _idx(self, window) -> int:
        h = 0
        for t in window:
            h = (h * MOD_FACTOR + t) & MASK64
        return h % self.entries.size

    def _add_range(self, tokens: list[int], i0: int, i1: int) -> None:
        """common_ngram_mod::add for the n-grams starting at i0 .. i1 - 1 (each maps to the token after it)."""
        if i1 <= i0:
            return
        t = np.asarray(tokens[i0 : i1 + self.n], np.uint64)
        count = i1 - i0
        h = np.zeros(count, np.uint64)  # (count,) uint64 arithmetic wraps like size_t
        for k in range(self.n):
            h = h * np.uint64(MOD_FACTOR) + t[k : k + count]
        idx = (h % np.uint64(self.entries.size)).astype(np.int64)
        self.used += int(np.count_nonzero(self.entries[np.unique(idx)] == MOD_EMPTY))
        self.entries[idx] = t[self.n : self.n + count].astype(np.int32)  # in order: the last write wins

    def reset(self) -> None:
        self.entries.fill(MOD_EMPTY)
        self.used = 0

    def begin(self, seq_id: int, prompt: list[int]) -> None:
        st = self.seqs[seq_id] = _ModSeq()
        if len(prompt) < self.n:
            return
        self._add_range(prompt, 0, len(prompt) - self.n)
        st.i_last = len(prompt) - self.n
        if self.used / self.entries.size > 0.25:
            self.reset()

    def draft(self, seq_id: int, prompt: list[int], sampled: int) -> list[int]:
        st = self.seqs.setdefault(seq_id, _ModSeq())
        st.n_draft_last = 0
        n, cur_len = self.n, len(prompt)
        if cur_len < n:
            return []
        if st.i_last + 32 < cur_len:  # new n-grams go in by chunks
            self._add_range(prompt, st.i_last, cur_len - n)
            st.i_last = cur_len - n
        window = [*prompt[cur_len - n + 1 :], sampled]  # (n,)
        out: list[int] = []
        for i in range(self.n_max):
            token = int(self.entries[self._idx(window[i : i + n])])
            if token == MOD_EMPTY:
                if i < self.n_min:
                    return []
                break
            window.append(token)
            out.append(token)
        st.n_draft_last = len(out)
        return out

    def accept(self, seq_id: int, n_accepted: int, is_other: bool) -> None:
        st = self.seqs.get(seq_id)
        if is_other or st is None or st.n_draft_last == 0:
            return
        if n_accepted / st.n_draft_last < 0.25:
            st.n_low += 1
            if st.n_low >= 5:
                self.reset()
                st.n_low = 0
                st.i_last = 0
        else:
            st.n_low = 0

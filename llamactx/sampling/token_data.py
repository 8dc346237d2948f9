"""The candidate array that samplers work on (llama.h `llama_token_data_array`) and the `Sampler` protocol.

`TokenDataArray` holds three parallel numpy arrays instead of an array of structs; a sampler that drops or
reorders candidates replaces the arrays (`keep`), one that rescales logits writes into them. The helpers below
are the shared pieces of src/llama-sampler.cpp: the partial sort
(`llama_token_data_array_partial_sort_inplace`), the softmax (`llama_sampler_softmax_impl`) and a vectorised
lookup of token ids among the candidates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np

from llamactx.errors import LlamactxError
from llamactx.sampling.kernels import top_k_scan


class SamplingParamsError(LlamactxError, ValueError):
    """A sampler or sampling parameter outside its allowed values; names the field, the value and the limit.
    (Defined here, at the bottom of the sampling package, so that every sampler module can raise it.)"""


# Below this many candidates a full stable argsort is cheaper than a threshold search.
_SMALL_SORT = 2048
# Up to this k the one-pass scan of kernels.py beats the threshold search (measured on a 49k vocabulary).
_SCAN_MAX_K = 128


@dataclass(slots=True)
class TokenDataArray:
    """Candidates for the next token: ids, logits, probabilities, the selected index and a sorted flag.

    `probs` is None until a sampler computes it (llama.cpp leaves `p` at 0); like llama.cpp, samplers that
    change logits afterwards leave `probs` stale. `sorted` means "descending by logit". `selected` is an index
    into the arrays, -1 until a selecting sampler (greedy, dist, mirostat) sets it.
    """

    ids: np.ndarray  # (n,) int32
    logits: np.ndarray  # (n,) float32
    probs: np.ndarray | None = None  # (n,) float32
    selected: int = -1
    sorted: bool = False

    @classmethod
    def from_logits(cls, logits: np.ndarray) -> TokenDataArray:
        """All tokens of a vocabulary in id order, from one row of logits (copied: samplers write into it).

        `ids` is a shared read-only 0..n_vocab-1 (building it costs more than the copy of the row): samplers
        replace `ids` (`keep`), they never write into it. Raises ValueError if `logits` is not one-dimensional
        or is empty.
        """
        row = np.array(logits, dtype=np.float32, copy=True)  # (n_vocab,)
        if row.ndim != 1 or row.shape[0] == 0:
            raise ValueError(f"logits: expected a non-empty 1-D array, got shape {row.shape}")
        return cls(_vocab_ids(row.shape[0]), row)

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])

    @property
    def selected_token(self) -> int:
        """The token id at `selected`; raises RuntimeError when no sampler selected one."""
        if not 0 <= self.selected < self.size:
            raise RuntimeError(
                f"no token selected (selected={self.selected}, size={self.size}): "
                "the chain needs a selecting sampler (greedy, dist, mirostat) at its end"
            )
        return int(self.ids[self.selected])

    def keep(self, index: np.ndarray | slice) -> None:
        """Keep (and order) the candidates at `index`, a slice, an index array or a boolean mask."""
        self.ids = self.ids[index]
        self.logits = self.logits[index]
        if self.probs is not None:
            self.probs = self.probs[index]

    def sort(self, k: int | None = None) -> None:
        """Sort descending by logit, keeping the top `k` (all when None); sets `sorted`.

        llama_token_data_array_partial_sort_inplace. Ties keep id order (lower index first), so results are
        deterministic.
        """
        n = self.size
        k = n if k is None else min(k, n)
        self.keep(top_order(self.logits, k))
        self.sorted = True

    def softmax(self, do_sort: bool) -> np.ndarray:
        """Fill `probs` with softmax(logits), sorting first when `do_sort`, and return it
        (llama_sampler_softmax_impl)."""
        if self.size == 0:
            raise RuntimeError("softmax of an empty candidate array")
        if do_sort and not self.sorted:
            self.sort()
        max_l = self.logits[0] if self.sorted else self.logits.max()
        p = np.exp(self.logits - max_l)  # (n,)
        p /= p.sum(dtype=np.float32)
        self.probs = p
        return p


@lru_cache(maxsize=4)
def _vocab_ids(n: int) -> np.ndarray:
    """0..n-1 as int32, read-only (one per vocabulary size, built once)."""
    ids = np.arange(n, dtype=np.int32)  # (n,)
    ids.flags.writeable = False
    return ids


def top_order(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` largest values of `x`, descending; ties in index order. No full sort of a large `x`.

    A small `k` is one pass of kernels.top_k_scan. Otherwise (or when the scan gives up: NaNs, values in
    ascending order) a strided subsample's k-th largest value is a lower bound for the k-th largest of `x`, so
    everything at or above it is a small candidate set that contains the answer; only that set is sorted.
    """
    n = x.shape[0]
    if 0 < k <= _SCAN_MAX_K and k < n and x.dtype == np.float32 and x.flags.c_contiguous:
        order, ok = top_k_scan(x, k, 16 * k + 256)  # (k,)
        if ok:
            return order
    if k >= n or n <= _SMALL_SORT:
        return np.argsort(-x, kind="stable")[:k]
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    step = max(1, n // max(4096, 64 * k))
    sample = x[::step]  # (n / step,)
    kk = min(k, sample.shape[0])
    threshold = np.partition(sample, sample.shape[0] - kk)[sample.shape[0] - kk]
    cand = np.flatnonzero(x >= threshold)  # (c,) ascending ids
    if cand.shape[0] > 8 * k + 4096:  # a flat distribution: tighten to the exact k-th value first
        vals = x[cand]
        kth = np.partition(vals, vals.shape[0] - k)[vals.shape[0] - k]
        cand = cand[vals >= kth]
    return cand[np.argsort(-x[cand], kind="stable")[:k]]


def ordered_prefix(keys: np.ndarray, cut: Callable[[np.ndarray], int | None], first_k: int) -> np.ndarray:
    """The shortest prefix of `keys`' descending order (ties in index order) that `cut` accepts, sorting only
    as much of `keys` as needed: the top `first_k`, then 8x more per round, then everything.

    `cut(order)` returns the prefix length it wants, or None when `order` is too short to decide. This is
    llama.cpp's top-p strategy ("if not sorted, try adaptive top-k sorting") made general.
    """
    n = keys.shape[0]
    k = min(max(first_k, 1), n)
    while True:
        order = top_order(keys, k)  # (k,)
        last = cut(order)
        if last is not None:
            return order[:last]
        if k >= n:
            return order
        k = min(n, k * 8)


def find_tokens(cur: TokenDataArray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where `tokens` (unique ids) sit among the candidates: (positions in `cur`, indices into `tokens`).

    Tokens that are not candidates are left out. The fast path is llama.cpp's logit-bias trick: while the
    array is still in vocabulary order, token t sits at position t.
    """
    n = cur.size
    tokens = np.asarray(tokens, dtype=np.int64)  # (m,)
    inside = np.flatnonzero((tokens >= 0) & (tokens < n))
    direct = inside[cur.ids[tokens[inside]] == tokens[inside]]
    if direct.shape[0] == tokens.shape[0]:
        return tokens, np.arange(tokens.shape[0])
    order = np.argsort(tokens, kind="stable")
    sorted_tokens = tokens[order]  # (m,)
    hit = np.isin(cur.ids, sorted_tokens)  # (n,)
    pos = np.flatnonzero(hit)
    which = order[np.searchsorted(sorted_tokens, cur.ids[pos])]
    return pos, which


@runtime_checkable
class Sampler(Protocol):
    """One step of a sampler chain (llama.h `llama_sampler_i`).

    `apply` filters or rescales the candidates in place, or selects one; `accept` tells a stateful sampler
    which token was chosen; `reset` returns it to its initial state; `clone` copies it with its state.
    """

    @property
    def name(self) -> str: ...

    def apply(self, cur: TokenDataArray) -> None: ...

    def accept(self, token: int) -> None: ...

    def reset(self) -> None: ...

    def clone(self) -> Sampler: ...

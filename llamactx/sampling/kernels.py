"""numba loops of the samplers of src/llama-sampler.cpp: the selection of top-k
(`llama_token_data_array_partial_sort`), the cuts of top-p and min-p, and the draw of dist.

Each replaces a handful of numpy calls on a few dozen candidates (or one partial sort of the vocabulary) by one
pass, and each is exact: only comparisons and sequential float32 / float64 additions, the same operations in the
same order as the numpy code they replace (np.cumsum is a sequential sum). Exponentials and numpy's pairwise
sums stay in numpy, so probabilities keep their bits. Where numpy's answer on NaNs would differ from a plain
loop's, the kernel reports it and the caller takes its numpy path.

top_k_scan keeps the `k` best (value, index) pairs in a small buffer sorted descending, ties in index order,
exactly the order of a stable descending sort; blocks of values that cannot enter are skipped with a vectorised
count. For the default chain (k = 40 of a 49k vocabulary) that is one read of the logits and a few hundred
insertions.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_BLOCK = 64  # values per vectorised "can any of these enter?" check
_SUB = 16  # and again per sub-block of a block with a hit


@njit(cache=True, inline="always")
def _insert(vals, idx, v, i, last) -> None:
    """Insert (v, i) into the descending buffer vals[:last + 1] (dropping vals[last]); after equal values,
    which have lower indices."""
    p = last
    while p > 0 and vals[p - 1] < v:
        vals[p] = vals[p - 1]
        idx[p] = idx[p - 1]
        p -= 1
    vals[p] = v
    idx[p] = i


@njit(cache=True, nogil=True)
def top_k_scan(x, k, budget):
    """(idx, ok): the indices of the `k` largest values of `x` (n,), descending, ties in index order, for
    0 < k <= n. `ok` is False, and `idx` meaningless, when `x` holds a NaN (whose place only a full sort
    defines) or when more than `budget` values had to be inserted after the first k (values arriving in
    ascending order would cost O(n k))."""
    n = x.shape[0]
    vals = np.empty(k, dtype=x.dtype)  # (k,) descending
    idx = np.empty(k, dtype=np.intp)  # (k,)
    for i in range(k):
        v = x[i]
        if v != v:
            return idx, False
        _insert(vals, idx, v, i, i)
    thr = vals[k - 1]
    inserted = 0
    n_blocks = (n - k) // _BLOCK
    for b in range(n_blocks + 1):
        start = k + b * _BLOCK
        end = min(start + _BLOCK, n)
        if b < n_blocks:  # a full block: constant trip counts, so that LLVM vectorises the counts
            hits = 0
            for j in range(_BLOCK):
                hits += not (x[start + j] <= thr)  # larger, or NaN
            if hits == 0:
                continue
            for sub in range(start, end, _SUB):  # then only the sub-blocks with a hit, one by one
                hits = 0
                for j in range(_SUB):
                    hits += not (x[sub + j] <= thr)
                if hits:
                    for j in range(sub, sub + _SUB):
                        v = x[j]
                        if not (v <= thr):
                            inserted += 1
                            if v != v or inserted > budget:
                                return idx, False
                            _insert(vals, idx, v, j, k - 1)
                            thr = vals[k - 1]
            continue
        for j in range(start, end):
            v = x[j]
            if not (v <= thr):
                inserted += 1
                if v != v or inserted > budget:
                    return idx, False
                _insert(vals, idx, v, j, k - 1)
                thr = vals[k - 1]
    return idx, True


@njit(cache=True, nogil=True)
def top_p_cut(probs, p, min_keep) -> int:
    """llama_sampler_top_p_apply's cut: the length of the shortest prefix whose float32 running sum of `probs`
    (n,) reaches `p` and that holds at least `min_keep` entries, or -1 when there is none."""
    cum = np.float32(0.0)
    for i in range(probs.shape[0]):
        cum += probs[i]
        if cum >= p and i + 1 >= min_keep:
            return i + 1
    return -1


@njit(cache=True, nogil=True)
def min_p_cut(logits, thr, min_keep) -> int:
    """llama_sampler_min_p_apply's cut on sorted `logits` (n,): the first index from max(1, min_keep) on whose
    logit is below `thr`, or n."""
    for i in range(max(1, min_keep), logits.shape[0]):
        if logits[i] < thr:
            return i
    return logits.shape[0]


@njit(cache=True, nogil=True)
def dist_pick(p, u, probs) -> int:
    """llama_sampler_dist_apply's draw from unnormalised weights `p` (n,) float32 with a uniform `u` in [0, 1):
    the first index whose double running sum reaches u * total (clamped to n - 1), and `probs` (n,) =
    p / total rounded to float32. Returns -1, writing nothing, when the total is NaN."""
    n = p.shape[0]
    total = 0.0
    for i in range(n):
        total += np.float64(p[i])
    if total != total:
        return -1
    for i in range(n):
        probs[i] = np.float32(np.float64(p[i]) / total)
    target = total * u
    cum = 0.0
    for i in range(n):
        cum += np.float64(p[i])
        if cum >= target:
            return i
    return n - 1

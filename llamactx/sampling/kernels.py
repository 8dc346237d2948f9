"""numba loops of the samplers of src/llama-sampler.cpp: the selection of top-k
(`llama_token_data_array_partial_sort`), the cuts of top-p and min-p, and the draw of dist.

Each replaces a handful of numpy calls on a few dozen candidates (or one partial sort of the vocabulary) by one
pass, and each is exact: only comparisons and sequential float32 / float64 additions, the same operations in the
same order as the numpy code they replace (np.cumsum is a sequential sum). Exponentials and numpy's pairwise
sums stay in numpy, so probabilities keep their bits. Where numpy's answer on NaNs would differ from a plain
loop's, the kernel reports it and the caller takes its numpy path.

top_k_scan keeps the `k` best (value, index) pairs in a small buffer sorted descending, ties in index order,
exactly the order of a stable descending sort; blocks of values that cannot enter are skipped with a vectorised
count. A threshold from a strided sample lets only about 4k values in from the start, so for the default chain
(k = 40 of a 49k vocabulary) that is one read of the logits and about a hundred insertions.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from llamactx.ggml import cpu as _target  # noqa: F401  (numba compiles for the checked target)

_BLOCK = 64  # values per vectorised "can any of these enter?" check
_STRIDE = 32  # top_k_scan's sample: every 32nd value ...
_SAMPLE_MIN_N = 4096  # ... of an array at least this long
_OK, _GAVE_UP, _SHORT = 0, 1, 2


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
    ascending order would cost O(n k)).

    On a large `x` a strided sample first gives a threshold t0 that about 4k values reach; values below it
    are skipped from the start. Only when fewer than k values reach t0 (rare) is the scan redone without."""
    n = x.shape[0]
    if n >= _SAMPLE_MIN_N and n >= 64 * k:
        t0 = _sample_threshold(x, k)
        if t0 > -np.inf:
            idx, status = _scan(x, k, budget, t0)
            if status != _SHORT:
                return idx, status == _OK
    idx, status = _scan(x, k, budget, -np.inf)
    return idx, status == _OK


@njit(cache=True, inline="always")
def _sample_threshold(x, k):
    """The r-th largest of every _STRIDE-th value of `x`, r chosen so that about 4k values of `x`
    reach it (a NaN or -inf when the sample holds NaNs or too few finite values)."""
    r = (4 * k) // _STRIDE + 1
    top = np.full(r, -np.inf, dtype=x.dtype)  # (r,) descending
    last = top[r - 1]
    for i in range(0, x.shape[0], _STRIDE):
        v = x[i]
        if not (v <= last):
            p = r - 1
            while p > 0 and top[p - 1] < v:
                top[p] = top[p - 1]
                p -= 1
            top[p] = v
            last = top[r - 1]
    return last


@njit(cache=True, nogil=True)
def _scan(x, k, budget, t0):
    """top_k_scan over the values of `x` >= t0 (all when t0 is -inf), in index order: the first k fill the
    buffer, later ones enter when above its last entry. Returns (idx, _OK | _GAVE_UP | _SHORT), _SHORT when
    fewer than k values reach t0."""
    n = x.shape[0]
    vals = np.empty(k, dtype=x.dtype)  # (k,) descending
    idx = np.empty(k, dtype=np.intp)  # (k,)
    count = 0
    start0 = 0
    thr = x.dtype.type(-np.inf)
    if t0 == -np.inf:  # no threshold: the first k values fill the buffer
        for i in range(k):
            v = x[i]
            if v != v:
                return idx, _GAVE_UP
            _insert(vals, idx, v, i, i)
        count = k
        start0 = k
        thr = vals[k - 1]
    else:  # the gate is "not (v <= thr)": just below t0 until the buffer is full
        thr = np.nextafter(x.dtype.type(t0), x.dtype.type(-np.inf))
    inserted = 0
    n_blocks = (n - start0) // _BLOCK
    for b in range(n_blocks + 1):
        start = start0 + b * _BLOCK
        end = min(start + _BLOCK, n)
        if b < n_blocks:  # a full block: a constant trip count, so that LLVM vectorises the count
            hits = 0
            for j in range(_BLOCK):
                hits += not (x[start + j] <= thr)  # larger, or NaN
            if hits == 0:
                continue
        for j in range(start, end):
            v = x[j]
            if not (v <= thr):
                if v != v:
                    return idx, _GAVE_UP
                if count < k:
                    _insert(vals, idx, v, j, count)
                    count += 1
                    if count == k:
                        thr = vals[k - 1]
                    continue
                inserted += 1
                if inserted > budget:
                    return idx, _GAVE_UP
                _insert(vals, idx, v, j, k - 1)
                thr = vals[k - 1]
    return idx, (_OK if count == k else _SHORT)


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

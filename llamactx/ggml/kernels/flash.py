"""Flash attention over the f16 KV cache (ggml-cpu's `ggml_compute_forward_flash_attn_ext_f16`, the arithmetic of
its tiled kernel), fast.

The arithmetic is llamactx.ggml.flash_attn's default (ReferenceOps), which is llama.cpp's tiled kernel bit for bit:
per score one FMA chain over the head dimension, from zero, of the f32 query (not rounded) and the f16 K row
widened; times scale, plus the mask; per tile of 64 cells (by rank) an online softmax: the tile's max, on a new
max VKQ and S scaled by `expf(M_old - M)`, `ggml_v_expf` of each score, the tile's sum in double (by groups of
the target's F32_EPR lanes; nothing else here depends on the vector width); VKQ += P V as one
FMA chain over the cells per output element (a zero probability adds nothing); out = VKQ / S.

Here 16 cells' scores are one register: a block of 16 K rows is transposed 16 x 16 in registers (`htranspose16`),
and the query heads of one KV head share it, three heads' chains at a time (twelve in flight, not four). VKQ runs
16 columns to a register over V rows widened to f32 once for the group. A prompt's tokens see prefixes of the same
slots: their K tiles are transposed once per call, and blocks of up to TOKEN_BLOCK of them share each K tile and V
chunk while it is in L1. Parallel over (token block, KV head) groups dealt round robin; few tokens over many cells
(decode at depth, with any number of threads) split instead, in three passes: scores by cell tiles (each thread
its own K rows, the next tile's prefetched), the softmax per head, VKQ by (KV head, 32-column block) for the
group's query heads three at a time (the chain over cells is sequential; its columns and heads are independent;
a thread's two blocks of one head run as one 64-column task), a chunk of V_SLOTS cells at a time, the lines
V_AHEAD cells ahead prefetched. A KV cache at depth is in DRAM (SmolLM2 at 4096 cells: 90 MB): with the rows
prefetched one thread reads them at about its share of the memory roof (1 thread, loaded Zen 4: 0.45 ms instead
of 0.78 ms per layer). Where the time goes (1 thread, SmolLM2's shape at 4096 cells, in cache): scores ~160 us
per layer, two thirds of it the K transposes; softmax ~40; values ~65 (100 before the 64-column tasks).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from llamactx.ggml.cpu import F32_EPR
from llamactx.ggml.kernels.attention import SPLIT_MIN_CELLS, _slot_cells, _widen_rows, v_chunk
from llamactx.ggml.kernels.simd import prefetch
from llamactx.ggml.kernels.wide import fadd16, ffma16s, fload16, fstore16, hload16, htranspose16, wscale, wzero
from llamactx.ggml.vec import hsum_vec, v_expf, vec_max

_F32 = np.float32
TILE = 64  # GGML_FA_TILE_KV: cells per online-softmax step


@numba.njit(cache=True)
def flash_attend(q, k, v, n_head, n_head_kv, cells, n_cells, mask_add, scale, out, n_threads):  # pragma: no cover
    """out (n, n_head * d_v) = flash attention of q (n, n_head * d_k) float32 over the cells each token sees: k
    (n_kv, n_head_kv * d_k) and v (n_kv, n_head_kv * d_v) are an f16 cache's rows as uint16 bits; cells (n, max
    visible) lists token t's n_cells[t] visible cells in cell order, mask_add their mask values. d_k, d_v
    multiples of 16 (checked by the callers). Few tokens over many cells run in three passes split evenly over
    `n_threads` (`_flash_split`); else each thread takes (token block, KV head) groups round robin
    (`_flash_groups`)."""
    n = q.shape[0]
    if n == 0:
        return
    n_pad = (n_cells.max() + TILE - 1) // TILE * TILE
    cl = np.empty((n, max(n_pad, TILE)), np.int64)  # whole tiles of valid rows; slots past m score -inf
    for t in range(n):
        _slot_cells(cells, t, n_cells[t], cl[t])
    if n < 2 * n_threads and n_cells.max() >= SPLIT_MIN_CELLS:
        _flash_split(q, k, v, n_head, n_head_kv, cl, n_cells, mask_add, scale, out, n_threads)
        return
    d_k = q.shape[1] // n_head
    ref, shared = _shared_slots(cl, n_cells)
    blocks = _token_blocks(shared, _block_limit(n, n_head_kv, n_threads))
    n_tiles = (n_cells[ref] + TILE - 1) // TILE if blocks.shape[0] <= n else 0  # of the shared slots
    kt = np.empty((n_head_kv * n_tiles * d_k, TILE), np.float32)  # (n_head_kv * n_tiles * d_k, TILE)
    if n_tiles:
        _k_tiles(k, cl, ref, n_cells[ref], n_head_kv, d_k, kt)
    _flash_groups(q, k, v, n_head, n_head_kv, cl, n_cells, mask_add, scale, out, n_threads, blocks, kt)


@numba.njit(cache=True)
def _k_tile(k, cl, t, r0, hk, d_k, kt, kr0):
    """kt[kr0 + i, s] = K row of slot r0 + s (cell cl[t, r0 + s]), element i of KV head hk, as f32, for s < TILE:
    a tile's K rows transposed, so that 16 slots' scores are one register."""
    for b in range(0, TILE, 16):
        for i in range(0, d_k, 16):
            htranspose16(k, cl, t, r0 + b, hk * d_k + i, kt, kr0 + i, b)


@numba.njit(parallel=True, cache=True)
def _k_tiles(k, cl, t, m, n_head_kv, d_k, kt):  # pragma: no cover
    """Every tile of token t's m slots through `_k_tile`, once for the tokens that share them: tile ti of KV head
    hk at kt rows (hk * n_tiles + ti) * d_k."""
    n_tiles = (m + TILE - 1) // TILE
    for task in numba.prange(n_head_kv * n_tiles):
        hk, ti = task // n_tiles, task % n_tiles
        _k_tile(k, cl, t, ti * TILE, hk, d_k, kt, task * d_k)


@numba.njit(cache=True)
def _shared_slots(cl, n_cells):
    """The token with the most visible cells, and which tokens see a prefix of its slots (a prompt's tokens under
    a causal mask): those read its K tiles, transposed once (`_k_tiles`). -> (ref, shared (n,) bool)"""
    ref = np.argmax(n_cells)
    shared = np.zeros(cl.shape[0], np.bool_)
    for t in range(cl.shape[0]):
        shared[t] = True
        for r in range(n_cells[t]):
            if cl[t, r] != cl[ref, r]:
                shared[t] = False
                break
    return ref, shared


TOKEN_BLOCK = 8  # tokens of a prompt that share their K tiles and V chunks while these are in L1


@numba.njit(cache=True)
def _block_limit(n, n_head_kv, n_threads):
    """Tokens to a block: TOKEN_BLOCK, or fewer where n tokens in blocks of TOKEN_BLOCK would make fewer than two
    (token block, KV head) groups per thread: a speculative draft verified at depth (8 tokens of one sequence,
    SmolLM2's 3 KV heads) made 3 groups for 2 threads, one thread idle a third of the time."""
    want = (2 * n_threads + n_head_kv - 1) // n_head_kv  # blocks
    return max(1, min(TOKEN_BLOCK, (n + want - 1) // want))


@numba.njit(cache=True)
def _token_blocks(shared, limit):
    """Block boundaries over the tokens: runs of up to `limit` consecutive shared tokens, every other token
    alone. -> (n_blocks + 1,) int64; fewer than n + 1 entries when some block holds several tokens."""
    n = shared.shape[0]
    bounds = np.empty(n + 1, np.int64)
    nb, t = 0, 0
    while t < n:
        bounds[nb] = t
        nb += 1
        t1 = t + 1
        if shared[t]:
            while t1 < n and t1 - t < limit and shared[t1]:
                t1 += 1
        t = t1
    bounds[nb] = n
    return bounds[: nb + 1]


@numba.njit(cache=True)
def _store_scores(w, wr, r0, m, mask_add, t, scale, a0, a1, a2, a3):
    """w[wr, r0:r0 + TILE] = the four 16-slot registers times scale, plus the mask; slots past m get -inf."""
    if r0 + TILE <= m:
        fstore16(w, wr, r0, fadd16(wscale(a0, scale), fload16(mask_add, t, r0)))
        fstore16(w, wr, r0 + 16, fadd16(wscale(a1, scale), fload16(mask_add, t, r0 + 16)))
        fstore16(w, wr, r0 + 32, fadd16(wscale(a2, scale), fload16(mask_add, t, r0 + 32)))
        fstore16(w, wr, r0 + 48, fadd16(wscale(a3, scale), fload16(mask_add, t, r0 + 48)))
        return
    fstore16(w, wr, r0, wscale(a0, scale))
    fstore16(w, wr, r0 + 16, wscale(a1, scale))
    fstore16(w, wr, r0 + 32, wscale(a2, scale))
    fstore16(w, wr, r0 + 48, wscale(a3, scale))
    for r in range(r0, r0 + TILE):
        w[wr, r] = w[wr, r] + mask_add[t, r] if r < m else _F32(-np.inf)


@numba.njit(cache=True)
def _tile_scores1(q, t, h, d_k, kt, kr0, mask_add, scale, m, r0, w, wr):
    """w[wr, r0:r0 + TILE] = scaled, masked kq of query head h of token t with the tile's K rows kt[kr0:kr0 +
    d_k] (d_k, TILE): per slot one FMA chain over the head dimension (the four 16-slot registers' chains
    interleaved); slots past m get -inf."""
    a0 = a1 = a2 = a3 = wzero()
    qo = h * d_k
    for i in range(d_k):
        x = q[t, qo + i]
        a0 = ffma16s(a0, fload16(kt, kr0 + i, 0), x)
        a1 = ffma16s(a1, fload16(kt, kr0 + i, 16), x)
        a2 = ffma16s(a2, fload16(kt, kr0 + i, 32), x)
        a3 = ffma16s(a3, fload16(kt, kr0 + i, 48), x)
    _store_scores(w, wr, r0, m, mask_add, t, scale, a0, a1, a2, a3)


@numba.njit(cache=True)
def _tile_scores3(q, t, h, d_k, kt, kr0, mask_add, scale, m, r0, w, wr):
    """`_tile_scores1` of query heads h..h+2 into rows wr..wr+2: twelve chains in flight instead of four (one
    head's four wait on the FMA latency), each K element loaded once for the three."""
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = wzero()
    qa, qb, qc = h * d_k, (h + 1) * d_k, (h + 2) * d_k
    for i in range(d_k):
        k0, k1 = fload16(kt, kr0 + i, 0), fload16(kt, kr0 + i, 16)
        k2, k3 = fload16(kt, kr0 + i, 32), fload16(kt, kr0 + i, 48)
        x, y, z = q[t, qa + i], q[t, qb + i], q[t, qc + i]
        a0, a1, a2, a3 = ffma16s(a0, k0, x), ffma16s(a1, k1, x), ffma16s(a2, k2, x), ffma16s(a3, k3, x)
        b0, b1, b2, b3 = ffma16s(b0, k0, y), ffma16s(b1, k1, y), ffma16s(b2, k2, y), ffma16s(b3, k3, y)
        c0, c1, c2, c3 = ffma16s(c0, k0, z), ffma16s(c1, k1, z), ffma16s(c2, k2, z), ffma16s(c3, k3, z)
    _store_scores(w, wr, r0, m, mask_add, t, scale, a0, a1, a2, a3)
    _store_scores(w, wr + 1, r0, m, mask_add, t, scale, b0, b1, b2, b3)
    _store_scores(w, wr + 2, r0, m, mask_add, t, scale, c0, c1, c2, c3)


@numba.njit(cache=True)
def _tile_scores(q, t, h, nh, d_k, kt, kr0, mask_add, scale, m, r0, w, wr):
    """`_tile_scores1` of query heads h..h+nh-1 (those of one KV head) into rows wr..wr+nh-1, three at a time."""
    n3 = nh - nh % 3
    for g in range(0, n3, 3):
        _tile_scores3(q, t, h + g, d_k, kt, kr0, mask_add, scale, m, r0, w, wr + g)
    for g in range(n3, nh):
        _tile_scores1(q, t, h + g, d_k, kt, kr0, mask_add, scale, m, r0, w, wr + g)


@numba.njit(cache=True, error_model="numpy")
def _online_soft_max(w, m, e, f):  # pragma: no cover - compiled
    """The tiled kernel's online softmax over w[:m] (scaled, masked scores; -inf up to the tile's end): e gets
    each tile's `ggml_v_expf(kq - M)` (zeros for a tile without a visible cell), f[tile] the factor VKQ is scaled
    by before the tile (`expf(M_old - M)` on a new max, else 1: the same bits as not scaling). -> S"""
    big_m = _F32(-np.inf)
    s = _F32(0.0)
    for ti in range((m + TILE - 1) // TILE):
        r0 = ti * TILE
        wt, et = w[r0 : r0 + TILE], e[r0 : r0 + TILE]
        tile_max = vec_max(wt, TILE)
        f[ti] = _F32(1.0)
        if tile_max == _F32(-np.inf):
            et[:] = _F32(0.0)
            continue
        m_new = max(big_m, tile_max)
        if m_new > big_m:
            ms = _F32(math.exp(big_m - m_new))
            f[ti] = ms
            s = s * ms
        big_m = m_new
        for j in range(TILE):
            et[j] = v_expf(wt[j] - m_new)
        tot = 0.0
        for g in range(0, TILE, F32_EPR):  # ggml_vec_soft_max_f32's groups (16 lanes AVX-512, 8 AVX2)
            tot += np.float64(hsum_vec(et, g))
        s = _F32(np.float64(s) + tot)
    return s


@numba.njit(cache=True, inline="always")
def _cols4(j, d_v):
    """The first columns of the four 16-column registers from column j. Past d_v a register repeats the last one
    (computed, never stored), so that the loops have no branch for a narrow tail. -> (j0, j1, j2, j3, stored)"""
    return j, min(j + 16, d_v - 16), min(j + 32, d_v - 16), min(j + 48, d_v - 16), min(4, (d_v - j) // 16)


@numba.njit(cache=True, inline="always")
def _tile_scale(a0, a1, a2, a3, f, row, r):
    """At a tile's first slot r, the registers times the tile's factor f[row, tile] (unless it is 1)."""
    if r % TILE == 0 and f[row, r // TILE] != _F32(1.0):
        x = f[row, r // TILE]
        return wscale(a0, x), wscale(a1, x), wscale(a2, x), wscale(a3, x)
    return a0, a1, a2, a3


@numba.njit(cache=True)
def _store4(x, row, col, nb, a0, a1, a2, a3):
    """Store the first nb (1-4) registers at x[row, col + 16 i]."""
    fstore16(x, row, col, a0)
    if nb > 1:
        fstore16(x, row, col + 16, a1)
    if nb > 2:
        fstore16(x, row, col + 32, a2)
    if nb > 3:
        fstore16(x, row, col + 48, a3)


@numba.njit(cache=True, inline="always")
def _p_fma4(a, p, w0, w1, w2, w3):
    """One head's four registers += p * a V row's four 16-column pieces, skipped for a zero probability."""
    if p != _F32(0.0):
        return ffma16s(a[0], w0, p), ffma16s(a[1], w1, p), ffma16s(a[2], w2, p), ffma16s(a[3], w3, p)
    return a


@numba.njit(cache=True)
def _chunk_vkq(vf, c0, c1, x, nh, j0, j1, j2, j3, e, f, a, b, c):
    """Slots c0..c1-1 of the widened chunk vf (row r - c0) into the chains of nh (1 or 3) heads, rows x.. of e / f,
    their 64 columns' registers a, b, c (b and c unused for one head): tile by tile, the factor at a tile's start,
    then its slots, each V piece loaded once for the heads."""
    r = c0
    while r < c1:
        a = _tile_scale(a[0], a[1], a[2], a[3], f, x, r)
        if nh == 3:
            b = _tile_scale(b[0], b[1], b[2], b[3], f, x + 1, r)
            c = _tile_scale(c[0], c[1], c[2], c[3], f, x + 2, r)
        r_end = min(c1, (r // TILE + 1) * TILE)
        for rr in range(r, r_end):
            w0, w1 = fload16(vf, rr - c0, j0), fload16(vf, rr - c0, j1)
            w2, w3 = fload16(vf, rr - c0, j2), fload16(vf, rr - c0, j3)
            a = _p_fma4(a, e[x, rr], w0, w1, w2, w3)
            if nh == 3:
                b = _p_fma4(b, e[x + 1, rr], w0, w1, w2, w3)
                c = _p_fma4(c, e[x + 2, rr], w0, w1, w2, w3)
        r = r_end
    return a, b, c


@numba.njit(cache=True)
def _chain_start(acc, x, c0, j0, j1, j2, j3):
    """Row x's four registers: zero at the first chunk, else the chains carried in acc."""
    if c0 == 0:
        z = wzero()
        return z, z, z, z
    return fload16(acc, x, j0), fload16(acc, x, j1), fload16(acc, x, j2), fload16(acc, x, j3)


@numba.njit(cache=True)
def _chain_end(acc, x, j0, j1, j2, j3, a, more, s, out, t, col, nb):
    """Carry row x's chains in acc when more chunks follow, else out[t, col..] = the first nb registers / S. (A
    register past d_v stores the same values as the one it repeats.)"""
    if more:
        fstore16(acc, x, j0, a[0])
        fstore16(acc, x, j1, a[1])
        fstore16(acc, x, j2, a[2])
        fstore16(acc, x, j3, a[3])
        return
    inv = _F32(0.0) if s[x] == _F32(0.0) else _F32(1.0) / s[x]
    _store4(out, t, col, nb, wscale(a[0], inv), wscale(a[1], inv), wscale(a[2], inv), wscale(a[3], inv))


@numba.njit(cache=True)
def _block_values(v, cl, t0, t1, hk, gqa, d_v, n_cells, e, f, s, acc, vf, out):
    """out[t, columns of query head g of KV head hk] for the tokens t0..t1-1 of a block that see prefixes of the
    same slots = (sum over slots of e[x, r] * V row of slot r, one FMA chain per column, scaled by f[x, tile] at
    each tile's start) / s[x], x = (t - t0) * gqa + g. V rows are widened to f32 a chunk at a time (vf), once for
    the block's tokens and heads; acc (block * gqa, d_v) carries the chains across chunks. A token's heads go three
    at a time (twelve chains in flight), the rest one at a time."""
    chunk = v_chunk(d_v)
    n3 = gqa - gqa % 3
    ref, m_max = t0, 0
    for t in range(t0, t1):
        if n_cells[t] > m_max:
            ref, m_max = t, n_cells[t]
    for c0 in range(0, max(m_max, 1), chunk):
        c1_all = min(c0 + chunk, m_max)
        _widen_rows(v, cl[ref], c0, c1_all - c0, hk * d_v, d_v, vf)
        for t in range(t0, t1):
            m = n_cells[t]
            if c0 >= max(m, 1):
                continue
            c1 = min(c1_all, m)
            g = 0
            while g < gqa:  # three heads at a time, then one
                nh = 3 if g < n3 else 1
                x, col = (t - t0) * gqa + g, (hk * gqa + g) * d_v
                for j in range(0, d_v, 64):
                    j0, j1, j2, j3, nb = _cols4(j, d_v)
                    a = _chain_start(acc, x, c0, j0, j1, j2, j3)
                    b = c = a
                    if nh == 3:
                        b = _chain_start(acc, x + 1, c0, j0, j1, j2, j3)
                        c = _chain_start(acc, x + 2, c0, j0, j1, j2, j3)
                    a, b, c = _chunk_vkq(vf, c0, c1, x, nh, j0, j1, j2, j3, e, f, a, b, c)
                    _chain_end(acc, x, j0, j1, j2, j3, a, c1 < m, s, out, t, col + j, nb)
                    if nh == 3:
                        _chain_end(acc, x + 1, j0, j1, j2, j3, b, c1 < m, s, out, t, col + d_v + j, nb)
                        _chain_end(acc, x + 2, j0, j1, j2, j3, c, c1 < m, s, out, t, col + 2 * d_v + j, nb)
                g += nh


@numba.njit(parallel=True, cache=True)
def _flash_groups(q, k, v, n_head, n_head_kv, cl, n_cells, mask_add, scale, out, n_threads, blocks,
                  kts):  # pragma: no cover
    """`flash_attend` with (token block, KV head) groups dealt round robin to the threads, each with its own
    scratch. blocks (n_blocks + 1,): block b is tokens blocks[b]..blocks[b+1]-1; a block of more than one token
    sees prefixes of the shared slots, reads their K tiles in kts (`_k_tiles`) and widens their V rows once; a
    single token of its own transposes its own."""
    d_k = q.shape[1] // n_head
    d_v = v.shape[1] // n_head_kv
    gqa = n_head // n_head_kv
    n_b = blocks.shape[0] - 1
    n_g = n_b * n_head_kv
    n_tasks = max(min(n_threads, n_g), 1)
    m_max = cl.shape[1]
    tb = 1
    for b in range(n_b):
        tb = max(tb, blocks[b + 1] - blocks[b])
    shared_tiles = kts.shape[0] // d_k // n_head_kv
    for task in numba.prange(n_tasks):
        w = np.empty((tb * gqa, m_max), np.float32)  # row (t - t0) * gqa + g
        e = np.empty((tb * gqa, m_max), np.float32)
        f = np.empty((tb * gqa, m_max // TILE), np.float32)
        s = np.empty(tb * gqa, np.float32)
        kt = np.empty((d_k, TILE), np.float32)
        acc = np.empty((tb * gqa, d_v), np.float32)
        vf = np.empty((v_chunk(d_v), d_v), np.float32)
        for p in range(task, n_g, n_tasks):
            b = p // n_head_kv
            hk = p - b * n_head_kv
            t0, t1 = blocks[b], blocks[b + 1]
            m_b = 0
            for t in range(t0, t1):
                m_b = max(m_b, n_cells[t])
            for ti in range((m_b + TILE - 1) // TILE):  # a tile's K rows for every token of the block
                if t1 - t0 > 1:
                    src, kr0 = kts, (hk * shared_tiles + ti) * d_k
                else:
                    _k_tile(k, cl, t0, ti * TILE, hk, d_k, kt, 0)
                    src, kr0 = kt, 0
                for t in range(t0, t1):
                    m = n_cells[t]
                    if ti * TILE < m:
                        _tile_scores(q, t, hk * gqa, gqa, d_k, src, kr0, mask_add, scale, m, ti * TILE, w,
                                     (t - t0) * gqa)
            for t in range(t0, t1):
                for g in range(gqa):
                    x = (t - t0) * gqa + g
                    s[x] = _online_soft_max(w[x], n_cells[t], e[x], f[x])
            _block_values(v, cl, t0, t1, hk, gqa, d_v, n_cells, e, f, s, acc, vf, out)


@numba.njit(cache=True)
def _prefetch_rows(src, ct, r0, r1, col0, width):
    """Prefetch columns col0..col0+width-1 of the f16 rows of slots r0..r1-1 (cells ct[r]; slots past ct's end are
    skipped): every 64-byte line, the last one too (a row need not start on a line)."""
    for r in range(r0, min(r1, ct.shape[0])):
        c = ct[r]
        for j in range(0, width, 32):
            prefetch(src, c, col0 + j)
        prefetch(src, c, col0 + width - 1)


@numba.njit(cache=True)
def _k_tile_ahead(k, cl, t, r0, hk, d_k, kt, r_next, r_end):
    """`_k_tile` of the slots from r0, the same columns of the slots from r_next (below r_end) prefetched 16 rows
    at a time as it goes (a cache at depth comes from DRAM)."""
    for b in range(0, TILE, 16):
        _prefetch_rows(k, cl[t], r_next + b, min(r_next + b + 16, r_end), hk * d_k, d_k)
        for i in range(0, d_k, 16):
            htranspose16(k, cl, t, r0 + b, hk * d_k + i, kt, i, b)


@numba.njit(parallel=True, cache=True)
def _split_scores(q, k, n_head, n_head_kv, cl, n_cells, mask_add, scale, w, n_blocks):  # pragma: no cover
    """w[t, h, r] = scaled, masked kq of every slot, in (token, run of tiles) tasks over all heads: each thread
    transposes its own contiguous share of the K rows, once per KV head, the next tile's rows prefetched."""
    n = q.shape[0]
    d_k = q.shape[1] // n_head
    gqa = n_head // n_head_kv
    for task in numba.prange(n * n_blocks):
        t, b = task // n_blocks, task % n_blocks
        m = n_cells[t]
        n_tiles = (m + TILE - 1) // TILE
        kt = np.empty((d_k, TILE), np.float32)
        ti1 = (b + 1) * n_tiles // n_blocks
        r_end = min(ti1 * TILE, m)  # nothing past the task's share
        for ti in range(b * n_tiles // n_blocks, ti1):
            for hk in range(n_head_kv):
                _k_tile_ahead(k, cl, t, ti * TILE, hk, d_k, kt, (ti + 1) * TILE, r_end)
                _tile_scores(q, t, hk * gqa, gqa, d_k, kt, 0, mask_add, scale, m, ti * TILE, w[t], hk * gqa)


@numba.njit(parallel=True, cache=True)
def _split_soft_max(w, n_cells, e, f, s):  # pragma: no cover
    """`_online_soft_max` of every (token, head): e, f, s[t, h]."""
    n, n_head = w.shape[0], w.shape[1]
    for task in numba.prange(n * n_head):
        t, h = task // n_head, task % n_head
        s[t, h] = _online_soft_max(w[t, h], n_cells[t], e[t, h], f[t, h])


@numba.njit(cache=True, inline="always")
def _pair_scale(a0, a1, f, t, h, r):
    """At a tile's first slot r, head h's two registers times its factor f[t, h, tile] (unless it is 1)."""
    if r % TILE == 0 and f[t, h, r // TILE] != _F32(1.0):
        x = f[t, h, r // TILE]
        return wscale(a0, x), wscale(a1, x)
    return a0, a1


@numba.njit(cache=True, inline="always")
def _pair_fma(a0, a1, x0, x1, p):
    """The two registers' chains += p * V columns (x0, x1), skipped for a zero probability."""
    if p != _F32(0.0):
        return ffma16s(a0, x0, p), ffma16s(a1, x1, p)
    return a0, a1


@numba.njit(cache=True, inline="always")
def _pair_start(acc, t, h, j0, j1, r0):
    """Head h's two registers for columns j0, j1: zero at the first slot, else the chains carried in acc."""
    if r0 == 0:
        return wzero(), wzero()
    return fload16(acc[t], h, j0), fload16(acc[t], h, j1)


@numba.njit(cache=True)
def _pair_end(acc, out, t, h, d_v, j, nb, s, last, a0, a1):
    """Carry head h's chains in acc (columns j.. of acc[t, h]) unless the slots are done; then out[t, columns j..
    of head h] = the first nb (1-2) registers / S. (A repeated register stores the same values.)"""
    if not last:
        fstore16(acc[t], h, j, a0)
        fstore16(acc[t], h, min(j + 16, d_v - 16), a1)
        return
    inv = _F32(0.0) if s[t, h] == _F32(0.0) else _F32(1.0) / s[t, h]
    _store4(out, t, h * d_v + j, nb, wscale(a0, inv), wscale(a1, inv), a1, a1)


@numba.njit(cache=True)
def _values3(v, t, h, col, j, d_v, ct, r0, r1, last, e, f, s, acc, out):
    """VKQ of query heads h..h+2 (one KV head, V columns from col) for 32 columns from j over slots r0..r1-1:
    six chains continued from acc (from zero at slot 0), each V element read and widened once for the three; the
    same columns one chunk ahead prefetched. last: the slots are done, out = VKQ / S."""
    j0, j1, nb = j, min(j + 16, d_v - 16), min(2, (d_v - j) // 16)
    a0, a1 = _pair_start(acc, t, h, j0, j1, r0)
    b0, b1 = _pair_start(acc, t, h + 1, j0, j1, r0)
    c0, c1 = _pair_start(acc, t, h + 2, j0, j1, r0)
    n_ct = ct.shape[0]
    for r in range(r0, r1):
        prefetch(v, ct[min(r + V_AHEAD, n_ct - 1)], col + j0)
        a0, a1 = _pair_scale(a0, a1, f, t, h, r)
        b0, b1 = _pair_scale(b0, b1, f, t, h + 1, r)
        c0, c1 = _pair_scale(c0, c1, f, t, h + 2, r)
        x0, x1 = hload16(v, ct[r], col + j0), hload16(v, ct[r], col + j1)
        a0, a1 = _pair_fma(a0, a1, x0, x1, e[t, h, r])
        b0, b1 = _pair_fma(b0, b1, x0, x1, e[t, h + 1, r])
        c0, c1 = _pair_fma(c0, c1, x0, x1, e[t, h + 2, r])
    _pair_end(acc, out, t, h, d_v, j, nb, s, last, a0, a1)
    _pair_end(acc, out, t, h + 1, d_v, j, nb, s, last, b0, b1)
    _pair_end(acc, out, t, h + 2, d_v, j, nb, s, last, c0, c1)


@numba.njit(cache=True)
def _values1(v, t, h, col, j, d_v, ct, r0, r1, last, e, f, s, acc, out):
    """`_values3` for one query head."""
    j0, j1, nb = j, min(j + 16, d_v - 16), min(2, (d_v - j) // 16)
    a0, a1 = _pair_start(acc, t, h, j0, j1, r0)
    n_ct = ct.shape[0]
    for r in range(r0, r1):
        prefetch(v, ct[min(r + V_AHEAD, n_ct - 1)], col + j0)
        a0, a1 = _pair_scale(a0, a1, f, t, h, r)
        p = e[t, h, r]
        if p != _F32(0.0):
            a0, a1 = _pair_fma(a0, a1, hload16(v, ct[r], col + j0), hload16(v, ct[r], col + j1), p)
    _pair_end(acc, out, t, h, d_v, j, nb, s, last, a0, a1)


@numba.njit(cache=True, inline="always")
def _quad_scale(a, f, t, h, r):
    """At a tile's first slot r, head h's four registers times its factor f[t, h, tile] (unless it is 1)."""
    if r % TILE == 0 and f[t, h, r // TILE] != _F32(1.0):
        x = f[t, h, r // TILE]
        return wscale(a[0], x), wscale(a[1], x), wscale(a[2], x), wscale(a[3], x)
    return a


@numba.njit(cache=True)
def _quad_start(acc, t, h, j, r0):
    """Head h's four registers for columns j..j+63: zero at the first slot, else the chains carried in acc."""
    if r0 == 0:
        z = wzero()
        return z, z, z, z
    x = acc[t]
    return fload16(x, h, j), fload16(x, h, j + 16), fload16(x, h, j + 32), fload16(x, h, j + 48)


@numba.njit(cache=True)
def _quad_end(acc, out, t, h, d_v, j, s, last, a):
    """`_pair_end` for four registers (columns j..j+63, all stored)."""
    if not last:
        x = acc[t]
        fstore16(x, h, j, a[0])
        fstore16(x, h, j + 16, a[1])
        fstore16(x, h, j + 32, a[2])
        fstore16(x, h, j + 48, a[3])
        return
    inv = _F32(0.0) if s[t, h] == _F32(0.0) else _F32(1.0) / s[t, h]
    _store4(out, t, h * d_v + j, 4, wscale(a[0], inv), wscale(a[1], inv), wscale(a[2], inv), wscale(a[3], inv))


@numba.njit(cache=True)
def _values3w(v, t, h, col, j, d_v, ct, r0, r1, last, e, f, s, acc, out):
    """`_values3` for 64 columns from j (j + 64 <= d_v): twelve chains, so that each probability's load,
    broadcast and zero test serve four registers instead of two. The same sums in the same order."""
    a = _quad_start(acc, t, h, j, r0)
    b = _quad_start(acc, t, h + 1, j, r0)
    c = _quad_start(acc, t, h + 2, j, r0)
    n_ct = ct.shape[0]
    for r in range(r0, r1):
        ahead = ct[min(r + V_AHEAD, n_ct - 1)]
        prefetch(v, ahead, col + j)
        prefetch(v, ahead, col + j + 32)
        a = _quad_scale(a, f, t, h, r)
        b = _quad_scale(b, f, t, h + 1, r)
        c = _quad_scale(c, f, t, h + 2, r)
        x0, x1 = hload16(v, ct[r], col + j), hload16(v, ct[r], col + j + 16)
        x2, x3 = hload16(v, ct[r], col + j + 32), hload16(v, ct[r], col + j + 48)
        a = _p_fma4(a, e[t, h, r], x0, x1, x2, x3)
        b = _p_fma4(b, e[t, h + 1, r], x0, x1, x2, x3)
        c = _p_fma4(c, e[t, h + 2, r], x0, x1, x2, x3)
    _quad_end(acc, out, t, h, d_v, j, s, last, a)
    _quad_end(acc, out, t, h + 1, d_v, j, s, last, b)
    _quad_end(acc, out, t, h + 2, d_v, j, s, last, c)


WIDE_VALUES = F32_EPR == 16  # 64-column tasks: twelve chains fit in 512-bit registers (24 of 32 zmm), not AVX2's
V_SLOTS = 256  # decode at depth: the values pass takes the slots a chunk at a time (a multiple of TILE) ...
V_AHEAD = 64  # ... each task's columns of the V row this many slots ahead prefetched (256: slower from DRAM)


@numba.njit(parallel=True, cache=True)
def _split_values(v, n_head, n_head_kv, cl, n_cells, e, f, s, acc, out, n_threads):  # pragma: no cover
    """out = VKQ / S over (token, KV head, 32-column block) units, a contiguous run of them per thread: chunk by
    chunk of V_SLOTS slots, each unit streams its columns of the chunk's V rows, read and widened in place, for
    the group's query heads three at a time (one FMA chain per column and head, carried across chunks in acc
    (n, n_head, d_v)). Two units of one head's 64-column block that fall to the same thread run as one
    (`_values3w`) where WIDE_VALUES. A thread's units read neighbouring lines of the same rows, close together
    in time."""
    n = e.shape[0]
    d_v = v.shape[1] // n_head_kv
    gqa = n_head // n_head_kv
    n3 = gqa - gqa % 3
    n_col = (d_v + 31) // 32
    n_tasks = n * n_head_kv * n_col
    n_workers = max(1, min(n_threads, n_tasks))
    m_all = max(n_cells.max(), 1)
    for wk in numba.prange(n_workers):
        u1 = (wk + 1) * n_tasks // n_workers
        for c0 in range(0, m_all, V_SLOTS):
            u = wk * n_tasks // n_workers
            while u < u1:
                t, rest = u // (n_head_kv * n_col), u % (n_head_kv * n_col)
                hk, j = rest // n_col, rest % n_col * 32
                wide = WIDE_VALUES and j % 64 == 0 and j + 64 <= d_v and u + 1 < u1
                m = n_cells[t]
                if c0 == 0 or c0 < m:
                    r1, last = min(c0 + V_SLOTS, m), c0 + V_SLOTS >= m
                    for g in range(0, n3, 3):  # three heads at a time, then one
                        if wide:
                            _values3w(v, t, hk * gqa + g, hk * d_v, j, d_v, cl[t], c0, r1, last, e, f, s, acc, out)
                        else:
                            _values3(v, t, hk * gqa + g, hk * d_v, j, d_v, cl[t], c0, r1, last, e, f, s, acc, out)
                    for g in range(n3, gqa):
                        _values1(v, t, hk * gqa + g, hk * d_v, j, d_v, cl[t], c0, r1, last, e, f, s, acc, out)
                        if wide:
                            _values1(v, t, hk * gqa + g, hk * d_v, j + 32, d_v, cl[t], c0, r1, last, e, f, s, acc,
                                     out)
                u += 2 if wide else 1


@numba.njit(cache=True)
def _flash_split(q, k, v, n_head, n_head_kv, cl, n_cells, mask_add, scale, out, n_threads):  # pragma: no cover
    """`flash_attend` for few tokens over many cells: scores split over runs of tiles, the online softmax per
    head, VKQ split over heads and column blocks; the same sums in the same order as `_flash_groups`."""
    n = q.shape[0]
    n_pad = cl.shape[1]
    w = np.empty((n, n_head, n_pad), np.float32)
    e = np.empty((n, n_head, n_pad), np.float32)
    f = np.empty((n, n_head, n_pad // TILE), np.float32)
    s = np.empty((n, n_head), np.float32)
    acc = np.empty((n, n_head, v.shape[1] // n_head_kv), np.float32)  # (n, n_head, d_v) VKQ between chunks
    _split_scores(q, k, n_head, n_head_kv, cl, n_cells, mask_add, scale, w, 4 * n_threads)
    _split_soft_max(w, n_cells, e, f, s)
    _split_values(v, n_head, n_head_kv, cl, n_cells, e, f, s, acc, out, n_threads)

"""The scale searches of ggml's quantizers (ggml-quants.c, ggml-base): `nearest_int`, `make_qx_quants`,
`make_q3_quants`, `make_qkx2_quants`, `make_qkx3_quants`, `make_qp_quants`, and the float32 -> fp16 rounding
(`GGML_FP32_TO_FP16`). quantize_rows.py builds the row quantizers of each type from them.

Bit-exact with the C: every operation is a float32 operation in the C's order (ggml-base is compiled with -O3
for plain x86-64, no -ffast-math and no FMA, so each `a*b + c` rounds twice and no sum is reordered). An int
multiplying a float is converted to float32 first, as C does; constants are float32 (`0.1f`). nearest_int's
magic-number trick (add 1.5 * 2^23 in float32) is round-half-to-even, which is `np.rint`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)
ZERO = F32(0.0)
ONE = F32(1.0)
TENTH = F32(0.1)


@njit(cache=True, inline="always")
def nearest_int(fval):
    """ggml-quants.c `nearest_int`: round half to even (|fval| <= 4194303)."""
    return int(np.rint(fval))


@njit(cache=True)
def fp16_round(f):
    """GGML_FP32_TO_FP16 then GGML_FP16_TO_FP32: (fp16 bits as int, the float32 they hold). Round to nearest even,
    overflow to inf, subnormals kept (ggml_compute_fp32_to_fp16). NaN is not expected here."""
    a = abs(float(f))
    sign = 0x8000 if f < 0 else 0
    if a == 0.0:
        return sign, F32(f)
    m, e = math.frexp(a)  # a = m * 2^e, m in [0.5, 1)
    ulp = math.ldexp(1.0, max(e - 11, -24))
    q = np.rint(a / ulp) * ulp  # exact: a power-of-two scale
    if q > 65504.0:
        return sign | 0x7C00, F32(-np.inf if sign else np.inf)
    if q < 6.103515625e-05:  # 2^-14: subnormal
        bits = int(q / 5.960464477539063e-08)
    else:
        m, e = math.frexp(q)
        bits = ((e - 1 + 15) << 10) | int((m * 2.0 - 1.0) * 1024.0)
    return sign | bits, F32(-q if sign else q)


@njit(cache=True)
def make_qx_quants(n, nmax, x, L, rmse_type, qw, use_qw):
    """ggml-quants.c `make_qx_quants`: symmetric levels L in [0, 2*nmax) and their scale; weights qw when
    use_qw, else x^2 (rmse_type 1)."""
    mx = ZERO
    amax = ZERO
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return ZERO
    fnmax = F32(nmax)
    iscale = F32(-fnmax) / mx
    sumlx = ZERO
    suml2 = ZERO
    for i in range(n):
        lv = nearest_int(iscale * x[i])
        lv = max(-nmax, min(nmax - 1, lv))
        L[i] = lv + nmax
        w = qw[i] if use_qw else x[i] * x[i]
        fl = F32(lv)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != 0 else ZERO
    best = scale * sumlx
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        iscale = -(fnmax + TENTH * F32(is_)) / mx
        sumlx = ZERO
        suml2 = ZERO
        for i in range(n):
            lv = nearest_int(iscale * x[i])
            lv = max(-nmax, min(nmax - 1, lv))
            w = qw[i] if use_qw else x[i] * x[i]
            fl = F32(lv)
            sumlx += w * x[i] * fl
            suml2 += w * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                lv = nearest_int(iscale * x[i])
                L[i] = nmax + max(-nmax, min(nmax - 1, lv))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True)
def make_q3_quants(n, nmax, x, L):
    """ggml-quants.c `make_q3_quants` with do_rmse (the only way Q3_K's reference quantizer calls it)."""
    mx = ZERO
    amax = ZERO
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return ZERO
    iscale = F32(-nmax) / mx
    sumlx = ZERO
    suml2 = ZERO
    for i in range(n):
        lv = nearest_int(iscale * x[i])
        lv = max(-nmax, min(nmax - 1, lv))
        L[i] = lv
        w = x[i] * x[i]
        sumlx += w * x[i] * F32(lv)
        suml2 += w * F32(lv) * F32(lv)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            li = F32(L[i])
            slx = sumlx - w * x[i] * li
            if slx > 0:
                sl2 = suml2 - w * li * li
                new_l = nearest_int(x[i] * sl2 / slx)
                new_l = max(-nmax, min(nmax - 1, new_l))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else ZERO


@njit(cache=True)
def make_qkx(n, nmax, x, weights, use_w, L, Laux, rmin, rdelta, nstep, use_mad, x3):
    """ggml-quants.c `make_qkx2_quants` (x3 False) and `make_qkx3_quants` (x3 True; weights x^2 unless use_w):
    asymmetric levels L in [0, nmax], returns (scale, the_min)."""
    mn = x[0]
    mxv = x[0]
    sum_w = weights[0] if use_w else x[0] * x[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mxv:
            mxv = x[i]
        w = weights[i] if use_w else x[i] * x[i]
        sum_w += w
        sum_x += w * x[i]
    if mn > 0:
        mn = ZERO
    if (mxv <= mn) if x3 else (mxv == mn):
        for i in range(n):
            L[i] = 0
        return ZERO, -mn
    fnmax = F32(nmax)
    iscale = fnmax / (mxv - mn)
    scale = ONE / iscale
    best_error = ZERO
    for i in range(n):
        lv = nearest_int(iscale * (x[i] - mn))
        L[i] = max(0, min(nmax, lv))
        diff = scale * F32(L[i]) + mn - x[i]
        diff = abs(diff) if use_mad else diff * diff
        w = weights[i] if use_w else x[i] * x[i]
        best_error += w * diff
    if nstep < 1:
        return scale, -mn
    for is_ in range(nstep + 1):
        iscale = (rmin + rdelta * F32(is_) + fnmax) / (mxv - mn)
        sum_l = ZERO
        sum_l2 = ZERO
        sum_xl = ZERO
        for i in range(n):
            lv = nearest_int(iscale * (x[i] - mn))
            lv = max(0, min(nmax, lv))
            Laux[i] = lv
            w = weights[i] if use_w else x[i] * x[i]
            fl = F32(lv)
            sum_l += w * fl
            sum_l2 += w * fl * fl
            sum_xl += w * fl * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = ZERO
                this_scale = sum_xl / sum_l2
            cur_error = ZERO
            for i in range(n):
                diff = this_scale * F32(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                w = weights[i] if use_w else x[i] * x[i]
                cur_error += w * diff
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(cache=True)
def make_qp_quants(n, nmax, x, L, quant_weights):
    """ggml-quants.c `make_qp_quants`: levels in [0, nmax] for non-negative x (the sub-block scales / mins)."""
    mx = ZERO
    for i in range(n):
        mx = max(mx, x[i])
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return ZERO
    fnmax = F32(nmax)
    iscale = fnmax / mx
    for i in range(n):
        L[i] = nearest_int(iscale * x[i])
    scale = ONE / iscale
    best_mse = ZERO
    for i in range(n):
        diff = x[i] - scale * F32(L[i])
        best_mse += quant_weights[i] * diff * diff
    for is_ in range(-4, 5):
        if is_ == 0:
            continue
        iscale_is = (TENTH * F32(is_) + fnmax) / mx
        scale_is = ONE / iscale_is
        mse = ZERO
        for i in range(n):
            lv = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * F32(lv)
            mse += quant_weights[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = ZERO
    suml2 = ZERO
    for i in range(n):
        lv = min(nmax, nearest_int(iscale * x[i]))
        L[i] = lv
        w = quant_weights[i]
        sumlx += w * x[i] * F32(lv)
        suml2 += w * F32(lv) * F32(lv)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = quant_weights[i]
            li = F32(L[i])
            slx = sumlx - w * x[i] * li
            sl2 = suml2 - w * li * li
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else ZERO


@njit(cache=True)
def best_neighbour(neigh, off, grid, xval, weight, scale, L):
    """iq2_find_best_neighbour / iq3_find_best_neighbour: among the grid rows listed at neigh[off] (a count, then
    the indices), the one minimizing sum_i weight_i (scale * grid_i - xval_i)^2 over its width (8 for IQ2, 4 for
    IQ3), summed in element order; its levels (grid - 1) / 2 into L. -> its grid index."""
    best_d2 = F32(np.finfo(np.float32).max)
    grid_index = -1
    width = grid.shape[1]
    for j in range(1, int(neigh[off]) + 1):
        g = int(neigh[off + j])
        d2 = ZERO
        for i in range(width):
            diff = scale * F32(grid[g, i]) - xval[i]
            d2 += weight[i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            grid_index = g
    for i in range(width):
        L[i] = (grid[grid_index, i] - 1) // 2
    return grid_index


@njit(cache=True)
def grid_code(L, k, width, bits):
    """The kmap key of group k of L: its `width` levels packed `bits` apiece, first level lowest."""
    u = 0
    for i in range(width):
        u |= int(L[width * k + i]) << (bits * i)
    return u


def iq2_grid_tables(magnitudes: np.ndarray, nwant: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """iq2xs_init_impl for a grid of 8 levels in {1, 3, 5} (IQ2_XXS's 256 points, IQ2_XS's 512, IQ2_S's 1024):
    magnitudes (n, 8) uint8 as ggml-common.h stores them (0x08, 0x19, 0x2b) -> grid (n, 8) int8 (kgrid's 2l + 1),
    kmap (43692,) int32 (grid index, or -(offset + 1) into neighbours), neighbours (uint16: a count, then grid
    indices sorted by (distance, index) up to the `nwant`-th distinct distance)."""
    n = magnitudes.shape[0]
    grid = np.select([magnitudes == 8, magnitudes == 25], [1, 3], 5).astype(np.int8)
    g32 = grid.astype(np.int32)  # (n, 8)
    shifts = 2 * np.arange(8)
    kmap = np.full(43692, -1, np.int32)
    kmap[((g32 - 1) // 2 << shifts).sum(axis=1)] = np.arange(n)
    return grid, kmap, iq2_neighbour_lists(g32, kmap, nwant)


@njit(cache=True)
def iq2_neighbour_lists(g32, kmap, nwant):
    """The neighbour lists of iq2xs_init_impl: for each kmap key off the grid (ascending), a count then the grid
    indices ordered by (distance, index) (iq2_compare_func) up to the nwant-th distinct distance; the key's kmap
    entry becomes -(offset + 1). -> neighbours (uint16)."""
    n = g32.shape[0]
    d2 = np.zeros(n, np.int32)
    pos = np.zeros(8, np.int32)
    out = np.zeros(1 << 20, np.uint16)
    used = 0
    for key in range(kmap.shape[0]):
        if kmap[key] >= 0:
            continue
        for k in range(8):
            pos[k] = 2 * ((key >> (2 * k)) & 3) + 1
        for j in range(n):
            d = 0
            for k in range(8):
                diff = g32[j, k] - pos[k]
                d += diff * diff
            d2[j] = d
        levels = np.full(nwant, 1 << 30, np.int32)  # the nwant smallest distinct distances, ascending
        for j in range(n):
            for m in range(nwant):
                if d2[j] == levels[m]:
                    break
                if d2[j] < levels[m]:
                    levels[m + 1:] = levels[m:nwant - 1].copy()
                    levels[m] = d2[j]
                    break
        count = 0
        for j in range(n):
            count += d2[j] <= levels[nwant - 1]
        if used + 1 + count > out.shape[0]:
            grown = np.zeros(2 * out.shape[0] + count + 1, np.uint16)
            grown[:used] = out[:used]
            out = grown
        kmap[key] = -(used + 1)
        out[used] = count
        used += 1
        for m in range(nwant):
            for j in range(n):
                if d2[j] == levels[m]:
                    out[used] = j
                    used += 1
    return out[:used].copy()


@njit(cache=True)
def even_signs(xb, weight, xval, block_signs, n8):
    """The sign step of quantize_row_iq2_xxs / iq2_xs / iq3_xxs_impl for n8 groups of 8 values xb: xval = |xb|,
    and where a group has an odd count of negatives the sign of its least important element (weight * x^2) is
    flipped, since the stored 7 sign bits imply an even count; block_signs[k] = those 7 bits. Returns max(xval)."""
    for k in range(n8):
        nflip = 0
        s = 0
        for i in range(8):
            if xb[8 * k + i] >= 0:
                xval[8 * k + i] = xb[8 * k + i]
            else:
                xval[8 * k + i] = -xb[8 * k + i]
                nflip += 1
                s |= 1 << i
        if nflip % 2:
            imin = 0
            mn = weight[8 * k] * xb[8 * k] * xb[8 * k]
            for i in range(1, 8):
                ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i]
                if ax < mn:
                    mn = ax
                    imin = i
            xval[8 * k + imin] = -xval[8 * k + imin]
            s ^= 1 << imin
        block_signs[k] = s & 127
    mx = xval[0]
    for i in range(1, 8 * n8):
        mx = mx if mx > xval[i] else xval[i]
    return mx


@njit(cache=True)
def level_sums(weight, xval, L):
    """sum w x q and sum w q^2 over a group of 32 with q = 2 L + 1 (the IQ2_XXS / IQ3_XXS least squares)."""
    sumqx = ZERO
    sumq2 = ZERO
    for i in range(32):
        q = F32(2 * int(L[i]) + 1)
        sumqx += weight[i] * xval[i] * q
        sumq2 += weight[i] * q * q
    return sumqx, sumq2


@njit(cache=True)
def iq2_scale_search(xval, weight, waux, mx, grid, kmap, neigh, L, Laux, on_grid, on_aux):
    """The scale search of quantize_row_iq2_xs_impl / quantize_row_iq2_s_impl for one 16-block of magnitudes xval
    (two groups of 8, levels 0..2 on the IQ2 grid): 19 trial scales (2*kMaxQ - 1 + is/10) / max, each group
    snapped to the grid or its best neighbour, the best by weighted least squares; then the groups that were off
    the grid redone at the found scale and the scale refit. Levels into L; returns the scale."""
    best = ZERO
    scale = mx / F32(5)
    on_grid[:] = True
    for is_ in range(-9, 10):
        id_ = (F32(5) + F32(is_) * TENTH) / mx
        this_scale = ONE / id_
        for k in range(2):
            for i in range(8):
                lv = nearest_int(F32(0.5) * (id_ * xval[8 * k + i] - ONE))
                Laux[8 * k + i] = max(0, min(2, lv))
            u = grid_code(Laux, k, 8, 2)
            on_aux[k] = True
            if kmap[u] < 0:
                on_aux[k] = False
                best_neighbour(neigh, -kmap[u] - 1, grid, xval[8 * k:8 * k + 8], waux[8 * k:8 * k + 8], this_scale,
                               Laux[8 * k:8 * k + 8])
        sumqx = ZERO
        sumq2 = ZERO
        for i in range(16):
            q = F32(2 * int(Laux[i]) + 1)
            sumqx += weight[i] * xval[i] * q
            sumq2 += weight[i] * q * q
        if sumq2 > 0 and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            L[:] = Laux
            on_grid[:] = on_aux
    if (not on_grid[0] or not on_grid[1]) and scale > 0:
        id_ = ONE / scale
        for k in range(2):
            if on_grid[k]:
                continue
            u = 0
            for i in range(8):
                lv = max(0, min(2, nearest_int(F32(0.5) * (id_ * xval[8 * k + i] - ONE))))
                u |= lv << (2 * i)
                L[8 * k + i] = lv
            if kmap[u] < 0:
                best_neighbour(neigh, -kmap[u] - 1, grid, xval[8 * k:8 * k + 8], waux[8 * k:8 * k + 8], scale,
                               L[8 * k:8 * k + 8])
        sumqx = ZERO
        sumq2 = ZERO
        for i in range(16):
            q = F32(2 * int(L[i]) + 1)
            sumqx += weight[i] * xval[i] * q
            sumq2 += weight[i] * q * q
        if sumq2 > 0:
            scale = sumqx / sumq2
    return scale


def iq3_grid_tables(grid: np.ndarray, nwant: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """iq3xs_init_impl for a grid of 4 levels in {1, 3, .., 15}: grid (n, 4) int8 (kgrid's 2l + 1) -> grid, kmap
    (4096,) int32 (grid index of a quadruple of 3-bit levels, or -(offset + 1) into neighbours), neighbours (uint16:
    a count, then grid indices sorted by (distance, index) up to the `nwant`-th distinct distance)."""
    g32 = grid.astype(np.int32)
    shifts = np.array([0, 3, 6, 9])
    kmap = np.full(4096, -1, np.int32)
    kmap[((g32 - 1) // 2 << shifts).sum(axis=1)] = np.arange(len(grid))
    order = np.arange(len(grid))
    neighbours: list[int] = []
    for i in range(4096):
        if kmap[i] >= 0:
            continue
        pos = 2 * ((i >> shifts) & 7) + 1
        d2 = ((g32 - pos) ** 2).sum(axis=1)
        ranked = np.lexsort((order, d2))  # iq3_compare_func: by distance, then index
        dists = d2[ranked]
        k = int((dists <= np.unique(dists)[:nwant][-1]).sum())
        kmap[i] = -(len(neighbours) + 1)
        neighbours += [k, *ranked[:k].tolist()]
    return grid, kmap, np.array(neighbours, np.uint16)

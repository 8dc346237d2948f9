"""Decode (activation rows one by one) of Q4_K weights near the memory roof: exact super-block integers, fast.

llama.cpp decodes Q4_K through the repacked gemv (`ggml_gemv_q4_K_8x8_q8_K`, arch/x86/repack.cpp), whose floats
depend only on two exact integers per super-block and row: isum = sum_s sc_s * (q_s . x_s) over the eight
32-element sub-blocks, and imin = sum_s mn_s * S_s, S_s the activation sum of sub-block s. Per super-block it
makes acc = fma(float(isum), d_w * d_x, acc) and acc_min = fma(float(imin), dmin_w * d_x, acc_min), and returns
acc - acc_min. `q4k_gemv_rows` makes the same floats from the same integers, which it gets with about half the
instructions of the 256-bit lane helpers (kquants.py), so that a 1B-parameter model's decode streams its weights
instead of waiting on integer work:

- `q4k_step4` (and `q4k_step2` / `q4k_step1` for the last super-blocks of a row): four super-blocks per call,
  everything in vectors. Their first 16 bytes (d, dmin, the twelve scale bytes) are four 128-bit loads, from which
  the 6-bit scales and mins of all four come out at once (ggml's kmask arithmetic on 32-bit lanes), and d, dmin as
  one `vcvtph2ps`. Each super-block's 128 bytes of nibbles are two 512-bit loads; each load splits into low
  nibbles (sub-blocks 4h and 4h + 2) and high ones (4h + 1, 4h + 3). `pmaddubsw` against the activation quants
  gives int16 pairs (at most 2 x 15 x 128: exact), and the scales, spread over their sub-block's pairs by one
  byte shuffle against zeros, meet them in `pmaddwd` (`vpdpwssd` with AVX512-VNNI). The four super-blocks'
  sixteen-lane sums fold together (three two-source folds, not twelve single ones), the mins meet the activation
  sums of 32 (`sub_sums16`) in one `pmaddwd`, and the two float chains (acc, acc_min) advance as the two lanes of
  one vector FMA per super-block. The activations are put once per matmul in the order the nibble loads want
  (`arrange_x`). Without AVX512BW the 512-bit operations run as 256-bit halves (AVX2's `vpmaddubsw` /
  `vpmaddwd`); without AVX2, as plain widened vector IR. Against two super-blocks per step with the scales
  unpacked in scalar registers this is about 5-10% faster with the weights in L2 (znver4 and haswell code on a
  Zen 4, 1 thread); llvm-mca's znver4 model puts both at the four vector pipes' limit, now ~14 cycles per
  super-block (from ~18): of its ~56 vector-pipe cycles per super-block, 40 go to the nibble split, pmaddubsw,
  pmaddwd and scale spread that any order of these integer sums needs.

One weight row at a time, read as ggml stores it (kblocks.py): a row is one stream of 144-byte super-blocks, scales
beside their quants, which the hardware prefetcher follows across the short rows of a model's matrices (the same
rows as five separate arrays took 10% longer over a 1B model's Q4_K matrices, one thread; four rows at once, twenty
streams, a third longer). Integer sums are exact in
any order, so the results are bit-identical to llama.cpp's (tests/ggml/test_kernels.py checks them against
vecdot_k).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.intrinsics import widen_half
from llamactx.ggml.kernels.kblocks import Q4K_BYTES, Q4K_QS, q4k_blocks
from llamactx.ggml.kernels.legacy import prefetch_ahead, prefetch_distance
from llamactx.ggml.kernels.simd import TagType, lane_index, ptr2d
from llamactx.ggml.kernels.vnni import _pairwise

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F0 = np.float32(0.0)


def _c(v):
    return ir.Constant(_I64, v)


def _fold(builder, a, b, lo, hi):
    """shuffle(a, b, lo) + shuffle(a, b, hi): one level of a reduction tree."""
    return builder.add(builder.shuffle_vector(a, b, lane_index(lo)), builder.shuffle_vector(a, b, lane_index(hi)))


def _spread(builder, small, picks):
    """A vector whose lanes repeat lanes of `small`: picks = [(lane, count), ...]."""
    return builder.shuffle_vector(small, small, lane_index([lane for lane, count in picks for _ in range(count)]))


def _scaled_pairs(builder, vnni, acc, w, x, scales):
    """acc (<16 x i32>) + pmaddwd(pmaddubsw(w, x), scales): 64 weight bytes (u8 <= 15) against 64 activation
    bytes, each int16 pair of products times its int16 scale."""
    if not cpu_features()["avx2"]:  # target-independent IR: products widened to i32, pairs and quads added
        v64 = ir.VectorType(_I32, 64)
        prod = builder.mul(builder.mul(builder.zext(w, v64), builder.sext(x, v64)),
                           builder.sext(_spread(builder, scales, [(k, 2) for k in range(32)]), v64))
        pairs = _fold(builder, prod, prod, range(0, 64, 2), range(1, 64, 2))
        return builder.add(acc, _fold(builder, pairs, pairs, range(0, 32, 2), range(1, 32, 2)))
    pairs = _pairwise(builder, "maddubs", w, x)  # <32 x i16>
    if vnni:
        v16 = ir.VectorType(_I32, 16)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16] * 3),
                                            "llvm.x86.avx512.vpdpwssd.512")
        return builder.call(fn, [acc, builder.bitcast(pairs, v16), builder.bitcast(scales, v16)])
    return builder.add(acc, _pairwise(builder, "maddwd", pairs, scales))


def _superblock(builder, vnni, load_w, load_x, scales):
    """<16 x i32> lanes summing to one super-block's isum. load_w(h) / load_x(k): its h-th 64 bytes of nibbles /
    k-th 64 bytes of arranged activations; scales(s, t): <32 x i16>, sub-block s's scale in lanes 0-15 and
    sub-block t's in lanes 16-31."""
    acc = ir.Constant(ir.VectorType(_I32, 16), None)
    for h in (0, 1):
        w = load_w(h)
        low4 = ir.Constant(w.type, [0x0F] * 64)
        lo = builder.and_(w, low4)
        hi = builder.and_(builder.lshr(w, ir.Constant(w.type, [4] * 64)), low4)
        acc = _scaled_pairs(builder, vnni, acc, lo, load_x(2 * h), scales(4 * h, 4 * h + 2))
        acc = _scaled_pairs(builder, vnni, acc, hi, load_x(2 * h + 1), scales(4 * h + 1, 4 * h + 3))
    return acc


def _fold_blocks(builder, accs):
    """<count x i32>: lane e = the sum of the sixteen lanes of accs[e] (count a power of two). Vectors are folded
    in pairs, each super-block's run of lanes halved at every level: count - 1 two-source folds and 4 - log2(count)
    in-vector ones for all of them, where one super-block at a time takes four in-vector folds."""
    vs, run = list(accs), 16  # run: lanes per super-block in each vector
    while len(vs) > 1:
        segs = 16 // run  # super-blocks per vector
        lo = [v * 16 + s * run + j for v in (0, 1) for s in range(segs) for j in range(run // 2)]
        hi = [k + run // 2 for k in lo]
        vs = [_fold(builder, vs[k], vs[k + 1], lo, hi) for k in range(0, len(vs), 2)]
        run //= 2
    f, n = vs[0], len(accs)
    while run > 1:
        lo = [s * run + j for s in range(n) for j in range(run // 2)]
        f = _fold(builder, f, f, lo, [k + run // 2 for k in lo])
        run //= 2
    return f


@njit(cache=True)
def sub_sums16(bsums, i0, out):
    """out[i, s] = bsums[i0 + i, 2s] + bsums[i0 + i, 2s + 1]: Q8_K's sums of 16 paired into the sums of 32 that
    meet the mins (within +-4096: int16)."""
    for i in range(out.shape[0]):
        for s in range(out.shape[1]):
            out[i, s] = bsums[i0 + i, 2 * s] + bsums[i0 + i, 2 * s + 1]


@njit(cache=True)
def arrange_x(xq, i0, xp):
    """xp[i] = the activation quants of row i0 + i in `q4k_isum2`'s order: per 128 elements x[0:32], x[64:96],
    x[32:64], x[96:128] (the partners of one 64-byte load's low nibbles, then of its high nibbles)."""
    for i in range(xp.shape[0]):
        for j in range(0, xp.shape[1], 128):
            for e in range(32):
                xp[i, j + e] = xq[i0 + i, j + e]
                xp[i, j + 32 + e] = xq[i0 + i, j + 64 + e]
                xp[i, j + 64 + e] = xq[i0 + i, j + 32 + e]
                xp[i, j + 96 + e] = xq[i0 + i, j + 96 + e]


# --- whole super-blocks per step: scales, mins, d and the float steps in vectors -----------------------------


def _splat32(value, n):
    return ir.Constant(ir.VectorType(_I32, n), [value] * n)


def _headers(context, builder, qsty, qs, r, b, count):
    """<4*count x i32>: the first 16 bytes of super-blocks b .. b+count-1 of row r, lanes 4e .. 4e+3 holding
    super-block b+e's (d | dmin << 16, u0, u1, u2): its f16 pair and twelve scale bytes as kblocks describes."""
    v16 = ir.VectorType(_I8, 16)
    parts = [builder.load(ptr2d(context, builder, qsty, qs, r, builder.add(builder.mul(b, _c(Q4K_BYTES)),
                                                                            _c(Q4K_BYTES * e)), v16), align=1)
             for e in range(count)]
    while len(parts) > 1:
        n = parts[0].type.count
        parts = [builder.shuffle_vector(parts[k], parts[k + 1], lane_index(range(2 * n)))
                 for k in range(0, len(parts), 2)]
    return builder.bitcast(parts[0], ir.VectorType(_I32, 4 * count))


def _scale_bytes(builder, hdr, count):
    """<16*count x i8>: super-block e's eight 6-bit scales in bytes 16e .. 16e+7 and its eight mins in 16e+8 ..
    16e+15, from `_headers`: kblocks.q4k_scales (ggml's utmp / kmask1..3) on every super-block's words at once."""
    n = 4 * count
    lo = builder.and_(hdr, _splat32(0x3F3F3F3F, n))  # lane 4e+1: scales 0-3, 4e+2: mins 0-3
    u2 = builder.shuffle_vector(hdr, hdr, lane_index([4 * (k // 4) + 3 for k in range(n)]))
    shift = ir.Constant(ir.VectorType(_I32, n), [4 if k % 4 == 2 else 0 for k in range(n)])
    top = builder.shl(builder.and_(builder.lshr(hdr, _splat32(6, n)), _splat32(0x03030303, n)), _splat32(4, n))
    hi = builder.or_(builder.and_(builder.lshr(u2, shift), _splat32(0x0F0F0F0F, n)), top)  # 4-7 likewise
    v8 = ir.VectorType(_I8, 4 * n)
    picks = []
    for e in range(count):
        for lane in (4 * e + 1, 4 * e + 2):  # scales, then mins
            picks += [4 * lane + k for k in range(4)] + [4 * n + 4 * lane + k for k in range(4)]
    return builder.shuffle_vector(builder.bitcast(lo, v8), builder.bitcast(hi, v8), lane_index(picks))


def _widened(builder, z, picks):
    """<len(picks) x i16> of bytes of z (zero-extended: one byte shuffle against zeros)."""
    idx = [v for p in picks for v in (p, z.type.count)]
    out = builder.shuffle_vector(z, ir.Constant(z.type, None), lane_index(idx))
    return builder.bitcast(out, ir.VectorType(_I16, len(picks)))


def _step_intrinsic(count):
    """An intrinsic (path, qs, r, b, xp, i, s16, xd, xrow, acc, acc_min) -> (acc, acc_min) after super-blocks
    b .. b+count-1 of row r against activation row i (xp / s16: `arrange_x` / `sub_sums16` rows; xd: Q8_K's
    scales, row xrow): per super-block acc = fma(float(isum), d_w * d_x, acc) and acc_min = fma(float(imin),
    dmin_w * d_x, acc_min), in the order of `q4k_gemv_rows`, both chains as the two lanes of one vector."""

    def typer(typingctx, path, qs, r, b, xp, i, s16, xd, xrow, acc, acc_min):
        if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
            return None
        ret = types.UniTuple(types.float32, 2)

        def codegen(context, builder, sig, args):
            _, qs_a, r_, b_, xp_a, i_, s_a, xd_a, xrow_, acc_, accm_ = args
            vnni = sig.args[0].tag_name == "vnni" and cpu_features()["avx512vnni"]
            v64i8 = ir.VectorType(_I8, 64)
            hdr = _headers(context, builder, sig.args[1], qs_a, r_, b_, count)
            z = _scale_bytes(builder, hdr, count)
            accs = []
            for e in range(count):
                def load_w(h, e=e):
                    col = builder.add(builder.mul(b_, _c(Q4K_BYTES)), _c(Q4K_BYTES * e + Q4K_QS + 64 * h))
                    return builder.load(ptr2d(context, builder, sig.args[1], qs_a, r_, col, v64i8), align=1)

                def load_x(k, e=e):
                    col = builder.add(builder.mul(b_, _c(256)), _c(256 * e + 64 * k))
                    return builder.load(ptr2d(context, builder, sig.args[4], xp_a, i_, col, v64i8), align=1)

                def scales(s, t, e=e):
                    return _widened(builder, z, [16 * e + s] * 16 + [16 * e + t] * 16)

                accs.append(_superblock(builder, vnni, load_w, load_x, scales))
            isum = _fold_blocks(builder, accs)  # <count x i32>
            mins = _widened(builder, z, [16 * e + 8 + s for e in range(count) for s in range(8)])
            s16 = builder.load(ptr2d(context, builder, sig.args[6], s_a, i_, builder.mul(b_, _c(8)),
                                     ir.VectorType(_I16, 8 * count)), align=2)
            imin = _min_lanes(builder, mins, s16, count)  # <count x i32>
            f32 = ir.FloatType()
            ints = builder.shuffle_vector(isum, imin, lane_index([v for e in range(count) for v in (e, count + e)]))
            f = builder.sitofp(ints, ir.VectorType(f32, 2 * count))  # (isum_e, imin_e) pairs
            dm = widen_half(builder, builder.bitcast(
                builder.shuffle_vector(hdr, hdr, lane_index([4 * e for e in range(count)])),
                ir.VectorType(_I16, 2 * count)))  # (d_e, dmin_e) pairs
            x = builder.load(ptr2d(context, builder, sig.args[7], xd_a, xrow_, b_, ir.VectorType(f32, count)),
                             align=4)
            p = builder.fmul(dm, builder.shuffle_vector(x, x, lane_index([e for e in range(count) for _ in "dm"])))
            v2 = ir.VectorType(f32, 2)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v2, [v2] * 3), "llvm.fma.v2f32")
            a = builder.insert_element(builder.insert_element(ir.Constant(v2, None), acc_, _c(0)), accm_, _c(1))
            for e in range(count):
                pick = lane_index([2 * e, 2 * e + 1])
                a = builder.call(fma, [builder.shuffle_vector(f, f, pick), builder.shuffle_vector(p, p, pick), a])
            return context.make_tuple(builder, ret, [builder.extract_element(a, _c(k)) for k in range(2)])

        return ret(path, qs, types.intp, types.intp, xp, types.intp, s16, xd, types.intp, types.float32,
                   types.float32), codegen

    typer.__name__ = typer.__qualname__ = f"q4k_step{count}"
    return intrinsic(typer)


def _min_lanes(builder, m, s, count):
    """<count x i32>: lane e = sum_s m[8e + s] * s[8e + s] (mins against sub-block sums, both <8*count x i16>)."""
    if cpu_features()["avx2"] and count >= 2:
        p = _pairwise(builder, "maddwd", m, s)  # <4*count x i32>: super-block e in lanes 4e .. 4e+3
    else:
        v = ir.VectorType(_I32, 8 * count)
        q = builder.mul(builder.zext(m, v), builder.sext(s, v))
        p = _fold(builder, q, q, range(0, 8 * count, 2), range(1, 8 * count, 2))
    n = 4 * count
    while n > count:
        p = _fold(builder, p, p, range(0, n, 2), range(1, n, 2))
        n //= 2
    return p


q4k_step1 = _step_intrinsic(1)
q4k_step2 = _step_intrinsic(2)
q4k_step4 = _step_intrinsic(4)

# Four super-blocks per step where 512-bit registers hold their sums (32 of them); with sixteen 256-bit ones
# (AVX2) two per step keep everything in registers and measured faster (haswell code on a Zen 4, weights in L2).
_STEP4 = bool(cpu_features()["avx512bw"])


@njit(cache=True)
def q4k_gemv_rows(path, W, a, i0, r0, r1, out):
    """out[i0:, r0:r1] for Q4_K weights as ggml_gemv_q4_K_8x8_q8_K computes each activation row (module
    docstring): one weight row at a time, four super-blocks per step (two on AVX2)."""
    qs = W[0]
    xq, xd, bsums, _ = a
    n, nb = xq.shape[0] - i0, q4k_blocks(qs)
    if n <= 0:
        return
    s16 = np.empty((n, nb * 8), np.int16)
    sub_sums16(bsums, i0, s16)
    xp = np.empty((n, xq.shape[1]), np.int8)
    arrange_x(xq, i0, xp)
    xs = np.empty((n, nb), np.float32)  # xd's rows, C-contiguous: the steps load four at once
    for i in range(n):
        for b in range(nb):
            xs[i, b] = xd[i0 + i, b]
    nb4 = nb - nb % 4 if _STEP4 else 0
    ahead = prefetch_distance(W[0], W[1], W[2])
    for r in range(r0, r1):
        prefetch_ahead(W[0], W[1], W[2], r, r0, r1, ahead, 1)
        for i in range(n):
            acc, acc_min = _F0, _F0
            for b in range(0, nb4, 4):
                acc, acc_min = q4k_step4(path, qs, r, b, xp, i, s16, xs, i, acc, acc_min)
            b = nb4
            while nb - b >= 2:
                acc, acc_min = q4k_step2(path, qs, r, b, xp, i, s16, xs, i, acc, acc_min)
                b += 2
            if b < nb:
                acc, acc_min = q4k_step1(path, qs, r, b, xp, i, s16, xs, i, acc, acc_min)
            out[i0 + i, r] = acc - acc_min

"""Decode (activation rows one by one) of Q4_K weights near the memory roof: exact super-block integers, fast.

llama.cpp decodes Q4_K through the repacked gemv (`ggml_gemv_q4_K_8x8_q8_K`, arch/x86/repack.cpp), whose floats
depend only on two exact integers per super-block and row: isum = sum_s sc_s * (q_s . x_s) over the eight
32-element sub-blocks, and imin = sum_s mn_s * S_s, S_s the activation sum of sub-block s. Per super-block it
makes acc = fma(float(isum), d_w * d_x, acc) and acc_min = fma(float(imin), dmin_w * d_x, acc_min), and returns
acc - acc_min. `q4k_gemv_rows` makes the same floats from the same integers, which it gets with about half the
instructions of the 256-bit lane helpers (kquants.py), so that a 1B-parameter model's decode streams its weights
instead of waiting on integer work:

- `q4k_isum2`: two super-blocks per call. Each super-block's 128 bytes of nibbles are two 512-bit loads; each load
  splits into low nibbles (sub-blocks 4h and 4h + 2) and high ones (4h + 1, 4h + 3). `pmaddubsw` against the
  activation quants gives int16 pairs (at most 2 x 15 x 128: exact), and the 6-bit scales, widened and spread over
  their sub-block's pairs, meet them in `pmaddwd` (`vpdpwssd` with AVX512-VNNI: multiply and accumulate in one).
  The activations are put once per matmul in the order those loads want (`arrange_x`), and the two super-blocks'
  accumulators fold together. Without AVX512BW the 512-bit operations run as 256-bit halves (AVX2's `vpmaddubsw` /
  `vpmaddwd`); without AVX2, as plain widened vector IR.
- `q4k_imin2`: the mins of two super-blocks against the activation sums of 32 (`sub_sums16`), one `pmaddwd`.

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
from llamactx.ggml.intrinsics import fma32
from llamactx.ggml.kernels.kblocks import Q4K_BYTES, Q4K_D, Q4K_DMIN, Q4K_QS, q4k_blocks, q4k_scales
from llamactx.ggml.kernels.legacy import prefetch_ahead, prefetch_distance
from llamactx.ggml.kernels.simd import TagType, lane_index, load_f16, ptr2d
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


def _superblock(builder, vnni, load_w, load_x, scl):
    """<16 x i32> lanes summing to one super-block's isum. load_w(h) / load_x(k): its h-th 64 bytes of nibbles /
    k-th 64 bytes of arranged activations; scl: its eight scales as <8 x i16>."""
    acc = ir.Constant(ir.VectorType(_I32, 16), None)
    for h in (0, 1):
        w = load_w(h)
        low4 = ir.Constant(w.type, [0x0F] * 64)
        lo = builder.and_(w, low4)
        hi = builder.and_(builder.lshr(w, ir.Constant(w.type, [4] * 64)), low4)
        acc = _scaled_pairs(builder, vnni, acc, lo, load_x(2 * h),
                            _spread(builder, scl, [(4 * h, 16), (4 * h + 2, 16)]))
        acc = _scaled_pairs(builder, vnni, acc, hi, load_x(2 * h + 1),
                            _spread(builder, scl, [(4 * h + 1, 16), (4 * h + 3, 16)]))
    return acc


def _words(builder, tup, count):
    """A UniTuple of `count` uint64 words (eight bytes each) as <8*count x i16>, byte k of word e in lane 8e + k."""
    v = ir.Constant(ir.VectorType(_I64, count), None)
    for e in range(count):
        v = builder.insert_element(v, builder.extract_value(tup, e), _c(e))
    return builder.zext(builder.bitcast(v, ir.VectorType(_I8, 8 * count)), ir.VectorType(_I16, 8 * count))


def _isum_intrinsic(count):
    """An intrinsic (path, qs, scw, r, b, xp, i) -> UniTuple(int32, count): the isums of super-blocks b .. b+count-1
    of row r against arranged activation row i (qs: (rows, nb*144) u8, ggml's block_q4_K rows (kblocks.py); scw:
    UniTuple(uint64, count), each super-block's eight 6-bit scales (`kblocks.q4k_scales`); xp: (n, k) i8,
    `arrange_x`)."""

    def typer(typingctx, path, qs, scw, r, b, xp, i):
        if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
            return None
        ret = types.UniTuple(types.int32, count)

        def codegen(context, builder, sig, args):
            _, qs_a, scw_, r_, b_, xp_a, i_ = args
            vnni = sig.args[0].tag_name == "vnni" and cpu_features()["avx512vnni"]
            v64i8 = ir.VectorType(_I8, 64)
            scl = _words(builder, scw_, count)
            accs = []
            for e in range(count):
                def load_w(h, e=e):
                    col = builder.add(builder.mul(b_, _c(Q4K_BYTES)), _c(Q4K_BYTES * e + Q4K_QS + 64 * h))
                    return builder.load(ptr2d(context, builder, sig.args[1], qs_a, r_, col, v64i8), align=1)

                def load_x(k, e=e):
                    col = builder.add(builder.mul(b_, _c(256)), _c(256 * e + 64 * k))
                    return builder.load(ptr2d(context, builder, sig.args[5], xp_a, i_, col, v64i8), align=1)

                own = builder.shuffle_vector(scl, scl, lane_index(range(8 * e, 8 * e + 8)))
                accs.append(_superblock(builder, vnni, load_w, load_x, own))
            if count == 2:  # super-block e's lanes end up in lane e
                f = _fold(builder, accs[0], accs[1], [*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)])
                f = _fold(builder, f, f, [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
                f = _fold(builder, f, f, [0, 1, 4, 5], [2, 3, 6, 7])
                f = _fold(builder, f, f, [0, 2], [1, 3])
            else:
                f = accs[0]
                for width in (8, 4, 2, 1):
                    f = _fold(builder, f, f, range(width), range(width, 2 * width))
            return context.make_tuple(builder, ret, [builder.extract_element(f, _c(k)) for k in range(count)])

        return ret(path, qs, scw, types.intp, types.intp, xp, types.intp), codegen

    typer.__name__ = typer.__qualname__ = f"q4k_isum{count}"
    return intrinsic(typer)


q4k_isum1 = _isum_intrinsic(1)
q4k_isum2 = _isum_intrinsic(2)


def _imin_intrinsic(count):
    """An intrinsic (mnw, b, s16, i) -> UniTuple(int32, count): sum_s mn_b'[s] * s16[i, 8b' + s] for the
    super-blocks b' = b .. b+count-1 (mnw: UniTuple(uint64, count), their mins as `kblocks.q4k_scales` gives them;
    s16: (n, nb*8) i16, `sub_sums16`)."""

    def typer(typingctx, mnw, b, s16, i):
        ret = types.UniTuple(types.int32, count)

        def codegen(context, builder, sig, args):
            mnw_, b_, s_a, i_ = args
            col = builder.mul(b_, _c(8))
            m = _words(builder, mnw_, count)
            s = builder.load(ptr2d(context, builder, sig.args[2], s_a, i_, col, ir.VectorType(_I16, 8 * count)),
                             align=2)
            if cpu_features()["avx2"] and count == 2:
                p = _pairwise(builder, "maddwd", m, s)  # <8 x i32>: super-block b in lanes 0-3, b + 1 in 4-7
            else:
                v = ir.VectorType(_I32, 8 * count)
                q = builder.mul(builder.zext(m, v), builder.sext(s, v))
                p = _fold(builder, q, q, range(0, 8 * count, 2), range(1, 8 * count, 2))
            n = 4 * count  # lanes left, four per super-block
            while n > count:
                p = _fold(builder, p, p, range(0, n, 2), range(1, n, 2))
                n //= 2
            return context.make_tuple(builder, ret, [builder.extract_element(p, _c(k)) for k in range(count)])

        return ret(mnw, types.intp, s16, types.intp), codegen

    typer.__name__ = typer.__qualname__ = f"q4k_imin{count}"
    return intrinsic(typer)


q4k_imin1 = _imin_intrinsic(1)
q4k_imin2 = _imin_intrinsic(2)


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


@njit(cache=True)
def q4k_gemv_rows(path, W, a, i0, r0, r1, out):
    """out[i0:, r0:r1] for Q4_K weights as ggml_gemv_q4_K_8x8_q8_K computes each activation row (module
    docstring): one weight row at a time, two super-blocks per step."""
    qs = W[0]
    xq, xd, bsums, _ = a
    n, nb = xq.shape[0] - i0, q4k_blocks(qs)
    if n <= 0:
        return
    s16 = np.empty((n, nb * 8), np.int16)
    sub_sums16(bsums, i0, s16)
    xp = np.empty((n, xq.shape[1]), np.int8)
    arrange_x(xq, i0, xp)
    nb2 = nb - nb % 2
    ahead = prefetch_distance(W[0], W[1], W[2])
    for r in range(r0, r1):
        prefetch_ahead(W[0], W[1], W[2], r, r0, r1, ahead, 1)
        for i in range(n):
            acc, acc_min = _F0, _F0
            for b in range(0, nb2, 2):
                sc0, mn0 = q4k_scales(qs, r, b)
                sc1, mn1 = q4k_scales(qs, r, b + 1)
                i0_, i1_ = q4k_isum2(path, qs, (sc0, sc1), r, b, xp, i)
                m0, m1 = q4k_imin2((mn0, mn1), b, s16, i)
                o0, o1 = b * Q4K_BYTES, (b + 1) * Q4K_BYTES
                x0, x1 = xd[i0 + i, b], xd[i0 + i, b + 1]
                acc = fma32(np.float32(i0_), load_f16(qs, r, o0 + Q4K_D) * x0, acc)
                acc_min = fma32(np.float32(m0), load_f16(qs, r, o0 + Q4K_DMIN) * x0, acc_min)
                acc = fma32(np.float32(i1_), load_f16(qs, r, o1 + Q4K_D) * x1, acc)
                acc_min = fma32(np.float32(m1), load_f16(qs, r, o1 + Q4K_DMIN) * x1, acc_min)
            for b in range(nb2, nb):
                sc, mn = q4k_scales(qs, r, b)
                (isum,) = q4k_isum1(path, qs, (sc,), r, b, xp, i)
                (imin,) = q4k_imin1((mn,), b, s16, i)
                o, x = b * Q4K_BYTES, xd[i0 + i, b]
                acc = fma32(np.float32(isum), load_f16(qs, r, o + Q4K_D) * x, acc)
                acc_min = fma32(np.float32(imin), load_f16(qs, r, o + Q4K_DMIN) * x, acc_min)
            out[i0 + i, r] = acc - acc_min

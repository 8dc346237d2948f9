"""Decode (activation rows one by one) of Q4_K weights at the memory roof: eight rows at a time, exact integers.

llama.cpp decodes Q4_K through the repacked gemv (`ggml_gemv_q4_K_8x8_q8_K`, arch/x86/repack.cpp), whose floats
depend only on two exact integers per super-block and row: isum = sum_s sc_s * (q_s . x_s) over the eight
32-element sub-blocks, and imin = sum_s mn_s * S_s, S_s the activation sum of sub-block s. Per super-block it
makes acc = fma(float(isum), d_w * d_x, acc) and acc_min = fma(float(imin), dmin_w * d_x, acc_min), and returns
acc - acc_min. `q4k_gemv_rows` makes the same floats from the same integers, over the weights as repack.py stores
them (kblocks.py: eight rows interleaved, llama.cpp's block_q4_Kx8 idea), one group of eight rows per call of
`q4k_group`, which loops over the super-blocks with everything in vectors:

- one 64-byte load holds eight nibble bytes of each of the eight rows, and the activation quants they meet are
  eight bytes broadcast to every row (`vpbroadcastq`): no arrangement of the activations, no horizontal sum per
  row. With AVX512-VNNI the low nibbles go straight into `vpdpbusd`, and the high ones masked in place (16 times
  their value: the int32 sums stay exact); one accumulator per sub-block pair, the high one shifted back after its
  four loads, both narrowed to int16 (|sum| <= 16 x 15 x 128) and multiplied by their scales in one `vpdpwssd`.
  On AVX2 without VNNI (`_group_isums_avx2`: rows 4h .. 4h + 3 in 256-bit half h) the four `pmaddubsw` of a
  sub-block's split nibbles are added as int16 (4 x 2 x 15 x 128 = 15360: exact) before one `pmaddwd` with each
  row's scale. (Activations read from a copy with each run of eight repeated four times instead of broadcast
  saved the `vpbroadcastq`s, an ALU uop each on Zen: 81 cycles in llvm-mca, 34 GB/s in L2, but 10% slower on a
  model's matrices streamed from DRAM, the copy taking L1 from the stream.) Without AVX2 (portable IR) the
  products of the split nibbles are widened and paired with the scales (`_scaled_pairs`).
- the eight rows' 6-bit scales and mins come out of their three scale words at once (ggml's kmask arithmetic on
  8 lanes), d and dmin as one `vcvtph2ps` of 16 halves, the mins meet the activation sums of 32 (`sub_sums16`)
  in `pmaddwd`, and both float chains of the eight rows advance as the 16 lanes of one FMA per super-block.

A matrix is one stream (group after group), which the hardware prefetcher follows without help. Integer sums are
exact in any order, so the results are bit-identical to llama.cpp's (tests/ggml/test_kgemv.py against vecdot_k).
Measured on Zen 4, 1 thread, CPU time (bench/kgemv_bench.py, weights in L2): 42 GB/s, from 21 GB/s one row at a
time in ggml's layout; llvm-mca's znver4 model puts the loop at the FP0/FP1 pipes (the 32 `vpdpbusd` of a group's
super-block), ~13 cycles per row and super-block. Compiled for haswell: llvm-mca znver4 114 -> 89 cycles per group
super-block with the int16 sums (haswell's model 173 -> 129), bound by the four vector ALU pipes (the 64
`pmaddubsw`, 96 nibble masks and shifts, 48 int16 adds, 32 broadcasts); in L2, 1 thread, CPU time
(bench/kgemv_bench.py): 26 -> 34 GB/s. One thread streaming from DRAM is at the memory's pace either way.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.intrinsics import widen_half
from llamactx.ggml.kernels.kblocks import Q4K_GBYTES, Q4K_GQS, Q4K_GROUP, Q4K_GSC, q4k_blocks
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
    """acc (<16 x i32>) + pmaddwd(pmaddubsw(w, x), scales): 64 weight bytes (u8 <= 63: Q4_K's nibbles, Q6_K's
    quants in q6k_gemv.py) against 64 activation bytes, each int16 pair of products times its int16 scale."""
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


@njit(cache=True)
def sub_sums16(bsums, i0, out):
    """out[i, s] = bsums[i0 + i, 2s] + bsums[i0 + i, 2s + 1]: Q8_K's sums of 16 paired into the sums of 32 that
    meet the mins (within +-4096: int16)."""
    for i in range(out.shape[0]):
        for s in range(out.shape[1]):
            out[i, s] = bsums[i0 + i, 2 * s] + bsums[i0 + i, 2 * s + 1]


# --- one group of eight rows, every super-block: scales, mins, d and the float steps in vectors ---------------


def _splat32(value, n):
    return ir.Constant(ir.VectorType(_I32, n), [value] * n)


def _scale_pos(r, s):
    """Byte of `_scale_bytes`' vectors holding lane r's sub-block s."""
    return 4 * r + s if s < 4 else 32 + 4 * r + s - 4


def _scale_bytes(builder, u, first):
    """<64 x i8>: the eight lanes' 6-bit scales (first = 0) or mins (first = 1) from the group super-block's scale
    words u (<24 x i32>: u0, u1, u2 of lanes 0-7), sub-block s of lane r at `_scale_pos(r, s)`: kblocks.q4k_scales
    (ggml's utmp / kmask1..3) on all eight lanes at once."""
    def words(k):
        return builder.shuffle_vector(u, u, lane_index(range(8 * k, 8 * k + 8)))

    w, u2 = words(first), words(2)  # scales: u0 (lo) and u2's low nibbles; mins: u1 and u2's high nibbles
    lo = builder.and_(w, _splat32(0x3F3F3F3F, 8))
    top = builder.shl(builder.and_(builder.lshr(w, _splat32(6, 8)), _splat32(0x03030303, 8)), _splat32(4, 8))
    hi = builder.or_(builder.and_(builder.lshr(u2, _splat32(4 * first, 8)), _splat32(0x0F0F0F0F, 8)), top)
    return builder.bitcast(builder.shuffle_vector(lo, hi, lane_index(range(16))), ir.VectorType(_I8, 64))


def _widened(builder, z, picks):
    """<len(picks) x i16> of bytes of z (zero-extended: one byte shuffle against zeros)."""
    idx = [v for p in picks for v in (p, z.type.count)]
    out = builder.shuffle_vector(z, ir.Constant(z.type, None), lane_index(idx))
    return builder.bitcast(out, ir.VectorType(_I16, len(picks)))


def _bcast8(context, builder, xty, xq, i, col):
    """<64 x i8>: the eight activation quants at [i, col] in every 8-byte run."""
    v = builder.load(ptr2d(context, builder, xty, xq, i, col, _I64), align=1)
    v8 = builder.insert_element(ir.Constant(ir.VectorType(_I64, 8), None), v, ir.Constant(_I32, 0))
    return builder.bitcast(builder.shuffle_vector(v8, v8, lane_index([0] * 8)), ir.VectorType(_I8, 64))


def _vnni_call(builder, name, acc, a, b):
    v16 = ir.VectorType(_I32, 16)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16] * 3), f"llvm.x86.avx512.{name}.512")
    return builder.call(fn, [acc, builder.bitcast(a, v16), builder.bitcast(b, v16)])


def _group_isums(context, builder, vnni, qsty, qs, g, col, xty, xq, i, xcol, scb):
    """<8 x i32>: lane r = isum of row 8g + r's super-block at column col of slot row g, against the activation
    quants of row i from xcol. With AVX512-VNNI: per 64-byte load, `vpdpbusd` of the low nibbles and of the high
    ones masked in place (16x their value; products summed in int32, exact), one accumulator per sub-block pair;
    after its four loads the high one is shifted back (exact), both are narrowed to int16 (|sum| <= 16 * 15 * 128)
    and meet their scales in one `vpdpwssd`. Otherwise (AVX2, portable IR) `pmaddubsw` of the split nibbles and
    `pmaddwd` with the scales spread over each row's pairs."""
    v64 = ir.VectorType(_I8, 64)
    tot = ir.Constant(ir.VectorType(_I32, 16), None)
    for c in range(4):
        lo_acc = hi_acc = ir.Constant(ir.VectorType(_I32, 16), None)
        for j in range(4):
            w = builder.load(ptr2d(context, builder, qsty, qs, g, builder.add(col, _c(Q4K_GQS + 64 * (4 * c + j))),
                                   v64), align=1)
            xl = _bcast8(context, builder, xty, xq, i, builder.add(xcol, _c(64 * c + 8 * j)))
            xh = _bcast8(context, builder, xty, xq, i, builder.add(xcol, _c(64 * c + 32 + 8 * j)))
            lo = builder.and_(w, ir.Constant(v64, [0x0F] * 64))
            if vnni:
                lo_acc = _vnni_call(builder, "vpdpbusd", lo_acc, lo, xl)
                hi_acc = _vnni_call(builder, "vpdpbusd", hi_acc, builder.and_(w, ir.Constant(v64, [0xF0] * 64)), xh)
            else:  # maddubs lane k: row k // 4
                hi = builder.and_(builder.lshr(w, ir.Constant(v64, [4] * 64)), ir.Constant(v64, [0x0F] * 64))
                tot = _scaled_pairs(builder, False, tot, lo, xl,
                                    _widened(builder, scb, [_scale_pos(k // 4, 2 * c) for k in range(32)]))
                tot = _scaled_pairs(builder, False, tot, hi, xh,
                                    _widened(builder, scb, [_scale_pos(k // 4, 2 * c + 1) for k in range(32)]))
        if vnni:  # lane k of either: row k // 2
            hi_acc = builder.ashr(hi_acc, _splat32(4, 16))
            v32 = ir.VectorType(_I16, 32)
            pair = builder.shuffle_vector(builder.bitcast(lo_acc, v32), builder.bitcast(hi_acc, v32),
                                          lane_index(range(0, 64, 2)))  # the low halves: lo lanes, then hi's
            sc = _widened(builder, scb, [_scale_pos(k // 2, 2 * c) for k in range(16)]
                          + [_scale_pos(k // 2, 2 * c + 1) for k in range(16)])
            tot = _vnni_call(builder, "vpdpwssd", tot, pair, sc)  # lane p: row p (even sub-block), p - 8 (odd)
    if vnni:
        return _fold(builder, tot, tot, range(8), range(8, 16))
    return _fold(builder, tot, tot, range(0, 16, 2), range(1, 16, 2))


def _bcast8_256(context, builder, xty, xq, i, col):
    """<32 x i8>: the eight activation quants at [i, col] in every 8-byte run (one `vpbroadcastq`)."""
    v = builder.load(ptr2d(context, builder, xty, xq, i, col, _I64), align=1)
    v4 = builder.insert_element(ir.Constant(ir.VectorType(_I64, 4), None), v, ir.Constant(_I32, 0))
    return builder.bitcast(builder.shuffle_vector(v4, v4, lane_index([0] * 4)), ir.VectorType(_I8, 32))


def _group_isums_avx2(context, builder, qsty, qs, g, col, xty, xq, i, xcol, scb):
    """`_group_isums` on AVX2's 256-bit halves (rows 4h .. 4h + 3 in half h), with a quarter of the scale
    multiplies: the four `pmaddubsw` of a sub-block's nibbles (pairs of at most 2 x 15 x 128) are added as int16
    (at most 4 x 3840 = 15360: exact) before one `pmaddwd` meets each row's scale, lane k of either half's words
    being row 4h + k // 4."""
    v32, v16 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16)
    low = ir.Constant(v32, [0x0F] * 32)
    tot = [ir.Constant(ir.VectorType(_I32, 8), None)] * 2
    for c in range(4):
        sums = [[ir.Constant(v16, None)] * 2 for _ in range(2)]  # [low / high nibbles][half]
        for j in range(4):
            x = [_bcast8_256(context, builder, xty, xq, i, builder.add(xcol, _c(64 * c + 32 * t + 8 * j)))
                 for t in (0, 1)]
            for h in (0, 1):
                w = builder.load(ptr2d(context, builder, qsty, qs, g,
                                       builder.add(col, _c(Q4K_GQS + 64 * (4 * c + j) + 32 * h)), v32), align=1)
                hi = builder.bitcast(builder.lshr(builder.bitcast(w, v16), ir.Constant(v16, [4] * 16)), v32)
                for t, nib in enumerate((builder.and_(w, low), builder.and_(hi, low))):
                    sums[t][h] = builder.add(sums[t][h], _pairwise(builder, "maddubs", nib, x[t]))
        for t in (0, 1):
            for h in (0, 1):
                sc = _widened(builder, scb, [_scale_pos(4 * h + k // 4, 2 * c + t) for k in range(16)])
                tot[h] = builder.add(tot[h], _pairwise(builder, "maddwd", sums[t][h], sc))
    both = builder.shuffle_vector(tot[0], tot[1], lane_index(range(16)))  # lane m: row m // 2
    return _fold(builder, both, both, range(0, 16, 2), range(1, 16, 2))


def _group_mins_avx2(context, builder, mnb, sty, s16, i, col):
    """`_group_mins` on AVX2: the mins of sub-blocks 0-3 (4-7) of rows 4h .. 4h + 3 are the 16 bytes
    16h .. 16h + 15 (32 + 16h ..) of mnb, zero-extended to words by one `vpmovzxbw` each, and meet the activation
    sums S_0..3 (S_4..7), broadcast as one quadword from the `sub_sums16` row i at col (col + 4), in `pmaddwd`."""
    v32 = ir.VectorType(_I32, 8)
    tot = []
    for h in (0, 1):
        p = ir.Constant(v32, None)
        for q in (0, 1):
            m = builder.zext(builder.shuffle_vector(mnb, mnb, lane_index(range(32 * q + 16 * h, 32 * q + 16 * h + 16))),
                             ir.VectorType(_I16, 16))
            sq = builder.bitcast(_bcast8_256(context, builder, sty, s16, i, builder.add(col, _c(4 * q))), m.type)
            p = builder.add(p, _pairwise(builder, "maddwd", m, sq))  # lane k: row 4h + k // 2
        tot.append(p)
    both = builder.shuffle_vector(tot[0], tot[1], lane_index(range(16)))
    return _fold(builder, both, both, range(0, 16, 2), range(1, 16, 2))


def _group_mins(builder, mnb, s8):
    """<8 x i32>: lane r = imin of row r = sum_s min_rs * S_s (mnb: `_scale_bytes` mins; s8: <8 x i16> the
    activation's sub-block sums)."""
    m = _widened(builder, mnb, [_scale_pos(r, s) for r in range(8) for s in range(8)])  # <64 x i16>
    halves = []
    for h in (0, 1):
        mh = builder.shuffle_vector(m, m, lane_index(range(32 * h, 32 * h + 32)))
        halves.append(_min_lanes(builder, mh, builder.shuffle_vector(s8, s8, lane_index([s for _ in range(4)
                                                                                        for s in range(8)])), 4))
    return builder.shuffle_vector(halves[0], halves[1], lane_index(range(8)))


@intrinsic
def q4k_group(typingctx, path, qs, g, xq, xrow, s16, xs, i, res):
    """Rows 8g .. 8g + 7 of Q4_K weights (kblocks.py's groups) against activation row xrow of xq (s16: its
    `sub_sums16` row i; xs: Q8_K's scales, row i) -> res[0, 0:8]: per super-block b, in order,
    acc = fma(float(isum), d_w * d_x, acc) and acc_min = fma(float(imin), dmin_w * d_x, acc_min) on the eight
    rows' lanes (one 16-lane FMA for both chains), then acc - acc_min."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None

    def codegen(context, builder, sig, args):
        _, qs_a, g_, xq_a, xrow_, s_a, xs_a, i_, res_a = args
        vnni = sig.args[0].tag_name == "vnni" and cpu_features()["avx512vnni"]
        f32 = ir.FloatType()
        v16f = ir.VectorType(f32, 16)
        qsty = sig.args[1]
        ary = context.make_array(qsty)(context, builder, qs_a)
        nb = builder.sdiv(builder.extract_value(ary.shape, 1), _c(Q4K_GBYTES))
        acc_p = cgutils.alloca_once_value(builder, ir.Constant(v16f, None))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16f, [v16f] * 3), "llvm.fma.v16f32")
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            col = builder.mul(b, _c(Q4K_GBYTES))
            dm = widen_half(builder, builder.load(ptr2d(context, builder, qsty, qs_a, g_, col,
                                                        ir.VectorType(_I16, 16)), align=1))  # d 0-7, dmin 8-15
            u = builder.load(ptr2d(context, builder, qsty, qs_a, g_, builder.add(col, _c(Q4K_GSC)),
                                   ir.VectorType(_I32, 24)), align=1)
            scb, mnb = _scale_bytes(builder, u, 0), _scale_bytes(builder, u, 1)
            args = (qsty, qs_a, g_, col, sig.args[3], xq_a, xrow_, builder.mul(b, _c(256)), scb)
            if vnni or not cpu_features()["avx2"]:
                isum = _group_isums(context, builder, vnni, *args)
                s8 = builder.load(ptr2d(context, builder, sig.args[5], s_a, i_, builder.mul(b, _c(8)),
                                        ir.VectorType(_I16, 8)), align=2)
                imin = _group_mins(builder, mnb, s8)
            else:
                isum = _group_isums_avx2(context, builder, *args)
                imin = _group_mins_avx2(context, builder, mnb, sig.args[5], s_a, i_, builder.mul(b, _c(8)))
            ints = builder.sitofp(builder.shuffle_vector(isum, imin, lane_index(range(16))), v16f)
            x = builder.load(ptr2d(context, builder, sig.args[6], xs_a, i_, b, f32), align=4)
            xv = builder.shuffle_vector(builder.insert_element(ir.Constant(v16f, None), x, ir.Constant(_I32, 0)),
                                        ir.Constant(v16f, None), lane_index([0] * 16))
            builder.store(builder.call(fma, [ints, builder.fmul(dm, xv), builder.load(acc_p)]), acc_p)
        acc = builder.load(acc_p)
        v8f = ir.VectorType(f32, 8)
        out = builder.fsub(builder.shuffle_vector(acc, acc, lane_index(range(8))),
                           builder.shuffle_vector(acc, acc, lane_index(range(8, 16))))
        builder.store(out, ptr2d(context, builder, sig.args[8], res_a, _c(0), _c(0), v8f), align=4)
        return context.get_dummy_value()

    return types.none(path, qs, types.intp, xq, types.intp, s16, xs, types.intp, res), codegen


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


@njit(cache=True)
def q4k_gemv_rows(path, W, a, i0, r0, r1, out):
    """out[i0:, r0:r1] for Q4_K weights (kblocks.py's groups of eight rows) as ggml_gemv_q4_K_8x8_q8_K computes
    each activation row (module docstring): a group's eight rows at a time, every super-block in one call."""
    qs = W[0]
    xq, xd, bsums, _ = a
    n, nb = xq.shape[0] - i0, q4k_blocks(qs)
    if n <= 0 or r1 <= r0:
        return
    s16 = np.empty((n, nb * 8), np.int16)
    sub_sums16(bsums, i0, s16)
    xs = np.empty((n, nb), np.float32)  # xd's rows, C-contiguous
    for i in range(n):
        for b in range(nb):
            xs[i, b] = xd[i0 + i, b]
    res = np.empty((1, Q4K_GROUP), np.float32)
    g0, g1 = r0 // Q4K_GROUP, (r1 + Q4K_GROUP - 1) // Q4K_GROUP
    for g in range(g0, g1):
        lo, hi = max(r0, g * Q4K_GROUP), min(r1, (g + 1) * Q4K_GROUP)
        for i in range(n):
            q4k_group(path, qs, g, xq, i0 + i, s16, xs, i, res)
            for r in range(lo, hi):
                out[i0 + i, r] = res[0, r - g * Q4K_GROUP]

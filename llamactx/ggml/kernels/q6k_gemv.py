"""Decode (activation rows one by one) of Q6_K weights near the memory roof, bit-identical to ggml's vec_dot.

llama.cpp has no repacked Q6_K on x86: a decode row runs `ggml_vec_dot_q6_K_q8_K` (arch/x86/quants.c, AVX2 path),
whose floats depend on eight int32 lanes per super-block. Lane L sums, over the eight 32-element quarters Q of the
super-block, sc_s * (q[4L..4L+3] . x[4L..4L+3]) of quarter Q (q = the unsigned 6-bit quant 0..63, s = the
16-element sub-block 2Q + L // 4), less q8sclsub's lane L = 32 * (sc_2L S_2L + sc_2L+1 S_2L+1), S_s the activation
sum of sub-block s (`bsums`). Per super-block acc = fma(d_w * d_x, float(lanes), acc) on the eight float lanes, and
the row's result is ggml's hsum_float_8(acc). Each lane is an exact integer computed in any order, so
`q6k_gemv_rows` makes ggml's floats from the same lanes, which it gets with far fewer instructions than the 256-bit
lane helpers (kquants' `_q6k_lanes1`, one quarter at a time; weights in L2, one thread, Zen 4: 26 -> 34 GB/s, llvm-mca
znver4 ~25 -> ~18 cycles per super-block; haswell code 24 -> 27 GB/s; bench/q6k_gemv_bench.py):

- 64 elements per vector: the quarters 2k and 2k + 1 (elements 64k .. 64k + 63, the natural order, so the
  activation quants are read as they are) come out of one 512-bit load of ql (its low nibbles for k even, high
  for k odd) and one 256-bit load of qh broadcast to both halves, each half's 2 high bits moved to bits 4-5 by one
  GFNI affine map (`vgf2p8affineqb`: Ice Lake, Zen 4) or else a per-half shift of 32-bit lanes and a mask
  (`vpsllvd` / `vpsrlvd`; constant shifts on AVX2's halves), then one `vpternlog` with the nibbles;
- with AVX512-VNNI: `vpdpbusd` against the activation quants gives each lane's sum of four products (at most
  4 x 63 x 128: exact in int16); one `vpermt2w` pairs quad m of quarters 4h, 4h + 1 with quad m of 4h + 2, 4h + 3
  (the same ggml lane) as int16, and one `vpdpwssd` multiplies both by their sub-blocks' scales (sign-extended once
  per super-block, spread by one `vpermw` per half) and adds them into sixteen int32 lanes, lanes L and L + 8 of
  the same ggml lane: six multiplying instructions per super-block. Otherwise `pmaddubsw` (pairs of products at
  most 2 x 63 x 128: exact int16) and `pmaddwd` against the scales per 64 elements (eight);
- the two halves added, q8sclsub subtracted (`pmaddwd` of the int16 bsums against the same scales, times 32), and
  the one float step per super-block.

Without AVX512BW the 512-bit operations run as 256-bit halves (AVX2's `vpmaddubsw` / `vpmaddwd`); without AVX2,
as plain widened vector IR. One weight row at a time, read as ggml stores it (kblocks.py: one stream of 210-byte
super-blocks per row). tests/ggml/test_q6k_gemv.py checks the results against vecdot_k bit for bit.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.intrinsics import widen_half
from llamactx.ggml.kernels.kblocks import Q6K_BYTES, Q6K_D, Q6K_QH, Q6K_QL, Q6K_SCALES, q6k_blocks
from llamactx.ggml.kernels.kgemv import _scaled_pairs
from llamactx.ggml.kernels.legacy import PREFETCH_BYTES, prefetch_ahead, prefetch_distance
from llamactx.ggml.kernels.simd import TagType, f32x8, fsum, fzero, lane_index, ptr2d
from llamactx.ggml.kernels.vnni import _pairwise

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()


def _target_has_gfni() -> bool:
    """GFNI's `vgf2p8affineqb` on 512-bit vectors (Ice Lake, Zen 4 and newer): the host's feature when numba
    compiles for the host, else only where NUMBA_CPU_FEATURES names +gfni (cpu.py gives a named CPU its LLVM
    features, and its table of them leaves GFNI out)."""
    if not cpu_features()["avx512bw"]:
        return False
    name, feats = numba.config.CPU_NAME, numba.config.CPU_FEATURES
    if name in (None, "", "host"):
        return bool(llvm.get_host_cpu_features().get("gfni")) and "-gfni" not in (feats or "")
    return "+gfni" in (feats or "")


_GFNI = _target_has_gfni()


def _c(v):
    return ir.Constant(_I64, v)


def _bytes(v, n=64):
    return ir.Constant(ir.VectorType(_I8, n), [v] * n)


def _quads(builder, w, x):
    """<32 x i16>: `vpdpbusd`'s sums of four products (w . x over bytes 4m .. 4m + 3 in dword m: at most
    4 x 63 x 128, so exact as int16) as the low words of its sixteen dwords (the high words are their signs)."""
    v16 = ir.VectorType(_I32, 16)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16] * 3),
                                        "llvm.x86.avx512.vpdpbusd.512")
    dots = builder.call(fn, [ir.Constant(v16, None), builder.bitcast(w, v16), builder.bitcast(x, v16)])
    return builder.bitcast(dots, ir.VectorType(_I16, 32))


def _scaled_quads(builder, acc, quads, sc, half):
    """acc + the scaled quads of half `half` (quarters 4h .. 4h + 3): `quads` = (quarters 4h | 4h + 1, quarters
    4h + 2 | 4h + 3), each quarter's eight quads in dwords. One `vpermt2w` pairs quad m of the first with quad m
    of the second (the same ggml lane m % 8), one `vpdpwssd` multiplies both by their sub-blocks' scales and adds
    them: a scale multiply per two quads where `_scaled_pairs` has one per two pairs."""
    pairs = builder.shuffle_vector(quads[0], quads[1], lane_index([v for m in range(16) for v in (2 * m, 32 + 2 * m)]))
    q = [4 * half + m // 8 for m in range(16)]  # dword m's quarter in quads[0]; quads[1]'s is two further
    picks = [v for m in range(16) for v in (2 * q[m] + m % 8 // 4, 2 * (q[m] + 2) + m % 8 // 4)]
    scales = builder.shuffle_vector(sc, sc, lane_index(picks))
    v16 = ir.VectorType(_I32, 16)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16] * 3),
                                        "llvm.x86.avx512.vpdpwssd.512")
    return builder.call(fn, [acc, builder.bitcast(pairs, v16), builder.bitcast(scales, v16)])


def _quants(builder, ql, qh, k):
    """<64 x i8>: the 6-bit quants of elements 64k .. 64k + 63 of a super-block (quarters 2k, 2k + 1), from its
    64 bytes of ql for half k // 2 and that half's 32 bytes of qh in both 256-bit halves (ggml-quants.c
    dequantize_row_q6_K: quarter t of a half takes ql's low nibbles (t = 0, 1) or high ones (t = 2, 3) and bits
    2t, 2t + 1 of qh)."""
    v16 = ir.VectorType(_I32, 16)
    lo = ql if k % 2 == 0 else builder.bitcast(builder.lshr(builder.bitcast(ql, v16), ir.Constant(v16, [4] * 16)),
                                               ql.type)
    if _GFNI:  # one affine map per byte moves bits 2t, 2t + 1 to 4, 5 and clears the rest
        t0 = 2 * (k % 2)
        mats = [(1 << (2 * t)) << 24 | (1 << (2 * t + 1)) << 16 for t in (t0, t0 + 1)]
        m = ir.Constant(ir.VectorType(_I64, 8), [mats[0]] * 4 + [mats[1]] * 4)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ql.type, [ql.type, ql.type, _I8]),
                                            "llvm.x86.vgf2p8affineqb.512")
        h = builder.call(fn, [qh, builder.bitcast(m, ql.type), ir.Constant(_I8, 0)])
        return builder.or_(builder.and_(lo, _bytes(0x0F)), h)
    h = builder.bitcast(qh, v16)
    if k % 2 == 0:  # t = 0, 1: qh bits 0-1 / 2-3 up to bits 4-5
        h = builder.shl(h, ir.Constant(v16, [4] * 8 + [2] * 8))
    else:  # t = 2, 3: bits 4-5 stay, 6-7 down to 4-5
        h = builder.lshr(h, ir.Constant(v16, [0] * 8 + [2] * 8))
    h = builder.bitcast(h, ql.type)
    return builder.or_(builder.and_(lo, _bytes(0x0F)), builder.and_(h, _bytes(0x30)))


def _opaque(builder, v):
    """v, through an empty inline asm: LLVM would move the scales' word permutes before their sign extension,
    a byte shuffle and a `vpmovsxbw` to 512 bits per permute where one `vpermw` does (AVX512BW)."""
    asm = ir.InlineAsm(ir.FunctionType(v.type, [v.type]), "", "=v,0")
    return builder.call(asm, [v])


def _spread(k):
    """Word picks of `_lanes`' scale sources for 64 elements 64k..: sub-block 4k + q's scale in words 8q .. 8q + 7.
    A source holds all sixteen scales (AVX512BW), else words 8h .. 8h + 7 of them in both 128-bit lanes (h = k // 2),
    the picks of each lane from that lane."""
    if cpu_features()["avx512bw"]:
        return [4 * k + q for q in range(4) for _ in range(8)]
    return [(4 * k + q) % 8 + 8 * (q % 2) for q in range(4) for _ in range(8)]


def _lanes(context, builder, vnni, qsty, qs, r, col, xty, xq, i, j):
    """(<8 x i32> lanes before q8sclsub, <16 x i16> scales) of the super-block at byte `col` of weight row r
    against activation row i's quants from element j."""
    def load(ty, arrty, arr, row, at, n):
        return builder.load(ptr2d(context, builder, arrty, arr, row, at, ir.VectorType(ty, n)), align=1)

    sc = builder.sext(load(_I8, qsty, qs, r, builder.add(col, _c(Q6K_SCALES)), 16), ir.VectorType(_I16, 16))
    if cpu_features()["avx512bw"]:  # one `vpermw` per 64 elements
        src = [_opaque(builder, sc)] * 2
    else:  # one in-lane `vpshufb` per 32: words 0-7 (8-15) in both 128-bit lanes, each lane picks its own
        src = [_opaque(builder, builder.shuffle_vector(sc, sc, lane_index(list(range(8 * h, 8 * h + 8)) * 2)))
               for h in (0, 1)]
    acc = ir.Constant(ir.VectorType(_I32, 16), None)
    for half in (0, 1):
        ql = load(_I8, qsty, qs, r, builder.add(col, _c(Q6K_QL + 64 * half)), 64)
        qh = load(_I8, qsty, qs, r, builder.add(col, _c(Q6K_QH + 32 * half)), 32)
        qh = builder.shuffle_vector(qh, qh, lane_index(list(range(32)) * 2))
        if vnni and cpu_features()["avx512bw"]:  # quads first, then the scales on two quarters' quads at once
            quads = [_quads(builder, _quants(builder, ql, qh, k), load(_I8, xty, xq, i, builder.add(j, _c(64 * k)), 64))
                     for k in (2 * half, 2 * half + 1)]
            acc = _scaled_quads(builder, acc, quads, src[0], half)
            continue
        for k in (2 * half, 2 * half + 1):
            w = _quants(builder, ql, qh, k)
            x = load(_I8, xty, xq, i, builder.add(j, _c(64 * k)), 64)
            s = builder.shuffle_vector(src[k // 2], src[k // 2], lane_index(_spread(k)))
            acc = _scaled_pairs(builder, vnni, acc, w, x, s)
    lanes = builder.add(builder.shuffle_vector(acc, acc, lane_index(range(8))),
                        builder.shuffle_vector(acc, acc, lane_index(range(8, 16))))
    return lanes, sc


def _sclsub(builder, sc, s16):
    """<8 x i32> q8sclsub: lane j = 32 * (sc_2j S_2j + sc_2j+1 S_2j+1) (ggml's madd(q8sums, scales_16) << 5)."""
    v8 = ir.VectorType(_I32, 8)
    if cpu_features()["avx2"]:
        p = _pairwise(builder, "maddwd", s16, sc)
    else:
        v16 = ir.VectorType(_I32, 16)
        q = builder.mul(builder.sext(s16, v16), builder.sext(sc, v16))
        p = builder.add(builder.shuffle_vector(q, q, lane_index(range(0, 16, 2))),
                        builder.shuffle_vector(q, q, lane_index(range(1, 16, 2))))
    return builder.shl(p, ir.Constant(v8, [5] * 8))


@intrinsic
def q6k_step(typingctx, path, qs, r, b, xq, i, s16, si, xd, acc):
    """acc after super-block b of weight row r against activation row i of xq / xd (Q8_K quants and scales) and
    row si of s16 (the bsums as int16): acc = fma(d_w * d_x, float(lanes - q8sclsub), acc), the float step of
    ggml_vec_dot_q6_K_q8_K. One super-block per call: two per call measured no faster (Zen 4, znver4 code) and
    slower with AVX2's sixteen registers (haswell code)."""
    if not isinstance(path, TagType) or path.tag_name not in ("vnni", "portable"):
        return None

    def codegen(context, builder, sig, args):
        _, qs_a, r_, b_, xq_a, i_, s_a, si_, xd_a, acc_ = args
        vnni = sig.args[0].tag_name == "vnni" and cpu_features()["avx512vnni"]
        v8f = ir.VectorType(_F32, 8)
        col = builder.mul(b_, _c(Q6K_BYTES))
        lanes, sc = _lanes(context, builder, vnni, sig.args[1], qs_a, r_, col, sig.args[4], xq_a, i_,
                           builder.mul(b_, _c(256)))
        s16 = builder.load(ptr2d(context, builder, sig.args[6], s_a, si_, builder.mul(b_, _c(16)),
                                 ir.VectorType(_I16, 16)), align=2)
        lanes = builder.sub(lanes, _sclsub(builder, sc, s16))
        dw = builder.load(ptr2d(context, builder, sig.args[1], qs_a, r_, builder.add(col, _c(Q6K_D)), _I16), align=1)
        dx = builder.load(ptr2d(context, builder, sig.args[8], xd_a, i_, b_, _F32), align=4)
        d = builder.fmul(dx, widen_half(builder, dw))  # ggml: y[i].d * GGML_FP16_TO_FP32(x[i].d)
        dv = builder.shuffle_vector(builder.insert_element(ir.Constant(v8f, None), d, _c(0)),
                                    ir.Constant(v8f, None), lane_index([0] * 8))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f] * 3), "llvm.fma.v8f32")
        return builder.call(fma, [dv, builder.sitofp(lanes, v8f), acc_])

    return f32x8(path, qs, types.intp, types.intp, xq, types.intp, s16, types.intp, xd, f32x8), codegen


@njit(cache=True)
def bsums16(bsums, i0):
    """bsums[i0:] as int16 (Q8_K's sums of 16 quants, within +-2032): `q6k_step`'s operand for q8sclsub."""
    out = np.empty((bsums.shape[0] - i0, bsums.shape[1]), np.int16)
    for i in range(out.shape[0]):
        for s in range(out.shape[1]):
            out[i, s] = bsums[i0 + i, s]
    return out


@njit(cache=True, inline="always")  # a call per weight row would reference-count its five arrays (atomics)
def q6k_gemv_row(path, qs, r, xq, xd, s16, i0, out):
    """out[i0 + i, r] for every row i of s16 (`bsums16(bsums, i0)`): weight row r of ggml's block_q6_K rows qs
    against activation rows i0.. of xq / xd, each as ggml_vec_dot_q6_K_q8_K computes it (module docstring)."""
    for i in range(s16.shape[0]):
        acc = fzero()
        for b in range(q6k_blocks(qs)):
            acc = q6k_step(path, qs, r, b, xq, i0 + i, s16, i, xd, acc)
        out[i0 + i, r] = fsum(acc)


@njit(cache=True)
def q6k_gemv_rows(path, W, a, i0, r0, r1, out):
    """out[i0:, r0:r1] for Q6_K weights (ggml's block_q6_K rows in W[0]) and activations a = (xq, xd, bsums, _):
    `q6k_gemv_row` for weight rows r0..r1-1, the next rows prefetched as decode streams them (legacy.py)."""
    if a[0].shape[0] <= i0:
        return
    s16 = bsums16(a[2], i0)
    ahead = prefetch_distance(W[0], W[1], W[2]) if PREFETCH_BYTES else 0  # not even the call where it is off
    for r in range(r0, r1):
        if ahead:
            prefetch_ahead(W[0], W[1], W[2], r, r0, r1, ahead, 1)
        q6k_gemv_row(path, W[0], r, a[0], a[1], s16, i0, out)

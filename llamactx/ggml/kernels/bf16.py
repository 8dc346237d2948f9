"""BF16 weights on the kernels: llamafile's tinyBLAS for BF16 (llamafile/sgemm.cpp `tinyBLAS<32, __m512,
__m512bh>` with AVX512_BF16, `tinyBLAS<16, __m512>` on widened values without it), whose order
llamactx.ggml.vecdot_bf16 (the oracle) describes: each output is one 16-lane accumulator over k from zero, then
`_mm512_reduce_add_ps`.

- With AVX512_BF16 (`arithmetic()["bf16_dot"]`) the step is ggml's own instruction, `vdpbf16ps` (LLVM's
  `llvm.x86.avx512bf16.dpbf16ps.512`) over 32 elements: lane i adds the odd product 2i+1, then the even one,
  each rounded (denormals treated as ggml's hardware treats them, since it is the same instruction).
- Without it (an AVX-512 target without BF16) the values are widened to float32 and each lane takes one FMA per
  16 elements, in order: two FMAs per 32-element step.

Weights are read as stored (uint16 bf16 bits, (rows, k): no packed copy), activations rounded to bf16 once
(`ggml_compute_fp32_to_bf16`). From 4 activation rows a 4-row x 4-token tile keeps 16 accumulators in registers
and loads each weight and activation vector once per step; below, each weight row is read once, in order. The
rows are split among the threads. Shapes outside tinyBLAS's (k % 32,
rows % 4) and AVX2 targets (8-lane `hsum` order) stay on the reference kernel (`supports`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from llamactx.ggml.cpu import F32_EPR, arithmetic
from llamactx.ggml.kernels.simd import ptr2d
from llamactx.ggml.kernels.wide import f32x16, reduce_add16, wzero

BF16_DOT = bool(arithmetic()["bf16_dot"])  # a compile-time constant: the target's instruction set
STEP = 32  # elements per accumulation step (one vdpbf16ps, or two 16-lane FMAs)
TILE = 4  # weight rows and activation rows per register tile

_I16, _I32 = ir.IntType(16), ir.IntType(32)
_V16I32 = ir.VectorType(_I32, 16)
_V16I16 = ir.VectorType(_I16, 16)
_V16F32 = ir.VectorType(ir.FloatType(), 16)


class _BFloat(ir.Type):
    """LLVM's `bfloat` (llvmlite has no such type): the element type of dpbf16ps's operands."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other) -> bool:
        return isinstance(other, _BFloat)

    def __hash__(self) -> int:
        return hash("bfloat")


_V32BF16 = ir.VectorType(_BFloat(), 32)


def _widened(builder, h):
    """<16 x i16> bf16 bits -> <16 x float> (exact: the bits are the float's upper half)."""
    return builder.bitcast(builder.shl(builder.zext(h, _V16I32), ir.Constant(_V16I32, [16] * 16)), _V16F32)


@intrinsic
def bdot(typingctx, acc, w, r, x, t, c):
    """acc + w[r, c:c+32] . x[t, c:c+32] as tinyBLAS's BF16 step (module docstring); w, x: 2-D uint16 bf16 bits."""
    sig = f32x16(f32x16, w, types.intp, x, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        acc, w, r, x, t, c = args
        if BF16_DOT:
            a = builder.load(ptr2d(context, builder, sig.args[1], w, r, c, _V16I32), align=1)
            b = builder.load(ptr2d(context, builder, sig.args[3], x, t, c, _V16I32), align=1)
            fty = ir.FunctionType(_V16F32, [_V16F32, _V32BF16, _V32BF16])
            fn = cgutils.get_or_insert_function(builder.module, fty, "llvm.x86.avx512bf16.dpbf16ps.512")
            return builder.call(fn, [acc, builder.bitcast(a, _V32BF16), builder.bitcast(b, _V32BF16)])
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 3),
                                             "llvm.fma.v16f32")
        for half in (0, 16):
            col = builder.add(c, ir.Constant(c.type, half))
            a = builder.load(ptr2d(context, builder, sig.args[1], w, r, col, _V16I16), align=1)
            b = builder.load(ptr2d(context, builder, sig.args[3], x, t, col, _V16I16), align=1)
            acc = builder.call(fma, [_widened(builder, a), _widened(builder, b), acc])
        return acc

    return sig, codegen


@njit(cache=True)
def _tile(w, r, x, t, k, out):  # pragma: no cover - compiled
    """out[t:t+4, r:r+4]: 16 accumulators, each weight and activation vector loaded once per step."""
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = wzero()
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = wzero()
    for c in range(0, k, STEP):
        a00 = bdot(a00, w, r, x, t, c)
        a01 = bdot(a01, w, r + 1, x, t, c)
        a02 = bdot(a02, w, r + 2, x, t, c)
        a03 = bdot(a03, w, r + 3, x, t, c)
        a10 = bdot(a10, w, r, x, t + 1, c)
        a11 = bdot(a11, w, r + 1, x, t + 1, c)
        a12 = bdot(a12, w, r + 2, x, t + 1, c)
        a13 = bdot(a13, w, r + 3, x, t + 1, c)
        a20 = bdot(a20, w, r, x, t + 2, c)
        a21 = bdot(a21, w, r + 1, x, t + 2, c)
        a22 = bdot(a22, w, r + 2, x, t + 2, c)
        a23 = bdot(a23, w, r + 3, x, t + 2, c)
        a30 = bdot(a30, w, r, x, t + 3, c)
        a31 = bdot(a31, w, r + 1, x, t + 3, c)
        a32 = bdot(a32, w, r + 2, x, t + 3, c)
        a33 = bdot(a33, w, r + 3, x, t + 3, c)
    out[t, r], out[t, r + 1], out[t, r + 2], out[t, r + 3] = (reduce_add16(a00), reduce_add16(a01),
                                                              reduce_add16(a02), reduce_add16(a03))
    out[t + 1, r], out[t + 1, r + 1], out[t + 1, r + 2], out[t + 1, r + 3] = (reduce_add16(a10), reduce_add16(a11),
                                                                              reduce_add16(a12), reduce_add16(a13))
    out[t + 2, r], out[t + 2, r + 1], out[t + 2, r + 2], out[t + 2, r + 3] = (reduce_add16(a20), reduce_add16(a21),
                                                                              reduce_add16(a22), reduce_add16(a23))
    out[t + 3, r], out[t + 3, r + 1], out[t + 3, r + 2], out[t + 3, r + 3] = (reduce_add16(a30), reduce_add16(a31),
                                                                              reduce_add16(a32), reduce_add16(a33))


@njit(cache=True)
def _row(w, r, x, t, k, out):  # pragma: no cover - compiled
    """out[t, r]: one weight row against one activation row."""
    acc = wzero()
    for c in range(0, k, STEP):
        acc = bdot(acc, w, r, x, t, c)
    out[t, r] = reduce_add16(acc)


@njit(cache=True)
def _to_bf16(x, xb):  # pragma: no cover - compiled
    """quants_cpu.bf16_bits (ggml_compute_fp32_to_bf16) of x (n, k) float32 into xb (n, k) uint16."""
    u = x.view(np.uint32)
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = u[t, j]
            if v & np.uint32(0x7FFFFFFF) > np.uint32(0x7F800000):  # NaN: kept, made quiet
                xb[t, j] = np.uint16((v >> np.uint32(16)) | np.uint32(64))
            else:  # round to nearest even (cannot overflow: the largest finite value rounds to infinity)
                xb[t, j] = np.uint16((v + np.uint32(0x7FFF) + ((v >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@njit(parallel=True, cache=True)
def gemm(w, x, n_tasks, out):  # pragma: no cover - compiled
    """out (n, rows) float32 = x (n, k) float32 . w^T for w (rows, k) uint16 bf16 bits (a packed BF16 weight's
    `qs`, viewed) of a shape `supports` accepts, the rows split into n_tasks contiguous shares. Below 4 activation
    rows each thread reads its weight rows once, in order (one sequential stream: faster from memory than four
    rows side by side), the activation rows taking each weight row from L1; from 4, 4 x 4 register tiles."""
    n, k = x.shape
    xb = np.empty((n, k), np.uint16)
    _to_bf16(x, xb)
    rows = w.shape[0]
    groups = rows // TILE
    n_tasks = max(1, min(n_tasks, groups))
    n4 = n // TILE * TILE
    for task in prange(n_tasks):
        g0, g1 = task * groups // n_tasks, (task + 1) * groups // n_tasks
        if n4 == 0:
            for r in range(g0 * TILE, g1 * TILE):
                for t in range(n):
                    _row(w, r, xb, t, k, out)
            continue
        for g in range(g0, g1):
            r = g * TILE
            for t in range(0, n4, TILE):
                _tile(w, r, xb, t, k, out)
            for t in range(n4, n):
                for i in range(TILE):
                    _row(w, r + i, xb, t, k, out)


def supports(weight) -> bool:
    """Whether the kernel computes this weight's products in llama.cpp's order: tinyBLAS's shapes (k % 32,
    rows % 4) on an AVX-512 target. llama.cpp takes tinyBLAS from 2 activation rows and ggml_vec_dot_bf16 for one;
    llamactx computes one row like several (as for F32 / F16 weights, docs/numerics.md), and under
    ggml_single_row leaves it to ReferenceOps (FastOps._vec_dot_bf16)."""
    return F32_EPR == 16 and int(weight.shape[0]) % STEP == 0 and weight.n_rows % TILE == 0

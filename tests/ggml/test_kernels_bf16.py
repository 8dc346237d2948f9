"""BF16 weights on the kernels (llamactx.ggml.kernels.bf16) bit for bit against the reference kernel (vecdot_bf16,
itself bit-identical to llama.cpp's tinyBLAS and ggml_vec_dot_bf16: tests/models/test_tiny_quant_types.py), and
FastOps' choice between them."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.backend.fast import FastOps
from llamactx.backend.reference import ReferenceOps
from llamactx.ggml import kernels
from llamactx.ggml.cpu import F32_EPR, arithmetic
from llamactx.ggml.kernels import bf16
from llamactx.ggml.quants_cpu import bf16_bits
from llamactx.model import Weight

pytestmark = pytest.mark.skipif(F32_EPR != 16, reason="the BF16 kernel is built for AVX-512 targets; AVX2 ones "
                                                      "compute BF16 on the reference kernel")


def bf16_weight(k: int, rows: int, rng, scale: float = 1.0) -> Weight:
    """Random normal values rounded to bf16 (no denormals: the reference adds them as IEEE floats, while
    vdpbf16ps treats them as zero, as llama.cpp's own instruction does)."""
    w = (rng.standard_normal((rows, k)) * scale).astype(np.float32)
    bits = ((w.view(np.uint32) + 0x8000) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, 2 * k)
    bits.flags.writeable = False
    return Weight("bf16.w", int(T.BF16), (k, rows), bits)


def assert_bits(got: np.ndarray, ref: np.ndarray, what) -> None:
    assert got.view(np.uint32).tolist() == ref.view(np.uint32).tolist(), what


@pytest.mark.parametrize("k", [32, 576, 1536])
def test_kernel_matches_reference_bit_for_bit(k):
    """Every tile shape: 1..9 and 17 activation rows (4 x 4 tiles and the single-row remainder), 4 / 36 weight rows
    (one group, or shares of 9 groups over the threads), 1 and 2 threads; activations of mixed magnitudes, so the
    bf16 rounding of x and the order of the additions both matter."""
    rng = np.random.default_rng(k)
    ref = ReferenceOps()
    for rows in (4, 36):
        w = bf16_weight(k, rows, rng)
        for n in (1, 2, 3, 4, 5, 8, 9, 17):
            x = (rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 50.0], (n, 1))).astype(np.float32)
            for threads in (1, 2):
                got = kernels.matmul(x, kernels.pack_weight(w), threads)  # (n, rows)
                assert_bits(got, ref.matmul(x, w), (rows, n, threads))


def test_denormals_as_the_instruction_treats_them():
    """With AVX512_BF16, vdpbf16ps reads denormal inputs as zero and flushes denormal products and sums (its
    implied DAZ / FTZ): the reference models it, and the kernel is the instruction. Without it (widened FMAs) both
    keep IEEE denormals. Weights or activations of 1e-39 (denormal), products and sums below 2^-126."""
    rng = np.random.default_rng(11)
    ref = ReferenceOps()
    for sw, sx in ((1e-20, 1e-19), (1e-39, 1e10), (1e10, 1e-39), (1e-30, 1e-9)):
        w = bf16_weight(64, 8, rng, sw)
        x = (rng.standard_normal((5, 64)) * sx).astype(np.float32)
        got = kernels.matmul(x, kernels.pack_weight(w), 2)
        assert_bits(got, ref.matmul(x, w), (sw, sx))
        if arithmetic()["bf16_dot"] and sw * sx < 1e-36:
            assert not got.any()  # every product is flushed


def test_fast_ops_take_the_kernel_only_where_it_is_llama_cpps_order(monkeypatch):
    """FastOps: the kernel for tinyBLAS's shapes, the reference for k % 32 != 0, rows % 4 != 0 and (under
    ggml_single_row) one activation row, each equal to ReferenceOps."""
    rng = np.random.default_rng(7)
    calls = []
    monkeypatch.setattr(FastOps, "_packed", lambda self, w: calls.append(w.name) or kernels.pack_weight(w))
    fast, ref = FastOps(None), ReferenceOps()
    fast.set_threads(2)
    for k, rows, n, kernel in ((64, 8, 3, True), (64, 8, 1, True), (48, 8, 3, False), (64, 6, 3, False)):
        calls.clear()
        w = bf16_weight(k, rows, rng)
        x = rng.standard_normal((n, k)).astype(np.float32)
        assert_bits(fast.matmul(x, w), ref.matmul(x, w), (k, rows, n))
        assert bool(calls) == kernel, (k, rows, n)
    fast.ggml_single_row = ref.ggml_single_row = True  # one row: ggml_vec_dot_bf16's order, on the reference
    calls.clear()
    w, x = bf16_weight(64, 8, rng), rng.standard_normal((1, 64)).astype(np.float32)
    assert_bits(fast.matmul(x, w), ref.matmul(x, w), "single row")
    assert_bits(fast.matmuls(x, [w, w])[1], ref.matmul(x, w), "single row, two weights")
    assert not calls


def test_activations_round_as_ggml():
    """bf16_bits (the reference's) and the kernel's conversion are ggml_compute_fp32_to_bf16: ties to even, NaN
    kept a (quiet) NaN, infinities and overflow to infinity kept; equal on every kind of value."""
    x = np.array([[1.0, 1.00390625, 1.01171875, -2.5, np.inf, -np.inf, np.nan, 3.4028235e38, 1e-40]], np.float32)
    got = bf16_bits(x)[0]
    assert got[:6].tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80, 0xFF80]
    assert got[6] & 0x7FC0 == 0x7FC0 and got[7] == 0x7F80 and got[8] == 0x0001
    rng = np.random.default_rng(3)
    x = np.concatenate([x, rng.integers(0, 2**32, (4, 9), dtype=np.uint32).view(np.float32)])  # NaN payloads too
    kernel = np.empty(x.shape, np.uint16)
    bf16._to_bf16(x, kernel)
    np.testing.assert_array_equal(kernel, bf16_bits(x))


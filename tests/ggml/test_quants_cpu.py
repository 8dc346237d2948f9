"""ggml-cpu's x86 activation / KV-cache quantizers (llamactx.ggml.quants_cpu) on hand-worked blocks.

Oracles: blocks worked by hand from ggml-cpu/arch/x86/quants.c and ggml-quants.c, and gguf-py's reference
quantizers where the two agree (and, for contrast, where they do not). Comparisons view float32 as uint32.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from llamactx.ggml.quants_cpu import (
    fake_quant,
    quantize_q4_0,
    quantize_q8_0,
    quantize_q8_1,
    quantize_q8_K,
    vec_dot_type,
)
from llamactx.gguf.quants import dequantize

T = GGMLQuantizationType


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# A Q8_0 block with amax = 127: d = 127 / 127 = 1.0 (f16 0x3C00), id = 127 / 127 = 1.0, so x * id = x and
# the halves are exact ties. x86 _mm256_round_ps(_MM_ROUND_NEAREST) rounds them to even; ggml's reference
# (roundf, and gguf-py's np_roundf) rounds them away from zero.
TIE_BLOCK = np.array([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -127] + [0] * 23, dtype=np.float32)
TIE_Q_X86 = [127, 0, 2, 2, 0, -2, -2, 4, -127] + [0] * 23
TIE_Q_REF = [127, 1, 2, 3, -1, -2, -3, 4, -127] + [0] * 23


def test_quantize_q8_0_rounds_ties_to_even():
    out = quantize_q8_0(TIE_BLOCK)
    assert out.shape == (34,) and out.dtype == np.uint8
    assert out[:2].tolist() == [0x00, 0x3C]  # f16 1.0, little-endian
    assert out[2:].view(np.int8).tolist() == TIE_Q_X86
    ref = gq.quantize(TIE_BLOCK[None], T.Q8_0)[0]  # the reference rounding, for contrast
    assert ref[:2].tolist() == [0x00, 0x3C] and ref[2:].view(np.int8).tolist() == TIE_Q_REF


def test_quantize_q8_0_uses_127_over_amax():
    # amax = 11, x = 5.5: x86 id = 127/11 = 0x1.71745ep+3, 5.5 * id = 63.500004 -> 64; the reference
    # id = 1 / (11/127) = 0x1.71745cp+3, 5.5 * id = 63.499996 -> 63. Not a tie: a different multiplier.
    x = np.zeros(32, np.float32)
    x[:2] = [11.0, 5.5]
    assert quantize_q8_0(x)[2:4].view(np.int8).tolist() == [127, 64]
    assert gq.quantize(x[None], T.Q8_0)[0, 2:4].view(np.int8).tolist() == [127, 63]


def test_quantize_q8_0_close_to_reference_and_round_trips():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 512)) * rng.uniform(0.01, 10, (64, 1))).astype(np.float32)
    ours = quantize_q8_0(x)
    assert ours.shape == (64, 16 * 34)
    ref = gq.quantize(x, T.Q8_0)
    blocks, ref_blocks = ours.reshape(-1, 34), ref.reshape(-1, 34)
    np.testing.assert_array_equal(blocks[:, :2], ref_blocks[:, :2])  # same d = amax / 127
    dq = blocks[:, 2:].view(np.int8).astype(int) - ref_blocks[:, 2:].view(np.int8)
    assert np.abs(dq).max() <= 1 and np.count_nonzero(dq) < dq.size // 1000
    back = dequantize(ours.reshape(-1), T.Q8_0, (512, 64))  # (64, 512)
    amax = np.abs(x.reshape(64, 16, 32)).max(axis=-1, keepdims=True)
    err = np.abs(back - x).reshape(64, 16, 32)
    assert np.all(err <= 0.51 * amax / 127 + 127 * amax / 127 * 2.0**-11)  # half a step + f16 error of d
    np.testing.assert_array_equal(fake_quant(x, T.Q8_0), back)


def test_quantize_q8_0_block_edges():
    zero = quantize_q8_0(np.zeros((2, 32), np.float32))
    assert not zero.any()  # d = +0, id = 0, q = 0
    # amax = 1e-38: 127 / amax overflows to inf, x * inf = +-inf and 0 * inf = NaN, which cvtps_epi32 turns
    # into INT32_MIN and packs saturates to -128; d = 1e-38 / 127 underflows to f16 +0.
    tiny = np.zeros(32, np.float32)
    tiny[:2] = [1e-38, -1e-38]
    out = quantize_q8_0(tiny)
    assert out[:2].tolist() == [0, 0] and out[2:].view(np.int8).tolist() == [-128] * 32
    with pytest.raises(ValueError, match="row length 48 .* 32"):
        quantize_q8_0(np.zeros(48, np.float32))


def test_quantize_q8_1_hand_worked():
    # amax = 3, x = [3, 3/8, 6/8, ..., 21/8]: id = 127/3, q = rint(k * 127/8)
    # = [127, 16, 32, 48, 64, 79, 95, 111], sum 572. d = 3/127 = 0.023622047 (f16 0x260C = 0.02362060546875).
    # s = f16(d * 572) with the f32 d: 13.511811 -> 13.515625 (0x4AC2); the f16 d would give
    # 13.51098 -> 13.5078125 (0x4AC1).
    x = np.zeros(32, np.float32)
    x[:8] = [3.0] + [3.0 * k / 8 for k in range(1, 8)]
    out = quantize_q8_1(np.stack([x, TIE_BLOCK]))
    assert out.shape == (2, 36)
    assert out[0, :4].view(np.uint16).tolist() == [0x260C, 0x4AC2]
    assert out[0, 4:12].view(np.int8).tolist() == [127, 16, 32, 48, 64, 79, 95, 111]
    # the tie block: d = 1.0, ties to even as Q8_0, s = 1.0 * sum(q) = 4
    assert out[1, :4].view(np.float16).tolist() == [1.0, 4.0]
    assert out[1, 4:].view(np.int8).tolist() == TIE_Q_X86
    fq = fake_quant(x, T.Q8_1)
    d16 = np.float32(np.float16(3.0 / 127))
    np.testing.assert_array_equal(fq[:8], d16 * out[0, 4:12].view(np.int8).astype(np.float32))


def test_quantize_q8_K_hand_worked():
    # block 0: the first largest |x| is -254, so iscale = -127 / -254 = 0.5 and d = 1 / 0.5 = 2.0 (f32).
    # nearest_int rounds ties to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, -1.5 -> -2; 254 -> 127.
    # block 1: +2 comes before -2, so iscale = -127 / 2 = -63.5, d = -1/63.5, and q(+2) = -127, q(-2) = 127.
    # block 2: all zero -> d = 0, q = 0, bsums = 0.
    x = np.zeros((3, 256), np.float32)
    x[0, :8] = [-254, 1, 3, 5, -1, -3, 254, 2]
    x[1, [0, 40]] = [2.0, -2.0]
    out = quantize_q8_K(x.reshape(-1))
    assert out.shape == (3 * 292,)
    b = out.reshape(3, 292)
    d = b[:, :4].copy().view(np.float32)[:, 0]
    qs = b[:, 4:260].view(np.int8)
    bsums = b[:, 260:].copy().view(np.int16)
    assert d.tolist() == [2.0, np.float32(1.0) / np.float32(-63.5), 0.0]
    assert qs[0, :8].tolist() == [-127, 0, 2, 2, 0, -2, 127, 1] and not qs[0, 8:].any()
    assert bsums[0].tolist() == [3] + [0] * 15
    assert qs[1, 0] == -127 and qs[1, 40] == 127 and bsums[1, 0] == -127 and bsums[1, 2] == 127
    assert not b[2].any()
    fq = fake_quant(x, T.Q8_K)
    assert fq[0, :8].tolist() == [-254, 0, 4, 4, 0, -4, 254, 2]
    np.testing.assert_array_equal(fq[1], d[1] * qs[1].astype(np.float32))
    with pytest.raises(ValueError, match="row length 128 .* 256"):
        quantize_q8_K(np.zeros(128, np.float32))


def test_quantize_q4_0_matches_reference():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 320)).astype(np.float32)
    x[0, 32:64] = 0.0
    x[1, :32] = np.linspace(-1, 1, 32)  # +1 and -1 both: the first one (-1) sets the sign of d
    x[2, :32] = 7.0  # q = trunc(7 * (-8/7)^-1 ... ) hits the MIN(15, .) clamp
    ours = quantize_q4_0(x)
    assert ours.shape == (9, 10 * 18)
    np.testing.assert_array_equal(ours, gq.quantize(x, T.Q4_0))  # both follow quantize_row_q4_0_ref
    back = dequantize(ours.reshape(-1), T.Q4_0, (320, 9))
    np.testing.assert_array_equal(bits(back), bits(gq.dequantize(ours, T.Q4_0)))


def test_quantize_q4_0_all_negative_zero_block():
    # quantize_row_q4_0_ref starts from max = +0.0 and keeps it (|-0.0| is not > 0), so d = +0.0 / -8 = -0.0;
    # gguf-py's argmax picks the -0.0 itself and stores +0.0. We follow the C code.
    out = quantize_q4_0(np.full(32, -0.0, np.float32))
    assert out[:2].view(np.uint16).tolist() == [0x8000]
    assert out[2:].tolist() == [0x88] * 16  # id = 0 -> trunc(8.5) = 8 in both nibbles


def test_fake_quant_float_types_and_vec_dot_type():
    x = np.array([1.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 3.0e38, -0.0], np.float32)
    np.testing.assert_array_equal(fake_quant(x, T.F32), x)
    f16 = fake_quant(x, T.F16)  # round to nearest even: the two ties go to 1.0 and 1 + 2^-9
    assert f16[:4].tolist() == [1.0, 1.0, 1 + 2.0**-9, 1 + 2.0**-8] and np.isinf(f16[4])
    bf16 = fake_quant(x, T.BF16)
    np.testing.assert_array_equal(bits(bf16), bits(gq.dequantize(gq.quantize(x, T.BF16), T.BF16)))
    assert bits(bf16)[5] == 0x80000000
    with pytest.raises(ValueError, match="vec_dot_type"):
        fake_quant(x, T.Q4_0)

    expected = {
        T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16, T.Q8_0: T.Q8_0, T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0,
        T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1, T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K,
        T.Q6_K: T.Q8_K,
    }  # fmt: skip
    for weight, act in expected.items():
        assert vec_dot_type(weight) == act
    with pytest.raises(ValueError, match="15"):
        vec_dot_type(T.Q8_K)


def test_quantizers_keep_leading_dims():
    x = np.random.default_rng(5).standard_normal((2, 3, 256)).astype(np.float32)
    assert quantize_q8_0(x).shape == (2, 3, 8 * 34)
    assert quantize_q8_1(x).shape == (2, 3, 8 * 36)
    assert quantize_q8_K(x).shape == (2, 3, 292)
    assert quantize_q4_0(x).shape == (2, 3, 8 * 18)
    np.testing.assert_array_equal(quantize_q8_0(x)[1, 2], quantize_q8_0(x[1, 2]))
    for t in (T.Q8_0, T.Q8_1, T.Q8_K):
        fq = fake_quant(x, t)
        assert fq.shape == x.shape and fq.dtype == np.float32
        assert np.abs(fq - x).max() < 0.6 * np.abs(x).max() / 127 + 1e-3

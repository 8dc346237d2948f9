"""ggml block formats: our decoders against gguf-py's bit for bit, and the x86 activation quantizers.

Oracles: gguf-py's `gguf.quants` (numpy ports of ggml-quants.c) for dequantization; for the quantizers,
hand-worked blocks derived from ggml-cpu/arch/x86/quants.c and ggml-quants.c (see quants_cpu.py).
Comparisons view float32 as uint32 so that -0.0 and NaN payloads count.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf import quants as gq

from llamactx.embedded import ModelNotInstalledError, gemma3_path, smollm2_path
from llamactx.gguf import quants as Q
from tests.conftest import SCALE_OFFSETS

T = GGMLQuantizationType

FLOATS = [T.F32, T.F16, T.BF16]
LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
K_QUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
SUPPORTED = FLOATS + LEGACY + K_QUANTS



def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def gguf_dequantize(blocks: np.ndarray, t: int) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return gq.dequantize(blocks, T(t))


def sane_blocks(t: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n random blocks of type t whose f16 scales are finite (weights: random finite values)."""
    fmt = Q.block_format(t)
    if t in (T.F32, T.F16, T.BF16):
        x = rng.standard_normal(n).astype(np.float32) * np.float32(100.0)
        if t == T.F32:
            return x.view(np.uint8).reshape(n, 4)
        if t == T.F16:
            return x.astype(np.float16).view(np.uint8).reshape(n, 2)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n, 2)
    blocks = rng.integers(0, 256, size=(n, fmt.type_size), dtype=np.uint8)
    for off in SCALE_OFFSETS[t]:
        scale = (rng.standard_normal(n) * 0.05).astype(np.float16)
        scale[::5] = np.float16(-0.0)  # signed zeros must survive too
        blocks[:, off : off + 2] = scale.view(np.uint8).reshape(n, 2)
    return blocks


def assert_bit_exact(blocks: np.ndarray, t: int) -> None:
    fmt = Q.block_format(t)
    n = blocks.shape[0]
    ours = Q.dequantize(blocks.reshape(-1), t, (n * fmt.block_size,), name="random")
    ref = gguf_dequantize(blocks, t).reshape(-1)
    assert ours.shape == (n * fmt.block_size,)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(bits(ours), bits(ref))


# --- registry -------------------------------------------------------------------------------------------


def test_registry_covers_every_gguf_type():
    for t, (block_size, type_size) in GGML_QUANT_SIZES.items():
        fmt = Q.block_format(t)
        assert (fmt.ggml_type, fmt.name, fmt.block_size) == (int(t), t.name, block_size)
        # gguf-py 0.19 still says 40 for Q8_1; ggml-common.h block_q8_1 is 2 + 2 + 32 bytes
        assert fmt.type_size == (36 if t == T.Q8_1 else type_size)
        assert Q.is_supported(t) == (t in SUPPORTED)
        assert (fmt.dequantize_blocks is not None) == (t in SUPPORTED)
    assert not Q.is_supported(9999)
    with pytest.raises(ValueError, match="9999"):
        Q.block_format(9999)


def test_row_nbytes():
    assert Q.row_nbytes(T.Q4_0, 576) == 18 * 18
    assert Q.row_nbytes(T.Q4_1, 576) == 18 * 20
    assert Q.row_nbytes(T.Q4_K, 1024) == 4 * 144
    assert Q.row_nbytes(T.Q6_K, 2048) == 8 * 210
    assert Q.row_nbytes(T.Q8_1, 64) == 72
    assert Q.row_nbytes(T.F32, 576) == 2304
    assert Q.row_nbytes(T.IQ2_XXS, 256) == 66  # metadata-only types still have sizes
    with pytest.raises(ValueError, match="Q4_K.*256"):
        Q.row_nbytes(T.Q4_K, 640)


def test_register_decoder_replaces_the_kernel():
    original = Q.block_format(T.Q8_0)
    seen = []

    def traced(blocks: np.ndarray) -> np.ndarray:
        seen.append(blocks.shape)
        return original.dequantize_blocks(blocks)

    try:
        assert Q.register_decoder(T.Q8_0, traced).dequantize_blocks is traced
        out = Q.dequantize(np.zeros(3 * 34, np.uint8), T.Q8_0, (96,))
        assert seen == [(3, 34)] and out.shape == (96,)
    finally:
        Q.register_decoder(T.Q8_0, original.dequantize_blocks)
    assert Q.block_format(T.Q8_0) == original


# --- dequantize: random blocks --------------------------------------------------------------------------


@pytest.mark.parametrize("t", SUPPORTED, ids=lambda t: t.name)
def test_dequantize_random_blocks_bit_exact(t):
    rng = np.random.default_rng(int(t))
    for n in (1, 3, 7, 257):
        assert_bit_exact(sane_blocks(t, n, rng), t)
    # fully random bytes: inf/NaN scales must give gguf-py's exact NaN/inf bits too
    raw = rng.integers(0, 256, size=(64, Q.block_format(t).type_size), dtype=np.uint8)
    assert_bit_exact(raw, t)


@pytest.mark.parametrize("t", [T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0], ids=lambda t: t.name)
def test_dequantize_blocks_quantized_by_gguf_py(t):
    rng = np.random.default_rng(100 + int(t))
    x = rng.standard_normal((5, 96)).astype(np.float32)
    x[1] = 0.0  # an all-zero row: d = 0 (or -0.0)
    blocks = gq.quantize(x, t).reshape(-1)
    ours = Q.dequantize(blocks, t, (96, 5))
    assert ours.shape == (5, 96)
    np.testing.assert_array_equal(bits(ours), bits(gq.dequantize(blocks.reshape(5, -1), t)))


def test_dequantize_shapes_follow_ggml_ne_order():
    rng = np.random.default_rng(7)
    blocks = sane_blocks(T.Q8_0, 4 * 3, rng)  # ne = (64, 3, 2): 2 blocks per row, 6 rows
    out = Q.dequantize(blocks.reshape(-1), T.Q8_0, (64, 3, 2))
    assert out.shape == (2, 3, 64)
    np.testing.assert_array_equal(out.reshape(-1), gq.dequantize(blocks, T.Q8_0).reshape(-1))
    ro = blocks.reshape(-1).copy()
    ro.flags.writeable = False  # an mmap view is read-only; decoding must not need to write it
    assert Q.dequantize(ro, T.Q8_0, (128, 3)).shape == (3, 128)


def test_dequantize_rejects_bad_input():
    raw = np.zeros(66, dtype=np.uint8)
    with pytest.raises(Q.UnsupportedTypeError) as err:
        Q.dequantize(raw, T.IQ2_XXS, (256,), name="blk.0.attn_q.weight")
    msg = str(err.value)
    assert "'blk.0.attn_q.weight'" in msg and "IQ2_XXS (16)" in msg and "Q4_K" in msg
    assert isinstance(err.value, ValueError)
    for t in (T.TQ1_0, T.MXFP4, T.Q8_1, T.IQ4_NL, T.Q8_K):
        fmt = Q.block_format(t)
        with pytest.raises(Q.UnsupportedTypeError, match=f"'w': ggml type {t.name} "):
            Q.dequantize(np.zeros(fmt.type_size, np.uint8), t, (fmt.block_size,), name="w")
    with pytest.raises(ValueError, match="'w'.*34 bytes.*needs 68"):
        Q.dequantize(np.zeros(34, np.uint8), T.Q8_0, (64,), name="w")
    with pytest.raises(ValueError, match="'w': ne\\[0\\] = 48 .* 32"):
        Q.dequantize(np.zeros(51, np.uint8), T.Q8_0, (48,), name="w")
    with pytest.raises(ValueError, match="1-D uint8"):
        Q.dequantize(np.zeros(8, np.float32), T.F32, (8,), name="w")
    with pytest.raises(ValueError, match="unknown"):
        Q.dequantize(raw, 1234, (256,), name="w")


# --- dequantize: the real models ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_tensors():
    try:
        paths = {"smollm2": smollm2_path(), "gemma3": gemma3_path()}
    except ModelNotInstalledError as e:
        pytest.skip(str(e))
    return {name: GGUFReader(path).tensors for name, path in paths.items()}


def pick_tensors(tensors, max_elements: int = 2_000_000):
    """Per type: the smallest tensor and the largest one under max_elements (whole tensors)."""
    by_type = {}
    for t in tensors:
        by_type.setdefault(t.tensor_type, []).append(t)
    picked = []
    for group in by_type.values():
        group = sorted(group, key=lambda t: int(t.n_elements))
        small = [t for t in group if int(t.n_elements) <= max_elements] or group[:1]
        picked += {id(t): t for t in (small[0], small[len(small) // 2], small[-1])}.values()
    return picked


def assert_tensor_bit_exact(t) -> None:
    raw = np.asarray(t.data).reshape(-1).view(np.uint8)  # the file's bytes, a read-only memmap view
    shape = tuple(int(ne) for ne in t.shape)
    ours = Q.dequantize(raw, int(t.tensor_type), shape, name=t.name)
    assert ours.shape == tuple(reversed(shape))
    ref = gq.dequantize(t.data, t.tensor_type).reshape(ours.shape)
    np.testing.assert_array_equal(bits(ours), bits(ref), err_msg=t.name)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_tensors_bit_exact(model_tensors, model):
    tensors = model_tensors[model]
    picked = pick_tensors(tensors)
    types = {t.tensor_type for t in tensors}
    assert {t.tensor_type for t in picked} == types
    expected = {"smollm2": {T.F32, T.Q8_0, T.Q4_1}, "gemma3": {T.F32, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K}}
    assert types == expected[model]
    for t in picked:
        assert_tensor_bit_exact(t)


def test_real_smollm2_token_embd_bit_exact(model_tensors):
    (embd,) = [t for t in model_tensors["smollm2"] if t.name == "token_embd.weight"]
    assert embd.tensor_type == T.Q8_0 and not np.asarray(embd.data).flags.writeable
    assert_tensor_bit_exact(embd)  # 28.3 M weights, 49152 x 576


# --- quantizers -----------------------------------------------------------------------------------------

# A Q8_0 block with amax = 127: d = 127 / 127 = 1.0 (f16 0x3C00), id = 127 / 127 = 1.0, so x * id = x and
# the halves are exact ties. x86 _mm256_round_ps(_MM_ROUND_NEAREST) rounds them to even; ggml's reference
# (roundf, and gguf-py's np_roundf) rounds them away from zero.
TIE_BLOCK = np.array([127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -127] + [0] * 23, dtype=np.float32)
TIE_Q_X86 = [127, 0, 2, 2, 0, -2, -2, 4, -127] + [0] * 23
TIE_Q_REF = [127, 1, 2, 3, -1, -2, -3, 4, -127] + [0] * 23


def test_quantize_q8_0_rounds_ties_to_even():
    out = Q.quantize_q8_0(TIE_BLOCK)
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
    assert Q.quantize_q8_0(x)[2:4].view(np.int8).tolist() == [127, 64]
    assert gq.quantize(x[None], T.Q8_0)[0, 2:4].view(np.int8).tolist() == [127, 63]


def test_quantize_q8_0_close_to_reference_and_round_trips():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 512)) * rng.uniform(0.01, 10, (64, 1))).astype(np.float32)
    ours = Q.quantize_q8_0(x)
    assert ours.shape == (64, 16 * 34)
    ref = gq.quantize(x, T.Q8_0)
    blocks, ref_blocks = ours.reshape(-1, 34), ref.reshape(-1, 34)
    np.testing.assert_array_equal(blocks[:, :2], ref_blocks[:, :2])  # same d = amax / 127
    dq = blocks[:, 2:].view(np.int8).astype(int) - ref_blocks[:, 2:].view(np.int8)
    assert np.abs(dq).max() <= 1 and np.count_nonzero(dq) < dq.size // 1000
    back = Q.dequantize(ours.reshape(-1), T.Q8_0, (512, 64))  # (64, 512)
    amax = np.abs(x.reshape(64, 16, 32)).max(axis=-1, keepdims=True)
    err = np.abs(back - x).reshape(64, 16, 32)
    assert np.all(err <= 0.51 * amax / 127 + 127 * amax / 127 * 2.0**-11)  # half a step + f16 error of d
    np.testing.assert_array_equal(Q.fake_quant(x, T.Q8_0), back)


def test_quantize_q8_0_block_edges():
    zero = Q.quantize_q8_0(np.zeros((2, 32), np.float32))
    assert not zero.any()  # d = +0, id = 0, q = 0
    # amax = 1e-38: 127 / amax overflows to inf, x * inf = +-inf and 0 * inf = NaN, which cvtps_epi32 turns
    # into INT32_MIN and packs saturates to -128; d = 1e-38 / 127 underflows to f16 +0.
    tiny = np.zeros(32, np.float32)
    tiny[:2] = [1e-38, -1e-38]
    out = Q.quantize_q8_0(tiny)
    assert out[:2].tolist() == [0, 0] and out[2:].view(np.int8).tolist() == [-128] * 32
    with pytest.raises(ValueError, match="row length 48 .* 32"):
        Q.quantize_q8_0(np.zeros(48, np.float32))


def test_quantize_q8_1_hand_worked():
    # amax = 3, x = [3, 3/8, 6/8, ..., 21/8]: id = 127/3, q = rint(k * 127/8)
    # = [127, 16, 32, 48, 64, 79, 95, 111], sum 572. d = 3/127 = 0.023622047 (f16 0x260C = 0.02362060546875).
    # s = f16(d * 572) with the f32 d: 13.511811 -> 13.515625 (0x4AC2); the f16 d would give
    # 13.51098 -> 13.5078125 (0x4AC1).
    x = np.zeros(32, np.float32)
    x[:8] = [3.0] + [3.0 * k / 8 for k in range(1, 8)]
    out = Q.quantize_q8_1(np.stack([x, TIE_BLOCK]))
    assert out.shape == (2, 36)
    assert out[0, :4].view(np.uint16).tolist() == [0x260C, 0x4AC2]
    assert out[0, 4:12].view(np.int8).tolist() == [127, 16, 32, 48, 64, 79, 95, 111]
    # the tie block: d = 1.0, ties to even as Q8_0, s = 1.0 * sum(q) = 4
    assert out[1, :4].view(np.float16).tolist() == [1.0, 4.0]
    assert out[1, 4:].view(np.int8).tolist() == TIE_Q_X86
    fq = Q.fake_quant(x, T.Q8_1)
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
    out = Q.quantize_q8_K(x.reshape(-1))
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
    fq = Q.fake_quant(x, T.Q8_K)
    assert fq[0, :8].tolist() == [-254, 0, 4, 4, 0, -4, 254, 2]
    np.testing.assert_array_equal(fq[1], d[1] * qs[1].astype(np.float32))
    with pytest.raises(ValueError, match="row length 128 .* 256"):
        Q.quantize_q8_K(np.zeros(128, np.float32))


def test_quantize_q4_0_matches_reference():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 320)).astype(np.float32)
    x[0, 32:64] = 0.0
    x[1, :32] = np.linspace(-1, 1, 32)  # +1 and -1 both: the first one (-1) sets the sign of d
    x[2, :32] = 7.0  # q = trunc(7 * (-8/7)^-1 ... ) hits the MIN(15, .) clamp
    ours = Q.quantize_q4_0(x)
    assert ours.shape == (9, 10 * 18)
    np.testing.assert_array_equal(ours, gq.quantize(x, T.Q4_0))  # both follow quantize_row_q4_0_ref
    back = Q.dequantize(ours.reshape(-1), T.Q4_0, (320, 9))
    np.testing.assert_array_equal(bits(back), bits(gq.dequantize(ours, T.Q4_0)))


def test_quantize_q4_0_all_negative_zero_block():
    # quantize_row_q4_0_ref starts from max = +0.0 and keeps it (|-0.0| is not > 0), so d = +0.0 / -8 = -0.0;
    # gguf-py's argmax picks the -0.0 itself and stores +0.0. We follow the C code.
    out = Q.quantize_q4_0(np.full(32, -0.0, np.float32))
    assert out[:2].view(np.uint16).tolist() == [0x8000]
    assert out[2:].tolist() == [0x88] * 16  # id = 0 -> trunc(8.5) = 8 in both nibbles


def test_fake_quant_float_types_and_vec_dot_type():
    x = np.array([1.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 3.0e38, -0.0], np.float32)
    np.testing.assert_array_equal(Q.fake_quant(x, T.F32), x)
    f16 = Q.fake_quant(x, T.F16)  # round to nearest even: the two ties go to 1.0 and 1 + 2^-9
    assert f16[:4].tolist() == [1.0, 1.0, 1 + 2.0**-9, 1 + 2.0**-8] and np.isinf(f16[4])
    bf16 = Q.fake_quant(x, T.BF16)
    np.testing.assert_array_equal(bits(bf16), bits(gq.dequantize(gq.quantize(x, T.BF16), T.BF16)))
    assert bits(bf16)[5] == 0x80000000
    with pytest.raises(ValueError, match="vec_dot_type"):
        Q.fake_quant(x, T.Q4_0)

    expected = {
        T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16, T.Q8_0: T.Q8_0, T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0,
        T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1, T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K,
        T.Q6_K: T.Q8_K,
    }  # fmt: skip
    for weight, act in expected.items():
        assert Q.vec_dot_type(weight) == act
    with pytest.raises(ValueError, match="15"):
        Q.vec_dot_type(T.Q8_K)


def test_quantizers_keep_leading_dims():
    x = np.random.default_rng(5).standard_normal((2, 3, 256)).astype(np.float32)
    assert Q.quantize_q8_0(x).shape == (2, 3, 8 * 34)
    assert Q.quantize_q8_1(x).shape == (2, 3, 8 * 36)
    assert Q.quantize_q8_K(x).shape == (2, 3, 292)
    assert Q.quantize_q4_0(x).shape == (2, 3, 8 * 18)
    np.testing.assert_array_equal(Q.quantize_q8_0(x)[1, 2], Q.quantize_q8_0(x[1, 2]))
    for t in (T.Q8_0, T.Q8_1, T.Q8_K):
        fq = Q.fake_quant(x, t)
        assert fq.shape == x.shape and fq.dtype == np.float32
        assert np.abs(fq - x).max() < 0.6 * np.abs(x).max() / 127 + 1e-3

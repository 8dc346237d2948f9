"""ggml block formats: our decoders against gguf-py's bit for bit.

Oracle: gguf-py's `gguf.quants` (numpy ports of ggml-quants.c).
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
IQ = [T.IQ4_NL, T.IQ4_XS, T.MXFP4]
LOWBIT = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0]
SUPPORTED = FLOATS + LEGACY + K_QUANTS + IQ + LOWBIT



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
        Q.dequantize(raw, T.NVFP4, (256,), name="blk.0.attn_q.weight")
    msg = str(err.value)
    assert "'blk.0.attn_q.weight'" in msg and "NVFP4 (40)" in msg and "Q4_K" in msg
    assert isinstance(err.value, ValueError)
    for t in (T.NVFP4, T.Q1_0, T.Q8_1, T.Q8_K):
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

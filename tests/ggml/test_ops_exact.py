"""Single ops of ReferenceOps against llama.cpp's own tensors, bit for bit.

The golden cases in tests/data/ops/ were captured from llama.cpp 0c1e570 (the build of tests/data/REFERENCE.md)
with a `cb_eval` callback: layer 0 of SmolLM2 (prompt 0, 5 tokens; the perplexity text's last token decoded alone
after the other 202) and of Gemma 3 (prompt 0, 6 tokens, then its last token alone; the perplexity text for the
>= 8-row matmul kernels). Each file holds an op's inputs as llama.cpp saw them and its output; K / V are stored as
the f16 cache held them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.backend.reference import ReferenceOps
from llamactx.ggml.inputs import ROPE_TYPE_NEOX, RopeParams
from llamactx.ggml.vec import gelu_table, v_expf
from llamactx.ggml.vecdot_k import is_exact_k
from llamactx.model import Weight
from tests.conftest import VARIANT

OPS_DATA = Path(__file__).parents[1] / "data" / "ops"
# the goldens are the AVX-512 build's tensors; where that build's sums follow its 16-lane vectors an AVX2 target
# computes the AVX2 build's instead, which tests/test_reference.py and test_flash_attn.py check end to end
AVX512_ONLY = pytest.mark.skipif(VARIANT == "avx2", reason="an AVX-512 build's golden of a width-dependent op; "
                                 "on AVX2 the AVX2 build's logits are checked end to end (tests/test_reference.py)")


def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(OPS_DATA / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    differ = int((ours.view(np.uint32) != theirs.astype(np.float32).view(np.uint32)).sum())
    assert differ == 0, f"{differ} of {ours.size} values differ, max |d| {np.abs(ours - theirs).max():.3g}"


@pytest.mark.parametrize(
    "name, mode, base",
    [
        ("smollm2_l0_rope", 0, 100000.0),  # NORM: adjacent pairs
        ("gemma3_l0_rope", ROPE_TYPE_NEOX, 10000.0),  # NEOX, the sliding-window layers' base
    ],
)
def test_rope_matches_llama_cpp(name, mode, base):
    g = golden(name)
    rp = RopeParams(n_rot=g["x"].shape[-1], mode=mode, freq_base=base, freq_scale=1.0)
    assert_bits_equal(ReferenceOps().rope(g["x"], np.arange(g["x"].shape[0]), rp), g["y"])


def causal_attention(g: dict, kq_scale: float, ops: ReferenceOps) -> np.ndarray:
    """The golden case's q over its cache: the last n of n_kv positions, causal. -> (n, n_head * d_v)"""
    n, n_kv = g["q"].shape[0], g["k"].shape[0]
    pos = np.arange(n_kv - n, n_kv)
    mask = np.where(np.arange(n_kv)[None, :] <= pos[:, None], np.float32(0), np.float32(-np.inf))
    k, v = g["k"].astype(np.float32), g["v"].astype(np.float32)
    return ops.attention(g["q"], k, v, mask.astype(np.float32), kq_scale, False)


@pytest.mark.parametrize(
    "name, kq_scale",
    [
        ("smollm2_l0_attn_prefill", 0.125),  # 5 tokens: tinyBLAS f16 for kq and kqv
        pytest.param("smollm2_l0_attn_decode", 0.125, marks=AVX512_ONLY),  # 1 token, 203 cells: ggml_vec_dot_f16
        ("gemma3_l0_attn_prefill", 1.0),  # head size 256, 4 query heads per KV head
        pytest.param("gemma3_l0_attn_decode", 1.0, marks=AVX512_ONLY),
    ],
)
def test_attention_matches_llama_cpp(name, kq_scale):
    assert_bits_equal(causal_attention(golden(name), kq_scale, ReferenceOps(ggml_single_row=True)), golden(name)["y"])


def test_single_token_attention_is_computed_like_a_batch_by_default():
    """llama.cpp's decode kernel (ggml_vec_dot_f16) gives other bits than its prompt kernel (tinyBLAS); by default
    a token alone in its ubatch gets exactly the result it has inside a batch."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 2, 64)).astype(np.float32)
    k, v = (rng.standard_normal((100, 1, 64)).astype(np.float16).astype(np.float32) for _ in range(2))
    mask = np.where(np.arange(100)[None, :] <= np.arange(97, 100)[:, None], 0, -np.inf).astype(np.float32)
    batch = ReferenceOps().attention(q, k, v, mask, 0.125, False)
    alone = ReferenceOps().attention(q[-1:], k, v, mask[-1:], 0.125, False)
    assert_bits_equal(alone, batch[-1:])
    ggml = ReferenceOps(ggml_single_row=True).attention(q[-1:], k, v, mask[-1:], 0.125, False)
    assert not np.array_equal(ggml, alone)
    np.testing.assert_allclose(ggml, alone, rtol=0, atol=1e-5)


def test_attention_ignores_where_other_sequences_sit():
    """The same visible cells give the same result whatever fills the masked cells around them."""
    g = golden("smollm2_l0_attn_prefill")
    k, v = g["k"].astype(np.float32), g["v"].astype(np.float32)
    n, n_kv = g["q"].shape[0], k.shape[0]
    causal = np.where(np.arange(n_kv)[None, :] <= np.arange(n)[:, None], np.float32(0), np.float32(-np.inf))
    rng = np.random.default_rng(0)
    others = rng.standard_normal((3, *k.shape[1:])).astype(np.float16).astype(np.float32)  # (3, n_head_kv, d)
    k2 = np.concatenate([others, k[:2], others, k[2:]])  # another sequence's cells interleaved
    v2 = np.concatenate([others, v[:2], others, v[2:]])
    mask2 = np.full((n, n_kv + 6), -np.inf, np.float32)
    mask2[:, [3, 4, 8, 9, 10]] = causal
    ops = ReferenceOps()
    assert_bits_equal(ops.attention(g["q"], k2, v2, mask2, 0.125, False), g["y"])


@AVX512_ONLY
def test_swiglu_matches_llama_cpp():
    g = golden("smollm2_l0_swiglu")
    assert_bits_equal(ReferenceOps().swiglu(g["gate"], g["up"]), g["y"])


def test_geglu_matches_llama_cpp():
    g = golden("gemma3_l0_geglu")
    assert_bits_equal(ReferenceOps().geglu(g["gate"], g["up"]), g["y"])


def test_geglu_outside_the_table_is_ggmls():
    """ggml_vec_geglu_f32 stores +0 for a gate <= -10 whatever the up value (never 0 * up: -0, or NaN for an
    infinite up) and gate * up from 10 on."""
    gate = np.array([[-20.0, -10.0, -20.0, 10.0, 12.0]], np.float32)
    up = np.array([[-1.0, -3.0, np.inf, -2.0, 0.5]], np.float32)
    y = ReferenceOps().geglu(gate, up)
    assert y.view(np.uint32).tolist() == np.array([[0.0, 0.0, 0.0, -20.0, 6.0]], np.float32).view(np.uint32).tolist()


def test_rms_norm_matches_llama_cpp(smollm):
    g = golden("smollm2_l0_ffn_norm")
    w = smollm.tensors["blk.0.ffn_norm.weight"]
    assert_bits_equal(ReferenceOps().rms_norm(g["x"], w, smollm.hparams.f_norm_rms_eps), g["y"])


@pytest.mark.parametrize(
    "name, weight",
    [
        ("gemma3_l0_ffn_down_q6_k_vec_dot", "blk.0.ffn_down.weight"),  # 6 rows: ggml_vec_dot_q6_K_q8_K
        ("gemma3_l0_ffn_down_q6_k_tiled", "blk.0.ffn_down.weight"),  # 9 rows: the tiled kernel
        ("gemma3_l0_attn_output_q4_k", "blk.0.attn_output.weight"),  # 7 rows: repacked gemm (4) + gemv (3)
    ],
)
def test_k_quant_matmul_matches_llama_cpp(gemma, name, weight):
    g = golden(name)
    w = gemma.weight(weight)
    assert is_exact_k(w)
    assert_bits_equal(ReferenceOps().matmul(g["x"], w), g["y"])


def test_k_quant_kernel_depends_on_rows_as_in_llama_cpp(gemma):
    """llama.cpp's Q6_K result for a row changes with the batch size (vec_dot below 8 rows, tiled from 8)."""
    g = golden("gemma3_l0_ffn_down_q6_k_tiled")
    w = gemma.weight("blk.0.ffn_down.weight")
    ops = ReferenceOps()
    alone = np.concatenate([ops.matmul(g["x"][i : i + 1], w) for i in range(9)])
    assert not np.array_equal(alone, g["y"])
    np.testing.assert_allclose(alone, g["y"], rtol=0, atol=1e-4)


def test_v_expf_is_ggml_approximation():
    """ggml_v_expf: within 2.5 ulp of exp, saturating to 0 / inf outside about [-104, 88.7]."""
    x = np.linspace(-87.0, 88.0, 20001, dtype=np.float32)
    ours = np.array([v_expf(v) for v in x], np.float32)
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert (np.abs(ours - exact) <= 2.5 * ulp).all()  # ggml: "max error 1.45358 plus 0.5 ulps"
    assert (ours != exact.astype(np.float32)).any()  # not a correctly rounded exp: the polynomial's own bits
    assert v_expf(np.float32(-200.0)) == 0.0 and math.isinf(v_expf(np.float32(200.0)))
    assert v_expf(np.float32(-np.inf)) == 0.0


def test_gelu_table_is_ggml_table():
    """Spot values of ggml_table_gelu_f16: f16 inputs, tanh approximation with 1 + 0.044715 x^2 fused."""
    table = gelu_table()
    for x in (-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0):
        i = int(np.float16(x).view(np.uint16))
        expected = 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))
        assert table[i] == pytest.approx(expected, abs=2e-3)
    assert table[int(np.float16(0.0).view(np.uint16))] == 0.0


@pytest.mark.parametrize("ggml_type, dtype", [(T.F32, np.float32), (T.F16, np.float16)])
def test_float_weights_get_rows_and_matmul(ggml_type, dtype):
    """F32 / F16 weights are stored typed; both ops take them (tinyBLAS for >= 2 rows, vec_dot for one)."""
    rng = np.random.default_rng(1)
    data = rng.standard_normal((8, 80)).astype(dtype)  # (ne1, ne0)
    data.flags.writeable = False
    w = Weight("w", int(ggml_type), (80, 8), data)
    ops = ReferenceOps()
    np.testing.assert_array_equal(ops.get_rows(w, np.array([3, 0])), data[[3, 0]].astype(np.float32))
    x = rng.standard_normal((3, 80)).astype(np.float32)
    xs = x.astype(dtype).astype(np.float64)  # F16 weights see f16 activations
    expected = xs @ data.astype(np.float64).T
    np.testing.assert_allclose(ops.matmul(x, w), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ops.matmul(x[:1], w), ops.matmul(x, w)[:1])  # one row like several
    single = ReferenceOps(ggml_single_row=True).matmul(x[:1], w)  # ggml_vec_dot_f32 / _f16
    np.testing.assert_allclose(single, expected[:1], rtol=1e-5, atol=1e-5)

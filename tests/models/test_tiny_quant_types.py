"""The quant types beyond the embedded models' (issue #26) on tiny synthetic models against llama.cpp's logits
(tests/data/quants, REFERENCE.md): Q2_K, Q3_K, Q5_K, IQ4_XS (tiny-quants-k) and IQ4_NL, MXFP4, BF16
(tiny-quants-nl), IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0 (tiny-quants-lowbit, issue #46),
each in tensors that take every kernel llama.cpp picks for it (repacked or not, tiled or vec_dot, tinyBLAS or
vec_dot), for prompts of 40, 19 and 6 tokens and 16 single-token decode steps; and single matmuls of every kernel
against libggml's own results (lowbit_cases.py's for the low-bit types)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx import Model
from llamactx.backend.fast import FastOps
from llamactx.backend.reference import ReferenceOps
from llamactx.ggml.cpu import arithmetic
from llamactx.ggml.vecdot_kx import is_repacked_kx
from llamactx.ggml.vecdot_nl import is_repacked_nl
from llamactx.model import ModelLoadError, Weight
from tests.conftest import VARIANT_DIR
from tests.data.quants import lowbit_cases
from tests.data.quants.quant_matmul_cases import MATMUL_CASES, N_ROWS, case_data
from tests.gguf.tiny_model import write_tiny_llama
from tests.models.tiny import decode_all, new_ctx

QUANTS = Path(__file__).parent.parent / "data" / "quants"
REF = QUANTS / VARIANT_DIR  # llama.cpp's outputs for the arithmetic this run computes (avx2/: its AVX2 build)
TYPES = {"k": {T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_XS}, "nl": {T.IQ4_NL, T.MXFP4, T.BF16},
         "lowbit": set(lowbit_cases.LOWBIT)}
# the reference folder holds a build with AVX512_BF16 (its BF16 dot products use dpbf16); an AVX-512 target without
# it computes another build's BF16 sums, and no reference of that build is kept
_BF16_MISMATCH = arithmetic()["f32_epr"] == 16 and not arithmetic()["bf16_dot"]


@pytest.fixture(scope="module", params=["k", "nl", "lowbit"])
def quant_model(request):
    name = request.param
    if not (REF / f"{name}.npz").exists():
        pytest.skip(f"no llama.cpp reference for tiny-quants-{name} in {REF} (this arithmetic's build: "
                    f"{arithmetic()['variant']}; make it with tests/data/quants/make_quant_reference.py)")
    if name == "nl" and _BF16_MISMATCH:
        pytest.skip("BF16 reference made with AVX512_BF16; this AVX-512 target has none")
    ref = json.loads((REF / f"{name}.json").read_text())
    with np.load(REF / f"{name}.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return name, Model.load(QUANTS / f"tiny-quants-{name}.gguf"), ref, arrays


def make_ops(kind: str, model, single_row: bool = False):
    ops = ReferenceOps(ggml_single_row=single_row) if kind == "reference" else FastOps(model)
    ops.ggml_single_row = single_row
    return ops


def test_models_hold_every_type_on_every_path(quant_model):
    """Each type is a weight matrix of its model, and the ne1 % 8 choices go both ways where they exist."""
    name, model, _, _ = quant_model
    weights = [model.weight(n) for n, info in model.tensor_infos.items() if len(info.shape) == 2]
    assert TYPES[name] <= {T(w.ggml_type) for w in weights}
    if name == "k" and arithmetic()["f32_epr"] == 16:
        assert {is_repacked_kx(w) for w in weights if w.ggml_type == T.Q2_K} == {True, False}
    if name == "nl":
        for t in (T.IQ4_NL, T.MXFP4):
            assert {is_repacked_nl(w) for w in weights if w.ggml_type == t} == {True, False}


@pytest.mark.parametrize("kind", ["reference", "fast"])
def test_prompt_logits_bit_identical(quant_model, kind):
    name, model, ref, arrays = quant_model
    for i, prompt in enumerate(ref["prompts"]):
        got = decode_all(new_ctx(model, make_ops(kind, model)), prompt["tokens"])
        np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"{name} {kind} prompt {i}")


@pytest.mark.parametrize("kind", ["reference", "fast"])
def test_teacher_forced_decode_bit_identical(quant_model, kind):
    """Greedy steps after the first prompt, one token per decode as llama.cpp ran them, with ggml's single-row
    kernels (attention and BF16 weights take ggml_vec_dot at n = 1; the quantized matmuls always pick by n)."""
    name, model, ref, arrays = quant_model
    ctx = new_ctx(model, make_ops(kind, model, single_row=True))
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"]):
        np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"{name} {kind} step {step}")
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


@pytest.fixture(scope="module")
def ggml_matmuls():
    if not (REF / "matmuls.npz").exists():
        pytest.skip(f"no llama.cpp matmul reference in {REF} (make it with tests/data/quants/make_quant_reference.py)")
    with np.load(REF / "matmuls.npz") as npz:
        return {k: npz[k] for k in npz.files}


@pytest.mark.parametrize("case", MATMUL_CASES, ids=lambda c: c["name"])
def test_single_matmul_bit_identical_to_libggml(ggml_matmuls, case):
    """One ggml_mul_mat per row count (1, 3, 6, 9, 17: vec_dot or gemv, gemm + gemv, tiled narrow and wide), the
    weight repacked where llama.cpp repacks it: every kernel checked directly, not only where its bits survive the
    next layer's activation quantization."""
    if case["type"] == T.BF16 and _BF16_MISMATCH:
        pytest.skip("BF16 reference made with AVX512_BF16; this AVX-512 target has none")
    t, data, x = case_data(case)
    data.flags.writeable = False
    w = Weight(case["name"], t, (case["k"], case["rows"]), data)
    got = np.concatenate([ReferenceOps(ggml_single_row=True).matmul(x[:n], w) for n in N_ROWS])
    np.testing.assert_array_equal(got, ggml_matmuls[case["name"]], err_msg=case["name"])


@pytest.fixture(scope="module")
def lowbit_matmuls():
    path = REF / "lowbit_matmuls.npz"
    if not path.exists():
        pytest.fail(f"no llama.cpp matmul reference {path} (make it with tests/data/quants/make_lowbit_reference.py)")
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


@pytest.mark.parametrize("case", lowbit_cases.MATMUL_CASES, ids=lambda c: c["name"])
def test_lowbit_matmul_bit_identical_to_libggml(lowbit_matmuls, case):
    """IQ1-IQ3 and TQ1_0 / TQ2_0: ggml_vec_dot for n < 8, the tiled kernel (narrow and wide) from 8 rows for the IQ
    types, vec_dot always for TQ; k of 1 and 2 super-blocks."""
    t, data, x = lowbit_cases.case_data(case)
    data.flags.writeable = False
    w = Weight(case["name"], t, (case["k"], case["rows"]), data)
    got = np.concatenate([ReferenceOps(ggml_single_row=True).matmul(x[:n], w) for n in lowbit_cases.N_ROWS])
    np.testing.assert_array_equal(got, lowbit_matmuls[case["name"]], err_msg=case["name"])


class _Unshared:
    """The model FastOps asks for packed weights: these experts belong to no model, each packed afresh."""

    def has_tensor(self, name: str) -> bool:
        return False

    def derived(self, key, build, replaces=()):
        return build()


@pytest.mark.parametrize("kind", ["reference", "fast"])
def test_lowbit_mul_mat_id_bit_identical_to_libggml(kind):
    """ggml_mul_mat_id of low-bit experts: each expert's rows as one matmul, the tiled kernel for the IQ types where
    8 or more rows chose the expert (tiled.cpp `ggml_compute_forward_mul_mat_id_tiled`), vec_dot below; "fast":
    the kernels' matmul_id (kernels.klowbit for the IQ types, the reference for TQ)."""
    path = REF / "lowbit_moe.npz"
    if not path.exists():
        pytest.fail(f"no llama.cpp mul_mat_id reference {path} (tests/data/quants/make_lowbit_reference.py makes it)")
    m = lowbit_cases.MOE_SHAPE
    with np.load(path) as ref:
        for t in lowbit_cases.MOE_TYPES:
            data, x, selected = lowbit_cases.moe_case(t)
            data.flags.writeable = False
            w = Weight("experts", int(t), (m["k"], m["rows"], m["n_expert"]), data)
            ops = ReferenceOps() if kind == "reference" else FastOps(model=_Unshared())
            np.testing.assert_array_equal(ops.matmul_id(x, w, selected), ref[T(t).name], err_msg=T(t).name)


def test_unsupported_type_is_named_with_the_supported_ones(tmp_path):
    path = write_tiny_llama(tmp_path / "nvfp4.gguf", types={"blk.0.attn_q.weight": T.NVFP4}, n_embd=256,
                            n_ff=256, n_layer=1, n_head=2, n_head_kv=1)
    with pytest.raises(ModelLoadError) as err:
        Model.load(path)
    msg = str(err.value)
    assert "'blk.0.attn_q.weight'" in msg and "NVFP4" in msg
    for supported in ("Q4_0", "Q8_0", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "MXFP4", "BF16", "IQ2_XXS",
                      "IQ1_M", "TQ2_0"):
        assert supported in msg.split("allowed:")[1], supported

"""The llama family's variants on tiny synthetic models against llama.cpp's logits (tests/data/tiny, REFERENCE.md):
qwen2 (q/k/v biases), qwen3 (q/k RMSNorm), Llama 3's RoPE frequency factors, YaRN scaling, and the mixtures of
experts: qwen3moe (Q8_0 experts) and llama with experts (Mixtral-style, F16 experts); and Q4_0 weights, which
llama.cpp repacks (llama-q4_0, qwen3moe-q4_0)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch, Model
from llamactx.backend.reference import ReferenceOps
from tests.gguf.tiny_model import finish
from tests.models.tiny import TINY, decode_all, load_tiny, new_ctx, sequences_batch

NAMES = ["qwen2", "qwen3", "llama3", "yarn", "qwen3moe", "mixtral", "llama-q4_0", "qwen3moe-q4_0", "qwen2moe"]


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    return load_tiny(request.param)


def test_prompt_logits_bit_identical(tiny):
    name, model, ref, arrays = tiny
    for i, prompt in enumerate(ref["prompts"]):
        got = decode_all(new_ctx(model), prompt["tokens"])
        np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"{name} prompt {i}")


@pytest.mark.parametrize("single_row", [True, False], ids=["ggml-single-row", "row-invariant"])
def test_teacher_forced_greedy_identical(tiny, single_row):
    """64 greedy steps after the first prompt, one token per decode as llama.cpp ran them. With ggml's single-row
    kernels (F32 / F16 weights and attention take ggml_vec_dot at n = 1) the logits are bit-identical; the
    default computes one row like several (docs/numerics.md), an ulp away for F32 / F16 weights."""
    name, model, ref, arrays = tiny
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True) if single_row else None)
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"]):
        if single_row:
            np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"{name} step {step}")
        else:
            np.testing.assert_allclose(row, arrays["greedy"][step], rtol=0, atol=1e-2, err_msg=f"{name} {step}")
        assert int(np.argmax(row)) == tok
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_two_sequences_in_one_batch_equal_each_alone(tiny):
    name, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    assert ctx.decode(sequences_batch([a, b])) == 0
    both = ctx.get_logits()
    np.testing.assert_array_equal(both[: len(a)], arrays["prompt_0"])
    np.testing.assert_array_equal(both[len(a):], arrays["prompt_1"])


def test_yarn_is_resolved_as_llama_cpp(tiny):
    name, model, _, _ = tiny
    p = new_ctx(model).params
    if name == "yarn":
        assert p.rope_scaling_type == "yarn" and p.yarn_ext_factor == 1.0 and p.rope_freq_scale == 0.25
        assert p.yarn_attn_factor == 1.0  # get_mscale(4) / (1 + 0.1 ln 4), in float32
    else:
        assert p.yarn_ext_factor == 0.0


def test_qwen3_without_qk_norm_is_refused(tmp_path):
    """qwen3's q/k norms are required tensors: a file without them fails at load, naming one."""
    import gguf

    src = gguf.GGUFReader(TINY / "tiny-qwen3.gguf")
    w = gguf.GGUFWriter(tmp_path / "bad.gguf", "qwen3")
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0],
                        field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in src.tensors:
        if "attn_q_norm" not in t.name:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=None if t.tensor_type in
                         (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) else t.data.shape,
                         raw_dtype=t.tensor_type)
    finish(w)
    from llamactx.model import ModelLoadError

    with pytest.raises(ModelLoadError, match="attn_q_norm"):
        Model.load(tmp_path / "bad.gguf")


def test_state_round_trip(tiny):
    name, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model)
    decode_all(ctx, toks[:-1])
    blob = ctx.state_get_data()
    other = new_ctx(model)
    other.state_set_data(blob)
    np.testing.assert_array_equal(decode_all(other, toks[-1:], pos0=len(toks) - 1)[-1], arrays["prompt_0"][-1])


def test_seq_cp_then_diverging_continuations_equal_each_alone(tiny):
    """A shared prefix copied to a second sequence, then two different continuations in one batch: each equals
    the same continuation decoded alone after the prefix."""
    name, model, ref, _ = tiny
    prefix, (a, b) = ref["prompts"][1]["tokens"], ref["greedy"][:2]
    ctx = new_ctx(model, n_seq_max=2)
    decode_all(ctx, prefix)
    ctx.memory.seq_cp(0, 1, -1, -1)
    batch = Batch(2)
    batch.add(a, len(prefix), [0], logits=True)
    batch.add(b, len(prefix), [1], logits=True)
    assert ctx.decode(batch) == 0
    both = ctx.get_logits().copy()
    for row, tok in ((0, a), (1, b)):
        alone = new_ctx(model)
        decode_all(alone, prefix)
        np.testing.assert_array_equal(both[row], decode_all(alone, [tok], pos0=len(prefix))[-1])

"""The llama family's variants on tiny synthetic models against llama.cpp's logits (tests/data/tiny, REFERENCE.md):
qwen2 (q/k/v biases), qwen3 (q/k RMSNorm), Llama 3's RoPE frequency factors, YaRN scaling, and the mixtures of
experts: qwen3moe (Q8_0 experts) and llama with experts (Mixtral-style, F16 experts); Q4_0 weights, which
llama.cpp repacks (llama-q4_0, qwen3moe-q4_0); and mistral3 (Ministral 3: YaRN with its own betas and log
multiplier, Llama 4's attention temperature by position)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch, Model
from llamactx.backend.reference import ReferenceOps
from llamactx.hparams import HParamsError
from llamactx.models.graph_inputs import attn_temp_scale
from tests.gguf.tiny_model import finish, rewrite_gguf
from tests.models.tiny import TINY, compiled_ops, decode_all, load_tiny, new_ctx, sequences_batch

NAMES = ["qwen2", "qwen3", "llama3", "yarn", "qwen3moe", "mixtral", "llama-q4_0", "qwen3moe-q4_0", "qwen2moe",
         "mistral3"]


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
    elif name == "mistral3":  # yarn_log_multiplier 1: get_mscale(4, 1) / get_mscale(4, 1), then / (1 + 0.1 ln 4)
        assert p.rope_scaling_type == "yarn" and p.yarn_ext_factor == 1.0 and p.rope_freq_scale == 0.25
        assert abs(p.yarn_attn_factor - 1 / (1 + 0.1 * np.log(4.0))) < 1e-7
        assert (p.yarn_beta_fast, p.yarn_beta_slow, p.n_ctx_orig_yarn) == (16.0, 2.0, 8)  # the file's, not 32 / 1
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


# -- mistral3: the attention temperature ----------------------------------------------------------------------


@pytest.mark.parametrize("ops", ["reference", "fast"])
def test_mistral3_prompt_across_ubatches_then_decodes(ops):
    """A prompt split into ubatches of 6 tokens (each ubatch's positions give its Q factors), then single-token
    decodes: llama.cpp's prompt logits and greedy logits bit for bit, on the compiled graph (FastOps) too."""
    _, model, ref, arrays = load_tiny("mistral3")
    ctx = new_ctx(model, ReferenceOps(ggml_single_row=True) if ops == "reference" else None, n_ubatch=6)
    toks = ref["prompts"][0]["tokens"]
    np.testing.assert_array_equal(decode_all(ctx, toks), arrays["prompt_0"])
    for step, tok in enumerate(ref["greedy"][:24]):  # past positions 24, 32 and 40: new factors
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]
        if ops == "reference":
            np.testing.assert_array_equal(row, arrays["greedy"][step + 1], err_msg=f"step {step}")
        else:
            np.testing.assert_allclose(row, arrays["greedy"][step + 1], rtol=0, atol=1e-2, err_msg=f"step {step}")
    if ops == "fast":
        plans = ctx.ops._plans
        assert plans and all(entry is not None for entry in plans.values())  # every ubatch ran as a program


def test_mistral3_temperature_scales_q_from_its_floor_scale(tmp_path):
    """The Q factor 1 + 0.5 ln(floor(pos / 8) + 1) is 1 below position 8: without `attention.temperature_scale`
    the first 8 logits rows stay llama.cpp's and the later ones change."""
    _, model, ref, arrays = load_tiny("mistral3")
    hp = model.hparams
    assert (hp.f_attn_temp_scale, hp.n_attn_temp_floor_scale, hp.f_attn_temp_offset) == (0.5, 8, 0.0)
    got = attn_temp_scale(np.array([0, 7, 8, 15, 16, 63, 64]), 8, 0.5, 0.0)  # (7, 1)
    want = [1 + 0.5 * np.log(k + 1) for k in (0, 0, 1, 1, 2, 7, 8)]
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-7)
    path = rewrite_gguf(TINY / "tiny-mistral3.gguf", tmp_path / "no-temp.gguf",
                        {"mistral3.attention.temperature_scale": None})
    plain = decode_all(new_ctx(Model.load(path)), ref["prompts"][0]["tokens"])
    np.testing.assert_array_equal(plain[:8], arrays["prompt_0"][:8])
    assert all(not np.array_equal(plain[i], arrays["prompt_0"][i]) for i in range(8, len(plain)))


def test_mistral3_temperature_without_original_context_is_refused(tmp_path):
    path = rewrite_gguf(TINY / "tiny-mistral3.gguf", tmp_path / "bad.gguf",
                        {"mistral3.rope.scaling.original_context_length": 0})
    with pytest.raises(HParamsError, match=r"mistral3\.rope\.scaling\.original_context_length' = 0.*temperature"):
        Model.load(path)


@pytest.mark.parametrize("name", ["llama-q4_0", "qwen3moe-q4_0"])
def test_q4_0_files_run_as_one_compiled_program(name):
    """A Q4_0 file's Q4_0 embeddings are looked up inside the compiled program (they made planning fail, so the
    whole model ran op by op): its prompt logits are still llama.cpp's."""
    _, model, ref, arrays = load_tiny(name)
    assert model.tensor_type("token_embd.weight") == 2  # Q4_0
    ctx = new_ctx(model)
    np.testing.assert_array_equal(decode_all(ctx, ref["prompts"][0]["tokens"]), arrays["prompt_0"])
    assert "get_rows" in compiled_ops(ctx)

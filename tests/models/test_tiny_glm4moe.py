"""glm4moe (GLM-4.5: q/k/v biases, partial NEOX RoPE, a dense leading layer, sigmoid-routed experts with the
selection bias and a shared expert, a NextN layer that is loaded and skipped) on the tiny synthetic model against
llama.cpp's logits (tests/data/tiny/tiny-glm4moe.gguf, make_tiny_glm4moe.py, REFERENCE.md): the prompts, a prompt
over ubatches then single-token steps, two sequences in one batch, state save / restore, the cache's layers, and
what a load refuses."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Model
from llamactx.backend.reference import ReferenceOps
from llamactx.hparams import ModelLoadError
from llamactx.models import kv_bytes_per_token
from tests.conftest import VARIANT
from tests.models.tiny import TINY_REF, compiled_ops, decode_all, interleaved_logits, load_tiny, new_ctx


@pytest.fixture(scope="module")
def tiny():
    if VARIANT == "avx2" and not (TINY_REF / "glm4moe.json").exists():
        pytest.fail("no AVX2 reference for tiny glm4moe (tests/data/tiny/avx2/glm4moe.json: make_tiny_reference.py "
                    "glm4moe with llama.cpp's AVX2 build)")
    return load_tiny("glm4moe")


@pytest.mark.parametrize("ops", ["fast", "reference"])
def test_prompt_logits_bit_identical(tiny, ops):
    _, model, ref, arrays = tiny
    for i, prompt in enumerate(ref["prompts"]):
        ctx = new_ctx(model, ops=ReferenceOps() if ops == "reference" else None)
        np.testing.assert_array_equal(decode_all(ctx, prompt["tokens"]), arrays[f"prompt_{i}"], err_msg=f"{i}")


def test_prompt_in_ubatches_then_single_token_steps(tiny):
    """The first prompt in ubatches of 4 tokens, then 16 greedy steps one token per decode with ggml's single-row
    kernels: every row is llama.cpp's."""
    _, model, ref, arrays = tiny
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True), n_ubatch=4)
    toks = ref["prompts"][0]["tokens"]
    rows = decode_all(ctx, toks)
    np.testing.assert_array_equal(rows, arrays["prompt_0"])
    row = rows[-1]
    for step, tok in enumerate(ref["greedy"][:16]):
        np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"step {step}")
        assert int(np.argmax(row)) == tok
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_two_sequences_in_one_batch_equal_each_alone(tiny):
    _, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    for s, rows in enumerate(interleaved_logits(ctx, a, b)):
        np.testing.assert_array_equal(rows, arrays[f"prompt_{s}"])


def test_state_round_trip(tiny):
    _, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    decode_all(ctx, toks[:-1], seq=1)
    for whole in (True, False):
        other = new_ctx(model, n_seq_max=2)
        if whole:
            other.state_set_data(ctx.state_get_data())
        else:
            other.state_seq_set_data(ctx.state_seq_get_data(1), 0)
        seq = 1 if whole else 0
        assert other.memory.seq_pos_max(seq) == len(toks) - 2
        got = decode_all(other, toks[-1:], seq=seq, pos0=len(toks) - 1)[-1]
        np.testing.assert_array_equal(got, arrays["prompt_0"][-1])


def test_nextn_layer_is_loaded_and_skipped(tiny):
    """block_count 4 with nextn_predict_layers 1: a trunk of 3 layers, and only those have KV cells, as llama.cpp
    logs for this file ("512 cells, 3 layers ... K (f16): 0.19 MiB, V (f16): 0.19 MiB"): 512 * 3 * 64 * 2 bytes
    each."""
    _, model, _, _ = tiny
    hp = model.hparams
    assert (hp.n_layer, hp.n_layer_nextn, hp.n_layer_dense_lead) == (3, 1, 1)
    assert model.has_tensor("blk.3.nextn.eh_proj.weight")
    n_ctx, n_layer, n_embd_kv = 512, 3, 2 * 32
    sizes = new_ctx(model).memory.memory_breakdown()
    assert sizes["k"] == sizes["v"] == n_ctx * n_layer * n_embd_kv * 2
    assert kv_bytes_per_token(hp) == 2 * n_layer * n_embd_kv * 2
    assert (hp.expert_gating_func, hp.expert_weights_norm, hp.expert_weights_scale) == ("sigmoid", True, 2.5)


def test_missing_selection_bias_is_refused(tmp_path):
    """glm4moe's MoE layers require exp_probs_b (create_tensor without TENSOR_NOT_REQUIRED)."""
    from tests.data.tiny.make_tiny_glm4moe import glm4moe

    path = glm4moe(path=tmp_path / "nobias.gguf", drop=("blk.2.exp_probs_b.bias",))
    with pytest.raises(ModelLoadError, match=r"tensor 'blk\.2\.exp_probs_b\.bias' is missing"):
        Model.load(path)


def test_forward_runs_as_one_compiled_program(tiny):
    """The sigmoid router with its selection bias is a node of the compiled program (MOE_ROUTE_SEL): a prompt
    in ubatches of 8 then a single-token step run compiled, with the llama.cpp logits of the prompt."""

    _, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model, n_ubatch=8)
    np.testing.assert_array_equal(decode_all(ctx, toks[:-1]), arrays["prompt_0"][:-1])
    np.testing.assert_array_equal(decode_all(ctx, toks[-1:], pos0=len(toks) - 1), arrays["prompt_0"][-1:])
    assert {"moe_route_sel", "attn", "mul_mat_id"} <= compiled_ops(ctx)

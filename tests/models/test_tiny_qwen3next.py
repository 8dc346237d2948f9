"""qwen3next (Qwen3-Next: Gated DeltaNet with the fused beta|alpha projection and repeat-interleaved key heads,
gated full attention with NEOX RoPE, experts plus a sigmoid-gated shared expert; hybrid memory) on the tiny
synthetic model against llama.cpp's logits (tests/data/tiny/tiny-qwen3next.gguf, make_tiny_qwen3next.py,
REFERENCE.md): the prompts, greedy steps one token at a time, a prompt split over ubatches, two sequences in one
batch, state save / restore, and the tensors a load refuses."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Model
from llamactx.backend.reference import ReferenceOps
from llamactx.hparams import ModelLoadError
from tests.models.tiny import TINY, decode_all, interleaved_logits, load_tiny, new_ctx


@pytest.fixture(scope="module")
def tiny():
    return load_tiny("qwen3next")


@pytest.mark.parametrize("ops", ["fast", "reference"])
def test_prompt_logits_bit_identical(tiny, ops):
    _, model, ref, arrays = tiny
    for i, prompt in enumerate(ref["prompts"]):
        ctx = new_ctx(model, ops=ReferenceOps() if ops == "reference" else None)
        np.testing.assert_array_equal(decode_all(ctx, prompt["tokens"]), arrays[f"prompt_{i}"], err_msg=f"{i}")


def test_prompt_in_small_ubatches_bit_identical(tiny):
    """The conv and delta-rule states carry the sequence across ubatches of 4 tokens exactly."""
    _, model, ref, arrays = tiny
    got = decode_all(new_ctx(model, n_ubatch=4), ref["prompts"][0]["tokens"])
    np.testing.assert_array_equal(got, arrays["prompt_0"])


def test_teacher_forced_greedy_bit_identical(tiny):
    """The first 24 of the 64 greedy steps after the first prompt, one token per decode as llama.cpp ran them, with
    ggml's single-row kernels (the F32 ssm_ba and router matmuls of one row)."""
    _, model, ref, arrays = tiny
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True))
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"][:24]):
        np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"step {step}")
        assert int(np.argmax(row)) == tok
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_two_sequences_in_one_batch_equal_each_alone(tiny):
    """Interleaved tokens of two sequences in one batch: each sequence's rows equal llama.cpp's for it alone."""
    _, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    for s, rows in enumerate(interleaved_logits(ctx, a, b)):
        np.testing.assert_array_equal(rows, arrays[f"prompt_{s}"])


def test_state_round_trip(tiny):
    """Whole-context and one-sequence states (KV cells, conv and delta-rule states) loaded into a fresh context:
    the next token's logits are llama.cpp's."""
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


def test_layers_and_memory(tiny):
    _, model, _, _ = tiny
    hp = model.hparams
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff_shexp) == (8, 2, 32, 64)
    assert hp.recurrent_layers == (True, False, True, False)  # full_attention_interval 2
    assert hp.n_rot == 8 and hp.rope_type == 2  # NEOX over a quarter of each head
    assert hp.n_embd_r == 3 * (2 * 2 * 64 + 4 * 64)  # (d_conv - 1) * conv channels
    assert hp.n_embd_s == 64 * 64 * 4  # an S x S state per value head
    assert new_ctx(model).memory.attn_layers == (1, 3)


def test_info_names_each_layer_kind(capsys):
    from llamactx.cli.commands import main

    assert main(["info", "-m", str(TINY / "tiny-qwen3next.gguf")]) == 0
    out = capsys.readouterr().out
    assert "layer kinds:    gated delta net x2 (0, 2); full attention x2 (1, 3)" in out


@pytest.mark.parametrize("variant, match", [
    ({"drop": ("blk.2.ssm_ba.weight",)}, r"tensor 'blk.2.ssm_ba.weight' is missing"),
    ({"drop": ("blk.0.ssm_conv1d.weight",)}, r"tensor 'blk.0.ssm_conv1d.weight' is missing"),
    ({"drop": ("blk.1.ffn_gate_inp_shexp.weight",)}, r"tensor 'blk.1.ffn_gate_inp_shexp.weight' is missing"),
    ({"meta_interval": 4}, r"tensor 'blk.1.attn_qkv.weight' is missing"),
    ({"legacy_ssm_in": True}, r"tensor 'blk.0.ssm_in.weight': a legacy fused q\|k\|v\|z projection"),
], ids=["no-ssm_ba", "no-conv", "no-shexp-gate", "layer-pattern-vs-tensors", "legacy-ssm_in"])
def test_bad_model_refused_at_load(tmp_path, variant, match):
    """A missing delta-net, conv or shared-expert tensor, a layer pattern the tensors disagree with, and a legacy
    fused ssm_in: refused naming the tensor."""
    from tests.data.tiny.make_tiny_qwen3next import qwen3next

    path = qwen3next(path=tmp_path / "bad.gguf", **variant)
    with pytest.raises(ModelLoadError, match=match):
        Model.load(path)

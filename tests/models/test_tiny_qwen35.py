"""qwen35 and qwen35moe (Qwen3.5: Gated DeltaNet + gated full attention, hybrid memory; the MoE variant's routed
and shared experts) on the tiny synthetic models against llama.cpp's logits (tests/data/tiny/tiny-qwen35*.gguf,
make_tiny_qwen35.py, REFERENCE.md): the prompts, greedy steps one token at a time, a prompt split over ubatches,
two sequences in one batch, state save / restore, and the metadata and tensors a load refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamactx import Batch, Model
from llamactx.backend.reference import ReferenceOps
from llamactx.ggml.mrope import imrope_fourth_section
from llamactx.hparams import HParamsError, ModelLoadError
from tests.conftest import VARIANT
from tests.models.tiny import (
    TINY,
    TINY_REF,
    assert_flash_single_row,
    decode_all,
    interleaved_logits,
    load_tiny,
    new_ctx,
)


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def tiny(request):
    """load_tiny(name), skipped (saying so) on the AVX2 variant until avx2/<name>.* are made with llama.cpp's
    AVX2 build."""
    name = request.param
    if VARIANT == "avx2" and not (TINY_REF / f"{name}.json").exists():
        pytest.skip(f"no AVX2 reference for tiny {name} (tests/data/tiny/avx2/{name}.json: make_tiny_reference.py "
                    f"{name} with llama.cpp's AVX2 build)")
    return load_tiny(name)


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
    """The first 24 of the 64 greedy steps after the first prompt, one token per decode as llama.cpp ran them (the
    single-token delta rule and conv step), with ggml's single-row kernels (the F32 ssm_alpha / ssm_beta matmuls of
    one row)."""
    _, model, ref, arrays = tiny
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True))
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"][:24]):
        np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"step {step}")
        assert int(np.argmax(row)) == tok
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_teacher_forced_greedy_row_invariant_close(tiny):
    """By default one row is computed like several (docs/numerics.md): the first 8 steps within 1e-2 of
    llama.cpp and the same greedy tokens."""
    _, model, ref, arrays = tiny
    ctx = new_ctx(model)
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"][:8]):
        np.testing.assert_allclose(row, arrays["greedy"][step], rtol=0, atol=1e-2, err_msg=f"step {step}")
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


def test_seq_cp_then_diverging_continuations_equal_each_alone(tiny):
    """A state copied to a second sequence, then two different continuations in one batch: each equals the same
    continuation decoded alone after the prefix."""
    _, model, ref, _ = tiny
    prefix, (a, b) = ref["prompts"][1]["tokens"], ref["greedy"][:2]
    ctx = new_ctx(model, n_seq_max=2)
    decode_all(ctx, prefix)
    ctx.memory.seq_cp(0, 1, -1, -1)
    batch = Batch(4)
    for seq, tok in ((0, a), (1, b)):
        batch.add(tok, len(prefix), [seq], logits=True)
        batch.add(tok, len(prefix) + 1, [seq], logits=True)
    assert ctx.decode(batch) == 0
    both = ctx.get_logits().copy()
    for rows, tok in ((slice(0, 2), a), (slice(2, 4), b)):
        alone = new_ctx(model)
        decode_all(alone, prefix)
        np.testing.assert_array_equal(both[rows], decode_all(alone, [tok, tok], pos0=len(prefix)))


def test_flash_attention_bit_identical():
    """With flash attention (qwen35-fa: llama.cpp's run with it on, and a 90-token prompt for its tiled kernel):
    under ggml_single_row every prompt and 64 greedy steps are llama.cpp's bits (the one-chunk kernel's f16
    accumulation below 64 tokens); by default the tiled kernel's prompt is too."""
    if VARIANT == "avx2" and not (TINY_REF / "qwen35-fa.json").exists():
        pytest.skip("no AVX2 reference for tiny qwen35-fa (tests/data/tiny/avx2/qwen35-fa.json)")
    ref = json.loads((TINY_REF / "qwen35-fa.json").read_text())
    with np.load(TINY_REF / "qwen35-fa.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    model = Model.load(TINY / ref["model"])
    assert_flash_single_row(model, ref, arrays)
    got = decode_all(new_ctx(model, flash_attn="enabled"), ref["prompts"][3]["tokens"])
    np.testing.assert_array_equal(got, arrays["prompt_3"])


def test_released_head_shapes_bit_identical():
    """qwen35-s128: the released models' head shapes (attention heads of 256 rotating 64 dimensions with sections
    [11, 11, 10, 0], one KV head; delta-net heads of 128, two value heads per key head; interval 4): the prompts by
    default and 8 greedy steps with ggml's single-row kernels are llama.cpp's bits."""
    if VARIANT == "avx2" and not (TINY_REF / "qwen35-s128.json").exists():
        pytest.skip("no AVX2 reference for tiny qwen35-s128 (tests/data/tiny/avx2/qwen35-s128.json)")
    _, model, ref, arrays = load_tiny("qwen35-s128")
    assert model.hparams.recurrent_layers == (True, True, True, False)
    for i, prompt in enumerate(ref["prompts"]):
        np.testing.assert_array_equal(decode_all(new_ctx(model), prompt["tokens"]), arrays[f"prompt_{i}"])
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True))
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"][:8]):
        np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"step {step}")
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_checkpoint_restore_then_continue(tiny):
    """A context checkpoint (the recurrent half; the KV cells stay) taken after 8 tokens, 4 more decoded, then the
    checkpoint loaded back at 8: the rest of the prompt gives llama.cpp's logits."""
    _, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model)
    decode_all(ctx, toks[:8])
    blob = ctx.memory.checkpoint_write(0)
    decode_all(ctx, toks[8:12], pos0=8)
    ctx.memory.checkpoint_load(0, blob, 8)
    assert ctx.memory.seq_pos_max(0) == 7
    np.testing.assert_array_equal(decode_all(ctx, toks[8:], pos0=8), arrays["prompt_0"][8:])


def test_imrope_fourth_section_pairs():
    """ggml_mrope_cache_init's interleave: sections (3, 3, 1, 0) over 8 pairs give sectors 0..6, 0; sector 5
    (5 % 3 == 2, not below 3 * 1) takes the fourth stream. Qwen3.5's (11, 11, 10, 0) over 32 pairs never does."""
    assert imrope_fourth_section(16, (3, 3, 1, 0)).tolist() == [False] * 5 + [True] + [False] * 2
    assert not imrope_fourth_section(64, (11, 11, 10, 0)).any()


def test_layers_and_memory(tiny):
    name, model, _, _ = tiny
    hp = model.hparams
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff_shexp) == ((8, 2, 32, 64) if name == "qwen35moe"
                                                                          else (0, 0, 0, 0))
    assert hp.recurrent_layers == (True, False, True, False)  # full_attention_interval 2
    assert hp.n_embd_r == 3 * (2 * 2 * 64 + 4 * 64)  # (d_conv - 1) * conv channels
    assert hp.n_embd_s == 64 * 64 * 4  # an S x S state per value head
    ctx = new_ctx(model)
    assert ctx.memory.attn_layers == (1, 3)


@pytest.mark.parametrize("name", ["qwen35", "qwen35moe"])
def test_info_names_each_layer_kind(capsys, name):
    from llamactx.cli.commands import main

    assert main(["info", "-m", str(TINY / f"tiny-{name}.gguf")]) == 0
    out = capsys.readouterr().out
    assert "layer kinds:    gated delta net x2 (0, 2); full attention x2 (1, 3)" in out
    assert "memory:         KV cache + recurrent states (llama_memory_hybrid)" in out


def test_recurrent_layer_flags_take_precedence(tmp_path, tiny):
    """attention.recurrent_layers (convert_hf_to_gguf.py's flags from layer_types) decides the layer kinds over
    full_attention_interval, as llama_model_qwen35::load_arch_hparams reads them: a file whose interval says 4 but
    whose flags say every other layer loads and gives llama.cpp's logits."""
    from tests.data.tiny.make_tiny_qwen35 import qwen35

    name, _, ref, arrays = tiny
    if name != "qwen35":
        pytest.skip("one architecture is enough: the flags are read by the same code")
    path = qwen35(path=tmp_path / "flags.gguf", meta_interval=4, recurrent_layers=[True, False, True, False])
    model = Model.load(path)
    assert model.hparams.recurrent_layers == (True, False, True, False)
    np.testing.assert_array_equal(decode_all(new_ctx(model), ref["prompts"][1]["tokens"]), arrays["prompt_1"])


def test_mtp_blocks_are_not_run(tmp_path, tiny):
    """A file with a multi-token-prediction block after its layers (convert_hf_to_gguf.py exports one:
    block_count 5, nextn_predict_layers 1, recurrent flags for all 5 blocks): the main graph runs the first 4
    layers, and gives the logits llama.cpp gives (the same as without the block, checked with its build)."""
    from tests.data.tiny.make_tiny_qwen35 import qwen35

    name, _, ref, arrays = tiny
    if name != "qwen35":
        pytest.skip("one architecture is enough: the layers are counted by the same code")
    path = qwen35(path=tmp_path / "mtp.gguf", nextn=1, recurrent_layers=[True, False, True, False, False])
    model = Model.load(path)
    assert model.hparams.n_layer == 4 and model.hparams.recurrent_layers == (True, False, True, False)
    np.testing.assert_array_equal(decode_all(new_ctx(model), ref["prompts"][1]["tokens"]), arrays["prompt_1"])


def test_moe_without_feed_forward_length(tmp_path):
    """A qwen35moe file without feed_forward_length (its converter writes it only from a config's
    intermediate_size; llama.cpp reads it as optional) loads: the experts' widths come from their own keys."""
    from tests.data.tiny.make_tiny_qwen35 import qwen35

    path = qwen35("qwen35moe", seed=22, moe=True, path=tmp_path / "no-ff.gguf",
                  drop_keys=("qwen35moe.feed_forward_length",))
    hp = Model.load(path).hparams
    assert (hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp) == (0, 32, 64)


@pytest.mark.parametrize("variant, error, match", [
    ({"meta_interval": 0}, HParamsError, r"'qwen35.full_attention_interval' = 0 is outside \[1,"),
    ({"drop": ("blk.2.ssm_conv1d.weight",)}, ModelLoadError, r"tensor 'blk.2.ssm_conv1d.weight' is missing"),
    ({"drop": ("blk.0.ssm_a",)}, ModelLoadError, r"tensor 'blk.0.ssm_a' is missing"),
    ({"drop": ("blk.0.attn_qkv.weight",)}, ModelLoadError, r"tensor 'blk.0.attn_qkv.weight' is missing"),
    ({"meta_interval": 4}, ModelLoadError, r"tensor 'blk.1.attn_qkv.weight' is missing"),
    ({"recurrent_layers": [True, True, True, False]}, ModelLoadError, r"tensor 'blk.1.attn_qkv.weight' is missing"),
    ({"recurrent_layers": [True, False]}, HParamsError, r"'qwen35.attention.recurrent_layers': expected 4"),
], ids=["interval-0", "no-conv", "no-ssm_a", "no-qkv", "layer-pattern-vs-tensors", "flags-vs-tensors",
        "flags-count"])
def test_bad_model_refused_at_load(tmp_path, variant, error, match):
    """full_attention_interval 0, a missing conv or delta-net tensor, and a layer pattern the tensors disagree
    with (the metadata's interval 4 makes layer 1, an attention layer in the file, a delta-net layer): refused
    naming the key or tensor."""
    from tests.data.tiny.make_tiny_qwen35 import qwen35

    path = qwen35(path=tmp_path / "bad.gguf", **variant)
    with pytest.raises(error, match=match):
        Model.load(path)

"""gemma4 (Gemma 4: iSWA with per-layer head sizes, proportional RoPE on the global layers, shared KV layers, V
normed, attention scale 1, per-layer output scales; the E models' per-layer embeddings; the MoE model's experts
beside the dense FFN) on the tiny synthetic models against llama.cpp's logits (tests/data/tiny/tiny-gemma4*.gguf,
make_tiny_gemma4.py, REFERENCE.md): the prompts (each past the 4-token window), greedy steps one token at a time, a
prompt split over ubatches, two sequences in one batch, state save / restore, flash attention, and the metadata and
tensors a load refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamactx import Model
from llamactx.backend.reference import ReferenceOps
from llamactx.hparams import HParamsError, ModelLoadError
from llamactx.memory.base import MemoryOpError
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


@pytest.fixture(scope="module", params=["gemma4", "gemma4-e", "gemma4-moe"])
def tiny(request):
    """load_tiny(name); its references exist for both ISA levels (avx2/ made with llama.cpp's AVX2 build)."""
    name = request.param
    if not (TINY_REF / f"{name}.json").exists():
        pytest.fail(f"no {VARIANT} reference for tiny {name}: run make_tiny_reference.py {name} (REFERENCE.md)")
    return load_tiny(name)


@pytest.mark.parametrize("ops", ["fast", "reference"])
def test_prompt_logits_bit_identical(tiny, ops):
    _, model, ref, arrays = tiny
    for i, prompt in enumerate(ref["prompts"]):
        ctx = new_ctx(model, ops=ReferenceOps() if ops == "reference" else None)
        np.testing.assert_array_equal(decode_all(ctx, prompt["tokens"]), arrays[f"prompt_{i}"], err_msg=f"{i}")


def test_prompt_in_small_ubatches_bit_identical(tiny):
    """Ubatches of 3 tokens (the SWA cache then holds 256 cells): the shared layers read the KV their source layers
    stored in earlier ubatches."""
    _, model, ref, arrays = tiny
    got = decode_all(new_ctx(model, n_ubatch=3), ref["prompts"][0]["tokens"])
    np.testing.assert_array_equal(got, arrays["prompt_0"])


def test_teacher_forced_greedy_bit_identical(tiny):
    """The first 12 of the 64 greedy steps after the first prompt (positions 21-32, each step past the 4-token
    window), one token per decode as llama.cpp ran them, with ggml's single-row kernels."""
    _, model, ref, arrays = tiny
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True))
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"][:12]):
        np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"step {step}")
        assert int(np.argmax(row)) == tok
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_teacher_forced_greedy_row_invariant_close(tiny):
    """By default one row is computed like several (docs/numerics.md): the first 8 steps within 1e-2 of llama.cpp
    and the same greedy tokens."""
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
    """Whole-context and one-sequence states (both caches, their different row widths) loaded into a fresh
    context: the next token's logits are llama.cpp's."""
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


def test_past_the_swa_cache_equals_swa_full():
    """300 tokens in ubatches of 32: the SWA cache (GGML_PAD(4 + 32, 256) = 256 cells) wraps and reuses the cells
    its window left; the last rows equal those of a full-size SWA cache (swa_full, as llama.cpp's references ran)."""
    model = Model.load(TINY / "tiny-gemma4.gguf")
    toks = [(i * 37 + 11) % 1024 for i in range(300)]
    windowed = new_ctx(model, n_ubatch=32)
    assert windowed.memory.swa.size == 256
    got = decode_all(windowed, toks)[-40:]
    full = new_ctx(model, n_ubatch=32, swa_full=True)
    assert full.memory.swa.size == 512
    np.testing.assert_array_equal(got, decode_all(full, toks)[-40:])


def test_flash_attention_bit_identical():
    """With flash attention (gemma4-fa: llama.cpp's run with it on, plus a 90-token prompt for its tiled kernel):
    under ggml_single_row every prompt and the first 12 greedy steps are llama.cpp's bits (the one-chunk kernel);
    by default the tiled kernel's prompt is too."""
    ref = json.loads((TINY_REF / "gemma4-fa.json").read_text())
    with np.load(TINY_REF / "gemma4-fa.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    model = Model.load(TINY / ref["model"])
    assert_flash_single_row(model, dict(ref, greedy=ref["greedy"][:12]), arrays)
    got = decode_all(new_ctx(model, flash_attn="enabled"), ref["prompts"][3]["tokens"])
    np.testing.assert_array_equal(got, arrays["prompt_3"])


def test_double_wide_mlp_bit_identical():
    """use_double_wide_mlp (tiny-gemma4-wide): feed_forward_length per layer, the two shared KV layers' FFNs twice
    as wide; every prompt gives llama.cpp's logits."""
    _, model, ref, arrays = load_tiny("gemma4-wide")
    assert model.hparams.n_ff_arr == (128,) * 4 + (256,) * 2
    assert [model.hparams.layer_n_ff(il) for il in (0, 5)] == [128, 256]
    for i, prompt in enumerate(ref["prompts"]):
        np.testing.assert_array_equal(decode_all(new_ctx(model), prompt["tokens"]), arrays[f"prompt_{i}"])


def test_layers_and_memory(tiny):
    """Per-layer shapes as llama_hparams gives them, each cache's rows as wide as its layers' K/V, the shared
    layers mapped to the KV of layers 2 (sliding) and 3 (global), and no K-shift across head sizes."""
    name, model, _, _ = tiny
    hp = model.hparams
    assert hp.swa_layers == (True, True, True, False, True, False)
    assert [hp.layer_head_size(il) for il in range(6)] == [16, 16, 16, 32, 16, 32]
    assert [hp.layer_n_head_kv(il) for il in range(6)] == [2, 2, 2, 1, 2, 1]
    assert [hp.layer_n_rot(il) for il in range(6)] == [16, 16, 16, 32, 16, 32]
    assert [hp.kv_reuse(il) for il in range(6)] == [-1, -1, -1, -1, 2, 3]
    assert hp.n_embd_per_layer == (16 if name == "gemma4-e" else 0)
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == ((4, 2, 32) if name == "gemma4-moe" else (0, 0, 0))
    mem = new_ctx(model).memory
    assert mem.base.layers == (3,) and mem.swa.layers == (0, 1, 2)
    assert (mem.base.n_embd_k_gqa, mem.swa.n_embd_k_gqa) == (32, 32)
    assert mem.swa.layer_index[4] == mem.swa.layer_index[2] and mem.base.layer_index[5] == mem.base.layer_index[3]
    full = new_ctx(model, swa_full=True).memory
    assert not full.can_shift
    with pytest.raises(MemoryOpError, match="different head sizes"):
        full.seq_add(0, 0, -1, 1)


@pytest.mark.parametrize("name", ["gemma4", "gemma4-e", "gemma4-moe"])
def test_info(capsys, name):
    from llamactx.cli.commands import main

    assert main(["info", "-m", str(TINY / f"tiny-{name}.gguf")]) == 0
    out = capsys.readouterr().out
    assert "architecture:   gemma4" in out
    assert ("heads:          global layers 4 x 32 (1 KV), RoPE over 32; sliding-window layers 4 x 16 (2 KV), RoPE "
            "over 16") in out
    assert ("per-layer embd: 16 per layer" in out) == (name == "gemma4-e")
    assert ("experts:        4, 2 used per token, n_ff_exp 32" in out) == (name == "gemma4-moe")
    assert ("llama_kv_cache_iswa (2 global layers, 4 sliding-window layers of 4 tokens; layers 4-5 read the KV of "
            "layers 2 (sliding) and 3 (global)") in out


@pytest.mark.parametrize("variant, error, match", [
    ({"kv_heads": [2, 1, 2, 1, 2, 1]}, HParamsError,
     r"'gemma4.attention.head_count_kv' = \[2, 1, 2, 1, 2, 1\]: the sliding-window layers have different KV head "
     r"counts \[1, 2\]"),
    ({"kv_heads": [2, 2, 2]}, HParamsError, r"'gemma4.attention.head_count_kv' = \[2, 2, 2\]: expected 6 values"),
    ({"kv_heads": [3, 3, 3, 1, 3, 1]}, HParamsError, r"that divide head_count = 4"),
    ({"n_shared": 3, "drop": ()}, HParamsError,
     r"'gemma4.attention.shared_kv_layers' = 3: layers 1 and 2 must be a sliding-window and a global layer"),
    ({"drop": ("blk.3.attn_k.weight",)}, ModelLoadError, r"tensor 'blk.3.attn_k.weight' is missing"),
    ({"drop": ("rope_freqs.weight",)}, ModelLoadError, r"tensor 'rope_freqs.weight' is missing"),
    ({"drop": ("blk.0.inp_gate.weight",), "per_layer": 16}, ModelLoadError, r"tensor 'blk.0.inp_gate.weight' is "
     r"missing"),
    ({"drop": ("blk.2.ffn_gate_up_exps.weight",), "moe": True}, ModelLoadError,
     r"tensor 'blk.2.ffn_gate_up_exps.weight' is missing"),
    ({"drop": ("blk.1.ffn_gate_inp.scale",), "moe": True}, ModelLoadError,
     r"tensor 'blk.1.ffn_gate_inp.scale' is missing"),
], ids=["kv-heads-mixed", "kv-heads-count", "kv-heads-divide", "shared-pattern", "no-k", "no-rope-freqs",
        "no-inp-gate", "no-gate-up-exps", "no-router-scale"])
def test_bad_model_refused_at_load(tmp_path, variant, error, match):
    """Per-layer KV head counts that disagree within a layer kind, are too few or do not divide the query heads,
    shared layers without a sliding-window and a global KV layer before them, and missing tensors: refused naming
    the key or tensor."""
    from tests.data.tiny.make_tiny_gemma4 import gemma4

    path = gemma4(path=tmp_path / "bad.gguf", **variant)
    with pytest.raises(error, match=match):
        Model.load(path)

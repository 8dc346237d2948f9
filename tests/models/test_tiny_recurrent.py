"""Recurrent and hybrid architectures on tiny synthetic models against llama.cpp's logits (tests/data/tiny,
REFERENCE.md): mamba2 (recurrent memory; d_state 16 runs ggml_ssm_scan's scalar loop, mamba2-s128 its SIMD
lanes as real Mamba-2 models do), lfm2 (hybrid memory: short-convolution + attention layers) and lfm2moe (the
same with routed experts), granitehybrid (Mamba-2 + attention layers, granite's scales; dense, and with experts
and a shared expert) and nemotron_h (Mamba-2, attention-only and ReLU-squared FFN-only layers)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch
from llamactx.backend.reference import ReferenceOps
from llamactx.models import ARCHITECTURES
from tests.models.tiny import TINY, decode_all, interleaved_logits, load_tiny, new_ctx

NAMES = [name for name in ("mamba2", "mamba2-s128", "lfm2", "lfm2moe", "granitehybrid", "granitehybrid-moe",
                            "nemotron_h") if name.split("-")[0] in ARCHITECTURES]


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    return load_tiny(request.param)


@pytest.mark.parametrize("ops", ["fast", "reference"])
def test_prompt_logits_bit_identical(tiny, ops):
    name, model, ref, arrays = tiny
    for i, prompt in enumerate(ref["prompts"]):
        ctx = new_ctx(model, ops=ReferenceOps() if ops == "reference" else None)
        got = decode_all(ctx, prompt["tokens"])
        np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"{name} prompt {i}")


def test_prompt_in_small_ubatches_bit_identical(tiny):
    """The states carry a sequence across ubatches (and decodes) exactly: n_ubatch 4 gives the same logits."""
    name, model, ref, arrays = tiny
    got = decode_all(new_ctx(model, n_ubatch=4), ref["prompts"][0]["tokens"])
    np.testing.assert_array_equal(got, arrays["prompt_0"])


@pytest.mark.parametrize("single_row", [True, False], ids=["ggml-single-row", "row-invariant"])
def test_teacher_forced_greedy_identical(tiny, single_row):
    """64 greedy steps after the first prompt, one token per decode as llama.cpp ran them: bit-identical with
    ggml's single-row kernels; the default computes one row like several (docs/numerics.md), within 1e-3 of
    llama.cpp with F32 weights (mamba2), 1e-2 with F16 ones (lfm2: f16 rounding of the activations)."""
    name, model, ref, arrays = tiny
    atol = 1e-3 if name.startswith("mamba2") else 1e-2
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True) if single_row else None)
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"]):
        if single_row:
            np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"{name} step {step}")
        else:
            np.testing.assert_allclose(row, arrays["greedy"][step], rtol=0, atol=atol, err_msg=f"{name} {step}")
        assert int(np.argmax(row)) == tok
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_two_sequences_in_one_batch_equal_each_alone(tiny):
    """Interleaved tokens of two sequences in one batch: each sequence's rows equal llama.cpp's for it alone."""
    name, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    for s, rows in enumerate(interleaved_logits(ctx, a, b)):
        np.testing.assert_array_equal(rows, arrays[f"prompt_{s}"])


def test_shared_prompt_then_two_continuations_in_one_batch(tiny):
    """Tokens of the sequence set (0, 1) then of 0 and of 1 alone, in one batch (llama.cpp splits them into
    separate ubatches): each continuation equals the same tokens decoded alone."""
    name, model, ref, arrays = tiny
    prefix, (a, b) = ref["prompts"][1]["tokens"], ref["greedy"][:2]
    ctx = new_ctx(model, n_seq_max=2)
    batch = Batch(len(prefix) + 2, n_seq_max=2)
    for i, t in enumerate(prefix):
        batch.add(t, i, [0, 1], logits=True)
    batch.add(a, len(prefix), [0], logits=True)
    batch.add(b, len(prefix), [1], logits=True)
    assert ctx.decode(batch) == 0
    got = ctx.get_logits()
    np.testing.assert_array_equal(got[: len(prefix)], arrays["prompt_1"])
    for row, tok in ((len(prefix), a), (len(prefix) + 1, b)):
        alone = new_ctx(model)
        np.testing.assert_array_equal(got[row], decode_all(alone, prefix + [tok])[-1])
    assert ctx.memory.seq_pos_max(0) == ctx.memory.seq_pos_max(1) == len(prefix)


def test_state_round_trip(tiny):
    """Whole-context and one-sequence states: loaded into a fresh context, the next token's logits are
    llama.cpp's."""
    name, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    decode_all(ctx, toks[:-1], seq=1)
    for whole in (True, False):
        other = new_ctx(model, n_seq_max=2)
        if whole:
            other.state_set_data(ctx.state_get_data())
            seq = 1
        else:
            other.state_seq_set_data(ctx.state_seq_get_data(1), 0)
            seq = 0
        assert other.memory.seq_pos_max(seq) == len(toks) - 2
        got = decode_all(other, toks[-1:], seq=seq, pos0=len(toks) - 1)[-1]
        np.testing.assert_array_equal(got, arrays["prompt_0"][-1])


def test_seq_cp_then_diverging_continuations_equal_each_alone(tiny):
    """A state copied to a second sequence, then two different continuations in one batch: each equals the same
    continuation decoded alone after the prefix."""
    name, model, ref, _ = tiny
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


def test_aborted_decode_leaves_the_states_as_they_were(tiny):
    """A decode aborted after its first ubatch rolls the states back: the sequence is as before (here empty, or
    after a first part), and decoding again gives llama.cpp's logits."""
    name, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    calls = {"n": 0, "armed": False}

    def abort() -> bool:
        calls["n"] += 1
        return calls["armed"] and calls["n"] > 1

    ctx = new_ctx(model, n_ubatch=4, abort_callback=abort)
    decode_all(ctx, toks[:5])
    calls["armed"] = True
    batch = Batch(len(toks) - 5)
    for i, t in enumerate(toks[5:]):
        batch.add(t, 5 + i, [0], logits=True)
    assert ctx.decode(batch) == 2
    assert ctx.memory.seq_pos_max(0) == 4
    calls["armed"] = False
    np.testing.assert_array_equal(decode_all(ctx, toks[5:], pos0=5), arrays["prompt_0"][5:])


def test_info_names_the_memory_type(tiny, capsys):
    from llamactx.cli.commands import main

    name, _, _, _ = tiny
    assert main(["info", "-m", str(TINY / f"tiny-{name}.gguf")]) == 0
    out = capsys.readouterr().out
    want = {"mamb": "memory:         recurrent states (llama_memory_recurrent)",
            "lfm2": "memory:         KV cache + recurrent states (llama_memory_hybrid)",
            "gran": "memory:         KV cache + recurrent states (llama_memory_hybrid)",
            "nemo": "memory:         KV cache + recurrent states (llama_memory_hybrid)"}[name.split("-")[0][:4]]
    assert want in out
    if name.startswith("lfm2"):  # both arrangements: conv, attention, conv, attention
        assert "layer kinds:    short convolution x2 (0, 2); attention x2 (1, 3)" in out
    if name.startswith("granitehybrid"):
        assert "layer kinds:    mamba2 x3 (0, 2-3); attention x1 (1)" in out
    if name == "nemotron_h":  # the pattern "M*-M-"
        assert "layer kinds:    mamba2 x2 (0, 3); attention x1 (1); ffn x2 (2, 4)" in out


def test_encode_is_refused(tiny):
    """llama_encode runs without memory; a recurrent layer has nothing to run on without its state."""
    from llamactx.batch import DecodeError

    name, model, _, _ = tiny
    with pytest.raises(DecodeError, match="recurrent state"):
        new_ctx(model).encode(Batch.get_one([1, 2]))

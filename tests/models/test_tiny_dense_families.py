"""More dense families on tiny synthetic models against llama.cpp's logits (tests/data/tiny, REFERENCE.md): phi3
(fused attn_qkv, gate+up ffn_up), gemma2 (attention and final logit soft-capping, a sliding window of 8 tokens on
even layers, post-norms), smollm3 (no RoPE in every fourth layer) and granite (embedding, residual, attention and
logit scales), and phi3 with LongRoPE in Phi-3.5-mini-128k's layout (phi3-longrope) and Phi-4-mini's (phi4-mini:
partial rotation, tied output), whose references at n_ctx 512 take the short factors and the -long ones (n_ctx
1024, past the original context of 512) the long factors. Each through ReferenceOps and FastOps (the default
ops)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from llamactx import Context, ContextParams, Model
from llamactx.backend.reference import ReferenceOps
from llamactx.engine import Engine, Limits
from llamactx.hparams import HParamsError
from llamactx.model import ModelLoadError
from llamactx.sampling import SamplerChain, SamplingParams
from tests.gguf.tiny_model import rewrite_gguf
from tests.models.tiny import TINY, TINY_REF, assert_flash_single_row, decode_all, load_tiny, new_ctx, sequences_batch

NAMES = ["phi3", "gemma2", "smollm3", "granite", "phi3-longrope", "phi4-mini"]
LONGROPE = ["phi3-longrope", "phi4-mini"]
OPS = {"reference": ReferenceOps, "fast": lambda: None}  # None: the context's default, FastOps


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    return load_tiny(request.param)


@pytest.fixture(scope="module")
def gemma2_fa():
    """tiny-gemma2 and llama.cpp's outputs for it with flash attention (ggml_flash_attn_ext's logit_softcap)."""
    _, model, _, _ = load_tiny("gemma2")
    ref = json.loads((TINY_REF / "gemma2-fa.json").read_text())
    with np.load(TINY_REF / "gemma2-fa.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return model, ref, arrays


@pytest.mark.parametrize("ops", list(OPS))
def test_prompt_logits_bit_identical(tiny, ops):
    name, model, ref, arrays = tiny
    for i, prompt in enumerate(ref["prompts"]):
        got = decode_all(new_ctx(model, OPS[ops]()), prompt["tokens"])
        np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"{name} prompt {i} ({ops})")


def test_prompts_go_past_the_sliding_window():
    """gemma2's references exercise its window: the prompts are longer than 8 tokens, and the sliding-window
    layers are the even ones."""
    _, model, ref, _ = load_tiny("gemma2")
    hp = model.hparams
    assert hp.n_swa == 8 and hp.swa_layers == (True, False, True, False)
    assert hp.f_attn_logit_softcapping == 10.0 and hp.f_final_logit_softcapping == 30.0
    assert all(len(p["tokens"]) > hp.n_swa for p in ref["prompts"])


@pytest.mark.parametrize("single_row", [True, False], ids=["ggml-single-row", "row-invariant"])
def test_teacher_forced_greedy_identical(tiny, single_row):
    """64 greedy steps after the first prompt, one token per decode as llama.cpp ran them: bit-identical with
    ggml's single-row kernels, within an ulp's consequences with the default ops (docs/numerics.md)."""
    name, model, ref, arrays = tiny
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True) if single_row else None)
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"]):
        if single_row:
            np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"{name} step {step}")
        else:
            # gemma2's logits reach 25 (post-norm gains of 32): its ulps become hundredths
            np.testing.assert_allclose(row, arrays["greedy"][step], rtol=0, atol=5e-2, err_msg=f"{name} {step}")
        assert int(np.argmax(row)) == tok
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_gemma2_flash_attention_soft_cap_bit_identical(gemma2_fa):
    """With flash attention the soft-cap is ggml_flash_attn_ext's (scale / cap, then cap * tanhf): prompts (fewer
    than 64 tokens: ggml's one-chunk kernel) and 64 decode steps bit-identical under ggml_single_row."""
    assert_flash_single_row(*gemma2_fa[-3:])


@pytest.mark.parametrize("ops", list(OPS))
def test_gemma2_flash_attention_tiled_kernel_bit_identical(gemma2_fa, ops):
    """A prompt of 64 tokens or more runs ggml's tiled flash kernel (soft-cap after its simd_gemm and scale):
    the default ops, which give every token that kernel's arithmetic, reproduce llama.cpp's logits exactly."""
    model, ref, arrays = gemma2_fa
    long = [i for i, p in enumerate(ref["prompts"]) if len(p["tokens"]) >= 64]
    assert long
    for i in long:
        got = decode_all(new_ctx(model, OPS[ops](), flash_attn="enabled"), ref["prompts"][i]["tokens"])
        np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"prompt {i} ({ops})")


@pytest.mark.parametrize("ops", list(OPS))
def test_gemma2_flash_attention_default_ops_close(gemma2_fa, ops):
    """The default (row-invariant) flash attention takes the tiled kernel's arithmetic (an f32 accumulator) for
    every token: the soft-capped logits stay close to llama.cpp's one-chunk ones (f16 accumulator), with the same
    argmax, and both ops agree bit for bit."""
    model, ref, arrays = gemma2_fa
    prompt = ref["prompts"][0]["tokens"]
    got = decode_all(new_ctx(model, OPS[ops](), flash_attn="enabled"), prompt)
    np.testing.assert_allclose(got, arrays["prompt_0"], rtol=0, atol=0.1)
    assert (got.argmax(1) == arrays["prompt_0"].argmax(1)).all()
    other = decode_all(new_ctx(model, ReferenceOps(), flash_attn="enabled"), prompt)
    np.testing.assert_array_equal(got, other)


def test_two_sequences_in_one_batch_equal_each_alone(tiny):
    name, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    assert ctx.decode(sequences_batch([a, b])) == 0
    both = ctx.get_logits()
    np.testing.assert_array_equal(both[: len(a)], arrays["prompt_0"])
    np.testing.assert_array_equal(both[len(a):], arrays["prompt_1"])


def test_state_round_trip(tiny):
    name, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model)
    decode_all(ctx, toks[:-1])
    blob = ctx.state_get_data()
    other = new_ctx(model)
    other.state_set_data(blob)
    np.testing.assert_array_equal(decode_all(other, toks[-1:], pos0=len(toks) - 1)[-1], arrays["prompt_0"][-1])


def test_seq_state_round_trip_into_another_sequence(tiny):
    """One sequence's state saved and loaded into another sequence of a fresh context continues as llama.cpp."""
    name, model, ref, arrays = tiny
    toks = ref["prompts"][2]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    decode_all(ctx, toks[:-1])
    blob = ctx.state_seq_get_data(0)
    other = new_ctx(model, n_seq_max=2)
    other.state_seq_set_data(blob, 1)
    np.testing.assert_array_equal(decode_all(other, toks[-1:], seq=1, pos0=len(toks) - 1)[-1],
                                  arrays["prompt_2"][-1])


def greedy(model) -> SamplerChain:
    return SamplerChain.default(SamplingParams(temperature=0.0), model.hparams.n_vocab, model.vocab, n_ctx=256)


def serve(engine: Engine, prompts, n: int) -> list[list[int]]:
    seqs = [engine.add_request(p, greedy(engine.model), Limits(max_tokens=n)) for p in prompts]
    for _ in range(500):
        if not engine.has_work:
            return [s.output for s in seqs]
        engine.step()
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("flash_attn", ["disabled", "auto"])
def test_engine_serves_llama_cpp_greedy_tokens(tiny, flash_attn):
    """Two concurrent requests (prompts prefilled in chunks of 8 beside decodes): the first gets llama.cpp's
    greedy tokens, the second what it gets alone."""
    name, model, ref, _ = tiny
    p0, p2 = ref["prompts"][0]["tokens"], ref["prompts"][2]["tokens"]
    engine = Engine(model, n_slots=2, n_ctx=256, n_batch=8, n_threads=2, flash_attn=flash_attn)
    out0, out2 = serve(engine, [p0, p2], 16)
    assert out0 == ref["greedy"][:16]
    alone = Engine(model, n_slots=1, n_ctx=256, n_threads=2, flash_attn=flash_attn)
    assert out2 == serve(alone, [p2], 16)[0]


def test_smollm3_rope_layers_and_context_shift():
    """Every fourth layer has no RoPE (n_no_rope_layer_step = 4), and a position shift leaves its keys as they
    are (llama_kv_cache::build_graph_shift) while it re-rotates the others'."""
    _, model, ref, _ = load_tiny("smollm3")
    assert [model.hparams.has_rope(il) for il in range(4)] == [True, True, True, False]
    ctx = new_ctx(model)
    toks = ref["prompts"][0]["tokens"]
    decode_all(ctx, toks)
    n = len(toks)
    before = ctx.memory.k.copy()  # (n_layer, n_ctx, n_embd_k_gqa) as stored
    ctx.memory.seq_add(0, 0, -1, 5)
    decode_all(ctx, [toks[0]], pos0=n + 5)  # the pending shift is applied before the decode
    after = ctx.memory.k
    assert np.array_equal(before[3, :n], after[3, :n])
    assert all(not np.array_equal(before[il, :n], after[il, :n]) for il in range(3))


# -- files that must be refused, with the field named -------------------------------------------------------


def rewrite(name: str, path, meta: dict | None = None, tensors: dict | None = None):
    """tiny-<name>.gguf copied to `path`, with metadata keys replaced (None: removed) and tensors replaced (a
    float32 numpy array in numpy order; None: removed)."""
    return rewrite_gguf(TINY / f"tiny-{name}.gguf", path, meta, tensors)


def test_phi3_attn_qkv_of_the_wrong_size_is_refused(tmp_path):
    path = rewrite("phi3", tmp_path / "bad.gguf", tensors={"blk.0.attn_qkv.weight": np.zeros((96, 64), np.float32)})
    with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_qkv\.weight.*\[64, 96\], expected \[64, 128\]"):
        Model.load(path)


@pytest.mark.parametrize("tensor", ["rope_factors_long.weight", "rope_factors_short.weight"])
def test_longrope_factors_of_the_wrong_length_are_refused(tmp_path, tensor):
    """n_rot/2 factors (6 for phi4-mini's 12 rotated dimensions): 8, a whole head's half, is refused naming the
    tensor."""
    path = rewrite("phi4-mini", tmp_path / "bad.gguf", tensors={tensor: np.ones(8, np.float32)})
    with pytest.raises(ModelLoadError, match=re.escape(f"{tensor}' has shape [8], expected [6]")):
        Model.load(path)


# -- LongRoPE: the long factors past the original context -----------------------------------------------------


@pytest.fixture(scope="module", params=LONGROPE)
def longrope(request):
    """A LongRoPE model and llama.cpp's outputs for it with n_ctx 1024 (its long factors)."""
    _, model, _, _ = load_tiny(request.param)
    ref = json.loads((TINY_REF / f"{request.param}-long.json").read_text())
    with np.load(TINY_REF / f"{request.param}-long.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return request.param, model, ref, arrays


def long_ctx(model, ops=None, n_ctx: int = 1024, **kw) -> Context:
    return Context(model, ContextParams(n_ctx=n_ctx, n_batch=512, n_threads=2, flash_attn="disabled", **kw), ops=ops)


def test_longrope_factors_follow_the_context_per_sequence(longrope):
    """llama_model::get_rope_factors: long factors where n_ctx_seq exceeds original_context_length (512), short
    ones at or below it; the attention factor is the file's rope.scaling.attn_factor either way."""
    name, model, _, _ = longrope
    t = model.tensors
    attn_factor = np.float32(np.sqrt(1 + np.log(8) / np.log(512)))
    for n_ctx, n_seq_max, which in ((512, 1, "short"), (1024, 1, "long"), (1024, 2, "short"), (2048, 2, "long")):
        ctx = long_ctx(model, n_ctx=n_ctx, n_seq_max=n_seq_max)
        rp = ctx._rope.full
        assert rp.freq_factors is t[f"rope_factors_{which}.weight"], (n_ctx, n_seq_max)
        assert np.float32(rp.attn_factor) == attn_factor and rp.ext_factor == 0.0


@pytest.mark.parametrize("ops", list(OPS))
def test_longrope_long_prompt_logits_bit_identical(longrope, ops):
    name, model, ref, arrays = longrope
    assert not np.array_equal(arrays["prompt_0"], load_tiny(name)[3]["prompt_0"])  # the factors matter
    for i, prompt in enumerate(ref["prompts"]):
        got = decode_all(long_ctx(model, OPS[ops]()), prompt["tokens"])
        np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"{name} prompt {i} ({ops})")


@pytest.mark.parametrize("n_ctx", [512, 1024])
def test_longrope_prompt_across_ubatches_then_decodes(n_ctx):
    """Both factor sets: a prompt in ubatches of 6 tokens, then 16 single-token decodes (ggml_single_row), equal
    llama.cpp's logits bit for bit."""
    for name in LONGROPE:
        _, model, ref, arrays = load_tiny(name)
        if n_ctx == 1024:
            ref = json.loads((TINY_REF / f"{name}-long.json").read_text())
            arrays = dict(np.load(TINY_REF / f"{name}-long.npz"))
        ctx = long_ctx(model, ReferenceOps(ggml_single_row=True), n_ctx=n_ctx, n_ubatch=6)
        toks = ref["prompts"][0]["tokens"]
        np.testing.assert_array_equal(decode_all(ctx, toks), arrays["prompt_0"], err_msg=name)
        for step, tok in enumerate(ref["greedy"][:16]):
            row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]
            np.testing.assert_array_equal(row, arrays["greedy"][step + 1], err_msg=f"{name} step {step}")


def test_longrope_long_two_sequences_and_state_round_trip(longrope):
    """Two sequences of n_ctx_seq 1024 (n_ctx 2048) in one batch each equal llama.cpp's alone; a state saved
    after all but the last prompt token continues as llama.cpp."""
    name, model, ref, arrays = longrope
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = long_ctx(model, n_ctx=2048, n_seq_max=2)
    assert ctx.decode(sequences_batch([a, b])) == 0
    both = ctx.get_logits()
    np.testing.assert_array_equal(both[: len(a)], arrays["prompt_0"])
    np.testing.assert_array_equal(both[len(a):], arrays["prompt_1"])
    ctx = long_ctx(model)
    decode_all(ctx, a[:-1])
    other = long_ctx(model)
    other.state_set_data(ctx.state_get_data())
    np.testing.assert_array_equal(decode_all(other, a[-1:], pos0=len(a) - 1)[-1], arrays["prompt_0"][-1])


def test_phi3_sliding_window_is_disabled_as_in_llama_cpp(tmp_path):
    """llama.cpp reads a Phi-3 sliding window and turns it off: the logits are the plain model's."""
    path = rewrite("phi3", tmp_path / "swa.gguf", meta={"phi3.attention.sliding_window": 4})
    model = Model.load(path)
    assert model.hparams.n_swa == 0 and not any(model.hparams.swa_layers)
    _, base, ref, arrays = load_tiny("phi3")
    np.testing.assert_array_equal(decode_all(new_ctx(model), ref["prompts"][0]["tokens"]), arrays["prompt_0"])


def test_smollm3_partial_rope_is_refused(tmp_path):
    path = rewrite("smollm3", tmp_path / "bad.gguf", meta={"smollm3.rope.dimension_count": 8})
    with pytest.raises(HParamsError, match=r"smollm3\.rope\.dimension_count' = 8"):
        Model.load(path)


def test_gemma2_zero_soft_cap_is_refused(tmp_path):
    path = rewrite("gemma2", tmp_path / "bad.gguf", meta={"gemma2.attn_logit_softcapping": 0.0})
    with pytest.raises(HParamsError, match=r"gemma2\.attn_logit_softcapping"):
        Model.load(path)


def test_granite_rope_switch(tmp_path):
    """`rope.scaling.finetuned` false turns RoPE off in every layer (llama_model_granite: rope_pattern): the
    positions then only reach attention through the mask, and the logits change."""
    path = rewrite("granite", tmp_path / "nope.gguf", meta={"granite.rope.scaling.finetuned": False})
    model = Model.load(path)
    assert not any(model.hparams.has_rope(il) for il in range(model.hparams.n_layer))
    _, _, ref, arrays = load_tiny("granite")
    got = decode_all(new_ctx(model), ref["prompts"][0]["tokens"])
    np.testing.assert_array_equal(got[0], arrays["prompt_0"][0])  # position 0: RoPE is the identity
    assert not np.array_equal(got[1:], arrays["prompt_0"][1:])


def test_granite_without_logit_scale_is_refused(tmp_path):
    path = rewrite("granite", tmp_path / "bad.gguf", meta={"granite.logit_scale": None})
    with pytest.raises(HParamsError, match=r"granite\.logit_scale' is missing"):
        Model.load(path)

"""gpt-oss (models/gpt_oss.py) on two tiny synthetic models against llama.cpp's logits (tests/data/tiny,
REFERENCE.md): `gpt-oss` (Q8_0 matrices and experts) and `gpt-oss-mxfp4` (F16 matrices, MXFP4 experts as the
released models have). Both have attention sinks, q/k/v/output biases, a window of 8 tokens on the even layers (every
prompt goes past it), YaRN RoPE, and 8 experts with router and expert biases gated by swiglu_oai. `gpt-oss-fa` is
llama.cpp's run of the first with flash attention on (heads of 32: no half-precision accumulation on any CPU, so
its one-chunk kernel's bits are the same with and without AVX512-FP16). Also the attention kernels' sinks against
float64 softmax arithmetic, swiglu_oai against the C loop of ggml, the "gpt-4o" pre-tokenizer against llama.cpp's
tokens, and files that llama.cpp would not run refused at load naming the key or tensor."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from llamactx import Context, ContextParams, Model
from llamactx.backend.reference import ReferenceOps
from llamactx.engine import Engine, Limits
from llamactx.ggml.attention import attention_f16_cells
from llamactx.ggml.flash_attn import flash_attn_f16_cells
from llamactx.ggml.inputs import VisibleCells
from llamactx.ggml.kernels.attention import attend
from llamactx.ggml.moe import swiglu_oai
from llamactx.hparams import HParamsError
from llamactx.model import ModelLoadError
from llamactx.sampling import SamplerChain, SamplingParams
from tests.conftest import VARIANT
from tests.gguf.tiny_model import rewrite_gguf
from tests.models.tiny import TINY, TINY_REF, assert_flash_single_row, decode_all, new_ctx, sequences_batch

NAMES = ["gpt-oss", "gpt-oss-mxfp4"]
OPS = {"reference": ReferenceOps, "fast": lambda: None}  # None: the context's default, FastOps


def load(name: str) -> tuple[str, Model, dict, dict[str, np.ndarray]]:
    """(name, tiny-<model>.gguf, <name>.json, <name>.npz): `load_tiny`, skipped on the AVX2 variant until its
    references are made with llama.cpp's AVX2 build."""
    if not (TINY_REF / f"{name}.json").exists() and VARIANT == "avx2":
        pytest.skip(f"no AVX2 reference for tiny {name} (tests/data/tiny/avx2/{name}.json: make_tiny_reference.py "
                    "with llama.cpp's AVX2 build)")
    ref = json.loads((TINY_REF / f"{name}.json").read_text())
    with np.load(TINY_REF / f"{name}.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return name, Model.load(TINY / ref["model"]), ref, arrays


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    return load(request.param)


@pytest.fixture(scope="module")
def tiny_fa():
    return load("gpt-oss-fa")


def test_hparams_and_tensors(tiny):
    """What the files exercise: SWA on the even layers, past the window in every prompt; YaRN on both kinds of
    layer; heads of 32 (q wider than n_embd); 8 experts of 64, 2 used; the expert types of each variant."""
    name, model, ref, _ = tiny
    hp = model.hparams
    assert hp.arch == "gpt-oss" and hp.n_swa == 8 and hp.swa_layers == (True, False, True, False)
    assert hp.rope_scaling_type == "yarn" and hp.rope_freq_scale == hp.rope_freq_scale_swa == 0.125
    assert (hp.n_head, hp.n_head_kv, hp.n_embd_head_k, hp.n_rot) == (4, 2, 32, 32)
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (8, 2, 64)
    assert model.tensor_type("blk.0.ffn_up_exps.weight") == (39 if name == "gpt-oss-mxfp4" else 8)  # MXFP4, Q8_0
    assert all(len(p["tokens"]) > hp.n_swa for p in ref["prompts"])
    assert "llama_kv_cache_iswa" in model.memory_description()


@pytest.mark.parametrize("ops", list(OPS))
def test_prompt_logits_bit_identical(tiny, ops):
    name, model, ref, arrays = tiny
    for i, prompt in enumerate(ref["prompts"]):
        got = decode_all(new_ctx(model, OPS[ops]()), prompt["tokens"])
        np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"{name} prompt {i} ({ops})")


@pytest.mark.parametrize("single_row", [True, False], ids=["ggml-single-row", "row-invariant"])
def test_teacher_forced_greedy_identical(tiny, single_row):
    """64 greedy steps after the first prompt, one token per decode as llama.cpp ran them: bit-identical with
    ggml's single-row kernels. The default ops compute one row like several (docs/numerics.md), where llama.cpp
    takes ggml_vec_dot for one token (the F32 router, the F16 matrices): an ulp that now and then flips one of a
    token's experts, so most steps stay within 0.05 with llama.cpp's token."""
    name, model, ref, arrays = tiny
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True) if single_row else None)
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    diffs, same = [], []
    for step, tok in enumerate(ref["greedy"]):
        if single_row:
            np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"{name} step {step}")
        diffs.append(np.abs(row - arrays["greedy"][step]).max())
        same.append(int(np.argmax(row)) == tok)
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]
    assert np.mean(np.array(diffs) < 0.05) >= 0.9 and np.mean(same) >= 0.9, (diffs, same)


def test_two_sequences_in_one_batch_equal_each_alone(tiny):
    name, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    assert ctx.decode(sequences_batch([a, b])) == 0
    both = ctx.get_logits()
    np.testing.assert_array_equal(both[: len(a)], arrays["prompt_0"])
    np.testing.assert_array_equal(both[len(a):], arrays["prompt_1"])


def test_state_round_trip(tiny):
    """The iSWA cache's state (both caches) saved mid-prompt and loaded into a fresh context continues as
    llama.cpp."""
    name, model, ref, arrays = tiny
    toks = ref["prompts"][2]["tokens"]
    ctx = new_ctx(model)
    decode_all(ctx, toks[:-1])
    blob = ctx.state_get_data()
    other = new_ctx(model)
    other.state_set_data(blob)
    np.testing.assert_array_equal(decode_all(other, toks[-1:], pos0=len(toks) - 1)[-1], arrays["prompt_2"][-1])


def greedy(model) -> SamplerChain:
    return SamplerChain.default(SamplingParams(temperature=0.0), model.hparams.n_vocab, model.vocab, n_ctx=256)


def test_engine_serves_llama_cpp_greedy_tokens(tiny):
    """Two concurrent requests (prompts prefilled in chunks of 8 beside decodes): the first gets llama.cpp's
    greedy tokens, the second what it gets alone."""
    name, model, ref, _ = tiny
    p0, p2 = ref["prompts"][0]["tokens"], ref["prompts"][2]["tokens"]

    def serve(engine: Engine, prompts) -> list[list[int]]:
        seqs = [engine.add_request(p, greedy(model), Limits(max_tokens=16)) for p in prompts]
        for _ in range(500):
            if not engine.has_work:
                return [s.output for s in seqs]
            engine.step()
        raise AssertionError("the engine did not finish")

    engine = Engine(model, n_slots=2, n_ctx=256, n_batch=8, n_threads=2, flash_attn="disabled")
    out0, out2 = serve(engine, [p0, p2])
    assert out0 == ref["greedy"][:16]
    alone = Engine(model, n_slots=1, n_ctx=256, n_threads=2, flash_attn="disabled")
    assert out2 == serve(alone, [p2])[0]


def test_flash_attention_sinks_bit_identical(tiny_fa):
    """With flash attention the sinks are ggml_flash_attn_ext's (after each row's cells): the prompts (fewer than
    64 tokens: the one-chunk kernel; 64 or more: the tiled one) and 64 decode steps bit-identical under
    ggml_single_row."""
    assert_flash_single_row(*tiny_fa[-3:])


@pytest.mark.parametrize("ops", list(OPS))
def test_flash_attention_default_ops(tiny_fa, ops):
    """The default (row-invariant) flash attention gives every token the tiled kernel's arithmetic: llama.cpp's
    bits for the prompt of 64 tokens or more. The short prompts against llama.cpp without flash attention (which
    differs in ggml too): the experts' hard routing turns an ulp into a flipped expert here and there, so close
    means most rows within 0.25 and the same argmax (without the sinks the median row is ~2 off, the argmax
    mostly another). A default context (flash_attn "auto") is the same as "enabled"."""
    _, model, ref, arrays = tiny_fa
    _, _, ref_off, arrays_off = load("gpt-oss")
    for i, prompt in enumerate(ref["prompts"]):
        got = decode_all(new_ctx(model, OPS[ops](), flash_attn="enabled"), prompt["tokens"])
        if len(prompt["tokens"]) >= 64:
            np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"prompt {i} ({ops})")
            continue
        assert ref_off["prompts"][i]["tokens"] == prompt["tokens"]
        off = arrays_off[f"prompt_{i}"]
        row_diff = np.abs(got - off).max(axis=1)  # (n,)
        assert np.median(row_diff) < 0.2, (i, row_diff)
        assert (got.argmax(1) == off.argmax(1)).mean() >= 0.85, i
    auto = Context(model, ContextParams(n_ctx=512, n_batch=512, n_threads=2), ops=OPS[ops]())
    assert auto.params.flash_attn
    np.testing.assert_array_equal(decode_all(auto, ref["prompts"][0]["tokens"]),
                                  decode_all(new_ctx(model, OPS[ops](), flash_attn="enabled"),
                                             ref["prompts"][0]["tokens"]))


def test_pre_tokenizer_gpt4o_matches_llama_cpp():
    """The file's tokenizer.ggml.pre is "gpt-4o" (o200k's regex, llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_GPT4O):
    digits in threes, case changes, contractions, CJK, accents, emoji and whitespace runs tokenize as llama.cpp
    tokenizes them."""
    _, model, ref, _ = load("gpt-oss")
    assert model.meta["tokenizer.ggml.pre"] == "gpt-4o"
    assert len(ref["tokenize"]) >= 6
    for case in ref["tokenize"]:
        assert model.vocab.tokenize(case["text"], add_special=False, parse_special=True) == case["tokens"], case


# -- the attention kernels' sinks ---------------------------------------------------------------------------------


def _attention_f64(q, k, v, n_head_kv, mask, scale, sinks) -> np.ndarray:
    """softmax([q.k * scale + mask, sink]) over the cells and the sink, times V, in float64. -> (n, n_head * d)"""
    n, n_head, d = q.shape
    kf = k.astype(np.float64).reshape(k.shape[0], n_head_kv, -1)
    vf = v.astype(np.float64).reshape(v.shape[0], n_head_kv, -1)
    out = np.zeros((n, n_head, vf.shape[2]))
    for h in range(n_head):
        hk = h // (n_head // n_head_kv)
        s = q[:, h].astype(np.float64) @ kf[:, hk].T * scale + mask
        mx = np.maximum(s.max(1, keepdims=True), sinks[h])
        e = np.exp(s - mx)
        out[:, h] = e @ vf[:, hk] / (e.sum(1, keepdims=True) + np.exp(sinks[h] - mx))
    return out.reshape(n, -1)


@pytest.mark.parametrize("kernel", ["kq-softmax-kqv", "compiled", "compiled-split", "tiled", "one-chunk",
                                    "split-kv"])
def test_attention_sinks_against_float64(kernel):
    """Every attention kernel adds each head's sink to its softmax (a sink far above the scores, one far below,
    and two in between): close to float64 arithmetic, and the sinks change the result. The compiled kq / softmax /
    kqv kernel (FastOps; its groups, and its three passes for one token over 512+ cells) gives the reference's
    bits."""
    rng = np.random.default_rng(7)
    n = {"one-chunk": 9, "split-kv": 1, "compiled-split": 1}.get(kernel, 70)
    n_kv = 600 if kernel.endswith("split") or kernel == "split-kv" else 70
    n_head, n_head_kv, d = 4, 2, 32
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    k = rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv * d)).astype(np.float16)
    pos = np.arange(n_kv - n, n_kv)
    mask = np.where(np.arange(n_kv)[None, :] <= pos[:, None], 0, -np.inf).astype(np.float32)
    sinks = np.array([3.0, -8.0, 0.5, 12.0], np.float32)
    vis, scale = VisibleCells.from_mask(mask), 1.0 / np.sqrt(np.float32(d))

    def run(s):
        if kernel in ("kq-softmax-kqv", "compiled", "compiled-split"):
            return attention_f16_cells(q, k, v, n_head_kv, vis, scale, False, 0.0, s)
        return flash_attn_f16_cells(q, k, v, n_head_kv, vis, scale, n_kv, 4, kernel != "tiled", False, 0.0, s)

    got = run(sinks)
    np.testing.assert_allclose(got, _attention_f64(q, k, v, n_head_kv, mask, scale, sinks), rtol=0, atol=2e-3)
    assert np.abs(got - run(None)).max() > 0.1
    if kernel.startswith("compiled"):
        out = np.empty_like(got)
        attend(q.reshape(n, -1), k.view(np.uint16), v.view(np.uint16), n_head, n_head_kv, vis.cells, vis.n_cells,
               vis.mask_add, np.float32(scale), out, 2, sinks)
        np.testing.assert_array_equal(out, got)


STD_SWIGLU_OAI = r"""
#include <algorithm>
#include <cmath>
#include <cstdio>
int main() {  // ggml_compute_forward_swiglu_oai_f32's loop: pairs of floats in (as hex), one float out
    const float alpha = 1.702f, limit = 7.0f;
    float g, u;
    while (scanf("%a %a", &g, &u) == 2) {
        const float x = std::min(g, limit);
        const float y = std::clamp(u, -limit, limit);
        const float out_glu = x / (1.f + expf(alpha * (-x)));
        printf("%a\n", out_glu * (y + 1.f));
    }
}
"""


def test_swiglu_oai_is_ggml_loop(tmp_path):
    """swiglu_oai against ggml's C loop compiled here (g++, the machine's libm expf, as ggml's): every bit, on
    values inside and past the limit of 7 on both sides."""
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed to compare swiglu_oai with ggml's C loop")
    (tmp_path / "s.cpp").write_text(STD_SWIGLU_OAI)
    subprocess.run(["g++", "-O2", "-o", str(tmp_path / "s"), str(tmp_path / "s.cpp")], check=True, timeout=120)
    rng = np.random.default_rng(3)
    g = (rng.standard_normal(4000) * 6).astype(np.float32)
    u = (rng.standard_normal(4000) * 6).astype(np.float32)
    text = "\n".join(f"{float(a).hex()} {float(b).hex()}" for a, b in zip(g, u, strict=True))
    out = subprocess.run([str(tmp_path / "s")], input=text.encode(), capture_output=True, check=True, timeout=60)
    want = np.array([float.fromhex(t) for t in out.stdout.decode().split()], np.float32)
    assert (np.abs(g) > 7).sum() > 100 and (np.abs(u) > 7).sum() > 100
    np.testing.assert_array_equal(swiglu_oai(g.reshape(40, 100), u.reshape(40, 100), 1.702, 7.0).reshape(-1), want)


# -- files llama.cpp would not run ---------------------------------------------------------------------------------


def _rewrite(tmp_path, meta: dict | None = None, drop: str | None = None):
    return rewrite_gguf(TINY / "tiny-gpt-oss.gguf", tmp_path / "bad.gguf", meta, {drop: None} if drop else None)


@pytest.mark.parametrize("drop", ["blk.1.attn_sinks.weight", "blk.0.ffn_up_exps.bias", "blk.3.ffn_gate_inp.bias",
                                  "blk.2.attn_output.bias", "blk.0.post_attention_norm.weight", "output.weight"])
def test_missing_tensor_is_refused(tmp_path, drop):
    with pytest.raises(ModelLoadError, match=f"tensor '{drop}' is missing"):
        Model.load(_rewrite(tmp_path, drop=drop))


@pytest.mark.parametrize("meta,message", [
    ({"gpt-oss.expert_count": 6}, r"ffn_gate_inp.weight' has shape \[64, 8\], expected \[64, 6\]"),
    ({"gpt-oss.expert_feed_forward_length": 32}, r"ffn_gate_exps.weight' has shape \[64, 64, 8\], expected "
                                                 r"\[64, 32, 8\]"),
    ({"gpt-oss.attention.head_count": 2, "gpt-oss.attention.head_count_kv": 1},
     r"attn_q.weight' has shape \[64, 128\], expected \[64, 64\]"),
    ({"gpt-oss.expert_count": 0, "gpt-oss.expert_used_count": 0}, "'gpt-oss.expert_count' is missing or 0"),
    ({"gpt-oss.attention.sliding_window": None}, "'gpt-oss.attention.sliding_window' is missing"),
    ({"gpt-oss.attention.sliding_window": 0}, r"'gpt-oss.attention.sliding_window' = 0 is outside \[1, "),
    ({"gpt-oss.rope.dimension_count": 16}, "'gpt-oss.rope.dimension_count' = 16: gpt-oss rotates whole heads"),
    ({"gpt-oss.expert_feed_forward_length": None}, "'gpt-oss.expert_feed_forward_length' is missing"),
])
def test_hparams_that_disagree_are_refused(tmp_path, meta, message):
    with pytest.raises(ModelLoadError, match=message):
        Model.load(_rewrite(tmp_path, meta))


def test_expert_bias_of_the_wrong_shape_is_refused(tmp_path):
    """An expert bias with another expert count than the file's experts: refused naming the tensor."""
    path = rewrite_gguf(TINY / "tiny-gpt-oss.gguf", tmp_path / "bad.gguf",
                        tensors={"blk.1.ffn_down_exps.bias": np.zeros((6, 64), np.float32)})
    with pytest.raises(ModelLoadError, match=r"blk.1.ffn_down_exps.bias' has shape \[64, 6\], expected \[64, 8\]"):
        Model.load(path)


def test_fused_qkv_is_refused(tmp_path):
    """create_tensor_qkv would take a fused attn_qkv.weight over attn_q/k/v: refused rather than ignored."""
    path = rewrite_gguf(TINY / "tiny-gpt-oss.gguf", tmp_path / "bad.gguf",
                        tensors={"blk.2.attn_qkv.weight": np.zeros((256, 64), np.float32)})
    with pytest.raises(ModelLoadError, match="blk.2.attn_qkv.weight': a fused q/k/v matrix"):
        Model.load(path)


def test_sliding_window_pattern_default_and_key():
    """llama.cpp's load_swa_pattern(ml, 2): without the key the even layers slide; the key (a period or one flag
    per layer) overrides it."""
    from llamactx.hparams import Meta
    from llamactx.models import gpt_oss

    base = {"n_expert": 8, "n_rot": 32, "n_embd_head_k": 32, "n_layer": 4, "rope_freq_base": 1e4,
            "rope_freq_scale": 1.0}
    meta = {"gpt-oss.attention.sliding_window": 8, "gpt-oss.expert_feed_forward_length": 64}
    assert gpt_oss.arch_hparams(Meta(meta, "gpt-oss"), base)["swa_layers"] == (True, False, True, False)
    meta["gpt-oss.attention.sliding_window_pattern"] = 4
    assert gpt_oss.arch_hparams(Meta(meta, "gpt-oss"), base)["swa_layers"] == (True, True, True, False)
    with pytest.raises(HParamsError, match="gpt-oss needs experts"):
        gpt_oss.arch_hparams(Meta(meta, "gpt-oss"), dict(base, n_expert=0))

"""Flash attention (llama.cpp's CPU default) reproduces ggml-cpu's flash_attn_ext bit for bit: each of its three
kernels (tiled, one chunk with an f16 accumulator, cells split over threads) against llama.cpp's logits
(tests/data/flash_attn, made by make_flash_attn_reference.py).

The one-chunk kernel's arithmetic depends on the CPU llama.cpp was built for: with AVX512-FP16 its f16 vector ops
run in half precision. reference.json says which variant its rows hold (`made_on`), and the tests run that
variant whatever the CPU they run on (llamactx computes either exactly on any x86-64), so they hold everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams
from llamactx.backend.fast import FastOps

DATA = Path(__file__).parent / "data" / "flash_attn"
REF = json.loads((DATA / "reference.json").read_text())


def last_row(model, tokens, n_prompt: int, then: int, flash="enabled", ggml_single_row=True,
             fp16=REF["made_on"]["fp16_accumulator"]) -> np.ndarray:
    """Decode as llama-cpp-python's eval did: the prompt in ubatches of 512, then single tokens; last output.
    ggml_single_row: the ops pick flash attention's kernel from the ubatch's shape as ggml does; fp16: the variant
    of the one-chunk kernel (by default the references')."""
    ops = FastOps(model)
    ops.ggml_single_row = ggml_single_row
    ops.fp16_accumulator = fp16
    ctx = Context(model, ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=2, flash_attn=flash),
                  ops=ops)
    for a in range(0, n_prompt, 512):
        chunk = tokens[a:min(a + 512, n_prompt)]
        batch = Batch(len(chunk))
        for i, t in enumerate(chunk):
            batch.add(t, a + i, [0], logits=i == len(chunk) - 1)
        assert ctx.decode(batch) == 0
    for i, t in enumerate(tokens[n_prompt:n_prompt + then]):
        batch = Batch(1)
        batch.add(t, n_prompt + i, [0], logits=True)
        assert ctx.decode(batch) == 0
    return ctx.get_logits()[-1].copy()


def cases():
    for name, m in REF["models"].items():
        for case in m["cases"]:
            yield pytest.param(name, case, id=f"{name}-{case}")


@pytest.mark.parametrize("name,case", list(cases()))
def test_flash_attention_bit_identical_to_llama_cpp(request, name, case):
    model = request.getfixturevalue({"smollm2": "smollm", "gemma3": "gemma"}[name])
    c = REF["cases"][case]
    got = last_row(model, REF["models"][name]["tokens"], c["n_prompt"], c["then"])
    with np.load(DATA / f"{name}.npz") as npz:
        want = npz[case]
    np.testing.assert_array_equal(got, want)


def test_flash_attention_differs_from_the_non_flash_path(smollm):
    """The two paths really are different arithmetic (f32 P*V, unrounded q in the tiled kernel), so the test
    above could fail: with flash attention off the same case gives other logits."""
    c = REF["cases"]["tiled"]
    off = last_row(smollm, REF["models"]["smollm2"]["tokens"], c["n_prompt"], c["then"], flash="disabled")
    with np.load(DATA / "smollm2.npz") as npz:
        assert not np.array_equal(off, npz["tiled"])


def test_by_default_a_token_gets_the_tiled_kernels_bits_whatever_its_ubatch(smollm):
    """Without ggml_single_row every token takes the tiled kernel's arithmetic: a prompt of 100 tokens decoded as
    100 single tokens ends on llama.cpp's tiled-kernel row bit for bit (batch invariance), and the prompt itself
    is llama.cpp's."""
    tokens = REF["models"]["smollm2"]["tokens"]
    with np.load(DATA / "smollm2.npz") as npz:
        want = npz["tiled"]
    np.testing.assert_array_equal(last_row(smollm, tokens, 100, 0, ggml_single_row=False), want)
    np.testing.assert_array_equal(last_row(smollm, tokens, 1, 99, ggml_single_row=False), want)


def test_the_fp16_accumulator_is_a_real_variant(gemma):
    """Without AVX512-FP16 (Zen 4, Ice Lake, AVX2 CPUs) the one-chunk kernel rounds each f16 update through f32:
    Gemma's split case (d_v 256) then gives other logits than the reference's AVX512-FP16 build, so the test above
    checks the variant it claims to. (llama.cpp built for Zen 4 gave llamactx's no-FP16 logits bit for bit in all
    seven cases, issue #21; this machine cannot run that build, so no such reference is stored.)"""
    c = REF["cases"]["split"]
    tokens = REF["models"]["gemma3"]["tokens"]
    fp32 = last_row(gemma, tokens, c["n_prompt"], c["then"], fp16=False)
    with np.load(DATA / "gemma3.npz") as npz:
        assert not np.array_equal(fp32, npz["split"])
        assert np.argmax(fp32) == np.argmax(npz["split"])  # the same prediction: a rounding variant, not a bug

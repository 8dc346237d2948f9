"""Flash attention (llama.cpp's CPU default) reproduces ggml-cpu's flash_attn_ext bit for bit: each of its three
kernels (tiled, one chunk with an f16 accumulator, cells split over threads) against llama.cpp's logits
(tests/data/flash_attn, made by make_flash_attn_reference.py).

The arithmetic depends on the CPU llama.cpp was built for. Its vector width (AVX-512 or AVX2) decides the softmax's
and the f16 dot products' sums: the tests compare with the references of the width they compile for (avx2/ on an
AVX2 target). And with AVX512-FP16 the one-chunk kernel's f16 vector ops run in half precision: reference.json says
which variant its rows hold (`made_on`), and the tests run that variant whatever the CPU (llamactx computes either
exactly on any x86-64)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams
from llamactx.backend.fast import FastOps
from tests.conftest import VARIANT

FLASH = Path(__file__).parent / "data" / "flash_attn"
# the reference sets of the vector width this run computes: the AVX-512 builds with (the folder itself, made on
# Emerald Rapids) and without AVX512-FP16 (avx512/, made on Zen 5), or the AVX2 build (avx2/)
SETS = ["avx2"] if VARIANT == "avx2" else [".", "avx512"]
REFS = {d: json.loads((FLASH / d / "reference.json").read_text()) for d in SETS}
DATA = FLASH / SETS[0]
REF = REFS[SETS[0]]


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
    for d, ref in REFS.items():
        for name, m in ref["models"].items():
            for case in m["cases"]:
                yield pytest.param(d, name, case, id=f"{'avx512-fp16' if d == '.' else d}-{name}-{case}")


@pytest.mark.parametrize("ref_set,name,case", list(cases()))
def test_flash_attention_bit_identical_to_llama_cpp(request, ref_set, name, case):
    model = request.getfixturevalue({"smollm2": "smollm", "gemma3": "gemma"}[name])
    ref = REFS[ref_set]
    c = ref["cases"][case]
    got = last_row(model, ref["models"][name]["tokens"], c["n_prompt"], c["then"],
                   fp16=ref["made_on"]["fp16_accumulator"])
    with np.load(FLASH / ref_set / f"{name}.npz") as npz:
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
    """With AVX512-FP16 the one-chunk kernel updates its f16 accumulator in half precision, without it (Zen 4/5,
    Ice Lake, AVX2 CPUs) it rounds each update through f32: in Gemma's split case (d_v 256) the other variant gives
    other logits than a reference's, so the test above checks the variant it claims to."""
    c = REF["cases"]["split"]
    tokens = REF["models"]["gemma3"]["tokens"]
    other = last_row(gemma, tokens, c["n_prompt"], c["then"], fp16=not REF["made_on"]["fp16_accumulator"])
    with np.load(DATA / "gemma3.npz") as npz:
        assert not np.array_equal(other, npz["split"])
        assert np.argmax(other) == np.argmax(npz["split"])  # the same prediction: a rounding variant, not a bug

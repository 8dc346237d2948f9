"""The Mamba-2 models run as one compiled program (llamactx.ggml.kernels.compute): the conv (SSM_CONV_RS) and the
selective scan (SSM_SCAN_RS, llamactx.ggml.kernels.ssm_scan) on the recurrent states in place, beside granitehybrid's
attention layers and scales and nemotron_h's attention-only and ReLU-squared FFN-only layers; mamba2 itself with no
KV cache at all. Every row equals llama.cpp's logits where it has them (tests/data/tiny/<name>.json) and the op-by-op
reference's elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.backend.reference import ReferenceOps
from tests.conftest import VARIANT
from tests.models.tiny import TINY_REF, compiled_ops, decode_all, interleaved_logits, load_tiny, new_ctx

NODES = {"granitehybrid": {"attn", "rope", "scale", "swiglu"}, "nemotron_h": {"attn", "relu", "mul"},
         "mamba2": set(), "mamba2-s128": set()}


@pytest.fixture(scope="module", params=sorted(NODES))
def tiny(request):
    name = request.param
    if VARIANT == "avx2" and not (TINY_REF / f"{name}.json").exists():
        pytest.fail(f"no AVX2 reference for tiny {name} (tests/data/tiny/avx2/{name}.json)")
    return load_tiny(name)


def test_prompt_in_ubatches_and_steps_run_compiled(tiny):
    """A prompt in ubatches of 8 (the states carried across them), then single-token steps: llama.cpp's prompt
    logits, the reference's rows for the steps, and every ubatch planned as one program."""
    name, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model, n_ubatch=8)
    np.testing.assert_array_equal(decode_all(ctx, toks), arrays["prompt_0"])
    eager = new_ctx(model, ops=ReferenceOps(), n_ubatch=8)
    decode_all(eager, toks)
    for i, tok in enumerate(ref["greedy"][:3]):
        pos = len(toks) + i
        np.testing.assert_array_equal(decode_all(ctx, [tok], pos0=pos), decode_all(eager, [tok], pos0=pos))
    assert {"ssm_conv_rs", "ssm_scan_rs", "silu", "swiglu", "mul_row"} | NODES[name] <= compiled_ops(ctx)
    assert all(entry is not None for entry in ctx.ops._plans.values()), "a ubatch ran op by op"


def test_two_sequence_sets_in_one_program(tiny):
    """Interleaved tokens of two sequences in one ubatch (two sequence sets, each on its own states): llama.cpp's
    rows for each alone, as one program."""
    _, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    for s, rows in enumerate(interleaved_logits(ctx, a, b)):
        np.testing.assert_array_equal(rows, arrays[f"prompt_{s}"])
    assert "ssm_scan_rs" in compiled_ops(ctx)
    assert all(entry is not None for entry in ctx.ops._plans.values()), "a ubatch ran op by op"

"""qwen3next runs as one compiled program (llamactx.ggml.kernels.compute): qwen35's recurrent nodes (SSM_CONV_RS,
GDN_RS) with the fused beta | alpha projection's per-key-head halves as copies (cont) and the key heads repeated
for their value heads by concat nodes, NEOX RoPE in the attention layers, the experts and the sigmoid-gated shared
expert. Every row equals llama.cpp's logits where it has them (tests/data/tiny/qwen3next.json) and the op-by-op
reference's elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.backend.reference import ReferenceOps
from tests.models.tiny import compiled_ops, decode_all, interleaved_logits, load_tiny, new_ctx

RECURRENT_NODES = {"ssm_conv_rs", "gdn_rs", "sigmoid", "softplus", "mul", "cont", "concat", "rope", "attn",
                   "moe_route", "mul_mat_id"}


@pytest.fixture(scope="module")
def tiny():
    return load_tiny("qwen3next")


def test_prompt_in_ubatches_and_steps_run_compiled(tiny):
    """A prompt in ubatches of 8 (the states carried across them), then single-token steps: llama.cpp's prompt
    logits, the reference's rows for the steps, and every ubatch planned as one program."""
    _, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model, n_ubatch=8)
    np.testing.assert_array_equal(decode_all(ctx, toks), arrays["prompt_0"])
    eager = new_ctx(model, ops=ReferenceOps(), n_ubatch=8)
    decode_all(eager, toks)
    for i, tok in enumerate(ref["greedy"][:3]):
        pos = len(toks) + i
        np.testing.assert_array_equal(decode_all(ctx, [tok], pos0=pos), decode_all(eager, [tok], pos0=pos))
    assert RECURRENT_NODES <= compiled_ops(ctx)
    assert all(entry is not None for entry in ctx.ops._plans.values()), "a ubatch ran op by op"


def test_two_sequence_sets_in_one_program(tiny):
    """Interleaved tokens of two sequences in one ubatch (two sequence sets, each on its own states): llama.cpp's
    rows for each alone, as one program."""
    _, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    for s, rows in enumerate(interleaved_logits(ctx, a, b)):
        np.testing.assert_array_equal(rows, arrays[f"prompt_{s}"])
    assert {"ssm_conv_rs", "gdn_rs"} <= compiled_ops(ctx)
    assert all(entry is not None for entry in ctx.ops._plans.values()), "a ubatch ran op by op"

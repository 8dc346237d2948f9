"""qwen35 and qwen35moe run as one compiled program (llamactx.ggml.kernels.compute): the gated delta-net layers'
conv and delta rule on the recurrent states in place (SSM_CONV_RS, GDN_RS), sigmoid / softplus / products, IMRoPE
as a rope table, the attention layers over the hybrid memory's KV cache. Every row equals llama.cpp's logits
where it has them (tests/data/tiny/qwen35*.json) and the op-by-op reference's elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch
from llamactx.backend.reference import ReferenceOps
from tests.conftest import VARIANT
from tests.models.tiny import TINY_REF, compiled_ops, decode_all, interleaved_logits, load_tiny, new_ctx

RECURRENT_NODES = {"ssm_conv_rs", "gdn_rs", "sigmoid", "softplus", "mul", "mul_row", "rope", "attn"}


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def tiny(request):
    name = request.param
    if VARIANT == "avx2" and not (TINY_REF / f"{name}.json").exists():
        pytest.skip(f"no AVX2 reference for tiny {name} (tests/data/tiny/avx2/{name}.json)")
    return load_tiny(name)


def test_prompt_in_ubatches_and_steps_run_compiled(tiny):
    """A prompt in ubatches of 8 (the states carried across them), then single-token steps: llama.cpp's prompt
    logits, the reference's rows for the steps, and every ubatch planned as one program."""
    name, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    steps = ref["greedy"][:3]
    ctx = new_ctx(model, n_ubatch=8)
    np.testing.assert_array_equal(decode_all(ctx, toks), arrays["prompt_0"])
    eager = new_ctx(model, ops=ReferenceOps(), n_ubatch=8)
    decode_all(eager, toks)
    for i, tok in enumerate(steps):
        pos = len(toks) + i
        np.testing.assert_array_equal(decode_all(ctx, [tok], pos0=pos), decode_all(eager, [tok], pos0=pos))
    assert RECURRENT_NODES <= compiled_ops(ctx)
    assert all(entry is not None for entry in ctx.ops._plans.values()), "a ubatch ran op by op"
    if name == "qwen35moe":
        assert "moe_route" in compiled_ops(ctx)


def test_two_sequence_sets_in_one_program(tiny):
    """Interleaved tokens of two sequences in one ubatch (two sequence sets, each on its own state): llama.cpp's
    rows for each alone, as one program."""
    _, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    for s, rows in enumerate(interleaved_logits(ctx, a, b)):
        np.testing.assert_array_equal(rows, arrays[f"prompt_{s}"])
    assert {"ssm_conv_rs", "gdn_rs"} <= compiled_ops(ctx)


def test_shared_set_states_reach_every_sequence(tiny):
    """Tokens of two sequences at once (one set, seq_ids (0, 1)): the program updates the first one's states and
    both sequences continue from them, as the op-by-op reference's."""
    _, model, ref, _ = tiny
    toks = ref["prompts"][1]["tokens"]
    got, want = new_ctx(model, n_seq_max=2), new_ctx(model, ops=ReferenceOps(), n_seq_max=2)
    for ctx in (got, want):
        batch = Batch(len(toks), n_seq_max=2)
        for i, t in enumerate(toks):
            batch.add(t, i, [0, 1], logits=i == len(toks) - 1)
        assert ctx.decode(batch) == 0
    for seq in (0, 1):
        tok, pos = ref["greedy"][seq], len(toks)
        np.testing.assert_array_equal(decode_all(got, [tok], seq=seq, pos0=pos),
                                      decode_all(want, [tok], seq=seq, pos0=pos))
    assert "gdn_rs" in compiled_ops(got)

"""The recurrent and hybrid models run as one compiled program per ubatch (llamactx.ggml.kernels.compute), their
states updated in place in the recurrent memory:

- qwen35 / qwen35moe: the gated delta-net layers' conv and delta rule (SSM_CONV_RS, GDN_RS), sigmoid / softplus /
  products, IMRoPE as a rope table, the attention layers over the hybrid memory's KV cache, qwen35moe's experts;
- qwen3next: the same recurrent nodes, the fused beta | alpha projection's per-key-head halves as copies (cont), the
  key heads repeated for their value heads by concat nodes, the experts and the sigmoid-gated shared expert;
- mamba2, granitehybrid, nemotron_h: the conv and the selective scan (SSM_SCAN_RS, kernels/ssm_scan.py) beside
  granitehybrid's attention layers and scales and nemotron_h's attention-only and ReLU-squared FFN-only layers;
  mamba2 with no KV cache at all.

Every row equals llama.cpp's logits where it has them (tests/data/tiny/<name>.json, avx2/ for the AVX2 target) and
the op-by-op reference's elsewhere; every ubatch must have run as one program (no fallback)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch
from llamactx.backend.reference import ReferenceOps
from tests.conftest import VARIANT
from tests.models.tiny import TINY_REF, compiled_ops, decode_all, interleaved_logits, load_tiny, new_ctx

_GDN = {"ssm_conv_rs", "gdn_rs", "sigmoid", "softplus", "mul"}
_MAMBA2 = {"ssm_conv_rs", "ssm_scan_rs", "silu", "swiglu", "mul_row"}
# the node kinds each model's program must hold after a prompt and a few steps
NODES = {
    "qwen35": _GDN | {"mul_row", "rope", "attn"},
    "qwen35moe": _GDN | {"mul_row", "rope", "attn", "moe_route"},
    "qwen3next": _GDN | {"cont", "concat", "rope", "attn", "moe_route", "mul_mat_id"},
    "granitehybrid": _MAMBA2 | {"attn", "rope", "scale"},
    "nemotron_h": _MAMBA2 | {"attn", "relu", "mul"},
    "mamba2": _MAMBA2,
    "mamba2-s128": _MAMBA2,
}
# the node that marks the recurrent layers as compiled
RECURRENT = {name: "gdn_rs" if "gdn_rs" in nodes else "ssm_scan_rs" for name, nodes in NODES.items()}


@pytest.fixture(scope="module", params=sorted(NODES))
def tiny(request):
    name = request.param
    if VARIANT == "avx2" and not (TINY_REF / f"{name}.json").exists():
        pytest.fail(f"no AVX2 reference for tiny {name} (tests/data/tiny/avx2/{name}.json)")
    return load_tiny(name)


def _all_compiled(ctx) -> bool:
    return all(entry is not None for entry in ctx.ops._plans.values())


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
    assert NODES[name] <= compiled_ops(ctx)
    assert _all_compiled(ctx), "a ubatch ran op by op"


def test_two_sequence_sets_in_one_program(tiny):
    """Interleaved tokens of two sequences in one ubatch (two sequence sets, each on its own states): llama.cpp's
    rows for each alone, as one program."""
    name, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    for s, rows in enumerate(interleaved_logits(ctx, a, b)):
        np.testing.assert_array_equal(rows, arrays[f"prompt_{s}"])
    assert {"ssm_conv_rs", RECURRENT[name]} <= compiled_ops(ctx)
    assert _all_compiled(ctx), "a ubatch ran op by op"


@pytest.mark.parametrize("name", ["qwen35", "qwen35moe"])
def test_shared_set_states_reach_every_sequence(name):
    """Tokens of two sequences at once (one set, seq_ids (0, 1)): the program updates the first one's states and
    both sequences continue from them, as the op-by-op reference's."""
    _, model, ref, _ = load_tiny(name)
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

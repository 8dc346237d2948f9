"""lfm2 / lfm2moe run as one compiled program (llamactx.ggml.kernels.compute): the short convolution on the conv
states in place (SSM_CONV_RS) between its B * x and C products, the attention layers over the hybrid memory's KV
cache, lfm2moe's sigmoid router with its selection bias and the experts. The tiny models' weights are F16, which the
program has no kernel for, so the test runs a Q8_0 copy of them (every F16 matrix quantized by gguf-py) and compares
the program's rows with the op-by-op reference's, which test_tiny_recurrent.py holds to llama.cpp's logits."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx import Model
from llamactx.backend.reference import ReferenceOps
from llamactx.gguf.reader import GGUFFile
from tests.gguf.tiny_model import copy_meta, finish
from tests.models.tiny import TINY, compiled_ops, decode_all, interleaved_logits, load_tiny, new_ctx


def q8_0_copy(src, dst):
    """The GGUF `src` at `dst` with each F16 tensor of rows of a multiple of 32 quantized to Q8_0."""
    src_file = GGUFFile(src)
    writer = gguf.GGUFWriter(str(dst), src_file.meta["general.architecture"])
    copy_meta(writer, src_file)
    for t in gguf.GGUFReader(src).tensors:
        data = np.asarray(t.data)
        if t.tensor_type == T.F16 and data.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(data.astype(np.float32), T.Q8_0)
            writer.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=T.Q8_0)
        else:
            quantized = t.tensor_type not in (T.F32, T.F16)
            writer.add_tensor(t.name, data, raw_shape=data.shape if quantized else None, raw_dtype=t.tensor_type)
    src_file.close()
    return finish(writer)


@pytest.fixture(scope="module", params=["lfm2", "lfm2moe"])
def tiny(request, tmp_path_factory):
    name = request.param
    _, _, ref, _ = load_tiny(name)
    path = q8_0_copy(TINY / f"tiny-{name}.gguf", tmp_path_factory.mktemp(name) / f"tiny-{name}-q8_0.gguf")
    return name, Model.load(path), ref


def test_prompt_in_ubatches_and_steps_run_compiled(tiny):
    """A prompt in ubatches of 8 (the conv states carried across them), then single-token steps: the reference's
    rows, every ubatch planned as one program."""
    name, model, ref = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx, eager = new_ctx(model, n_ubatch=8), new_ctx(model, ops=ReferenceOps(), n_ubatch=8)
    np.testing.assert_array_equal(decode_all(ctx, toks), decode_all(eager, toks))
    for i, tok in enumerate(ref["greedy"][:3]):
        pos = len(toks) + i
        np.testing.assert_array_equal(decode_all(ctx, [tok], pos0=pos), decode_all(eager, [tok], pos0=pos))
    want = {"ssm_conv_rs", "mul", "attn", "rope"} | ({"moe_route_sel", "mul_mat_id"} if name == "lfm2moe" else set())
    assert want <= compiled_ops(ctx)
    assert all(entry is not None for entry in ctx.ops._plans.values()), "a ubatch ran op by op"


def test_two_sequence_sets_in_one_program(tiny):
    """Interleaved tokens of two sequences in one ubatch (two sets, each on its own conv states): the reference's
    rows, as one program."""
    _, model, ref = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    got = interleaved_logits(ctx, a, b)
    want = interleaved_logits(new_ctx(model, ops=ReferenceOps(), n_seq_max=2), a, b)
    for s in (0, 1):
        np.testing.assert_array_equal(got[s], want[s])
    assert "ssm_conv_rs" in compiled_ops(ctx)
    assert all(entry is not None for entry in ctx.ops._plans.values()), "a ubatch ran op by op"

"""deepseek2 (multi-head latent attention, dense leading layer, routed + shared experts) on the tiny synthetic models
against llama.cpp's logits (tests/data/tiny/tiny-deepseek2*.gguf, make_tiny_deepseek2.py, REFERENCE.md): low-rank
Q with DeepSeek-V3's router (sigmoid, selection bias, expert groups, normalized and scaled weights), and a plain
attn_q with V2-Lite's softmax router and YaRN. The prompts, a prompt over ubatches then single-token steps, two
sequences in one batch, state save / restore, the K-only cache's size, and what a load refuses."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Context, ContextParams, Model
from llamactx.backend.reference import ReferenceOps
from llamactx.cparams import ContextParamsError
from llamactx.hparams import HParamsError, ModelLoadError
from llamactx.models import kv_bytes_per_token
from tests.conftest import VARIANT
from tests.models.tiny import TINY_REF, compiled_ops, decode_all, interleaved_logits, load_tiny, new_ctx

NAMES = ["deepseek2", "deepseek2-lite"]


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    name = request.param
    if VARIANT == "avx2" and not (TINY_REF / f"{name}.json").exists():
        pytest.fail(f"no AVX2 reference for tiny {name} (tests/data/tiny/avx2/{name}.json: make_tiny_reference.py "
                    f"{name} with llama.cpp's AVX2 build)")
    return load_tiny(name)


@pytest.mark.parametrize("ops", ["fast", "reference"])
def test_prompt_logits_bit_identical(tiny, ops):
    _, model, ref, arrays = tiny
    for i, prompt in enumerate(ref["prompts"]):
        ctx = new_ctx(model, ops=ReferenceOps() if ops == "reference" else None)
        np.testing.assert_array_equal(decode_all(ctx, prompt["tokens"]), arrays[f"prompt_{i}"], err_msg=f"{i}")


def test_prompt_in_ubatches_then_single_token_steps(tiny):
    """The first prompt in ubatches of 4 tokens (each reading the latents the earlier ones cached), then 16 greedy
    steps one token per decode with ggml's single-row kernels: every row is llama.cpp's."""
    _, model, ref, arrays = tiny
    ctx = new_ctx(model, ops=ReferenceOps(ggml_single_row=True), n_ubatch=4)
    toks = ref["prompts"][0]["tokens"]
    rows = decode_all(ctx, toks)
    np.testing.assert_array_equal(rows, arrays["prompt_0"])
    row = rows[-1]
    for step, tok in enumerate(ref["greedy"][:16]):
        np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"step {step}")
        assert int(np.argmax(row)) == tok
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]


def test_two_sequences_in_one_batch_equal_each_alone(tiny):
    _, model, ref, arrays = tiny
    a, b = ref["prompts"][0]["tokens"], ref["prompts"][1]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    for s, rows in enumerate(interleaved_logits(ctx, a, b)):
        np.testing.assert_array_equal(rows, arrays[f"prompt_{s}"])


def test_state_round_trip(tiny):
    """Whole-context and one-sequence states of the K-only cache loaded into a fresh context: the next token's
    logits are llama.cpp's."""
    _, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model, n_seq_max=2)
    decode_all(ctx, toks[:-1], seq=1)
    for whole in (True, False):
        other = new_ctx(model, n_seq_max=2)
        if whole:
            other.state_set_data(ctx.state_get_data())
        else:
            other.state_seq_set_data(ctx.state_seq_get_data(1), 0)
        seq = 1 if whole else 0
        assert other.memory.seq_pos_max(seq) == len(toks) - 2
        got = decode_all(other, toks[-1:], seq=seq, pos0=len(toks) - 1)[-1]
        np.testing.assert_array_equal(got, arrays["prompt_0"][-1])


def test_seq_rm_then_redecode(tiny):
    """seq_rm of the last half of a prompt, then those tokens decoded again: llama.cpp's rows."""
    _, model, ref, arrays = tiny
    toks = ref["prompts"][0]["tokens"]
    ctx = new_ctx(model)
    decode_all(ctx, toks)
    half = len(toks) // 2
    assert ctx.memory.seq_rm(0, half, -1)
    np.testing.assert_array_equal(decode_all(ctx, toks[half:], pos0=half), arrays["prompt_0"][half:])


def test_kv_cache_holds_the_latent_only(tiny):
    """The cache allocates K rows of kv_lora_rank + n_rot per layer and no V, as llama.cpp's log reports for these
    files ("512 cells, 3 layers ... K (f16): 0.23 MiB, V (f16): 0.00 MiB"): n_ctx * n_layer * (64 + 16) * 2
    bytes; `llamactx info` reports that per token."""
    _, model, _, _ = tiny
    hp = model.hparams
    n_ctx, n_layer, kv_lora_rank, n_rot = 512, 3, 64, 16  # make_tiny_deepseek2.py
    llama_cpp_k = n_ctx * n_layer * (kv_lora_rank + n_rot) * 2  # llama_kv_cache: ggml_new_tensor_3d(type_k, ...)
    ctx = new_ctx(model)
    sizes = ctx.memory.memory_breakdown()
    assert (sizes["k"], sizes["v"]) == (llama_cpp_k, 0)
    assert kv_bytes_per_token(hp) == llama_cpp_k // n_ctx == 480
    assert "KV per token:   480 bytes" in model.card()
    assert (hp.n_lora_kv, hp.n_embd_head_k, hp.n_embd_head_k_mla, hp.n_embd_head_v_mla) == (64, 80, 48, 32)


def test_k_and_v_cache_types_must_match(tiny):
    _, model, _, _ = tiny
    with pytest.raises(ContextParamsError, match="type_k = 'f16' and type_v = 'q8_0'"):
        Context(model, ContextParams(n_ctx=512, type_k="f16", type_v="q8_0", flash_attn="enabled"))


def test_kv_lora_rank_disagreeing_with_tensors_is_refused(tmp_path):
    """A kv_lora_rank (48) that the tensors (64) contradict: the load names the tensor and both shapes."""
    from tests.data.tiny.make_tiny_deepseek2 import deepseek2

    path = deepseek2(path=tmp_path / "rank.gguf", kv_lora_meta=48)
    with pytest.raises(ModelLoadError, match=r"tensor 'blk\.0\.attn_kv_a_norm\.weight' has shape \[64\], "
                                             r"expected \[48\]"):
        Model.load(path)


def test_key_length_disagreeing_with_ranks_is_refused(tmp_path):
    """key_length must be kv_lora_rank + n_rot (the cache row): the key is named with the value it needs."""
    import gguf

    from tests.data.tiny.make_tiny_deepseek2 import deepseek2
    from tests.gguf.tiny_model import copy_meta, finish

    src = deepseek2(path=tmp_path / "ok.gguf")
    from llamactx.gguf.reader import GGUFFile

    f = GGUFFile(src)
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "deepseek2")
    copy_meta(w, f, keep=lambda key: key != "deepseek2.attention.key_length")
    w.add_key_length(72)
    finish(w)
    f.close()
    with pytest.raises(HParamsError, match=r"'deepseek2\.attention\.key_length' = 72: MLA's cache needs 80"):
        Model.load(tmp_path / "bad.gguf")


def test_yarn_log_multiplier_bit_identical():
    """DeepSeek-V2-Lite's YaRN: the converter's yarn_log_multiplier (0.1 * mscale_all_dim) is divided back by 0.1,
    llama_context's deepseek2 case makes yarn_attn_factor mscale / mscale (1) before the 1 + 0.1 ln(factor)
    correction, and the graph's KQ scale carries mscale^2: every prompt is llama.cpp's (tiny-deepseek2-yarn)."""
    if VARIANT == "avx2" and not (TINY_REF / "deepseek2-yarn.json").exists():
        pytest.fail("no AVX2 reference for tiny deepseek2-yarn (tests/data/tiny/avx2/deepseek2-yarn.json)")
    _, model, ref, arrays = load_tiny("deepseek2-yarn")
    assert model.hparams.rope_yarn_log_mul == float(np.float32(np.float32(0.0707) / np.float32(0.1)))
    for i, prompt in enumerate(ref["prompts"]):
        got = decode_all(new_ctx(model, ops=ReferenceOps()), prompt["tokens"])
        np.testing.assert_array_equal(got, arrays[f"prompt_{i}"], err_msg=f"{i}")


@pytest.mark.parametrize("flash_attn", ["disabled", "enabled"])
def test_forward_runs_as_one_compiled_program(tiny, flash_attn):
    """FastOps records MLA (per-head matmuls, head slices, concatenations, V read from the K-only cache's latent)
    and the router (DeepSeek-V3's: MOE_ROUTE_SEL) as one program, for a prompt in ubatches and single-token steps:
    every row is the op-by-op reference's (with flash attention too, which has no llama.cpp rows here)."""
    name, model, ref, _ = tiny
    toks = ref["prompts"][0]["tokens"] + ref["greedy"][:3]
    ctx = new_ctx(model, flash_attn=flash_attn, n_ubatch=8)
    eager = new_ctx(model, ops=ReferenceOps(), flash_attn=flash_attn, n_ubatch=8)
    for lo, hi in ((0, len(toks) - 3), (len(toks) - 3, len(toks) - 2), (len(toks) - 2, len(toks) - 1)):
        np.testing.assert_array_equal(decode_all(ctx, toks[lo:hi], pos0=lo), decode_all(eager, toks[lo:hi], pos0=lo))
    kinds = compiled_ops(ctx)
    assert {"mul_mat_heads", "cont", "concat", "attn"} <= kinds
    assert ("moe_route_sel" if name == "deepseek2" else "moe_route") in kinds

"""Model loading: hparams from metadata, read-only weights, tensor validation, description."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from llamactx import Batch, Context, ContextParams, ContextParamsError, Model, ModelLoadError
from llamactx.gguf.reader import GGUFFile
from llamactx.hparams import HParamsError
from llamactx.model import MATRIX_TYPES
from llamactx.models import load_hparams
from tests.gguf.tiny_model import copy_meta, finish, tensor_table, tiny_hparams, write_tiny_llama


def test_smollm2_hparams_equal_metadata(smollm):
    hp, meta = smollm.hparams, smollm.meta
    assert smollm.arch == "llama"
    assert hp.n_embd == meta["llama.embedding_length"] == 576
    assert hp.n_layer == meta["llama.block_count"] == 30
    assert hp.n_head == meta["llama.attention.head_count"] == 9
    assert hp.n_head_kv == meta["llama.attention.head_count_kv"] == 3
    assert hp.n_ff == meta["llama.feed_forward_length"] == 1536
    assert hp.n_ctx_train == meta["llama.context_length"] == 8192
    assert hp.n_vocab == meta["llama.vocab_size"] == smollm.vocab.n_tokens == 49152
    assert hp.n_rot == meta["llama.rope.dimension_count"] == 64
    assert hp.n_embd_head_k == hp.n_embd_head_v == 64
    assert hp.rope_freq_base == meta["llama.rope.freq_base"]
    assert hp.f_norm_rms_eps == meta["llama.attention.layer_norm_rms_epsilon"]
    assert hp.rope_type == 0 and hp.n_swa == 0 and not any(hp.swa_layers)
    assert smollm.desc == "llama 135M Q4_1"
    assert smollm.chat_template and "<|im_start|>" in smollm.chat_template


def test_gemma3_hparams_equal_metadata(gemma):
    hp, meta = gemma.hparams, gemma.meta
    assert gemma.arch == "gemma3"
    assert hp.n_embd == meta["gemma3.embedding_length"] == 640
    assert hp.n_layer == meta["gemma3.block_count"] == 18
    assert hp.n_head == 4 and hp.n_head_kv == 1
    assert hp.n_embd_head_k == meta["gemma3.attention.key_length"] == 256
    assert hp.n_swa == meta["gemma3.attention.sliding_window"] == 512
    # every sixth layer is global (llama_hparams::set_swa_pattern(6))
    assert [il for il in range(18) if not hp.is_swa(il)] == [5, 11, 17]
    assert hp.rope_freq_base == 1e6 and hp.rope_freq_base_swa == 10000.0
    assert hp.rope_type == 2
    assert hp.f_attention_scale == pytest.approx(1 / 16)
    assert gemma.desc == "gemma3 270M Q4_K_M"
    assert gemma.chat_template is None


def test_model_arrays_are_read_only_and_not_copied(smollm):
    for name, arr in smollm.tensors.items():
        assert not arr.flags.writeable, name
        with pytest.raises(ValueError):
            arr.flags.writeable = True
    w = smollm.weight("blk.0.ffn_up.weight")
    assert w.type_name == "Q4_1" and w.shape == (576, 1536)
    assert w.data.shape == (1536, 576 // 32 * 20)
    with pytest.raises(ValueError):
        w.data[0, 0] = 1


def test_model_sizes(smollm):
    info = GGUFFile(smollm.path)
    assert smollm.size == sum(t.nbytes for t in info.tensors.values())
    assert smollm.n_params == sum(t.n_elements for t in info.tensors.values())
    assert 134e6 < smollm.n_params < 136e6
    assert smollm.quant_mix() == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    card = smollm.card()
    assert "llama 135M Q4_1" in card and "chat template:  present" in card


def test_use_mmap_false_gives_equal_read_only_arrays(smollm):
    copy = Model.load(smollm.path, use_mmap=False)
    a, b = copy.tensors["blk.3.attn_q.weight"], smollm.tensors["blk.3.attn_q.weight"]
    np.testing.assert_array_equal(a, b)
    assert not a.flags.writeable


def test_vocab_only_skips_weights_checks(smollm):
    m = Model.load(smollm.path, vocab_only=True)
    assert m.vocab.tokenize("Hello world", add_special=False) == smollm.vocab.tokenize("Hello world", False)


def _copy_model(src: Model, path, *, drop: str | None = None, reshape: str | None = None, arch: str | None = None):
    """Write a copy of `src` (metadata and tensors as raw bytes) with one tensor dropped or mis-shaped."""
    writer = GGUFWriter(str(path), arch or src.arch)
    copy_meta(writer, src.gguf)
    for name, info in src.tensor_infos.items():
        if name == drop:
            continue
        arr = np.array(src.tensors[name])  # typed (F32/F16) or uint8 (rows, row_bytes) for quantized types
        if name == reshape:
            arr = arr[:-32]
        quantized = info.ggml_type not in (0, 1)
        writer.add_tensor(name, arr, raw_dtype=info.ggml_type if quantized else None)
    return finish(writer)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"drop": "blk.7.ffn_down.weight"}, ModelLoadError, "tensor 'blk.7.ffn_down.weight' is missing"),
        ({"reshape": "blk.2.attn_k.weight"}, ModelLoadError, r"'blk.2.attn_k.weight' has shape \[576, 160\], "
                                                             r"expected \[576, 192\]"),
    ],
)
def test_missing_or_misshaped_tensor_rejected(smollm, tmp_path, kwargs, error, message):
    path = _copy_model(smollm, tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(error, match=message):
        Model.load(path)


def test_unsupported_architecture_rejected(tmp_path):
    writer = GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    writer.add_tensor("w", np.zeros(4, np.float32))
    finish(writer)
    with pytest.raises(HParamsError, match="architecture 'mamba' is not supported .*llama, qwen2, qwen3, qwen3moe, "
                                           "qwen2moe, gemma3, mamba2, lfm2"):
        Model.load(tmp_path / "x.gguf")


# -- hostile models (issue 12): every bad value is refused at load, naming the key or tensor -------------------------


def tiny(tmp_path, name="tiny.gguf", **kwargs):
    return write_tiny_llama(tmp_path / name, **kwargs)


def test_tiny_model_loads_and_decodes(tmp_path):
    model = Model.load(tiny(tmp_path))
    ctx = Context(model, ContextParams(n_ctx=256))
    assert ctx.decode(Batch.get_one([1, 260, 261])) == 0
    assert np.isfinite(ctx.get_logits_ith(-1)).all()


@pytest.mark.parametrize(
    "key, value, message",
    [
        # 10^6 layers took 41 s and 3.3 GB before failing; 2^40 raised a bare MemoryError
        ("llama.block_count", 10**6, r"'llama.block_count' = 1000000 is outside \[1, 512\]"),
        ("llama.block_count", 2**40, r"'llama.block_count' = 1099511627776 is outside \[1, 512\]"),
        ("llama.context_length", 2**40, r"'llama.context_length' = 1099511627776 is outside \[1, 4294967295\]"),
        ("llama.embedding_length", 2**40, r"'llama.embedding_length' = 1099511627776 is outside"),
        ("llama.feed_forward_length", 0, r"'llama.feed_forward_length' = 0 is outside \[1, 4294967295\]"),
        ("llama.attention.head_count", 2**33, r"'llama.attention.head_count' = 8589934592 is outside"),
        ("llama.attention.head_count", 128, r"'llama.attention.key_length' = 0 \(absent; the default"),
        ("llama.vocab_size", 2**40, r"'llama.vocab_size' = 1099511627776 is outside"),
        ("llama.rope.dimension_count", 2**20, r"'llama.rope.dimension_count' = 1048576 is outside \[1, 16\]"),
        ("llama.attention.value_length", 8, r"'llama.attention.value_length' = 8 differs from key_length = 16"),
    ],
)
def test_size_like_hparams_are_bounded(tmp_path, key, value, message):
    path = tiny(tmp_path, meta={key: value})
    with pytest.raises(HParamsError, match=message) as err:
        Model.load(path)
    assert isinstance(err.value, ModelLoadError)


def test_context_length_beyond_n_ctx_limit_is_a_clear_error_with_n_ctx_0(tmp_path):
    # context_length 2^32 - 1 is a valid uint32; n_ctx = 0 ("from the model") used to try a 4 TiB KV cache
    model = Model.load(tiny(tmp_path, meta={"llama.context_length": 2**32 - 1}))
    with pytest.raises(ContextParamsError, match=r"n_ctx = 0 takes the model's context_length 4294967295, more than "
                                                  r"the limit 16777216"):
        Context(model, ContextParams(n_ctx=0))
    assert Context(model, ContextParams(n_ctx=256)).n_ctx == 256


@pytest.mark.parametrize(
    "key, value",
    [
        ("llama.attention.layer_norm_rms_epsilon", math.nan),
        ("llama.attention.layer_norm_rms_epsilon", 0.0),
        ("llama.attention.layer_norm_rms_epsilon", -1.0),
        ("llama.attention.layer_norm_rms_epsilon", np.float64(1e-60)),  # 0 as the float32 llama.cpp keeps
        ("llama.rope.freq_base", math.nan),
        ("llama.rope.freq_base", 0.0),
        ("llama.rope.freq_base", -10000.0),
        ("llama.rope.freq_base", math.inf),
        ("llama.rope.freq_base", np.float64(1e300)),
        ("llama.rope.freq_base_swa", math.nan),
        ("llama.rope.scaling.factor", math.nan),
        ("llama.rope.scaling.factor", -2.0),
        ("llama.rope.scaling.factor", np.float64(1e-300)),  # its inverse overflows float32
        ("llama.rope.scale_linear", math.inf),
        ("llama.rope.scaling.type", "sideways"),
    ],
)
def test_impossible_float_hparams_rejected(tmp_path, key, value):
    # NaN / zero / negative values used to load and give all-NaN logits
    path = tiny(tmp_path, meta={key: value})
    problem = "(.*must be finite and|.*is not one of|.*inverse)"
    with pytest.raises(HParamsError, match=re.escape(f"'{key}' = ") + problem):
        Model.load(path)


def test_gemma3_softcapping_must_be_finite(gemma):
    meta = {**gemma.meta, "gemma3.final_logit_softcapping": math.nan}
    with pytest.raises(HParamsError, match="'gemma3.final_logit_softcapping' = nan must be finite and >= 0"):
        load_hparams(meta)
    with pytest.raises(HParamsError, match="sliding_window_pattern' must be an integer or 18 per-layer flags"):
        load_hparams({**gemma.meta, "gemma3.attention.sliding_window_pattern": "every sixth"})


@pytest.mark.parametrize("ggml_type", sorted(MATRIX_TYPES))
def test_every_allowed_matrix_type_computes(tmp_path, ggml_type):
    # the allow-list is honest: a model whose matrices all have this type decodes to finite logits
    hp = {"n_embd": 256, "n_ff": 256}
    types = {name: ggml_type for name, shape in tensor_table(tiny_hparams(**hp)).items() if len(shape) == 2}
    model = Model.load(tiny(tmp_path, types=types, **hp))
    ctx = Context(model, ContextParams(n_ctx=256))
    assert ctx.decode(Batch.get_one([1, 260, 261])) == 0
    assert np.isfinite(ctx.get_logits_ith(-1)).all()


@pytest.mark.parametrize(
    "name, ggml_type, role",
    [
        ("blk.0.attn_q.weight", GGMLQuantizationType.NVFP4, "a weight matrix"),
        ("blk.1.ffn_down.weight", GGMLQuantizationType.Q1_0, "a weight matrix"),
        ("token_embd.weight", GGMLQuantizationType.NVFP4, "a weight matrix"),
        ("blk.1.attn_norm.weight", GGMLQuantizationType.Q8_0, "a norm weight or bias"),
        ("output_norm.weight", GGMLQuantizationType.BF16, "a norm weight or bias"),
    ],
)
def test_tensor_of_a_type_llamactx_cannot_compute_rejected_at_load(tmp_path, name, ggml_type, role):
    # these loaded and failed only at decode (no tensor name, or a numba typing error)
    hp = {"n_embd": 256, "n_ff": 256}
    path = tiny(tmp_path, types={name: ggml_type}, **hp)
    with pytest.raises(ModelLoadError, match=rf"tensor '{re.escape(name)}' has type {ggml_type.name}, which llamactx "
                                             rf"cannot compute as {role} \(allowed: "):
        Model.load(path)


def test_zero_in_a_shape_is_an_error_not_a_zero_division(tmp_path):
    path = tiny(tmp_path, shapes={"blk.0.attn_q.weight": (64, 0)})
    with pytest.raises(ModelLoadError, match=r"'blk.0.attn_q.weight' has shape \[64, 0\], expected \[64, 64\]"):
        Model.load(path)
    # tensors the model does not use
    extra = tiny(tmp_path, "extra.gguf", shapes={"unused.weight": (0, 4), "unused.bias": (0,)})
    model = Model.load(extra)
    assert model.tensors["unused.weight"].shape == (4, 0)
    assert Model.load(path, vocab_only=True).tensors["blk.0.attn_q.weight"].shape == (0, 64)

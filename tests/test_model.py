"""Model loading: hparams from metadata, read-only weights, tensor validation, description."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFWriter

from llamactx import Model, ModelLoadError
from llamactx.gguf.reader import GGUFFile
from llamactx.hparams import HParamsError


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
    for key, value in src.meta.items():
        if key in ("general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"):
            continue
        vtype = src.gguf.meta_types[key]
        sub = src.gguf.meta_array_types.get(key)
        if isinstance(value, np.ndarray):
            value = value.tolist()
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for name, info in src.tensor_infos.items():
        if name == drop:
            continue
        arr = np.array(src.tensors[name])  # typed (F32/F16) or uint8 (rows, row_bytes) for quantized types
        if name == reshape:
            arr = arr[:-32]
        quantized = info.ggml_type not in (0, 1)
        writer.add_tensor(name, arr, raw_dtype=info.ggml_type if quantized else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


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
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(HParamsError, match="architecture 'mamba' is not supported .*llama, gemma3"):
        Model.load(tmp_path / "x.gguf")

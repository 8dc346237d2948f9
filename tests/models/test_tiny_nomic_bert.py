"""The `nomic-bert` encoder (models/bert.py: bert.cpp's graph with RoPE, fused attn_qkv and a SwiGLU FFN) on the tiny
synthetic model (tests/data/tiny/tiny-nomic-bert.gguf): llama.cpp's embeddings bit for bit for every pooling type,
each text alone and all texts in one batch, flash attention off (tests/data/tiny/nomic-bert.json + nomic-bert.npz,
make_tiny_nomic_bert_reference.py); the model's own pooling as the default; a classifier head refused at load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamactx import Model
from llamactx.ggml.inputs import ROPE_TYPE_NEOX
from llamactx.hparams import ModelLoadError
from tests.conftest import VARIANT
from tests.models.tiny import TINY, TINY_REF, encoder_context, sequences_batch

POOLINGS = ("none", "mean", "cls", "last")


@pytest.fixture(scope="module")
def nomic() -> Model:
    return Model.load(TINY / "tiny-nomic-bert.gguf")


@pytest.fixture(scope="module")
def ref() -> dict:
    path = TINY_REF / "nomic-bert.json"
    if not path.exists():  # made by make_tiny_nomic_bert_reference.py for each build of llama.cpp
        pytest.skip(f"no llama.cpp reference {path} for the {VARIANT} arithmetic")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def npz(ref) -> dict[str, np.ndarray]:
    with np.load(TINY_REF / "nomic-bert.npz") as f:
        return {k: f[k] for k in f.files}


def test_hparams_and_tokens(nomic, ref):
    hp = nomic.hparams
    assert (hp.arch, hp.rope_type, hp.n_rot, hp.rope_freq_base) == ("nomic-bert", ROPE_TYPE_NEOX, 16, 1000.0)
    assert (hp.causal_attn, hp.pooling_type) == (False, "mean") and nomic.is_embedding_only
    assert ref["pooling_type"] == 1
    assert [nomic.vocab.tokenize(t, add_special=True) for t in ref["texts"]] == ref["tokens"]


@pytest.mark.parametrize("pooling", POOLINGS)
def test_each_text_alone_is_llama_cpps(nomic, ref, npz, pooling):
    ctx = encoder_context(nomic, pooling)
    for i, tokens in enumerate(ref["tokens"]):
        assert ctx.encode(sequences_batch([tokens])) == 0
        got = ctx.get_embeddings() if pooling == "none" else ctx.get_embeddings_seq(0)
        np.testing.assert_array_equal(got, npz[f"{pooling}_{i}"], err_msg=f"text {i}")


@pytest.mark.parametrize("pooling", ("mean", "cls", "last"))
def test_all_texts_in_one_batch_are_llama_cpps(nomic, ref, npz, pooling):
    ctx = encoder_context(nomic, pooling, n_seq_max=len(ref["tokens"]))
    assert ctx.encode(sequences_batch(ref["tokens"])) == 0
    for s in range(len(ref["tokens"])):
        np.testing.assert_array_equal(ctx.get_embeddings_seq(s), npz[f"{pooling}_batch_{s}"], err_msg=f"seq {s}")


@pytest.mark.parametrize("tensors, match", [
    ({"cls.output.weight": np.zeros((1, 64), np.float32)}, "tensor 'cls.output.weight': nomic-bert has no classifier"),
    ({"blk.0.ffn_gate.weight": None}, "tensor 'blk.0.ffn_gate.weight' is missing"),
])
def test_bad_files_are_refused_naming_the_tensor(tmp_path, tensors, match):
    from tests.gguf.tiny_model import rewrite_gguf

    path = rewrite_gguf(TINY / "tiny-nomic-bert.gguf", tmp_path / "bad-nomic.gguf", None, tensors)
    with pytest.raises(ModelLoadError, match=match):
        Model.load(path)


def test_missing_q_k_v_without_attn_qkv_is_named(tmp_path):
    from tests.gguf.tiny_model import rewrite_gguf

    path = rewrite_gguf(TINY / "tiny-nomic-bert.gguf", tmp_path / "bad-nomic.gguf", None,
                        {"blk.1.attn_k.weight": None})
    ctx = encoder_context(Model.load(path), "mean")
    with pytest.raises(ModelLoadError, match="'blk.1.attn_k.weight' is missing, and so is 'blk.1.attn_qkv.weight'"):
        ctx.encode(sequences_batch([[2, 10, 3]]))

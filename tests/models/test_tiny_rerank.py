"""BERT rerankers (models/bert.py classifier_head, Context._rank) on the tiny synthetic rerankers
(tests/data/tiny/make_tiny_rerank.py): llama.cpp's rank scores bit for bit for each (query, document) pair alone and
for all pairs in one batch (tests/data/tiny/rerank.json, make_tiny_rerank_reference.py, flash attention off):
the one-label head (cls, tanh, cls.output), a three-label output projection after mean pooling, and a model
without a head; pairs formatted as llama-server formats them; heads of the wrong shape refused at load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamactx import Context, Model
from llamactx.api.rerank import format_prompt
from llamactx.embedding import Embedder
from llamactx.hparams import ModelLoadError
from tests.conftest import VARIANT
from tests.models.tiny import TINY, TINY_REF, encoder_context, sequences_batch

FILES = {"rerank": "tiny-bert-rerank.gguf", "rerank-labels": "tiny-bert-rerank-labels.gguf",
         "no-head": "tiny-bert.gguf"}


@pytest.fixture(scope="module")
def ref() -> dict:
    path = TINY_REF / "rerank.json"
    if not path.exists():  # made by make_tiny_rerank_reference.py for each build of llama.cpp
        pytest.skip(f"no llama.cpp reference {path} for the {VARIANT} arithmetic")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def models() -> dict[str, Model]:
    return {name: Model.load(TINY / file) for name, file in FILES.items()}


def _f32(hexes: list[str]) -> np.ndarray:
    return np.array([float.fromhex(h) for h in hexes], np.float32)


def _context(model: Model, n_seq_max: int = 1) -> Context:
    return encoder_context(model, "rank", n_seq_max=n_seq_max)


def test_hparams_are_llama_cpps(models, ref):
    hp, hp3 = models["rerank"].hparams, models["rerank-labels"].hparams
    assert (hp.pooling_type, hp.n_cls_out, hp.pooling_type_cls) == ("rank", 1, "unspecified")
    assert (hp3.pooling_type, hp3.n_cls_out, hp3.pooling_type_cls) == ("rank", 3, "mean")
    assert ref["rerank"]["n_cls_out"] == 1 and ref["rerank-labels"]["n_cls_out"] == 3
    assert ref["rerank-labels"]["labels"] == ["entailment", "neutral", "contradiction"]


def test_pairs_are_formatted_as_llama_server(models, ref):
    """[CLS] query [SEP] document: the WordPiece vocabulary adds BOS and SEP, not EOS (format_prompt_rerank)."""
    for name in FILES:
        got = [format_prompt(models[name], ref["query"], doc) for doc in ref["documents"]]
        assert got == ref["tokens"], name


@pytest.mark.parametrize("name", FILES)
def test_each_pair_alone_is_llama_cpps(models, ref, name):
    ctx = _context(models[name])
    for i, tokens in enumerate(ref["tokens"]):
        assert ctx.encode(sequences_batch([tokens])) == 0
        np.testing.assert_array_equal(ctx.get_embeddings_seq(0), _f32(ref[name]["alone"][i]), err_msg=f"pair {i}")


@pytest.mark.parametrize("name", FILES)
def test_all_pairs_in_one_batch_are_llama_cpps(models, ref, name):
    """The head's mul_mat over 5 pooled rows (not one), and llama_context's extraction of n_cls_out floats at
    offset n_cls_out * seq_idx: without a head, sequence j reads element j of sequence 0's pooled state."""
    ctx = _context(models[name], n_seq_max=len(ref["tokens"]))
    assert ctx.encode(sequences_batch(ref["tokens"])) == 0
    for s in range(len(ref["tokens"])):
        np.testing.assert_array_equal(ctx.get_embeddings_seq(s), _f32(ref[name]["batch"][s]), err_msg=f"seq {s}")


def test_embedder_scores_each_pair_alone(models, ref):
    """What the server's reranker runs: Embedder(pooling="rank"), one pair per decode, scores not normalised."""
    for name in ("rerank", "rerank-labels"):
        got = Embedder(models[name], n_ctx=512, pooling="rank", flash_attn="disabled").embed(ref["tokens"])
        assert got.shape == (len(ref["tokens"]), ref[name]["n_cls_out"])
        np.testing.assert_array_equal(got, np.stack([_f32(v) for v in ref[name]["alone"]]), err_msg=name)


def _rewrite(tmp_path, src: str, meta=None, tensors=None):
    from tests.gguf.tiny_model import rewrite_gguf

    return rewrite_gguf(TINY / src, tmp_path / "bad-rerank.gguf", meta, tensors)


@pytest.mark.parametrize("src, meta, tensors, match", [
    ("tiny-bert-rerank.gguf", None, {"cls.weight": np.zeros((3, 64), np.float32)},
     r"tensor 'cls.weight' has shape \[64, 3\], expected \[64, 64\]"),
    ("tiny-bert-rerank.gguf", None, {"cls.bias": np.zeros(63, np.float32)},
     r"tensor 'cls.bias' has shape \[63\], expected \[64\]"),
    # three labels declared, but the output projection has one row
    ("tiny-bert-rerank.gguf", {"bert.classifier.output_labels": ["a", "b", "c"]}, None,
     r"tensor 'cls.output.weight' has shape \[64, 1\], expected \[64, 3\]"),
    # the labels dropped: n_cls_out 1, but the projection has three rows
    ("tiny-bert-rerank-labels.gguf", {"bert.classifier.output_labels": None}, None,
     r"tensor 'cls.output.weight' has shape \[64, 3\], expected \[64, 1\]"),
    ("tiny-bert-rerank.gguf", None, {"blk.0.attn_qkv.weight": np.zeros((100, 64), np.float32)},
     r"tensor 'blk.0.attn_qkv.weight' has shape \[64, 100\], expected \[64, 192\]"),
    ("tiny-bert-rerank.gguf", {"bert.classifier.output_labels": 3}, None, "bert.classifier.output_labels"),
])
def test_bad_heads_are_refused_naming_the_tensor_and_shapes(tmp_path, src, meta, tensors, match):
    with pytest.raises(ModelLoadError, match=match):
        Model.load(_rewrite(tmp_path, src, meta, tensors))

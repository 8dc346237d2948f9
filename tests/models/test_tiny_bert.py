"""The `bert` encoder (models/bert.py) on the tiny synthetic BERT (tests/data/tiny/tiny-bert.gguf): llama.cpp's
embeddings bit for bit for every pooling type, with and without flash attention, each text alone and all texts in
one batch (tests/data/tiny/bert.json + bert.npz, made by make_tiny_bert_reference.py through llama-cpp-python's
`embed`); the model's own pooling type as the default; generation refused; bad files refused at load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamactx import Context, ContextParams, Model
from llamactx.embedding import Embedder, embd_normalize
from llamactx.engine import Engine
from llamactx.engine.sequence import EngineError
from llamactx.hparams import ModelLoadError
from llamactx.sampling import SamplerChain, SamplingParams
from llamactx.state_io import StateError
from tests.conftest import reference_path
from tests.models.tiny import TINY, encoder_context, sequences_batch

POOLINGS = ("none", "mean", "cls", "last")
FLASH = {"fa": "enabled", "nofa": "disabled"}


@pytest.fixture(scope="module")
def bert() -> Model:
    return Model.load(TINY / "tiny-bert.gguf")


@pytest.fixture(scope="module")
def ref() -> dict:
    return json.loads(reference_path(TINY, "bert.json").read_text())


@pytest.fixture(scope="module")
def npz() -> dict[str, np.ndarray]:
    with np.load(reference_path(TINY, "bert.npz")) as f:
        return {k: f[k] for k in f.files}


def _context(model: Model, pooling: str, fa: str, n_seq_max: int = 1) -> Context:
    return encoder_context(model, pooling, FLASH[fa], n_seq_max)


def test_hparams_and_vocab(bert, ref):
    hp = bert.hparams
    assert (hp.arch, hp.causal_attn, hp.pooling_type, hp.n_token_types) == ("bert", False, "mean", 2)
    assert ref["pooling_type"] == 1  # llama.cpp read LLAMA_POOLING_TYPE_MEAN from the file too
    assert bert.is_embedding_only and bert.vocab.model_type == "bert"


@pytest.mark.parametrize("fa", FLASH)
@pytest.mark.parametrize("pooling", POOLINGS)
def test_each_text_alone_is_llama_cpps(bert, ref, npz, pooling, fa):
    ctx = _context(bert, pooling, fa)
    for i, tokens in enumerate(ref["tokens"]):
        assert ctx.encode(sequences_batch([tokens])) == 0
        got = ctx.get_embeddings() if pooling == "none" else ctx.get_embeddings_seq(0)
        np.testing.assert_array_equal(got, npz[f"{fa}_{pooling}_{i}"], err_msg=f"text {i}")


@pytest.mark.parametrize("fa", FLASH)
@pytest.mark.parametrize("pooling", ("mean", "cls", "last"))
def test_all_texts_in_one_batch_are_llama_cpps(bert, ref, npz, pooling, fa):
    """254 tokens of 8 sequences in one ubatch: flash attention's tiled kernel over the ubatch's cells, mean
    pooling's dots over every row (zeros included) and tinyBLAS for 8 columns, as llama.cpp runs them."""
    ctx = _context(bert, pooling, fa, n_seq_max=8)
    assert ctx.encode(sequences_batch(ref["tokens"])) == 0
    for s in range(len(ref["tokens"])):
        np.testing.assert_array_equal(ctx.get_embeddings_seq(s), npz[f"{fa}_{pooling}_batch_{s}"], err_msg=f"seq {s}")


def test_two_sequences_in_one_batch_equal_each_alone(bert, ref):
    """Under 64 tokens (flash attention's one-chunk kernel skips the other sequence's cells) every token's
    vector, and so cls / last pooling, is the same in a batch of two as alone."""
    pair = [ref["tokens"][7], ref["tokens"][4]]  # 3 + 19 tokens
    ctx = _context(bert, "none", "fa", n_seq_max=2)
    alone = []
    for tokens in pair:
        ctx.encode(sequences_batch([tokens]))
        alone.append(np.array(ctx.get_embeddings()))
    ctx.encode(sequences_batch(pair))
    np.testing.assert_array_equal(ctx.get_embeddings(), np.concatenate(alone))


def test_decode_encodes_and_the_models_pooling_is_the_default(bert, ref, npz):
    """llama_decode on a model without memory runs llama_encode; pooling "unspecified" takes bert.pooling_type
    (mean), as llama.cpp's context does (default_0: llama-cpp-python's defaults, flash attention off)."""
    ctx = Context(bert, ContextParams(n_ctx=512, n_ubatch=512, embeddings=True, flash_attn="disabled"))
    assert ctx.params.pooling_type == "mean" and not ctx.params.causal_attn and ctx.memory is None
    assert ctx.decode(sequences_batch([ref["tokens"][0]])) == 0
    np.testing.assert_array_equal(ctx.get_embeddings_seq(0), npz["default_0"])
    with pytest.raises(IndexError, match="no logits"):
        ctx.get_logits_ith(-1)
    with pytest.raises(StateError, match="encoder without memory"):
        ctx.state_get_data()


def test_embedder_normalizes_as_llama_cpp(bert, ref, npz):
    """Embedder (LLM.embed, the server, `llamactx embedding`): the model's mean pooling, then
    common_embd_normalize; llama-cpp-python's own float64 normalization agrees to float precision."""
    emb = Embedder(bert, n_ctx=512)
    assert emb.pooling == "mean" and emb.n_ctx == bert.hparams.n_ctx_train
    vecs = emb.embed(ref["tokens"])
    for i in range(len(ref["tokens"])):
        raw = npz[f"fa_mean_{i}"]
        np.testing.assert_array_equal(vecs[i], embd_normalize(raw))
        np.testing.assert_allclose(vecs[i], npz[f"fa_mean_norm_{i}"], rtol=0, atol=1e-7)


def test_generation_is_refused(bert):
    engine = Engine(bert, n_slots=1, n_ctx=256)
    sampler = SamplerChain.default(SamplingParams(), bert.hparams.n_vocab)
    with pytest.raises(EngineError, match="encoder .*cannot generate"):
        engine.add_request([2, 5, 3], sampler)


def _rewrite(tmp_path, drop_tensor: str | None = None, drop_key: str | None = None, set_key=None):
    """tiny-bert.gguf copied without one tensor or key, or with one key changed."""
    from tests.gguf.tiny_model import rewrite_gguf

    meta = {drop_key: None} if drop_key else {}
    if set_key is not None:
        meta[set_key[0]] = set_key[1]
    return rewrite_gguf(TINY / "tiny-bert.gguf", tmp_path / "bad-bert.gguf", meta,
                        {drop_tensor: None} if drop_tensor else None)


@pytest.mark.parametrize("case, match", [
    (dict(drop_tensor="position_embd.weight"), "position_embd.weight"),
    (dict(drop_tensor="blk.1.layer_output_norm.bias"), "blk.1.layer_output_norm.bias"),
    (dict(drop_key="tokenizer.ggml.token_type_count"), "tokenizer.ggml.token_type_count"),
    (dict(drop_key="bert.attention.layer_norm_epsilon"), "bert.attention.layer_norm_epsilon"),
    (dict(set_key=("bert.attention.head_count", 5)), "bert.attention.head_count"),  # 5 x 12 != 64
    (dict(set_key=("bert.pooling_type", 7)), "bert.pooling_type"),
])
def test_bad_files_are_refused_naming_the_tensor_or_key(tmp_path, case, match):
    path = _rewrite(tmp_path, **case)
    with pytest.raises(ModelLoadError, match=match):
        Model.load(path)

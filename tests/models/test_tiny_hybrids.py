"""The hybrids of issue 41 beside test_tiny_recurrent.py's exactness tests (which run their tiny models,
make_tiny_hybrids.py): the metadata and tensors a load refuses, naming the key or tensor, and the layer kinds
`llamactx info` names."""

from __future__ import annotations

import pytest

from llamactx import Model
from llamactx.hparams import HParamsError, ModelLoadError
from tests.gguf.tiny_model import rewrite_gguf
from tests.models.tiny import TINY

BAD = [
    ("lfm2moe", {}, {"blk.2.shortconv.conv.weight": None}, ModelLoadError,
     r"tensor 'blk.2.shortconv.conv.weight' is missing"),
    ("lfm2moe", {}, {"blk.1.exp_probs_b.bias": None}, ModelLoadError, r"tensor 'blk.1.exp_probs_b.bias' is missing"),
    ("lfm2moe", {"lfm2moe.attention.head_count_kv": [2, 2, 0, 2]}, {}, ModelLoadError,
     r"tensor 'blk.0.attn_q_norm.weight' is missing"),
    ("lfm2moe", {"lfm2moe.leading_dense_block_count": 0}, {}, ModelLoadError,
     r"tensor 'blk.0.ffn_gate_inp.weight' is missing"),
    ("lfm2moe", {"lfm2moe.expert_gating_func": None}, {}, HParamsError,
     r"'lfm2moe.expert_gating_func' is missing"),
    ("lfm2moe", {"lfm2moe.expert_gating_func": 4}, {}, HParamsError,
     r"'lfm2moe.expert_gating_func' = 4 is not supported"),
    ("lfm2moe", {"lfm2moe.expert_count": None, "lfm2moe.expert_used_count": None}, {}, HParamsError,
     r"'lfm2moe.expert_count' is missing or 0: layers 1-3"),
    ("granitehybrid", {}, {"blk.2.ssm_conv1d.weight": None}, ModelLoadError,
     r"tensor 'blk.2.ssm_conv1d.weight' is missing"),
    ("granitehybrid", {}, {"blk.0.ssm_conv1d.bias": None}, ModelLoadError,
     r"tensor 'blk.0.ssm_conv1d.bias' is missing"),
    ("granitehybrid", {}, {"blk.3.ssm_a": None}, ModelLoadError, r"tensor 'blk.3.ssm_a' is missing"),
    ("granitehybrid", {"granitehybrid.attention.head_count_kv": [0, 0, 0, 2]}, {}, ModelLoadError,
     r"tensor 'blk.1.ssm_in.weight' is missing"),
    ("granitehybrid", {"granitehybrid.attention.head_count_kv": 2}, {}, HParamsError,
     r"'granitehybrid.attention.head_count_kv' must hold one value per layer"),
    ("granitehybrid", {"granitehybrid.ssm.inner_size": 64}, {}, HParamsError,
     r"'granitehybrid.ssm.inner_size' = 64: granitehybrid needs 2 \* embedding_length = 128"),
    ("granitehybrid", {"granitehybrid.ssm.group_count": 3}, {}, HParamsError,
     r"'granitehybrid.ssm.group_count' = 3 does not divide"),
    ("granitehybrid-moe", {}, {"blk.1.ffn_up_shexp.weight": None}, ModelLoadError,
     r"tensor 'blk.1.ffn_up_shexp.weight' is missing"),
    ("nemotron_h", {}, {"blk.3.ssm_conv1d.weight": None}, ModelLoadError,
     r"tensor 'blk.3.ssm_conv1d.weight' is missing"),
    ("nemotron_h", {}, {"blk.0.ssm_d": None}, ModelLoadError, r"tensor 'blk.0.ssm_d' is missing"),
    ("nemotron_h", {"nemotron_h.attention.head_count_kv": [0, 2, 2, 0, 0],
                    "nemotron_h.feed_forward_length": [0, 0, 0, 0, 128]}, {}, ModelLoadError,
     r"tensor 'blk.2.attn_q.weight' is missing"),
    ("nemotron_h", {"nemotron_h.feed_forward_length": [0, 0, 128, 128, 128]}, {}, ModelLoadError,
     r"tensor 'blk.3.ffn_up.weight' is missing"),
    ("nemotron_h", {"nemotron_h.feed_forward_length": 128}, {}, HParamsError,
     r"'nemotron_h.feed_forward_length' and 'nemotron_h.attention.head_count_kv' must hold one value per layer"),
    ("nemotron_h", {"nemotron_h.feed_forward_length": [0, 128, 128, 0, 128]}, {}, HParamsError,
     r"layer 1 has both an FFN width and KV heads"),
    ("nemotron_h", {"nemotron_h.feed_forward_length": [0, 0, 128, 0, 64]}, {}, HParamsError,
     r"'nemotron_h.feed_forward_length' = \[0, 0, 128, 0, 64\]: expected 5 values"),
    ("nemotron_h", {"nemotron_h.attention.layer_norm_epsilon": None}, {}, HParamsError,
     r"'nemotron_h.attention.layer_norm_epsilon' is missing"),
]


@pytest.mark.parametrize("name, meta, tensors, error, match", BAD,
                         ids=["lfm2moe-no-conv", "lfm2moe-no-probs-b", "lfm2moe-layer-pattern-vs-tensors",
                              "lfm2moe-dense-lead-vs-tensors", "lfm2moe-no-gating", "lfm2moe-gating-4",
                              "lfm2moe-no-experts", "granitehybrid-no-conv", "granitehybrid-no-conv-bias",
                              "granitehybrid-no-ssm_a", "granitehybrid-layer-pattern-vs-tensors",
                              "granitehybrid-no-pattern", "granitehybrid-inner-size", "granitehybrid-groups",
                              "granitehybrid-moe-no-shexp", "nemotron_h-no-conv", "nemotron_h-no-ssm_d",
                              "nemotron_h-attention-pattern-vs-tensors", "nemotron_h-ffn-pattern-vs-tensors",
                              "nemotron_h-scalar-ff", "nemotron_h-ffn-and-kv", "nemotron_h-two-widths",
                              "nemotron_h-no-layernorm-eps"])
def test_bad_model_refused_at_load(tmp_path, name, meta, tensors, error, match):
    """A missing conv / expert tensor, a layer pattern (or dense-layer count) that the tensors disagree with, a
    missing or unknown key: refused at load, naming the key or tensor."""
    path = rewrite_gguf(TINY / f"tiny-{name}.gguf", tmp_path / "bad.gguf", meta=meta, tensors=tensors)
    with pytest.raises(error, match=match):
        Model.load(path)

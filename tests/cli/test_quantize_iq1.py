"""`llamactx quantize` to IQ1_S / IQ1_M (llamactx.ggml.kernels.quantize_iq1): the tensors and the file-type mixes
as llama-quantize 0c1e570 writes them from SmolLM2 (the embedded Q4_1 model, requantized) with made-up importance
matrices (tests/data/quantize_iq1/llama_quantize.json), ggml_quantize_chunk's bytes on made-up rows
(chunk_sha256.json), and the refusals without an importance matrix."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from llamactx.cli import main
from llamactx.embedded import smollm2_path
from llamactx.gguf import imatrix_file
from llamactx.gguf.reader import GGUFFile
from tests.cli.test_quantize_k import REF as K_REF
from tests.cli.test_quantize_k import _matmul_weights, _sha256, synthetic_imatrix

T = GGMLQuantizationType
DATA = Path(__file__).parents[1] / "data" / "quantize_iq1"
REF = json.loads((DATA / "llama_quantize.json").read_text())
CHUNKS = json.loads((DATA / "chunk_sha256.json").read_text())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """model.gguf and the two made-up imatrices, under the names the references were made with."""
    d = tmp_path_factory.mktemp("quantize_iq1")
    model = smollm2_path()
    assert _sha256(Path(model)) == REF["input_sha256"], "the embedded model changed: remake the references"
    os.symlink(model, d / "model.gguf")
    synthetic_imatrix(d / "synth.imatrix.gguf")
    assert _sha256(d / "synth.imatrix.gguf") == K_REF["synthetic_imatrix_sha256"]
    synthetic_imatrix(d / "synth_all.imatrix.gguf", _matmul_weights(d / "model.gguf"))
    assert _sha256(d / "synth_all.imatrix.gguf") == K_REF["synthetic_all_imatrix_sha256"]
    return d


@pytest.mark.parametrize("case", sorted(CHUNKS))
def test_iq1_quantizers_are_ggml_quantize_chunks(case):
    """quantize_iq1_s / quantize_iq1_m on rows with an all-zero block and an outlier, with the imatrix (and IQ1_M
    without one, x^2 weights), against ggml_quantize_chunk's bytes."""
    from llamactx.ggml.kernels.quantize_iq1 import quantize_rows_iq1m, quantize_rows_iq1s

    spec = importlib.util.spec_from_file_location("iq1_chunk_reference", DATA / "make_chunk_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ref = module.chunk_module()
    qw = ref.chunk_imatrix() if case.endswith("_imatrix") else None
    quantize = quantize_rows_iq1s if case.startswith("IQ1_S") else quantize_rows_iq1m
    out = quantize(ref.chunk_input(), qw)
    assert hashlib.sha256(out.tobytes()).hexdigest() == CHUNKS[case]


def test_iq1_s_refuses_rows_without_weights():
    from llamactx.ggml.kernels.quantize_iq1 import quantize_rows_iq1m, quantize_rows_iq1s

    with pytest.raises(ValueError, match="IQ1_S needs importance matrix weights"):
        quantize_rows_iq1s(np.ones((1, 256), np.float32), None)
    with pytest.raises(ValueError, match=r"rows of shape \(2, 320\) are not rows of whole 256-blocks"):
        quantize_rows_iq1m(np.ones((2, 320), np.float32), None)


def test_iq1_tensors_quantized_as_llama_quantize(workdir):
    """blk.0-1 ffn_down IQ1_S, blk.2-3 IQ1_M (--tensor-type, made-up imatrix): their bytes as in llama-quantize's
    file (the Q8_0 rest of it is the slow part, left out)."""
    from llamactx.cli.quantize import _options, add_parser, convert, plan

    args = add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(
        ["--allow-requantize", *REF["tensor_args"], "model.gguf", "Q8_0"])
    weights = imatrix_file.load(workdir / "synth.imatrix.gguf").weights()
    want = REF["tensor_sha256"]
    with GGUFFile(workdir / "model.gguf") as f:
        plans = {p.name: p for p in plan(f, _options(args, "Q8_0"), weights) if p.name in want}
        assert {name: p.dst_type for name, p in plans.items()} == {
            **{f"blk.{i}.ffn_down.weight": T.IQ1_S for i in (0, 1)},
            **{f"blk.{i}.ffn_down.weight": T.IQ1_M for i in (2, 3)}}
        got = {name: hashlib.sha256(convert(f, p).tobytes()).hexdigest() for name, p in plans.items()}
    assert got == want


@pytest.mark.parametrize("file_type", ["IQ1_S", "IQ1_M"])
def test_iq1_file_type_mixes_are_llama_quantizes(workdir, file_type):
    """The IQ1_S / IQ1_M mixes with an imatrix of every layer matrix: each tensor's type as in llama-quantize's
    file (Q2_K ffn_down in the first n_layer/8 layers and attn_v, IQ2_XXS attn_output, the 576-wide rows' IQ4_NL /
    Q4_0 fallbacks, Q8_0 tied embeddings); the files, byte-identical when made, take minutes (file_type_sha256)."""
    from llamactx.cli.quantize import QuantizeOptions, plan

    weights = imatrix_file.load(workdir / "synth_all.imatrix.gguf").weights()
    with GGUFFile(workdir / "model.gguf") as f:
        got = {p.name: p.dst_type.name for p in plan(f, QuantizeOptions(file_type, allow_requantize=True), weights)}
    assert got == REF["file_type_tensor_types"][file_type]


def test_iq1_type_rules_on_256_wide_rows():
    """The IQ1 rules SmolLM2's 576-wide rows hide: IQ1 ffn_gate / ffn_up / attn_q / attn_k, IQ2_XXS attn_output
    (Q5_K with 8 experts), attn_v Q2_K (Q4_K from n_gqa 4), Q5_K output, Q2_K token_embd; IQ4_NL where 256-blocks
    do not fit."""
    from llamactx.cli.quantize_types import FILE_TYPES, ModelFacts, TypeChooser, requires_imatrix

    facts = ModelFacts("llama", 2, 0, 16, False, 16, False)
    for file_type in ("IQ1_S", "IQ1_M"):
        ftype, default = FILE_TYPES[file_type]
        c = TypeChooser(facts, ftype, default, has_imatrix=True)
        assert [c.choose(f"blk.{i}.ffn_down.weight", (1024, 512), T.F16) for i in range(4)] == \
            [T.Q2_K] * 2 + [default] * 2
        for name in ("ffn_gate", "ffn_up", "attn_q", "attn_k"):
            assert c.choose(f"blk.0.{name}.weight", (512, 1024), T.F16) == default
        assert c.choose("blk.0.attn_output.weight", (512, 512), T.F16) == T.IQ2_XXS
        assert c.choose("blk.0.attn_v.weight", (512, 256), T.F16) == T.Q2_K
        assert c.choose("blk.0.ffn_up.weight", (576, 1024), T.F16) == T.IQ4_NL
        assert c.choose("output.weight", (512, 1000), T.F16) == T.Q5_K
        assert c.choose("token_embd.weight", (512, 1000), T.F16) == T.Q2_K
        gqa4 = TypeChooser(ModelFacts("llama", 4, 0, 16, False, 16, False), ftype, default)
        assert gqa4.choose("blk.0.attn_v.weight", (512, 128), T.F16) == T.Q4_K
        moe = TypeChooser(ModelFacts("llama", 2, 8, 16, False, 16, False), ftype, default)
        assert moe.choose("blk.0.attn_output.weight", (512, 512), T.F16) == T.Q5_K
        assert requires_imatrix("blk.0.ffn_up.weight", default, ftype)
        assert not requires_imatrix("output.weight", default, ftype)


@pytest.mark.parametrize("file_type", ["IQ1_S", "IQ1_M"])
def test_iq1_files_need_an_imatrix(workdir, monkeypatch, capsys, file_type):
    """Without --imatrix, refused at the first tensor that needs one, the one llama-quantize names."""
    monkeypatch.chdir(workdir)
    assert main(["quantize", "--allow-requantize", "model.gguf", "o.gguf", file_type]) == 1
    err = capsys.readouterr().err
    assert f"tensor 'blk.3.ffn_down.weight' ({file_type} in a {file_type} file) needs an importance matrix" in err
    assert err.count("\n") == 1 and not (workdir / "o.gguf").exists()


def test_iq1_s_embeddings_without_an_imatrix_entry_are_refused(workdir, monkeypatch, capsys):
    """token_embd is exempt from tensor_requires_imatrix, but ggml's IQ1_S quantizer asserts without weights
    (llama-quantize aborts): refused by name."""
    monkeypatch.chdir(workdir)
    assert main(["quantize", "--allow-requantize", "--imatrix", "synth.imatrix.gguf", "--token-embedding-type",
                 "iq1_s", "model.gguf", "o.gguf", "Q8_0"]) == 1
    err = capsys.readouterr().err
    assert "tensor 'token_embd.weight' (IQ1_S) has no importance matrix entry" in err, err
    assert not (workdir / "o.gguf").exists()

"""`llamactx quantize` to the K-quant mixes: SmolLM2 (the embedded Q4_1 model, requantized) written byte for byte
as llama-quantize 0c1e570 writes it (sha256 of its files in tests/data/quantize_k/llama_quantize.json), and the
quantizers of llamactx.ggml.kernels.quantize_rows against ggml's on small cases; bad input refused."""

from __future__ import annotations

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
from llamactx.gguf.quants import dequantize
from llamactx.gguf.reader import GGUFFile

T = GGMLQuantizationType
DATA = Path(__file__).parents[1] / "data" / "quantize_k"
REF = json.loads((DATA / "llama_quantize.json").read_text())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory holding the model as model.gguf (the names the references were made with)."""
    d = tmp_path_factory.mktemp("quantize_k")
    model = smollm2_path()
    assert _sha256(Path(model)) == REF["input_sha256"], "the embedded model changed: remake the references"
    os.symlink(model, d / "model.gguf")
    synthetic_imatrix(d / "synth.imatrix.gguf")
    assert _sha256(d / "synth.imatrix.gguf") == REF["synthetic_imatrix_sha256"]
    return d


def synthetic_imatrix(path: Path, entries: dict[str, int] | None = None) -> None:
    """The made-up imatrix of the iq2xxs case: sums[i] = ((i * 7919) % 997 + 1) / 16 over 64 tokens for
    blk.0-3.ffn_down (1536 columns) and blk.0.attn_q (576), or for `entries` (name -> columns)."""
    entries = entries or {**{f"blk.{i}.ffn_down.weight": 1536 for i in range(4)}, "blk.0.attn_q.weight": 576}
    sums = {name: ((((np.arange(n) * 7919) % 997 + 1) / 16).astype(np.float32)[None, :], np.array([64]))
            for name, n in entries.items()}
    imatrix_file.save(path, sums, ["synthetic.txt"], 1, 64)


@pytest.fixture(scope="module")
def quantized(workdir):
    """case -> the file `llamactx quantize` writes for it (made once per module), run in workdir."""
    done = {}

    def make(case: str) -> Path:
        if case not in done:
            argv = _argv(case)
            cwd = Path.cwd()
            os.chdir(workdir)
            try:
                code = main(["quantize", "--allow-requantize", *argv[:-1], "model.gguf", f"{case}.gguf", argv[-1]])
            finally:
                os.chdir(cwd)
            assert code == 0
            done[case] = workdir / f"{case}.gguf"
        return done[case]

    return make


def _argv(case: str) -> list[str]:
    """llama-quantize's arguments of a reference case, the file type last."""
    return {"mix": [*REF["mix_args"], "Q4_K_M"], "iq4": [*REF["iq4_args"], "Q8_0"],
            "iq3s": [*REF["iq3s_args"], "Q8_0"], "iq2xxs": [*REF["iq2xxs_args"], "Q8_0"],
            "iq2s": [*REF["iq2s_args"], "Q8_0"], "iq3xxs": [*REF["iq3xxs_args"], "Q8_0"]}.get(case, [case])


@pytest.mark.parametrize("case", ["Q4_K_M", "Q2_K", "mix", "iq4", "iq3s", "TQ1_0", "TQ2_0"])
def test_smollm2_quantized_as_llama_quantize(quantized, case, capsys):
    """Q4_K_M: Q4_K / Q6_K ffn_down by use_more_bits, Q5_0 / Q8_0 fallbacks for 576-wide rows, Q8_0 tied
    embeddings; Q2_K: Q3_K ffn_down, Q4_0 fallbacks; mix (--pure, --tensor-type, --output-tensor-type): every
    K-quant's reference quantizer and the 32-block fallbacks; iq4 / iq3s: IQ4_NL, IQ4_XS and IQ3_S tensors in a
    Q8_0 file (an IQ3_S attn_q falls back to IQ4_NL); TQ1_0 / TQ2_0: ternary ffn_down (1536 wide), the 576-wide
    rest falls back to Q4_0, the tied embeddings to Q8_0."""
    out = quantized(case)
    assert _sha256(out) == REF["quantize_sha256"][case]
    err = capsys.readouterr().err
    assert "converting to" in err and ("falling back to" in err) == (case not in ("iq4",))


@pytest.mark.parametrize("case", sorted(REF["tensor_sha256"]))
def test_iq_tensors_quantized_as_llama_quantize(workdir, case):
    """iq2xxs / iq2s / iq3xxs (blk.0-3 ffn_down IQ2_XXS / IQ2_S / IQ3_XXS with the made-up imatrix, blk.0 attn_q
    falling back to IQ4_NL): those tensors' bytes as in llama-quantize's file (the rest of it, Q8_0, is the slow
    part, left out). IQ2_XXS: the flipped-sign value make_qp_quants sees as a wrapped uint8 level."""
    import argparse

    from llamactx.cli.quantize import _options, add_parser, convert, plan
    from llamactx.gguf import imatrix_file as im
    parser = argparse.ArgumentParser()
    args = add_parser(parser.add_subparsers()).parse_args(
        ["--allow-requantize", *REF[f"{case}_args"], "model.gguf", "Q8_0"])
    opts = _options(args, "Q8_0")
    weights = im.load(workdir / "synth.imatrix.gguf").weights()
    want = REF["tensor_sha256"][case]
    with GGUFFile(workdir / "model.gguf") as f:
        plans = {p.name: p for p in plan(f, opts, weights) if p.name in want}
        got = {name: hashlib.sha256(convert(f, p).tobytes()).hexdigest() for name, p in plans.items()}
    assert got == want


def test_q4_k_m_type_mix(quantized):
    """llama_tensor_get_type's Q4_K_M choices on SmolLM2 (30 layers): ffn_down Q6_K where use_more_bits (layers
    0-2, 26-29 and every third between), attn_v likewise but 576-wide rows fall back to Q8_0 / Q5_0."""
    with GGUFFile(quantized("Q4_K_M")) as f:
        types = {name: T(info.ggml_type) for name, info in f.tensors.items()}
        assert f.meta["general.file_type"] == 15
    more_bits = [i for i in range(30) if i < 3 or i >= 26 or (i - 3) % 3 == 2]
    assert [i for i in range(30) if types[f"blk.{i}.ffn_down.weight"] == T.Q6_K] == more_bits
    assert {types[f"blk.{i}.ffn_down.weight"] for i in range(30) if i not in more_bits} == {T.Q4_K}
    assert [i for i in range(30) if types[f"blk.{i}.attn_v.weight"] == T.Q8_0] == more_bits  # Q6_K -> Q8_0
    assert types["token_embd.weight"] == T.Q8_0 and types["blk.0.attn_q.weight"] == T.Q5_0


def test_iq_type_rules():
    """IQ4_NL / IQ4_XS files: ffn_down of the first n_layer/8 layers is Q5_K unless an imatrix is given; IQ4_XS
    rows that 256-blocks do not divide fall back to IQ4_NL; the tied embeddings get Q8_0."""
    from llamactx.cli.quantize_types import FILE_TYPES, ModelFacts, TypeChooser

    facts = ModelFacts(arch="llama", n_gqa=3, n_expert=0, n_layer=30, is_70b=False, n_attention_wv=30, tied=True)
    for file_type, has_imatrix in (("IQ4_NL", False), ("IQ4_XS", False), ("IQ4_XS", True)):
        ftype, default = FILE_TYPES[file_type]
        chooser = TypeChooser(facts, ftype, default, has_imatrix=has_imatrix)
        got = [chooser.choose(f"blk.{i}.ffn_down.weight", (1536, 576), T.Q4_1) for i in range(30)]
        want_first = default if has_imatrix else T.Q5_K
        assert got == [want_first] * 3 + [default] * 27, (file_type, has_imatrix)
        assert chooser.choose("blk.0.attn_q.weight", (576, 576), T.Q4_1) == T.IQ4_NL
        assert chooser.choose("token_embd.weight", (576, 49152), T.Q4_1) == T.Q8_0
    chooser = TypeChooser(facts, *FILE_TYPES["IQ3_S"])  # IQ3_S: 256-blocks, IQ4_NL where they do not fit
    assert chooser.choose("blk.0.ffn_down.weight", (1536, 576), T.Q4_1) == T.IQ3_S
    assert chooser.choose("blk.0.attn_v.weight", (576, 192), T.Q4_1) == T.IQ4_NL  # n_gqa 3: no Q4_K
    gqa4 = TypeChooser(ModelFacts("llama", 4, 0, 30, False, 30, True), *FILE_TYPES["IQ3_S"])
    assert gqa4.choose("blk.0.attn_v.weight", (512, 128), T.F16) == T.Q4_K
    # IQ2_XS: Q2_K ffn_down for the first n_ffn_down/8 (by count), Q2_K attn_v (n_gqa < 4), Q5_K output
    chooser = TypeChooser(ModelFacts("llama", 3, 0, 30, False, 30, False), *FILE_TYPES["IQ2_XS"], has_imatrix=True)
    assert [chooser.choose(f"blk.{i}.ffn_down.weight", (1536, 576), T.Q4_1) for i in range(5)] == \
        [T.Q2_K] * 3 + [T.IQ2_XS] * 2
    assert chooser.choose("blk.0.attn_v.weight", (512, 128), T.F16) == T.Q2_K
    assert chooser.choose("output.weight", (512, 1000), T.F16) == T.Q5_K
    assert chooser.choose("token_embd.weight", (512, 1000), T.F16) == T.Q2_K


def test_tq_type_rules():
    """TQ1_0 / TQ2_0 files: untied token_embd Q4_K, output Q6_K, rows 256-blocks do not divide Q4_0, no attn_v or
    ffn_down bumps."""
    from llamactx.cli.quantize_types import FILE_TYPES, ModelFacts, TypeChooser

    for file_type in ("TQ1_0", "TQ2_0"):
        ftype, default = FILE_TYPES[file_type]
        chooser = TypeChooser(ModelFacts("llama", 4, 0, 30, False, 30, False), ftype, default)
        assert chooser.choose("token_embd.weight", (512, 1000), T.F16) == T.Q4_K
        assert chooser.choose("output.weight", (512, 1000), T.F16) == T.Q6_K
        assert chooser.choose("blk.0.attn_v.weight", (512, 128), T.F16) == default
        assert chooser.choose("blk.0.ffn_down.weight", (1536, 512), T.F16) == default
        assert chooser.choose("blk.0.attn_q.weight", (576, 576), T.F16) == T.Q4_0


def _matmul_weights(model: Path) -> dict[str, int]:
    """name -> columns of each layer matrix (what llama-imatrix collects)."""
    with GGUFFile(model) as f:
        return {n: t.shape[0] for n, t in f.tensors.items() if n.startswith("blk.") and n.endswith(".weight")
                and len(t.shape) >= 2 and t.shape[1] > 1}


@pytest.mark.parametrize("file_type", sorted(REF["file_type_tensor_types"]))
def test_iq_file_type_mixes_are_llama_quantizes(workdir, file_type):
    """The IQ2_XXS / IQ2_S / IQ2_M / IQ3_XXS (with the made-up imatrix of every layer matrix) and IQ3_XS / IQ3_M
    (without one) mixes: each tensor's type as in llama-quantize's file (the files themselves, byte-identical when
    made, take minutes to write: their sha256 are in file_type_sha256)."""
    from llamactx.cli.quantize import QuantizeOptions, plan
    from llamactx.gguf import imatrix_file as im

    want = REF["file_type_tensor_types"][file_type]
    weights = None
    if file_type in REF["file_types_with_imatrix"]:
        path = workdir / "synth_all.imatrix.gguf"
        if not path.exists():
            synthetic_imatrix(path, _matmul_weights(workdir / "model.gguf"))
        assert _sha256(path) == REF["synthetic_all_imatrix_sha256"]
        weights = im.load(path).weights()
    with GGUFFile(workdir / "model.gguf") as f:
        got = {p.name: p.dst_type.name for p in plan(f, QuantizeOptions(file_type, allow_requantize=True), weights)}
    assert got == want


def _chunk_reference():
    spec = importlib.util.spec_from_file_location("make_chunk_reference", DATA / "make_chunk_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", sorted(json.loads((DATA / "chunk_sha256.json").read_text())))
def test_quantizers_are_ggml_quantize_chunks(case):
    """The low-bit quantizers on made-up rows (an all-zero block, an outlier), with and without an imatrix, against
    ggml_quantize_chunk's bytes (the no-imatrix paths are reached in files only by token_embd / output)."""
    from llamactx.ggml.kernels.quantize_iq2s import quantize_rows_iq2s
    from llamactx.ggml.kernels.quantize_iq2xxs import quantize_rows_iq2xxs
    from llamactx.ggml.kernels.quantize_iq3xxs import quantize_rows_iq3xxs
    from llamactx.ggml.kernels.quantize_tq import quantize_rows_tq

    ref = _chunk_reference()
    name = case.removesuffix("_imatrix")
    qw = ref.chunk_imatrix() if case.endswith("_imatrix") else None
    quantize = {"IQ2_XXS": quantize_rows_iq2xxs, "IQ2_S": quantize_rows_iq2s, "IQ3_XXS": quantize_rows_iq3xxs,
                "TQ1_0": lambda x, w: quantize_rows_tq(x, True), "TQ2_0": lambda x, w: quantize_rows_tq(x, False)}
    out = quantize[name](ref.chunk_input(), qw)
    assert hashlib.sha256(out.tobytes()).hexdigest() == json.loads((DATA / "chunk_sha256.json").read_text())[case]


def test_iq3_type_rules_on_256_wide_rows():
    """The IQ3 rules SmolLM2's 576-wide rows hide (they fall back to IQ4_NL): IQ3_XS attn_q / attn_k IQ3_XXS and
    ffn_gate / ffn_up IQ3_XXS in the middle layers; IQ3_XXS attn_q IQ2_S, attn_output IQ3_S, attn_v IQ3_S without
    an imatrix; IQ3_M attn_v / attn_output Q4_K; IQ2_M attn_output IQ3_S."""
    from llamactx.cli.quantize_types import FILE_TYPES, ModelFacts, TypeChooser

    facts = ModelFacts("llama", 2, 0, 16, False, 16, False)
    xs = TypeChooser(facts, *FILE_TYPES["IQ3_XS"])
    assert xs.choose("blk.0.attn_q.weight", (512, 512), T.F16) == T.IQ3_XXS
    assert xs.choose("blk.0.attn_k.weight", (512, 256), T.F16) == T.IQ3_XXS
    assert [xs.choose(f"blk.{i}.ffn_gate.weight", (512, 1024), T.F16) for i in range(16)] == \
        [T.IQ3_S] * 2 + [T.IQ3_XXS] * 12 + [T.IQ3_S] * 2
    xxs = TypeChooser(facts, *FILE_TYPES["IQ3_XXS"])
    assert xxs.choose("blk.0.attn_q.weight", (512, 512), T.F16) == T.IQ2_S
    assert xxs.choose("blk.0.attn_output.weight", (512, 512), T.F16) == T.IQ3_S
    assert xxs.choose("blk.0.attn_v.weight", (512, 256), T.F16) == T.IQ3_S
    assert TypeChooser(facts, *FILE_TYPES["IQ3_XXS"], has_imatrix=True).choose(
        "blk.0.attn_v.weight", (512, 256), T.F16) == T.IQ3_XXS
    m = TypeChooser(facts, *FILE_TYPES["IQ3_M"])
    assert m.choose("blk.0.attn_v.weight", (512, 256), T.F16) == T.Q4_K
    assert m.choose("blk.0.attn_output.weight", (512, 512), T.F16) == T.Q4_K
    assert TypeChooser(facts, *FILE_TYPES["IQ2_M"]).choose("blk.0.attn_output.weight", (512, 512), T.F16) == T.IQ3_S


def _write_imatrix(path: Path, entries: dict[str, int]) -> Path:
    sums = {name: (np.ones((1, n), np.float32), np.array([64])) for name, n in entries.items()}
    imatrix_file.save(path, sums, ["x.txt"], 1, 64)
    return path


def test_an_imatrix_of_another_model_is_refused(workdir, monkeypatch, capsys):
    other = _write_imatrix(workdir / "other.imatrix.gguf", {"blk.0.attn_q.weight": 64, "blk.0.ffn_down.weight": 64})
    foreign = _write_imatrix(workdir / "foreign.imatrix.gguf", {"layers.0.wq": 576})
    monkeypatch.chdir(workdir)
    for path, message in ((other, "its entry for 'blk.0.attn_q.weight' has 64 values, the tensor has 576 columns"),
                          (foreign, "has no entry for any tensor of this model")):
        assert main(["quantize", "--allow-requantize", "--imatrix", path.name, "model.gguf", "o.gguf", "Q4_K_M"]) == 1
        err = capsys.readouterr().err
        assert f"imatrix '{path.name}'" in err and message in err and err.count("\n") == 1, err
    (workdir / "junk.dat").write_bytes(b"\x01\x00")
    assert main(["quantize", "--imatrix", "junk.dat", "model.gguf", "o.gguf", "Q4_K_M"]) == 1
    assert "imatrix 'junk.dat'" in capsys.readouterr().err
    assert not (workdir / "o.gguf").exists()


def test_q2_k_s_and_iq2_xs_need_an_imatrix(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    for file_type in ("Q2_K_S", "IQ2_XS"):
        assert main(["quantize", "--allow-requantize", "--pure", "model.gguf", "o.gguf", file_type]) == 1
        err = capsys.readouterr().err
        assert f"in a {file_type} file) needs an importance matrix" in err, err


def test_unknown_type_names_list_the_known_ones(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    assert main(["quantize", "--token-embedding-type", "q4_k_m", "model.gguf", "o.gguf", "Q4_K_M"]) == 1
    err = capsys.readouterr().err
    assert "unknown type 'q4_k_m' (known: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, " \
           "q6_K, iq2_xs, iq3_s, iq4_nl, iq4_xs, tq1_0, tq2_0, iq2_xxs, iq2_s, iq3_xxs, iq1_s, iq1_m)" in err
    assert main(["quantize", "model.gguf", "o.gguf", "Q7_K"]) == 1
    assert "Q2_K_S, Q3_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K, Q4_K_S, Q4_K_M" in capsys.readouterr().err


def test_requantized_k_weights_decode_close_to_the_source(workdir, quantized):
    """The K-quant blocks written decode (llamactx.gguf.quants) to the Q4_1 weights within their step."""
    with GGUFFile(workdir / "model.gguf") as src, GGUFFile(quantized("mix")) as dst:
        for i, t in ((0, T.Q2_K), (1, T.Q3_K), (4, T.Q4_K), (2, T.Q5_K), (3, T.Q6_K)):
            name = f"blk.{i}.ffn_down.weight"
            info = dst.tensors[name]
            assert T(info.ggml_type) == t
            want = dequantize(src.tensor_data(name), T(src.tensors[name].ggml_type), info.shape, name)
            got = dequantize(dst.tensor_data(name), t, info.shape, name)
            err = np.abs(got - want).mean() / np.abs(want).mean()
            assert err < {T.Q2_K: 0.5, T.Q3_K: 0.3, T.Q4_K: 0.15, T.Q5_K: 0.08, T.Q6_K: 0.04}[t], (t, err)

"""`llamactx quantize`: llama-quantize's files byte for byte, its type rules, gguf-py's quantized bytes, a model
that loads and decodes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf import quants as gguf_quants

from llamactx import Batch, Context, ContextParams, Model
from llamactx.cli import main
from llamactx.embedded import smollm2_path
from llamactx.gguf.quants import dequantize
from llamactx.gguf.reader import GGUFFile
from tests.gguf.tiny_model import copy_meta, finish

T = GGMLQuantizationType
TYPES = ("F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
N_EMBD, N_FF = 64, 80  # ffn_down's rows (n_ff = 80) are not whole 32-blocks: llama-quantize falls back to F16


def write_f32_model(path: Path, tied: bool = True, seed: int = 0) -> Path:
    """A small llama model in F32 with SmolLM2's tokenizer: 2 layers, n_embd 64, n_ff 80, random weights."""
    w = GGUFWriter(path, "llama")
    with GGUFFile(smollm2_path()) as src:
        copy_meta(w, src, keep=lambda key: not key.startswith("llama.") and key != "general.file_type")
        n_vocab = len(src.meta["tokenizer.ggml.tokens"])
    n_head, n_head_kv, n_layer = 4, 2, 2
    for key, value, vtype in (("context_length", 512, "u32"), ("embedding_length", N_EMBD, "u32"),
                              ("block_count", n_layer, "u32"), ("feed_forward_length", N_FF, "u32"),
                              ("attention.head_count", n_head, "u32"), ("attention.head_count_kv", n_head_kv, "u32"),
                              ("rope.dimension_count", N_EMBD // n_head, "u32"), ("vocab_size", n_vocab, "u32"),
                              ("attention.layer_norm_rms_epsilon", 1e-5, "f32"), ("rope.freq_base", 10000.0, "f32")):
        (w.add_uint32 if vtype == "u32" else w.add_float32)(f"llama.{key}", value)
    w.add_file_type(LlamaFileType.ALL_F32)
    rng = np.random.default_rng(seed)
    n_kv = N_EMBD // n_head * n_head_kv
    shapes = {"token_embd.weight": (n_vocab, N_EMBD), "output_norm.weight": (N_EMBD,)}
    if not tied:
        shapes["output.weight"] = (n_vocab, N_EMBD)
    for il in range(n_layer):
        b = f"blk.{il}."
        shapes.update({b + "attn_norm.weight": (N_EMBD,), b + "attn_q.weight": (N_EMBD, N_EMBD),
                       b + "attn_k.weight": (n_kv, N_EMBD), b + "attn_v.weight": (n_kv, N_EMBD),
                       b + "attn_output.weight": (N_EMBD, N_EMBD), b + "ffn_norm.weight": (N_EMBD,),
                       b + "ffn_gate.weight": (N_FF, N_EMBD), b + "ffn_up.weight": (N_FF, N_EMBD),
                       b + "ffn_down.weight": (N_EMBD, N_FF)})
    for name, shape in shapes.items():  # numpy shapes: (rows, ne[0]); norms near 1, weights near 0
        x = 0.1 * rng.standard_normal(shape)
        w.add_tensor(name, (x + 1.0 if len(shape) == 1 else x).astype(np.float32))
    return finish(w)


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory) -> Path:
    path = write_f32_model(tmp_path_factory.mktemp("quantize") / "tiny-f32.gguf")
    assert _sha256(path) == TINY_F32_SHA256, "the test model changed: LLAMA_QUANTIZE_SHA256 must be made again"
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The files llama-quantize (build 0c1e570, tools/quantize, `llama-quantize tiny-f32.gguf OUT TYPE 1`) writes from
# write_f32_model()'s file: the whole file, metadata and all, is what `llamactx quantize` must write.
TINY_F32_SHA256 = "dc08edc5811d56ab3d2ad76db5c247d9502deea06ba9b540e726a3b46fb663ff"
LLAMA_QUANTIZE_SHA256 = {
    "F16": "2f7c89ca67ec094d482ac5f33deb49cbb0971bab8552d8a63ec55c4ce2c99294",
    "Q8_0": "5c0dd741af959ed3244499cb069d4231f20c841e7abeae21101f38806def64a6",
    "Q4_0": "6aacd4130182e7c5c0b21c58cbb3170ddf4ca269f3762868b981f4d430ae70c8",
    "Q4_1": "e87a5b631a078de56de469b957ece96301e270925932f640653e65b465202eb8",
    "Q5_0": "74d4a5bf3b71d23d0fa0126fff961670b9e38c1240aad56c911a785af842fe8f",
    "Q5_1": "c523a5ff39d933d6c056ede26d471132577ab90c52b50d6446059fb7e92b079f",
}


def expected_type(name: str, file_type: str) -> T:
    """llama-quantize's choice for the tiny model: 1-D tensors stay F32; the tied token_embd gets the output
    type, Q6_K, which 64-element rows turn into Q8_0 (F16 stays F16); ffn_down's 80-element rows, F16."""
    target = T[file_type]
    if not name.endswith("weight") or "_norm" in name:
        return T.F32
    if target == T.F16:
        return T.F16
    if name == "token_embd.weight":
        return T.Q8_0
    return T.F16 if "ffn_down" in name else target


@pytest.mark.parametrize("file_type", TYPES)
def test_quantized_file_is_llama_quantizes_with_gguf_py_bytes(f32_model, tmp_path, file_type, capsys):
    out = tmp_path / f"tiny-{file_type}.gguf"
    assert main(["quantize", str(f32_model), str(out), file_type.lower()]) == 0
    assert "converting to" in capsys.readouterr().err
    assert _sha256(out) == LLAMA_QUANTIZE_SHA256[file_type]
    with GGUFFile(f32_model) as src, GGUFFile(out) as dst:
        assert list(dst.tensors) == sorted(src.tensors, key=lambda n: (int(n.split(".")[1]) if n.startswith("blk.")
                                                                       else -1, n))  # llama-quantize's order
        for name, info in src.tensors.items():
            got = dst.tensors[name]
            want = expected_type(name, file_type)
            assert (got.ggml_type, got.shape) == (want, info.shape), name
            f32 = src.tensor_data(name).view(np.float32).reshape(info.shape[::-1])
            expected = gguf_quants.quantize(f32, want).view(np.uint8).reshape(-1)
            assert np.array_equal(dst.tensor_data(name), expected), name
        assert dst.meta["general.file_type"] == int(LlamaFileType[f"MOSTLY_{file_type}"])
        assert dst.meta["general.quantization_version"] == 2
        for key, value in src.meta.items():  # everything else is copied
            if key not in ("general.file_type",):
                assert np.array_equal(dst.meta[key], value) if isinstance(value, np.ndarray) \
                    else dst.meta[key] == value, key


def _logits(path: Path, tokens: list[int]) -> np.ndarray:
    ctx = Context(Model.load(path), ContextParams(n_ctx=256, n_threads=2))
    assert ctx.decode(Batch.get_one(tokens)) == 0
    return np.array(ctx.get_logits_ith(-1))  # (n_vocab,)


def test_quantized_models_load_and_decode_close_to_f32(f32_model, tmp_path):
    tokens = Model.load(f32_model).vocab.tokenize("The capital of France is", add_special=True)
    reference = _logits(f32_model, tokens)
    for file_type, min_corr in (("F16", 0.9999), ("Q8_0", 0.999), ("Q4_0", 0.9), ("Q5_1", 0.95)):
        out = tmp_path / f"{file_type}.gguf"
        assert main(["quantize", str(f32_model), str(out), file_type]) == 0
        logits = _logits(out, tokens)
        assert np.isfinite(logits).all() and np.corrcoef(logits, reference)[0, 1] > min_corr, file_type


def _synthetic(path: Path, tensors: dict[str, tuple[tuple[int, ...], T]], **meta) -> Path:
    """A GGUF with just the named tensors (numpy shapes), for the type rules; not a loadable model."""
    w = GGUFWriter(path, str(meta.pop("arch", "llama")))
    for key, value in meta.items():
        w.add_uint32(key, value)
    rng = np.random.default_rng(1)
    for name, (shape, t) in tensors.items():
        data = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        w.add_tensor(name, gguf_quants.quantize(data, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _types(path: Path) -> dict[str, str]:
    with GGUFFile(path) as f:
        return {name: T(info.ggml_type).name for name, info in f.tensors.items()}


def test_type_rules(tmp_path, capsys):
    src = _synthetic(tmp_path / "rules.gguf", {
        "output.weight": ((8, 256), T.F32),  # rows of whole 256-blocks: Q6_K
        "token_embd.weight": ((8, 256), T.F16),  # not tied (output.weight exists): the file type
        "blk.0.attn_v.weight": ((8, 64), T.F32),
        "blk.0.ffn_gate_inp.weight": ((8, 64), T.F32),  # expert gate: kept
        "blk.0.attn_norm.weight": ((64,), T.F32),
        "blk.0.ffn_down.weight": ((8, 48), T.F32),  # 48 is not whole 32-blocks: F16
        "blk.0.attn_q.bias": ((8, 64), T.F32),  # not a weight: kept
        "blk.1.attn_k.weight": ((8, 64), T.F32),
    })
    out = tmp_path / "q4.gguf"
    assert main(["quantize", str(src), str(out), "Q4_0"]) == 0
    assert ("blk.0.ffn_down.weight: ncols 48 not divisible by 32 (required for type q4_0) -> falling back to f16"
            in capsys.readouterr().err)
    assert _types(out) == {"output.weight": "Q6_K", "token_embd.weight": "Q4_0", "blk.0.attn_v.weight": "Q4_0",
                           "blk.0.ffn_gate_inp.weight": "F32", "blk.0.attn_norm.weight": "F32",
                           "blk.0.ffn_down.weight": "F16", "blk.0.attn_q.bias": "F32", "blk.1.attn_k.weight": "Q4_0"}
    assert main(["quantize", "--pure", str(src), str(out), "Q5_1"]) == 0
    assert _types(out)["output.weight"] == "Q5_1"
    assert main(["quantize", "--output-tensor-type", "f16", "--token-embedding-type", "q8_0", str(src), str(out),
                 "Q4_1"]) == 0
    assert (_types(out)["output.weight"], _types(out)["token_embd.weight"]) == ("F16", "Q8_0")
    # an 8-expert model keeps attn_v and attn_k in Q8_0
    moe = _synthetic(tmp_path / "moe.gguf", {"blk.0.attn_v.weight": ((8, 64), T.F32),
                                             "blk.0.attn_k.weight": ((8, 64), T.F32),
                                             "blk.0.attn_q.weight": ((8, 64), T.F32)}, **{"llama.expert_count": 8})
    assert main(["quantize", str(moe), str(out), "Q4_0"]) == 0
    assert _types(out) == {"blk.0.attn_v.weight": "Q8_0", "blk.0.attn_k.weight": "Q8_0",
                           "blk.0.attn_q.weight": "Q4_0"}


def test_requantizing_needs_allow_requantize(tmp_path, capsys):
    src = _synthetic(tmp_path / "q8.gguf", {"blk.0.attn_q.weight": ((4, 64), T.Q8_0),
                                            "blk.0.attn_norm.weight": ((64,), T.F32)})
    out = tmp_path / "q4.gguf"
    assert main(["quantize", str(src), str(out), "Q4_0"]) == 1
    err = capsys.readouterr().err
    assert "requantizing from Q8_0 is disabled" in err and err.count("\n") == 1 and not out.exists()
    assert main(["quantize", "--allow-requantize", str(src), str(out), "Q4_0"]) == 0
    with GGUFFile(src) as s, GGUFFile(out) as d:
        f32 = dequantize(s.tensor_data("blk.0.attn_q.weight"), T.Q8_0, (64, 4))
        assert np.array_equal(d.tensor_data("blk.0.attn_q.weight"), gguf_quants.quantize(f32, T.Q4_0).reshape(-1))


def test_default_output_name_and_errors(f32_model, tmp_path, capsys):
    src = _synthetic(tmp_path / "in.gguf", {"blk.0.attn_q.weight": ((4, 64), T.F32)})
    before = src.read_bytes()
    assert main(["quantize", str(src), "q8_0", "4"]) == 0  # llama-quantize's IN TYPE NTHREADS
    assert _types(tmp_path / "ggml-model-Q8_0.gguf") == {"blk.0.attn_q.weight": "Q8_0"}
    capsys.readouterr()
    for argv, message in (
        ([str(src), str(tmp_path / "o.gguf"), "MXFP4_MOE"], "type 'MXFP4_MOE' is not one that llamactx writes "
                                                           "bit-exactly"),
        ([str(src), "Q1_0"], "type 'Q1_0' is not one"),
        ([str(src), str(src), "Q4_0"], "input and output files are the same"),
        ([str(src), str(tmp_path / ".." / tmp_path.name / "in.gguf"), "Q4_0"], "input and output files are the same"),
        ([str(tmp_path / "missing.gguf"), str(tmp_path / "o.gguf"), "Q4_0"], "does not exist"),
        ([str(src), str(tmp_path), "Q4_0"], "is a directory"),
        ([str(src), str(tmp_path / "no" / "o.gguf"), "Q4_0"], "the output's directory"),
        ([str(src), str(tmp_path / "o.gguf")], "missing the type"),
        (["--output-tensor-type", "q7_k", str(src), str(tmp_path / "o.gguf"), "Q4_0"],
         "--output-tensor-type: unknown type 'q7_k' (known: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K"),
        (["--tensor-type", "attn_q", str(src), str(tmp_path / "o.gguf"), "Q4_0"], "expected TENSOR_NAME=TYPE"),
        (["--tensor-type", "attn_q=mxfp4", str(src), str(tmp_path / "o.gguf"), "Q4_0"], "unknown type 'mxfp4'"),
        (["--imatrix", str(tmp_path / "none.dat"), str(src), str(tmp_path / "o.gguf"), "Q4_0"], "none.dat' does not"),
        ([str(tmp_path / "ggml-model-Q8_0.gguf") + "x", "Q4_0"], "does not exist"),
        ([str(Path(__file__)), str(tmp_path / "o.gguf"), "Q4_0"], "bad magic"),
    ):
        assert main(["quantize", *argv]) == 1, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert src.read_bytes() == before and not (tmp_path / "o.gguf").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ggml-model-Q8_0.gguf", "in.gguf"]  # no temporary left

"""LoRA adapters (llamactx.lora, Context.set_adapters_lora) against llama.cpp: the adapters of tests/data/lora/
(make_lora_adapter.py) on SmolLM2 and Gemma 3, logits of every prompt position from llama-cpp-python 0.3.36
(make_lora_reference.py), bit for bit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from llamactx.backend.reference import ReferenceOps
from llamactx.batch import Batch
from llamactx.context import Context
from llamactx.cparams import ContextParams
from llamactx.lora import LoraAdapter, LoraError
from tests.conftest import VARIANT, VARIANT_DIR
from tests.gguf.tiny_model import finish

DATA = Path(__file__).parent / "data" / "lora"
REF_DIR = DATA / VARIANT_DIR  # llama.cpp's outputs for this run's arithmetic (avx2/: its AVX2 build)
REF = json.loads((REF_DIR / "reference.json").read_text())
CASES = {c["name"]: c for c in REF["cases"]}


def decode_all(model, tokens, adapters=(), ops=None) -> np.ndarray:
    """Logits of every position of `tokens` as one batch, with (adapter, scale) pairs set. (n, n_vocab)"""
    ctx = Context(model, ContextParams(n_ctx=256, n_batch=256, flash_attn=False), ops=ops)
    ctx.set_adapters_lora([a for a, _ in adapters], [s for _, s in adapters])
    return decode(ctx, tokens)


def decode(ctx, tokens) -> np.ndarray:
    batch = Batch(len(tokens))
    for i, t in enumerate(tokens):
        batch.add(t, i, (0,), True)
    assert ctx.decode(batch) == 0
    return np.array(ctx.get_logits())


@pytest.fixture(scope="module")
def adapters(smollm):
    return {name: LoraAdapter.load(smollm, DATA / name) for name in ("smollm2-lora.gguf", "smollm2-lora-b.gguf")}


@pytest.fixture(scope="module")
def base_logits(smollm):
    return decode_all(smollm, CASES["a_1"]["tokens"])


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, np.float32).tobytes()).hexdigest()


@pytest.mark.parametrize("name", list(CASES))
def test_lora_logits_equal_llama_cpp(request, name):
    """Every position's logits bit for bit (sha256 of the whole array; SmolLM2's last row compared in full)."""
    case = CASES[name]
    model = request.getfixturevalue(("smollm", "gemma")[case["model"]])
    assert model.vocab.tokenize(REF["prompt"], add_special=True, parse_special=True) == case["tokens"]
    logits = decode_all(model, case["tokens"], [(LoraAdapter.load(model, DATA / f), s) for f, s in case["adapters"]])
    if case["model"] == 0:
        np.testing.assert_array_equal(logits[-1], np.load(REF_DIR / "reference.npz")[name])
    assert logits.argmax(axis=1).tolist() == case["argmax"]
    assert _sha(logits) == case["sha256"]
    assert _sha(decode_all(model, case["tokens"])) != case["sha256"]  # the adapter does change the logits


def test_reference_ops_give_the_same_bits(smollm, adapters):
    case = CASES["a_1_b_0.75"]
    logits = decode_all(smollm, case["tokens"], [(adapters[f], s) for f, s in case["adapters"]], ReferenceOps())
    assert _sha(logits) == case["sha256"]


def test_adapters_are_per_context(smollm, adapters, base_logits):
    tokens = CASES["a_1"]["tokens"]
    a = adapters["smollm2-lora.gguf"]
    with Context(smollm, ContextParams(n_ctx=256, flash_attn=False)) as ctx1, \
            Context(smollm, ContextParams(n_ctx=256, flash_attn=False)) as ctx2:
        ctx1.set_adapter_lora(a, 0.5)
        assert ctx1.adapters_lora == ((a, 0.5),) and ctx2.adapters_lora == ()
        assert _sha(decode(ctx1, tokens)) == CASES["a_0.5"]["sha256"]
        np.testing.assert_array_equal(decode(ctx2, tokens), base_logits)  # the other context is unchanged
        ctx1.memory.clear()
        ctx1.set_adapter_lora(a, 1.0)  # a new scale for the same adapter
        assert _sha(decode(ctx1, tokens)) == CASES["a_1"]["sha256"]
        assert ctx1.rm_adapter_lora(a) and not ctx1.rm_adapter_lora(a)
        ctx1.memory.clear()
        np.testing.assert_array_equal(decode(ctx1, tokens), base_logits)
        ctx1.set_adapters_lora([a, adapters["smollm2-lora-b.gguf"]], [0.0, 0.0])  # scale 0: not applied
        assert ctx1.adapters_lora == ()
        ctx1.set_adapter_lora(a)
        ctx1.clear_adapter_lora()
        assert ctx1.adapters_lora == ()
        ctx2.memory.clear()  # ctx2 ran without adapters first: nothing it prepared for that may be reused now
        ctx2.set_adapter_lora(a, 0.5)
        assert _sha(decode(ctx2, tokens)) == CASES["a_0.5"]["sha256"]


def test_adapter_and_model_stay_read_only(smollm, adapters):
    for lw in adapters["smollm2-lora.gguf"].weights.values():
        assert not lw.a.data.flags.writeable and not lw.b.data.flags.writeable
    assert not smollm.weight("blk.0.attn_q.weight").data.flags.writeable
    assert set(adapters["smollm2-lora.gguf"].weights) == {  # the _norm.weight tensor is skipped, as llama.cpp
        "blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_up.weight", "blk.1.attn_q.weight",
        "blk.1.ffn_up.weight", "blk.2.attn_v.weight", "blk.2.ffn_down.weight", "blk.29.attn_output.weight"}
    assert adapters["smollm2-lora.gguf"].alpha == 16.0 and adapters["smollm2-lora-b.gguf"].alpha == 0.0


def test_set_adapters_rejects_bad_input_and_changes_nothing(smollm, gemma, adapters):
    a = adapters["smollm2-lora.gguf"]
    with Context(smollm, ContextParams(n_ctx=64)) as ctx:
        ctx.set_adapter_lora(a, 0.5)
        for args, match in ((([a], [1.0, 2.0]), "2 scales"), (([a, a], [1.0, 1.0]), "twice"),
                            (([a], [float("nan")]), "finite")):
            with pytest.raises(LoraError, match=match):
                ctx.set_adapters_lora(*args)
        assert ctx.adapters_lora == ((a, 0.5),)
    with Context(gemma, ContextParams(n_ctx=64)) as ctx, pytest.raises(LoraError, match="loaded for"):
        ctx.set_adapter_lora(a)


# -- bad adapter files --------------------------------------------------------------------------------------------


def _write(path: Path, arch="llama", kv=None, tensors=None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    kv = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0} if kv is None else kv
    for key, value in kv.items():
        if key == "general.architecture":
            continue
        (w.add_float32 if isinstance(value, float) else w.add_string)(key, value)
    rng = np.random.default_rng(0)
    if tensors is None:
        tensors = {"blk.0.attn_q.weight.lora_a": (4, 576), "blk.0.attn_q.weight.lora_b": (576, 4)}
    for name, shape in tensors.items():
        dtype = np.float32
        if isinstance(shape, tuple) and shape and isinstance(shape[0], type):
            dtype, shape = shape[0], shape[1:]
        w.add_tensor(name, rng.standard_normal(shape).astype(dtype))
    finish(w)
    return path


_GOOD_KV = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0}
BAD = {
    "model_file": (dict(kv={"general.type": "model"}), r"'general.type' is 'model', expected 'adapter'"),
    "no_type": (dict(kv={"adapter.type": "lora"}), r"'general.type' is None"),
    "arch": (dict(arch="gemma3"), r"'general.architecture' is 'gemma3' but the model's is 'llama'"),
    "adapter_type": (dict(kv={**_GOOD_KV, "adapter.type": "control_vector"}), r"'adapter.type' is 'control_vector'"),
    "alpha_type": (dict(kv={**_GOOD_KV, "adapter.lora.alpha": "16"}), r"'adapter.lora.alpha' has type STRING"),
    "missing_b": (dict(tensors={"blk.0.attn_q.weight.lora_a": (4, 576)}),
                  r"pair for 'blk.0.attn_q.weight' is missing one component \('blk.0.attn_q.weight.lora_b'\)"),
    "suffix": (dict(tensors={"blk.0.attn_q.weight.delta": (4, 576)}), r"'blk.0.attn_q.weight.delta' has an unexp"),
    "not_in_model": (dict(tensors={"blk.99.attn_q.weight.lora_a": (4, 576), "blk.99.attn_q.weight.lora_b": (576, 4)}),
                     r"'blk.99.attn_q.weight' does not exist in the base model"),
    "shape": (dict(tensors={"blk.0.attn_v.weight.lora_a": (4, 576), "blk.0.attn_v.weight.lora_b": (576, 4)}),
              r"'blk.0.attn_v.weight' is \[576, 192\] in the model but its LoRA pair is a \[576, 4\], b \[4, 576\]"),
    "rank": (dict(tensors={"blk.0.attn_q.weight.lora_a": (4, 576), "blk.0.attn_q.weight.lora_b": (576, 8)}),
             r"different ranks"),
    "dtype": (dict(tensors={"blk.0.attn_q.weight.lora_a": (np.float64, 4, 576),
                            "blk.0.attn_q.weight.lora_b": (576, 4)}), r"'blk.0.attn_q.weight.lora_a' is F64"),
    "vector": (dict(tensors={"blk.0.attn_q.weight.lora_a": (576,), "blk.0.attn_q.weight.lora_b": (576, 4)}),
               r"'blk.0.attn_q.weight.lora_a' is F32 with 1 dimensions"),
    "token_embd": (dict(tensors={"token_embd.weight.lora_a": (49152, 4), "token_embd.weight.lora_b": (576, 4)}),
                   r"'token_embd.weight' is not supported"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_adapters_are_rejected(smollm, tmp_path, case):
    kwargs, match = BAD[case]
    path = _write(tmp_path / f"{case}.gguf", **kwargs)
    with pytest.raises(LoraError, match=match):
        LoraAdapter.load(smollm, path)


def test_a_good_hand_written_adapter_loads(smollm, tmp_path):
    adapter = LoraAdapter.load(smollm, _write(tmp_path / "ok.gguf"))
    lw = adapter.weights["blk.0.attn_q.weight"]
    assert lw.rank == 4 and lw.get_scale(adapter.alpha, 1.0) == np.float32(2.0)
    assert adapter.meta["adapter.type"] == "lora"


# -- the API, the command line ------------------------------------------------------------------------------------

GREEDY = REF["greedy"]  # llama-cpp-python's create_completion at temperature 0 with one adapter


def test_llama_lora_path_greedy_equals_llama_cpp_python():
    from llamactx import Llama

    llm = Llama("smollm2", n_ctx=512, lora_path=str(DATA / GREEDY["adapter"]), lora_scale=GREEDY["scale"],
                verbose=False)
    out = llm(GREEDY["prompt"], max_tokens=GREEDY["max_tokens"], temperature=0.0)
    assert out["choices"][0]["text"] == GREEDY["text"]
    assert llm._engine.ctx.adapters_lora[0][1] == GREEDY["scale"]


def test_lora_flags_parse_in_order_as_common_arg():
    from llamactx.cli.commands import build_parser

    args = build_parser().parse_args(["run", "-p", "x", "--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf:0.5,d:-2",
                                      "--lora-scaled", "e.gguf", "0.25", "--lora", "f.gguf"])
    assert args.lora == [("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", 0.5), ("d", -2.0), ("e.gguf", 0.25),
                         ("f.gguf", 1.0)]
    for cmd in (["chat"], ["serve"], ["perplexity", "-f", "t.txt"], ["embedding", "-p", "x"]):
        assert build_parser().parse_args([*cmd, "--lora-scaled", "a.gguf:0.5"]).lora == [("a.gguf", 0.5)]


@pytest.mark.parametrize("argv, message", [
    (["--lora-scaled", "a.gguf"], "expected FNAME:SCALE"),
    (["--lora-scaled", "a.gguf:x"], "scale 'x' is not a number"),
    (["--lora-scaled", "a.gguf", "inf"], "not a finite number"),
    (["--lora", "missing.gguf"], "missing.gguf"),
])
def test_bad_lora_flags_are_one_line_errors(argv, message, capsys):
    from llamactx.cli import main

    assert main(["run", "-p", "x", "-n", "1", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_run_with_a_bad_adapter_names_the_problem(tmp_path, capsys):
    from llamactx.cli import main

    path = _write(tmp_path / "bad.gguf", arch="gemma3")
    assert main(["run", "-p", "x", "-n", "1", "--lora", str(path)]) == 1
    assert "'general.architecture' is 'gemma3' but the model's is 'llama'" in capsys.readouterr().err


def test_run_with_lora_scaled_prints_llama_cpp_greedy_text(capsys):
    from llamactx.cli import main

    assert main(["run", "-p", GREEDY["prompt"], "-n", str(GREEDY["max_tokens"]), "--temp", "0",
                 "--lora-scaled", f"{DATA / GREEDY['adapter']}:{GREEDY['scale']}"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == GREEDY["text"]


def test_perplexity_with_lora_matches_llama_perplexity(capsys):
    """llama-perplexity -c 128 -b 128 --chunks 3 --lora-scaled smollm2-lora.gguf:0.25 gives 22.8560 (AVX2 build:
    22.6212); here the tool differs from llama-perplexity by ~0.3%, as it does without the adapter at -b 128."""
    from llamactx.cli import main
    from tests.conftest import DATA as ROOT_DATA

    assert main(["perplexity", "-f", str(ROOT_DATA / "gpl3_head.txt"), "-c", "128", "--chunks", "3",
                 "--lora-scaled", f"{DATA / 'smollm2-lora.gguf'}:0.25"]) == 0
    out = capsys.readouterr().out
    ppl = float(out.split("Final estimate: PPL = ")[1].split()[0])
    theirs = 22.6212 if VARIANT == "avx2" else 22.8560
    assert abs(ppl / theirs - 1) < 0.01, ppl


def test_embedding_with_lora_changes_the_vectors_as_the_context_does(smollm, capsys):
    from llamactx.cli import main
    from llamactx.embedding import Embedder

    adapter = DATA / "smollm2-lora.gguf"
    assert main(["embedding", "-p", "hello world", "--embd-output-format", "array", "--lora-scaled",
                 f"{adapter}:0.5"]) == 0
    printed = np.array(json.loads(capsys.readouterr().out))  # (1, n_embd)
    tokens = smollm.vocab.tokenize("hello world", add_special=True, parse_special=True)
    with_lora = Embedder(smollm, n_ctx=4096, lora=[(LoraAdapter.load(smollm, adapter), 0.5)]).embed([tokens])
    without = Embedder(smollm, n_ctx=4096).embed([tokens])
    np.testing.assert_allclose(printed, with_lora, atol=1e-7)  # printed with 7 decimals
    assert np.abs(with_lora - without).max() > 1e-3

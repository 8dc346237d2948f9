"""llama-cpp-python 0.3.36's examples (examples/ of its sdist), run unchanged as their users run them, each in its
own Python process with this repository's `llama_cpp` first on the path and the embedded SmolLM2 as their model
argument. Their generation is kept short by a runner that caps `max_tokens` (Llama.create_completion patched in
the child, never the example's file); what they print is checked against `Llama` called here with the same
arguments.

examples/high_level_api: high_level_api_inference, _streaming, _embedding, _infill and fastapi_server run here.
langchain_custom_llm needs the `langchain` package (0.0.x's `langchain.llms.base`), which this project does not
install. Of examples/low_level_api, quantize.py runs here (llama_model_quantize is `llamactx quantize`); the
others cannot run on llama-cpp-python 0.3.36 either: low_level_api_llama_cpp.py and low_level_api_chat_cpp.py (which
Chat.py, Miku.py and ReasonAct.py run) call `llama_eval` and `llama_sample_*`, which llama.h removed (0.3.36 raises
AttributeError: no attribute 'llama_eval'), and sample through ctypes arrays of llama_token_data handed to C by
pointer (`ctypes.pointer(llama_token_data_array(...))`), C memory that llamactx does not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import pytest

from llamactx.embedded import smollm2_path
from tests.conftest import LLAMACPP_SDIST
from tests.server.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = LLAMACPP_SDIST / "examples" / "high_level_api"
QUESTION = "Question: What are the names of the planets in the solar system? Answer: "
MAX_TOKENS = 8  # the cap on every completion an example asks for
EXAMPLE_SEED = 2  # Llama's seed where an example gives none (1337 draws a first "\n" here, natively)
TIMEOUT_S = 180

# runs the example at argv[1] as __main__ with the rest of argv, after capping Llama.create_completion's max_tokens
# and giving Llama a fixed seed where the example gives none: sampled at temperature 0.8 and stopping at "\n", a
# random seed sometimes drew "\n" first and the streaming example printed a single chunk
RUNNER = r"""
import os, runpy, sys
import llama_cpp
cap = int(os.environ["EXAMPLE_MAX_TOKENS"])
init = llama_cpp.Llama.__init__
def seeded(self, *args, **kwargs):
    kwargs.setdefault("seed", int(os.environ["EXAMPLE_SEED"]))
    init(self, *args, **kwargs)
llama_cpp.Llama.__init__ = seeded
create = llama_cpp.Llama.create_completion
def capped(self, *args, **kwargs):
    kwargs["max_tokens"] = min(kwargs.get("max_tokens") or cap, cap)
    return create(self, *args, **kwargs)
llama_cpp.Llama.create_completion = capped
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def example(name: str, folder: Path = EXAMPLES) -> Path:
    path = folder / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make test` unpacks llama-cpp-python 0.3.36's sdist there")
    return path


def child_env(**extra: str) -> dict[str, str]:
    """This repository first on the path (its llama_cpp, not an installed llama-cpp-python)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "EXAMPLE_MAX_TOKENS": str(MAX_TOKENS), "EXAMPLE_SEED": str(EXAMPLE_SEED),
            **extra}


def run_example(name: str, *args: str) -> str:
    """The example's standard output; a failure with its standard error when it exits non-zero."""
    cmd = [sys.executable, "-c", RUNNER, str(example(name)), "-m", str(smollm2_path()), *args]
    out = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT_S, cwd=EXAMPLES)
    if out.returncode != 0:
        pytest.fail(f"{name} exited with {out.returncode}:\n{out.stderr[-4000:]}")
    return out.stdout


@pytest.fixture(scope="module")
def llm():
    return llama_cpp.Llama(str(smollm2_path()), verbose=False)


def test_high_level_api_inference(llm):
    out = json.loads(run_example("high_level_api_inference.py"))  # sampled at temperature 0.8, EXAMPLE_SEED
    text = out["choices"][0]["text"]
    assert out["object"] == "text_completion" and text.startswith(QUESTION) and "\n" not in text  # echo, stop
    assert 0 < out["usage"]["completion_tokens"] <= MAX_TOKENS
    assert out["usage"]["prompt_tokens"] == len(llm.tokenize(QUESTION.encode(), special=True))


def test_high_level_api_streaming():
    printed = run_example("high_level_api_streaming.py")
    chunks = [json.loads(c) for c in printed.replace("}\n{", "}\x00{").split("\x00")]
    assert len(chunks) > 1 and all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert len({c["id"] for c in chunks}) == 1
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text.strip() and not text.startswith(QUESTION)  # no echo


def test_high_level_api_embedding(llm):
    """SmolLM2's pooling type is none: one vector per token, not normalised (llama-cpp-python's create_embedding),
    the same as Llama.embed's here."""
    printed = run_example("high_level_api_embedding.py")
    out = eval(printed, {})  # noqa: S307 -- the example prints the response dict's repr
    n_tokens = len(llm.tokenize(b"Hello world!"))
    assert out["object"] == "list" and out["usage"]["prompt_tokens"] == n_tokens
    rows = np.array(out["data"][0]["embedding"])  # (n_tokens, n_embd)
    assert rows.shape == (n_tokens, llm.n_embd()) and np.abs(np.linalg.norm(rows, axis=1) - 1.0).min() > 1e-3
    here = llama_cpp.Llama(str(smollm2_path()), embedding=True, verbose=False).embed("Hello world!")
    np.testing.assert_allclose(rows, np.array(here), rtol=1e-5, atol=1e-5)


def test_high_level_api_infill(llm):
    """SmolLM2 has no fill-in-the-middle tokens: the prompt is completed and the suffix appended to the text,
    which the example recognises and shows as filtered."""
    printed = run_example("high_level_api_infill.py")
    assert printed.startswith("Fill-in-Middle completion (filtered):\n\ndef add(\x1b[32m")
    assert printed.endswith("\x1b[33m\n    return sum\n\n\x1b[0m\n")


def test_infill_prompt_puts_the_fim_tokens_in_llama_cpp_pythons_order(llamacpp_src):
    """A vocabulary with FIM tokens (StarCoder's): PRE prompt SUF suffix MID, or SUF suffix PRE prompt MID."""
    vocab_file = str(llamacpp_src / "models" / "ggml-vocab-starcoder.gguf")
    for spm, want in ((False, "<fim_prefix>def add(<fim_suffix>\n    return sum<fim_middle>"),
                      (True, "<fim_suffix>\n    return sum<fim_prefix>def add(<fim_middle>")):
        vocab_llm = llama_cpp.Llama(vocab_file, vocab_only=True, spm_infill=spm, verbose=False)
        tokens, after = vocab_llm._infill_tokens("def add(", [], "\n    return sum")
        assert after == "" and vocab_llm.detokenize(tokens, special=True).decode() == want


def test_fastapi_server_example():
    """examples/high_level_api/fastapi_server.py: create_app() reads its settings from the environment (MODEL),
    as llama-cpp-python's BaseSettings do, and uvicorn serves it on $HOST:$PORT."""
    port = free_port()
    env = child_env(MODEL=str(smollm2_path()), HOST="127.0.0.1", PORT=str(port), N_CTX="512", N_PARALLEL="1")
    proc = subprocess.Popen([sys.executable, str(example("fastapi_server.py"))], env=env, cwd=EXAMPLES,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"fastapi_server.py exited with {proc.returncode}:\n{proc.stderr.read()[-4000:]}")
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("fastapi_server.py did not start")
            time.sleep(0.2)
        body = {"prompt": "The quick brown fox jumps over the lazy dog. The quick brown fox", "max_tokens": 6,
                "temperature": 0.0}
        out = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
        assert out["choices"][0]["text"] == " is a classic example of a"  # Llama.create_completion's (SmolLM2)
        assert out["model"] == str(smollm2_path())  # the model setting, no alias
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_low_level_quantize_example(tmp_path):
    """examples/low_level_api/quantize.py IN OUT 7: llama_model_quantize writes a Q8_0 file, as `llamactx
    quantize IN OUT Q8_0` does."""
    from gguf import GGMLQuantizationType, GGUFReader

    src = REPO / "tests" / "data" / "tiny" / "tiny-llama3.gguf"
    if not src.exists():
        pytest.fail(f"{src} is missing (tests/data/tiny/make_tiny_models.py makes it)")
    out = tmp_path / "q8.gguf"
    script = example("quantize.py", LLAMACPP_SDIST / "examples" / "low_level_api")
    done = subprocess.run([sys.executable, str(script), str(src), str(out), "7"], env=child_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    reader = GGUFReader(out)
    assert int(reader.fields["general.file_type"].parts[-1][0]) == 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    assert GGMLQuantizationType.Q8_0 in {t.tensor_type for t in reader.tensors}
    again = tmp_path / "cli.gguf"
    cli = subprocess.run([sys.executable, "-m", "llamactx", "quantize", str(src), str(again), "Q8_0"],
                         env=child_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert cli.returncode == 0, cli.stderr[-4000:]
    assert out.read_bytes() == again.read_bytes()
    failed = subprocess.run([sys.executable, str(script), str(src), str(tmp_path / "bad.gguf"), "4"],
                            env=child_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert failed.returncode != 0 and "ftype = 4 is not one llamactx writes" in failed.stderr


@pytest.mark.parametrize(("name", "stdin"), [("low_level_api_llama_cpp.py", ""), ("Miku.py", "Hi\n")])
def test_low_level_examples_stop_where_llama_cpp_python_does(name, stdin):
    """They load the model, tokenize (into ctypes llama_token arrays) and print as with llama-cpp-python 0.3.36,
    then call llama_eval, which neither has: an AttributeError naming it and llama.h's replacement."""
    script = example(name, LLAMACPP_SDIST / "examples" / "low_level_api")
    env = child_env(MODEL=str(smollm2_path()), N_PREDICTS="4")
    done = subprocess.run([sys.executable, str(script)], env=env, input=stdin, capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=script.parent)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("AttributeError: llama_cpp.llama_eval: llama.h no longer has")

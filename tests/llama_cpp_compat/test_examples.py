"""llama-cpp-python 0.3.36's high-level examples (examples/high_level_api of its sdist), run unchanged on the
embedded SmolLM2 with this repository's llama_cpp. (examples/low_level_api calls llama_eval and llama_sample_*,
which llama.h no longer has, and builds ctypes arrays: the real 0.3.36 cannot run it either.)"""

from __future__ import annotations

import json
import runpy
import sys

import pytest

from llamactx.embedded import smollm2_path
from tests.conftest import LLAMACPP_SDIST

EXAMPLES = LLAMACPP_SDIST / "examples" / "high_level_api"
QUESTION = "Question: What are the names of the planets in the solar system? Answer: "


def run_example(name: str, monkeypatch, capsys) -> str:
    path = EXAMPLES / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make test` unpacks llama-cpp-python 0.3.36's sdist there")
    monkeypatch.setattr(sys, "argv", [str(path), "-m", str(smollm2_path())])
    runpy.run_path(str(path), run_name="__main__")
    return capsys.readouterr().out


def test_high_level_api_inference(monkeypatch, capsys):
    out = json.loads(run_example("high_level_api_inference.py", monkeypatch, capsys))
    text = out["choices"][0]["text"]
    assert out["object"] == "text_completion" and text.startswith(QUESTION) and "\n" not in text  # echo, stop


def test_high_level_api_streaming(monkeypatch, capsys):
    printed = run_example("high_level_api_streaming.py", monkeypatch, capsys)
    chunks = [json.loads(c) for c in printed.replace("}\n{", "}\x00{").split("\x00")]
    assert len(chunks) > 1 and all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "".join(c["choices"][0]["text"] for c in chunks).strip()


def test_high_level_api_embedding(monkeypatch, capsys):
    printed = run_example("high_level_api_embedding.py", monkeypatch, capsys)
    assert printed.startswith("{'object': 'list'") and "'embedding': [" in printed

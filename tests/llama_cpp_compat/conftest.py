"""llama-cpp-python 0.3.36's own tests (tests/ of its sdist, copied unchanged beside this file) against the
`llama_cpp` package of this repository. README.md here says what is adapted and why; everything is adapted here,
in fixtures, never in the copied files:

- `hf_hub_download` answers from local models instead of the Hugging Face Hub (no network in the tests): the
  embedded SmolLM2 stands in for Qwen3.5-0.8B and stories15M, and the tiny synthetic models of tests/data/tiny
  for the recurrent (mamba2 for mamba-130m), hybrid (lfm2 for Falcon-H1) and embedding (bert for bge-small)
  cases.
- The tests run from the sdist's root, as upstream runs them: test_llama.py reads ./vendor/llama.cpp/models/.
- Three tests assert the texts and token ids of Qwen3.5-0.8B, which SmolLM2 does not produce: they are strict
  xfails here (llama-cpp-python itself fails them on these models too: 23 of 26 pass in this set-up).
  tests/test_llama_api.py runs the same steps with SmolLM2's own expected outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import LLAMACPP_SDIST

TINY = Path(__file__).parent.parent / "data" / "tiny"

# (repo_id, filename) of the upstream tests -> the local stand-in
_SMOLLM2 = "smollm2"
LOCAL_MODELS = {
    ("lmstudio-community/Qwen3.5-0.8B-GGUF", "Qwen3.5-0.8B-Q8_0.gguf"): _SMOLLM2,
    ("ggml-org/models", "tinyllamas/stories15M-q4_0.gguf"): _SMOLLM2,
    ("CompendiumLabs/bge-small-en-v1.5-gguf", "bge-small-en-v1.5-q4_k_m.gguf"): TINY / "tiny-bert.gguf",
    ("QuantFactory/mamba-130m-hf-GGUF", "mamba-130m-hf.Q2_K.gguf"): TINY / "tiny-mamba2.gguf",
    ("tiiuae/Falcon-H1-Tiny-90M-Instruct-GGUF", "Falcon-H1-Tiny-90M-Instruct-Q2_K.gguf"): TINY / "tiny-lfm2.gguf",
}

# the upstream tests whose assertions are Qwen3.5-0.8B's outputs
QWEN_OUTPUTS = {
    "test_real_model": "asserts Qwen3.5's token ids for 'Hello, world!' ([9419, 11, 1814, 0])",
    "test_real_llama": "asserts Qwen3.5's continuation ' jumps over the lazy dog.' (SmolLM2: ' is a classic ...')",
    "test_real_llama_repeated_prompt_cache": "asserts Qwen3.5's continuation ' jumps over the lazy dog.'",
}


def local_model(repo_id: str, filename: str, **kwargs) -> str:
    """hf_hub_download's answer: the local stand-in's path; a failure naming an unknown download."""
    target = LOCAL_MODELS.get((repo_id, filename))
    if target is None:
        pytest.fail(f"hf_hub_download({repo_id!r}, {filename!r}): no local stand-in (tests/llama_cpp_compat)")
    if target == _SMOLLM2:
        from llamactx.embedded import smollm2_path

        return str(smollm2_path())
    if not Path(target).exists():
        pytest.fail(f"{target} is missing (tests/data/tiny/make_tiny_models.py makes it)")
    return str(target)


@pytest.fixture(autouse=True)
def _upstream_setup(request, monkeypatch):
    """Each copied test: local models behind hf_hub_download, the sdist's root as working directory."""
    if not (LLAMACPP_SDIST / "vendor" / "llama.cpp" / "models").is_dir():
        pytest.fail(f"{LLAMACPP_SDIST} is missing: `make test` unpacks llama-cpp-python 0.3.36's sdist there")
    monkeypatch.setattr(request.module, "hf_hub_download", local_model, raising=False)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", local_model)
    monkeypatch.chdir(LLAMACPP_SDIST)


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here and item.name in QWEN_OUTPUTS:
            item.add_marker(pytest.mark.xfail(reason=QWEN_OUTPUTS[item.name], strict=True))

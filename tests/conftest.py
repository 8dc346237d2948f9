"""Shared fixtures: the two embedded models (loaded once per session) and llama.cpp's reference outputs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from llamactx.ggml.cpu import arithmetic

# The tests' local Rays bind 127.0.0.1 only (llamactx/cluster/loopback.py), which Ray reads once, when it is first
# imported; under `make test`'s workers a file run before tests/cluster/ may import it first (any llamactx.cluster
# module does), so the setting is made before any test runs
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

DATA = Path(__file__).parent / "data"
# llama.cpp's outputs differ between its AVX-512 and AVX2 builds (docs/numerics.md): each reference folder holds the
# AVX-512 build's, and avx2/ the AVX2 build's; the tests compare with the one of the arithmetic they run
VARIANT = str(arithmetic()["variant"])
VARIANT_DIR = "avx2" if VARIANT == "avx2" else "."
# the AVX-512 build with GCC's AMD tuning (native on Zen 4/5) sums ggml_vec_dot_f32's tail without the Intel
# build's epilogue (llamactx.ggml.vec.dot_vec): the references that this changes are in a znver/ folder beside them
TAIL_DIR = "znver" if VARIANT == "avx512-znver" else None


def reference_path(base: Path, name: str) -> Path:
    """The reference file `name` of folder `base` for this run's arithmetic: base/znver/name on the AMD-tuned
    AVX-512 build where that exists (a reference that depends on the f32 dot product's tail), else
    base/VARIANT_DIR/name."""
    if TAIL_DIR is not None and (base / TAIL_DIR / name).exists():
        return base / TAIL_DIR / name
    return base / VARIANT_DIR / name
# llama.cpp 0c1e570's sources (tokenizer vocabularies, chat templates, test-chat cases) and llama-cpp-python 0.3.36's
# tests, unpacked from its PyPI sdist into the venv by `make test` (the Makefile's SDIST_STAMP)
LLAMACPP_SDIST = Path(sys.prefix) / "share" / "llamactx" / "llama_cpp_python-0.3.36"
LLAMACPP_SRC = LLAMACPP_SDIST / "vendor" / "llama.cpp"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `make test` (pytest-xdist, `-n 2 --dist loadfile`): one work unit per test file, so a module's
    fixtures (servers, models, written files) start once, on one worker; and one for all of tests/cluster/, so two
    local Rays never run at once. (Not xdist_group marks: on pytest 9 they no longer reach the scheduler.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/cluster/" if scope.startswith("tests/cluster/") else scope

    return FileScheduling(config, log)


# the order of `make test`'s queue of files (under xdist only): first one that compiles the kernels most tests run
# (llamactx run, perplexity with and without flash attention, both models), then files that compile none, which the
# other worker runs meanwhile instead of compiling the same kernels beside it; then the rest, in collection order
XDIST_FIRST = ("cli/test_cli.py",)
XDIST_NO_KERNELS = ("cli/test_args.py", "cli/test_bench_args.py", "vocab/", "test_chat_template.py",
                    "test_chat_template_names.py", "test_chat_parse.py", "test_tool_calls.py", "test_layout.py",
                    "gguf/test_reader.py", "sampling/test_grammar.py")


def pytest_collection_modifyitems(config, items) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    root = Path(__file__).parent

    def rank(item) -> int:
        rel = Path(item.path).relative_to(root).as_posix() if Path(item.path).is_relative_to(root) else ""
        return 0 if rel in XDIST_FIRST else 1 if rel.startswith(XDIST_NO_KERNELS) else 2

    items.sort(key=rank)  # stable: each file's tests stay together and in order


@pytest.fixture(scope="session")
def llamacpp_src() -> Path:
    """llama.cpp 0c1e570's source tree; a failure (never a skip) when `make test` did not unpack it."""
    if not LLAMACPP_SRC.is_dir():
        pytest.fail(f"{LLAMACPP_SRC} is missing: `make test` unpacks llama-cpp-python 0.3.36's sdist there")
    return LLAMACPP_SRC


REFERENCE_DIRS = {"smollm2": DATA / "smollm2-135m-instruct-q4_1" / VARIANT_DIR,
                  "gemma3": DATA / "gemma3-270m-q4_k_m" / VARIANT_DIR}


def load_reference(name: str) -> dict:
    return json.loads((REFERENCE_DIRS[name] / "reference.json").read_text())


def reference_logits(name: str, i: int) -> np.ndarray:
    return np.load(REFERENCE_DIRS[name] / f"logits_{i}.npy")


@pytest.fixture(scope="session")
def smollm():
    from llamactx import Model
    from llamactx.embedded import smollm2_path

    return Model.load(smollm2_path())


@pytest.fixture(scope="session")
def gemma():
    from llamactx import Model
    from llamactx.embedded import gemma3_path

    return Model.load(gemma3_path())


@pytest.fixture(scope="session")
def smollm_ref():
    return load_reference("smollm2")


@pytest.fixture(scope="session")
def gemma_ref():
    return load_reference("gemma3")


# byte offsets of each block's f16 scale fields (ggml-common.h): tests overwrite them with finite values
SCALE_OFFSETS = {
    GGMLQuantizationType.Q4_0: [0],
    GGMLQuantizationType.Q4_1: [0, 2],
    GGMLQuantizationType.Q5_0: [0],
    GGMLQuantizationType.Q5_1: [0, 2],
    GGMLQuantizationType.Q8_0: [0],
    GGMLQuantizationType.Q2_K: [80, 82],
    GGMLQuantizationType.Q3_K: [108],
    GGMLQuantizationType.Q4_K: [0, 2],
    GGMLQuantizationType.Q5_K: [0, 2],
    GGMLQuantizationType.Q6_K: [208],
    GGMLQuantizationType.IQ4_NL: [0],
    GGMLQuantizationType.IQ4_XS: [0],
    GGMLQuantizationType.MXFP4: [],  # an E8M0 exponent byte, no f16 scale
    GGMLQuantizationType.IQ2_XXS: [0],
    GGMLQuantizationType.IQ2_XS: [0],
    GGMLQuantizationType.IQ2_S: [0],
    GGMLQuantizationType.IQ3_XXS: [0],
    GGMLQuantizationType.IQ3_S: [0],
    GGMLQuantizationType.IQ1_S: [0],
    GGMLQuantizationType.IQ1_M: [],  # its f16 d is packed in the top nibbles of 4 u16 scale words (offset 48)
    GGMLQuantizationType.TQ1_0: [52],
    GGMLQuantizationType.TQ2_0: [64],
}

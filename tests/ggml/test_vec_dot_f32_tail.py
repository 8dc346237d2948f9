"""ggml_vec_dot_f32 on rows whose length is not a multiple of 64 (F32 weights outside tinyBLAS, e.g. a LoRA
adapter's lora_b with k = rank): llama.cpp's own products, caught by tests/data/lora/dump_lora_matmuls.py, and
ggml_vec_dot_f32 itself on every length 1..200 (dump_vec_dot_f32.py), for the build of this run's arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.backend.reference import ReferenceOps
from llamactx.ggml.cpu import F32_EPR, F32_TAIL_EPILOGUE
from llamactx.ggml.vec import dot_vec, f32_tail
from llamactx.model import Weight
from tests.conftest import VARIANT, reference_path

LORA = Path(__file__).parents[1] / "data" / "lora"
DATA = np.load(reference_path(LORA, "f32_ranks.npz"))
CASES = sorted({k.rsplit("|", 1)[0] for k in DATA.files}, key=lambda k: int(k.split("|")[0]))
VEC_DOT = reference_path(LORA, "vec_dot_f32.npz")


@pytest.mark.parametrize("case", CASES)
def test_f32_matmul_equals_llama_cpp(case):
    w, x, y = DATA[case + "|W"], DATA[case + "|X"], DATA[case + "|Y"]  # (n_out, k), (n, k), (n, n_out)
    weight = Weight(case, int(T.F32), (w.shape[1], w.shape[0]), w)
    np.testing.assert_array_equal(ReferenceOps().matmul(x, weight), y)
    if VARIANT != "avx2":  # AVX-512: every case takes the vec_dot path (AVX2's tinyBLAS takes k = 24 and 72)
        assert w.shape[1] % 16 != 0 or w.shape[0] % 4 != 0


@pytest.fixture(scope="module")
def vec_dot():
    if not VEC_DOT.exists():
        pytest.skip(f"no ggml_vec_dot_f32 outputs {VEC_DOT} of the llama.cpp build of the {VARIANT} arithmetic "
                    f"(make them with tests/data/lora/dump_vec_dot_f32.py on that build)")
    with np.load(VEC_DOT) as f:
        return f["x"], f["y"], f["s"]  # (pairs, 200) each


def test_dot_vec_equals_ggml_vec_dot_f32(vec_dot):
    x, y, s = vec_dot
    acc = np.zeros(64, np.float32)
    ours = np.array([[dot_vec(x[j, :n], y[j, :n], acc, False) for n in range(1, x.shape[1] + 1)]
                     for j in range(x.shape[0])], np.float32)  # (pairs, 200)
    bad = (np.argwhere(ours.view(np.uint32) != s.view(np.uint32)) + [0, 1]).tolist()  # [pair, n]
    assert not bad, f"[pair, n] where dot_vec differs from llama.cpp: {bad[:20]}"


@pytest.mark.skipif(F32_EPR != 16, reason="the AVX2 build's tail (4 at a time) has no epilogue to tell apart")
def test_the_other_tuning_differs(vec_dot):
    """The recorded outputs tell GCC's Intel and AMD tuning of the tail apart (a wrong F32_TAIL_EPILOGUE fails the
    test above): for n < 64 the whole sum is the tail."""
    x, y, s = vec_dot
    differ = {n for j in range(x.shape[0]) for n in range(1, 64)
              if f32_tail(x[j, :n], y[j, :n], 0, np.float32(0), not F32_TAIL_EPILOGUE) != s[j, n - 1]}
    assert differ and differ <= {n for n in range(16, 64) if n % 8 > 4}, sorted(differ)


TARGET = """
import json
from llamactx.ggml.cpu import TargetError, arithmetic, check_target
try:
    check_target()
except TargetError as e:
    print(json.dumps({"error": str(e)}))
else:
    print(json.dumps(arithmetic()))
"""


@pytest.mark.parametrize("cpu, epilogue, variant", [("skylake-avx512", True, "avx512"),
                                                    ("sapphirerapids", True, "avx512-fp16"),
                                                    ("znver4", False, "avx512-znver"), ("haswell", False, "avx2")])
def test_the_target_name_picks_the_tuning(cpu, epilogue, variant):
    """NUMBA_CPU_NAME decides GCC's tuning of the tail: an Intel name the Intel build's epilogue, a znver name
    none (a process per target: the switch is fixed at import)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")} | {"NUMBA_CPU_NAME": cpu}
    r = subprocess.run([sys.executable, "-c", TARGET], env=env, capture_output=True, text=True, timeout=120)
    got = json.loads(r.stdout)
    if "error" in got:
        pytest.skip(got["error"])
    assert (got["f32_tail_epilogue"], got["variant"]) == (epilogue, variant)

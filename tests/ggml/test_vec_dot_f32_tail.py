"""ggml_vec_dot_f32 on rows whose length is not a multiple of 64 (F32 weights outside tinyBLAS, e.g. a LoRA
adapter's lora_b with k = rank): llama.cpp's own products, caught by tests/data/lora/dump_lora_matmuls.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.backend.reference import ReferenceOps
from llamactx.model import Weight
from tests.conftest import VARIANT, VARIANT_DIR

DATA = np.load(Path(__file__).parents[1] / "data" / "lora" / VARIANT_DIR / "f32_ranks.npz")
CASES = sorted({k.rsplit("|", 1)[0] for k in DATA.files}, key=lambda k: int(k.split("|")[0]))


@pytest.mark.parametrize("case", CASES)
def test_f32_matmul_equals_llama_cpp(case):
    w, x, y = DATA[case + "|W"], DATA[case + "|X"], DATA[case + "|Y"]  # (n_out, k), (n, k), (n, n_out)
    weight = Weight(case, int(T.F32), (w.shape[1], w.shape[0]), w)
    np.testing.assert_array_equal(ReferenceOps().matmul(x, weight), y)
    if VARIANT != "avx2":  # AVX-512: every case takes the vec_dot path (AVX2's tinyBLAS takes k = 24 and 72)
        assert w.shape[1] % 16 != 0 or w.shape[0] % 4 != 0

"""llama.cpp's outputs for the low-bit quant types (lowbit_cases.py): the tiny model's prompt logits and greedy
steps (make_quant_reference.py's `reference`, -> lowbit.json / lowbit.npz) and libggml's own single mul_mat of every
case of MATMUL_CASES (-> lowbit_matmuls.npz). REFERENCE_VARIANT=avx2 (LLAMA_CPP_LIB_PATH at the AVX2 build) writes
into avx2/.

Usage: PYTHONPATH=<llama-cpp-python 0.3.36 sdist> LLAMA_CPP_LIB_PATH=<build>/bin \
    python tests/data/quants/make_lowbit_reference.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from lowbit_cases import MATMUL_CASES, N_ROWS, case_data  # noqa: E402
from make_quant_reference import _GGML, OUT, reference  # noqa: E402


def matmuls() -> None:
    g = _GGML()
    arrays, digests = {}, {}
    for case in MATMUL_CASES:
        t, w, x = case_data(case)
        arrays[case["name"]] = np.concatenate([g.mul_mat(t, w, case["k"], x[:n], False) for n in N_ROWS])
        digests[case["name"]] = hashlib.sha256(w.tobytes() + x.tobytes()).hexdigest()
    OUT.mkdir(exist_ok=True)
    np.savez_compressed(OUT / "lowbit_matmuls.npz", **arrays)
    (OUT / "lowbit_matmuls.json").write_text(json.dumps({"inputs_sha256": digests}, indent=1))
    print("matmuls", len(arrays))


if __name__ == "__main__":
    matmuls()
    reference("lowbit")

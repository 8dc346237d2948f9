"""sha256 of ggml_quantize_chunk's output (llama.cpp 0c1e570's libggml-base, the plain-C quantizers, the same on
every build) for `chunk_input()` rows, with and without `chunk_imatrix()`, for the quantizers whose no-imatrix path
SmolLM2's files cannot reach: written to chunk_sha256.json. Run:
  .venv/bin/python tests/data/quantize_k/make_chunk_reference.py ~/.cache/llamactx-llamacpp/bin/libggml-base.so
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
TYPES = ("IQ2_XXS", "IQ2_S", "IQ3_XXS", "TQ1_0", "TQ2_0")
NROW, NCOL = 16, 512


def chunk_input() -> np.ndarray:
    """(16, 512) float32: sines of row-dependent frequency and scale, one all-zero block, one outlier."""
    i = np.arange(NROW * NCOL, dtype=np.float64).reshape(NROW, NCOL)
    x = np.sin(i * 0.37 + np.cos(i * 0.011)) * (0.02 + 0.3 * (np.arange(NROW)[:, None] % 5))
    x[3, :256] = 0
    x[4, 5] = 40
    return x.astype(np.float32)


def chunk_imatrix() -> np.ndarray:
    return (((np.arange(NCOL) * 7919) % 997 + 1) / 200).astype(np.float32)


def main(lib_path: str) -> None:
    lib = ctypes.CDLL(lib_path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    x, qw = chunk_input(), chunk_imatrix()
    out = {}
    for name in TYPES:
        t = T[name]
        for w in (None, qw):
            if w is None and name == "IQ2_XXS":
                continue  # ggml asserts: quant_weights required
            dst = np.zeros(NROW * NCOL // 256 * GGML_QUANT_SIZES[t][1], np.uint8)
            lib.ggml_quantize_chunk(int(t), x.ctypes.data, dst.ctypes.data, 0, NROW, NCOL,
                                    None if w is None else w.ctypes.data)
            out[f"{name}{'_imatrix' if w is not None else ''}"] = hashlib.sha256(dst.tobytes()).hexdigest()
    Path(__file__).with_name("chunk_sha256.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])

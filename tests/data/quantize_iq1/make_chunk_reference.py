"""sha256 of ggml_quantize_chunk's IQ1_S / IQ1_M output (llama.cpp 0c1e570's libggml-base, plain C, the same on every
build) for quantize_k/make_chunk_reference.py's `chunk_input()` rows (an all-zero block, an outlier) with its
`chunk_imatrix()`, and IQ1_M without one (ggml asserts for IQ1_S without one): written to chunk_sha256.json.
Run:
  .venv/bin/python tests/data/quantize_iq1/make_chunk_reference.py ~/.cache/llamactx-llamacpp/bin/libggml-base.so
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
CASES = (("IQ1_S", True), ("IQ1_M", True), ("IQ1_M", False))


def chunk_module():
    """tests/data/quantize_k/make_chunk_reference.py (chunk_input, chunk_imatrix)."""
    path = Path(__file__).parents[1] / "quantize_k" / "make_chunk_reference.py"
    spec = importlib.util.spec_from_file_location("quantize_k_chunk_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ggml_chunks(lib_path: str) -> dict[str, bytes]:
    lib = ctypes.CDLL(lib_path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    ref = chunk_module()
    x, qw = ref.chunk_input(), ref.chunk_imatrix()
    nrow, ncol = x.shape
    out = {}
    for name, with_imatrix in CASES:
        t = T[name]
        dst = np.zeros(nrow * ncol // 256 * GGML_QUANT_SIZES[t][1], np.uint8)
        lib.ggml_quantize_chunk(int(t), x.ctypes.data, dst.ctypes.data, 0, nrow, ncol,
                                qw.ctypes.data if with_imatrix else None)
        out[f"{name}{'_imatrix' if with_imatrix else ''}"] = dst.tobytes()
    return out


def main(lib_path: str) -> None:
    chunks = ggml_chunks(lib_path)
    out = {case: hashlib.sha256(data).hexdigest() for case, data in chunks.items()}
    Path(__file__).with_name("chunk_sha256.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])

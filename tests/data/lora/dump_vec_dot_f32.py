"""llama.cpp's ggml_vec_dot_f32 (ggml-cpu/vec.cpp) itself, called through ctypes from the libggml-cpu.so that
llama-cpp-python 0.3.36 loads (build 0c1e570; it exports the symbol), on fixed random vectors of every length 1..200:
every length of the tail that GCC vectorized from `sumf += x[i]*y[i]` (n % 64, n % 32 in the AVX2 build), after
0 to 3 blocks of the 4 x GGML_F32_EPR FMA loop. How that tail is summed depends on the compiler's tuning of the
build (llamactx.ggml.vec.dot_vec, docs/numerics.md), so each build's outputs go into its own folder.

Usage: $LLAMACPP/venv/bin/python tests/data/lora/dump_vec_dot_f32.py
REFERENCE_VARIANT=znver (llama.cpp built natively on Zen 4/5) or avx2 (with LLAMA_CPP_LIB_PATH at llama.cpp built
for AVX2) writes into that folder; by default this one (llama.cpp built natively on Intel).
Writes vec_dot_f32.npz: "x", "y" (N_PAIRS, N_MAX) float32 and "s" (N_PAIRS, N_MAX) float32, s[j, n - 1] =
ggml_vec_dot_f32(n, x[j, :n], y[j, :n]).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp
import numpy as np

HERE = Path(__file__).parent
N_MAX = 200
N_PAIRS = 8
SEED = 21


def load_vec_dot_f32():
    """ggml_vec_dot_f32(int n, float *s, size_t bs, const float *x, size_t bx, const float *y, size_t by, int nrc)
    from the libggml-cpu.so next to the libllama.so that llama_cpp loaded."""
    lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
    ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    f = ctypes.CDLL(str(lib_dir / "libggml-cpu.so")).ggml_vec_dot_f32
    f.restype = None
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                  ctypes.c_size_t, ctypes.c_int]
    return lib_dir, f


def main() -> None:
    lib_dir, vec_dot_f32 = load_vec_dot_f32()
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((N_PAIRS, N_MAX)).astype(np.float32)  # (N_PAIRS, N_MAX)
    y = rng.standard_normal((N_PAIRS, N_MAX)).astype(np.float32)  # (N_PAIRS, N_MAX)
    s = np.zeros((N_PAIRS, N_MAX), np.float32)  # (N_PAIRS, N_MAX)
    out = np.zeros(1, np.float32)
    for j in range(N_PAIRS):
        for n in range(1, N_MAX + 1):
            vec_dot_f32(n, out.ctypes.data, 0, x[j].ctypes.data, 0, y[j].ctypes.data, 0, 1)
            s[j, n - 1] = out[0]
    dest = HERE / os.environ.get("REFERENCE_VARIANT", "")
    dest.mkdir(exist_ok=True)
    np.savez_compressed(dest / "vec_dot_f32.npz", x=x, y=y, s=s)
    print(f"{dest / 'vec_dot_f32.npz'}: ggml_vec_dot_f32 of {lib_dir / 'libggml-cpu.so'}, n = 1..{N_MAX}")


if __name__ == "__main__":
    main()

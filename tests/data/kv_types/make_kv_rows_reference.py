"""ggml 0c1e570's own from_float rows for the KV cache types (tests/test_kv_types.py): libggml-base's
`quantize_row_{q4_1,q5_0,q5_1,iq4_nl}_ref` and libggml-cpu's `ggml_cpu_fp32_to_bf16` on fixed rows (a normal row,
wide-range rows, ties, an all-zero block). usage: LLAMA_CPP_LIB_PATH=<build>/bin python make_kv_rows_reference.py"""

import ctypes
import os
from pathlib import Path

import numpy as np

LIB = Path(os.environ.get("LLAMA_CPP_LIB_PATH", Path.home() / ".cache/llamactx-llamacpp/bin"))
base = ctypes.CDLL(str(LIB / "libggml-base.so"))
cpu = ctypes.CDLL(str(LIB / "libggml-cpu.so"))
rng = np.random.default_rng(46)
x = np.concatenate([rng.standard_normal((6, 128)), rng.standard_normal((4, 128)) * 30,
                    np.round(rng.standard_normal((4, 128)) * 4) / 2]).astype(np.float32)
x[3, 32:64] = 0  # an all-zero block
x[5, :32] = 1e-3
SIZES = {"q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}
out = {"x": x}
for name, size in SIZES.items():
    fn = getattr(base, f"quantize_row_{name}_ref")
    y = np.zeros((x.shape[0], x.shape[1] // 32 * size), np.uint8)
    for r in range(x.shape[0]):
        fn(x[r].ctypes.data_as(ctypes.c_void_p), y[r].ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.shape[1]))
    out[name] = y
y = np.zeros(x.shape, np.uint16)
cpu.ggml_cpu_fp32_to_bf16(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
out["bf16"] = y
np.savez_compressed(Path(__file__).parent / "kv_rows.npz", **out)

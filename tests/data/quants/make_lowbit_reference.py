"""llama.cpp's outputs for the low-bit quant types (lowbit_cases.py): the tiny model's prompt logits and greedy
steps (make_quant_reference.py's `reference`, -> lowbit.json / lowbit.npz) and libggml's own single mul_mat of every
case of MATMUL_CASES (-> lowbit_matmuls.npz). REFERENCE_VARIANT=avx2 (LLAMA_CPP_LIB_PATH at the AVX2 build) writes
into avx2/.

Usage: PYTHONPATH=<llama-cpp-python 0.3.36 sdist> LLAMA_CPP_LIB_PATH=<build>/bin \
    python tests/data/quants/make_lowbit_reference.py
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from lowbit_cases import MATMUL_CASES, MOE_SHAPE, MOE_TYPES, N_ROWS, case_data, moe_case  # noqa: E402
from make_quant_reference import _GGML, OUT, _InitParams, reference  # noqa: E402


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


def mul_mat_id(g: _GGML, t: int, w: np.ndarray, x: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """ggml_mul_mat_id(as, b, ids) with as (k, rows, n_expert) of type t, b = x as (k, 1, n_tokens) (each token's
    row shared by its slots), ids = selected (n_used, n_tokens). -> (n_tokens, n_used, rows) float32"""
    b, c = g.base, ctypes
    m = MOE_SHAPE
    for name, res, args in (("ggml_new_tensor_3d", c.c_void_p, [c.c_void_p, c.c_int, c.c_int64, c.c_int64, c.c_int64]),
                            ("ggml_mul_mat_id", c.c_void_p, [c.c_void_p] * 4)):
        getattr(b, name).restype, getattr(b, name).argtypes = res, args
    mem = 16 * b.ggml_tensor_overhead() + b.ggml_graph_overhead()
    ctx_w, ctx_x = (b.ggml_init(_InitParams(mem, None, True)) for _ in range(2))
    tw = b.ggml_new_tensor_3d(ctx_w, t, m["k"], m["rows"], m["n_expert"])
    tx = b.ggml_new_tensor_3d(ctx_x, 0, m["k"], 1, m["n_tokens"])  # F32
    ti = b.ggml_new_tensor_2d(ctx_x, 26, m["n_used"], m["n_tokens"])  # GGML_TYPE_I32
    ty = b.ggml_mul_mat_id(ctx_x, tw, tx, ti)
    buft = g.cpu.ggml_backend_cpu_buffer_type()
    bufs = [b.ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft) for ctx in (ctx_w, ctx_x)]
    for tensor, arr in ((tw, np.ascontiguousarray(w)), (tx, np.ascontiguousarray(x, np.float32)),
                        (ti, np.ascontiguousarray(selected, np.int32))):
        b.ggml_backend_tensor_set(tensor, arr.ctypes.data, 0, arr.nbytes)
    gf = b.ggml_new_graph(ctx_x)
    b.ggml_build_forward_expand(gf, ty)
    assert b.ggml_backend_graph_compute(g.backend, gf) == 0
    y = np.empty((m["n_tokens"], m["n_used"], m["rows"]), np.float32)
    b.ggml_backend_tensor_get(ty, y.ctypes.data, 0, y.nbytes)
    for buf in bufs:
        b.ggml_backend_buffer_free(buf)
    for ctx in (ctx_w, ctx_x):
        b.ggml_free(ctx)
    return y


def moe_matmuls() -> None:
    g = _GGML()
    arrays = {T(t).name: mul_mat_id(g, int(t), *moe_case(t)) for t in MOE_TYPES}
    np.savez_compressed(OUT / "lowbit_moe.npz", **arrays)
    print("moe", len(arrays))


if __name__ == "__main__":
    moe_matmuls()
    matmuls()
    reference("lowbit")

"""Reference outputs of llama.cpp for the tiny quant-type models (make_quant_models.py), through llama-cpp-python
0.3.36 built natively from the tree behind every reference here (build 0c1e570; ../shared/tools/build_llamacpp.sh
makes that venv).

Usage: $LLAMACPP/venv/bin/python tests/data/quants/make_quant_reference.py [name ...]
Writes tests/data/quants/<name>.json (tokens, greedy completion) and <name>.npz (logits, float32):
  prompts: for each text, llama.cpp's tokens and the logits of every position ("prompt_<i>", (n, n_vocab)); the
    lengths (40, 19, 6 tokens) take the kernels of n >= 8 and n < 8, and gemm plus gemv for n % 4 != 0
  greedy: 16 greedy tokens after the first prompt, one decode each (the n = 1 kernels), and the logits that
    chose each ("greedy", (16, n_vocab))
  and matmuls.npz: single ggml_mul_mat results of libggml itself for every (type, kernel) case of MATMUL_CASES
    (quant_matmul_cases.py: the weights and activations come from seeds), so that each kernel is checked directly
    and not only where a difference survives the next activation quantization: "<case>" (n, rows) float32 for
    each n of N_ROWS, with the weight in llama.cpp's repack buffer where llama.cpp would put it
REFERENCE_VARIANT=avx2 (with LLAMA_CPP_LIB_PATH at llama.cpp built for AVX2) writes into avx2/ instead.

On a CPU with AMX, llama.cpp's native build puts Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS/F16 weights whose shapes
allow it into its AMX buffer (other kernels; the tiny qwen2 model even crashes there). Every reference here is
the build without AMX: run with LD_PRELOAD of a shim that refuses arch_prctl(ARCH_REQ_XCOMP_PERM) (REFERENCE.md).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
from pathlib import Path

import llama_cpp
import numpy as np
from gguf import GGMLQuantizationType as T
from llama_cpp import Llama

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from quant_matmul_cases import MATMUL_CASES, N_ROWS, case_data  # noqa: E402

OUT = HERE / os.environ.get("REFERENCE_VARIANT", "")
PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world! 1 2 3", "abc de"]
N_GREEDY = 16


def reference(name: str) -> None:
    llm = Llama(model_path=str(HERE / f"tiny-quants-{name}.gguf"), n_ctx=512, n_batch=512, n_threads=2,
                logits_all=True, verbose=False, seed=0, flash_attn=False)
    out: dict = {"model": f"tiny-quants-{name}.gguf", "prompts": [], "n_vocab": llm.n_vocab()}
    arrays = {}
    for i, text in enumerate(PROMPTS):
        toks = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(toks)
        arrays[f"prompt_{i}"] = np.array(llm.scores[: len(toks)], np.float32)
        out["prompts"].append({"text": text, "tokens": toks})
    toks = out["prompts"][0]["tokens"]
    llm.reset()
    llm.eval(toks)
    gen, rows = [], []
    for _ in range(N_GREEDY):
        row = np.array(llm.scores[llm.n_tokens - 1], np.float32)
        t = int(np.argmax(row))
        rows.append(row)
        gen.append(t)
        llm.eval([t])
    out["greedy"] = gen
    arrays["greedy"] = np.stack(rows)
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(out, indent=1))
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    print(name, [len(p["tokens"]) for p in out["prompts"]], gen[:8])


_REPACK_BUFT = "_Z35ggml_backend_cpu_repack_buffer_typev"  # C++: ggml_backend_cpu_repack_buffer_type()


class _GGML:
    """The few libggml entry points a single mul_mat needs (ggml.h, ggml-alloc.h, ggml-backend.h, ggml-cpu.h)."""

    def __init__(self):
        lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
        self.base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        p, sz, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
        sig = {"ggml_init": (p, [_InitParams]), "ggml_new_tensor_2d": (p, [p, ctypes.c_int, i64, i64]),
               "ggml_mul_mat": (p, [p, p, p]), "ggml_new_graph": (p, [p]), "ggml_build_forward_expand": (None, [p, p]),
               "ggml_nbytes": (sz, [p]), "ggml_tensor_overhead": (sz, []), "ggml_graph_overhead": (sz, []),
               "ggml_free": (None, [p]), "ggml_backend_alloc_ctx_tensors_from_buft": (p, [p, p]),
               "ggml_backend_tensor_set": (None, [p, p, sz, sz]), "ggml_backend_tensor_get": (None, [p, p, sz, sz]),
               "ggml_backend_graph_compute": (ctypes.c_int, [p, p]), "ggml_backend_buffer_free": (None, [p])}
        for name, (res, args) in sig.items():
            fn = getattr(self.base, name)
            fn.restype, fn.argtypes = res, args
        for name, res, args in (("ggml_backend_cpu_init", p, []),
                                ("ggml_backend_cpu_set_n_threads", None, [p, ctypes.c_int]),
                                ("ggml_backend_cpu_buffer_type", p, []), ("ggml_cpu_has_avx512", ctypes.c_int, []),
                                (_REPACK_BUFT, p, [])):
            fn = getattr(self.cpu if hasattr(self.cpu, name) else self.base, name)
            fn.restype, fn.argtypes = res, args
        self.backend = self.cpu.ggml_backend_cpu_init()
        self.cpu.ggml_backend_cpu_set_n_threads(self.backend, 2)

    def mul_mat(self, t: int, w: np.ndarray, k: int, x: np.ndarray, repack: bool) -> np.ndarray:
        """ggml_mul_mat(W, x) with W (rows, row_bytes) stored as ggml type t. -> (n, rows) float32"""
        b = self.base
        rows, n = w.shape[0], x.shape[0]
        mem = 16 * b.ggml_tensor_overhead() + b.ggml_graph_overhead()
        ctx_w, ctx_x = (b.ggml_init(_InitParams(mem, None, True)) for _ in range(2))
        tw = b.ggml_new_tensor_2d(ctx_w, t, k, rows)
        tx = b.ggml_new_tensor_2d(ctx_x, 0, k, n)  # GGML_TYPE_F32
        ty = b.ggml_mul_mat(ctx_x, tw, tx)
        buft_w = getattr(self.cpu, _REPACK_BUFT if repack else "ggml_backend_cpu_buffer_type")()
        buf_w = b.ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, buft_w)
        buf_x = b.ggml_backend_alloc_ctx_tensors_from_buft(ctx_x, self.cpu.ggml_backend_cpu_buffer_type())
        w = np.ascontiguousarray(w)
        x = np.ascontiguousarray(x, np.float32)
        b.ggml_backend_tensor_set(tw, w.ctypes.data, 0, w.nbytes)
        b.ggml_backend_tensor_set(tx, x.ctypes.data, 0, x.nbytes)
        gf = b.ggml_new_graph(ctx_x)
        b.ggml_build_forward_expand(gf, ty)
        assert b.ggml_backend_graph_compute(self.backend, gf) == 0
        y = np.empty((n, rows), np.float32)
        b.ggml_backend_tensor_get(ty, y.ctypes.data, 0, y.nbytes)
        for buf in (buf_w, buf_x):
            b.ggml_backend_buffer_free(buf)
        for ctx in (ctx_w, ctx_x):
            b.ggml_free(ctx)
        return y


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def matmuls() -> None:
    """ggml's own mul_mat for every case of MATMUL_CASES -> matmuls.npz (+ the inputs' sha256 in matmuls.json)."""
    g = _GGML()
    avx512 = bool(g.cpu.ggml_cpu_has_avx512())
    arrays, digests = {}, {}
    for case in MATMUL_CASES:
        t, w, x = case_data(case)
        rows, k = case["rows"], case["k"]
        # repack.cpp ggml_repack_get_optimal_repack_type: IQ4_NL / MXFP4 with AVX2, Q2_K with AVX-512; ne1 % 8 == 0
        repack = rows % 8 == 0 and (t in (T.IQ4_NL, T.MXFP4) or (t == T.Q2_K and avx512))
        ys = [g.mul_mat(t, w, k, x[:n], repack) for n in N_ROWS]
        arrays[case["name"]] = np.concatenate(ys)  # (sum N_ROWS, rows)
        digests[case["name"]] = hashlib.sha256(w.tobytes() + x.tobytes()).hexdigest()
    OUT.mkdir(exist_ok=True)
    np.savez_compressed(OUT / "matmuls.npz", **arrays)
    (OUT / "matmuls.json").write_text(json.dumps({"avx512": avx512, "inputs_sha256": digests}, indent=1))
    print("matmuls", len(arrays))


if __name__ == "__main__":
    for name in sys.argv[1:] or ["k", "nl", "matmuls"]:
        matmuls() if name == "matmuls" else reference(name)

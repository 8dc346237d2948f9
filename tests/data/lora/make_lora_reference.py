"""llama.cpp's logits for SmolLM2-135M with the adapters of make_lora_adapter.py, through llama-cpp-python 0.3.36
built natively from the tree behind every reference here (build 0c1e570): `Llama(lora_path=..., lora_scale=...)`,
and for two adapters at once the C API's llama_adapter_lora_init + llama_set_adapters_lora. n_ctx 2048, n_batch 512,
2 threads, flash attention off, the whole prompt in one batch with every position's logits.

Usage: $LLAMACPP/venv/bin/python tests/data/lora/make_lora_reference.py SMOLLM2_GGUF GEMMA3_GGUF
(the paths `.venv/bin/python -c "from llamactx.embedded import *; print(smollm2_path(), gemma3_path())"` prints)
Writes reference.json (per case: adapters and scales, tokens, each position's argmax, sha256 of the (n, n_vocab)
float32 logits; `greedy`: llama-cpp-python's create_completion text at temperature 0 with one adapter) and
reference.npz (per SmolLM2 case: the last position's logits, float32 (n_vocab,)).
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
from llama_cpp import Llama

HERE = Path(__file__).parent
# REFERENCE_VARIANT=avx2 (with LLAMA_CPP_LIB_PATH at llama.cpp built for AVX2) writes into avx2/
OUT = HERE / os.environ.get("REFERENCE_VARIANT", "")
PROMPT = "The quick brown fox jumps over the lazy dog."
CASES = [  # name, model (0 SmolLM2, 1 Gemma 3), [(adapter file, scale)]
    ("a_1", 0, [("smollm2-lora.gguf", 1.0)]),
    ("a_0.5", 0, [("smollm2-lora.gguf", 0.5)]),
    ("a_1_b_0.75", 0, [("smollm2-lora.gguf", 1.0), ("smollm2-lora-b.gguf", 0.75)]),
    ("gemma3_0.5", 1, [("gemma3-lora.gguf", 0.5)]),
]

GREEDY = {"adapter": "smollm2-lora.gguf", "scale": 0.25, "prompt": "The capital of France is", "max_tokens": 12}


def case_logits(model_path: str, adapters: list[tuple[str, float]]) -> tuple[list[int], np.ndarray]:
    first, scale = adapters[0]
    llm = Llama(model_path=model_path, n_ctx=2048, n_batch=512, n_threads=2, logits_all=True, verbose=False,
                seed=0, flash_attn=False, lora_path=str(HERE / first), lora_scale=scale)
    if len(adapters) > 1:
        handles = [llm._lora_adapter]
        for name, _ in adapters[1:]:
            h = llama_cpp.llama_adapter_lora_init(llm._model.model, str(HERE / name).encode())
            if not h:
                raise RuntimeError(f"llama.cpp rejected {name}")
            handles.append(h)
        arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(handles))(*handles)
        scales = (ctypes.c_float * len(handles))(*[s for _, s in adapters])
        llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, len(handles), scales)
    toks = llm.tokenize(PROMPT.encode(), add_bos=True, special=True)
    llm.reset()
    llm.eval(toks)
    return toks, np.array(llm.scores[: len(toks)], np.float32)


def main() -> None:
    model_paths = sys.argv[1:3]
    out: dict = {"models": ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"],
                 "llama_cpp_python": llama_cpp.__version__, "prompt": PROMPT, "cases": []}
    arrays = {}
    for name, model, adapters in CASES:
        toks, logits = case_logits(model_paths[model], adapters)
        out["cases"].append({"name": name, "model": model, "adapters": [[f, s] for f, s in adapters], "tokens": toks,
                             "argmax": logits.argmax(axis=1).tolist(),
                             "sha256": hashlib.sha256(logits.tobytes()).hexdigest()})
        if model == 0:  # Gemma's 262144-token row would make the file 1.5 MB: its sha256 is the check
            arrays[name] = logits[-1]
        print(name, toks, logits.argmax(axis=1).tolist())
    llm = Llama(model_path=model_paths[0], n_ctx=2048, n_batch=512, n_threads=2, verbose=False, seed=0,
                flash_attn=False, lora_path=str(HERE / GREEDY["adapter"]), lora_scale=GREEDY["scale"])
    out["greedy"] = {**GREEDY, "text": llm.create_completion(GREEDY["prompt"], max_tokens=GREEDY["max_tokens"],
                                                           temperature=0.0)["choices"][0]["text"]}
    print(out["greedy"])
    OUT.mkdir(exist_ok=True)
    (OUT / "reference.json").write_text(json.dumps(out, indent=1))
    np.savez_compressed(OUT / "reference.npz", **arrays)


if __name__ == "__main__":
    main()

"""llama.cpp's logits with flash attention on (its CPU default), for tests/test_flash_attn.py.

Usage: $LLAMACPP/venv/bin/python tests/data/flash_attn/make_flash_attn_reference.py smollm2=GGUF gemma3=GGUF [out=DIR]
(out: where to write; by default this folder, or REFERENCE_VARIANT=avx2 its avx2/, for llama.cpp built for AVX2
loaded with LLAMA_CPP_LIB_PATH pointing at that build's libllama.so; avx512/ was made with out=).
llama-cpp-python 0.3.36 (build 0c1e570), n_ctx 1024, n_batch = n_ubatch = 512, 2 threads, flash_attn=True,
last-token logits only. Each case decodes the first n_prompt tokens of tests/data/gpl3_head.txt (add_bos as the
model says) as llama-cpp-python's eval cuts them (512 per ubatch), then `then` single tokens, and keeps the last
logits row: one case per ggml kernel (docs/numerics.md):
  tiled      100 tokens in one ubatch (>= GGML_FA_TILE_Q = 64)
  chunk      40 tokens (< 64: the one-chunk kernel, f16 accumulator)
  decode     40 tokens, then one (one token, n_kv 256 < 512: one chunk)
  split      300 tokens, then one (one token, n_kv 512: the cells split over the 2 threads)
  split_600  600 tokens (512 + 88), then one (n_kv 768)
Writes <model>.npz (case -> float32 row) and reference.json (cases, tokens).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama

HERE = Path(__file__).parent
DATA = HERE.parent
CASES = {"tiled": (100, 0), "chunk": (40, 0), "decode": (40, 1), "split": (300, 1), "split_600": (600, 1)}
MODELS = {"smollm2": list(CASES), "gemma3": ["tiled", "split"]}  # Gemma's rows are 1 MB: two of them


def main(paths: dict[str, str]) -> None:
    out = Path(paths.pop("out", HERE / os.environ.get("REFERENCE_VARIANT", "")))
    out.mkdir(parents=True, exist_ok=True)
    text = (DATA / "gpl3_head.txt").read_text()
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    meta = {"made_on": {"system_info": info.strip(), "fp16_accumulator": "AVX512_FP16 = 1" in info},
            "cases": {k: {"n_prompt": a, "then": b} for k, (a, b) in CASES.items()}, "models": {}}
    for name, path in paths.items():
        llm = Llama(model_path=path, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2,
                    flash_attn=True, verbose=False, seed=0)
        tokens = llm.tokenize(text.encode(), add_bos=True, special=False)[:700]
        rows = {}
        for case in MODELS[name]:
            n_prompt, then = CASES[case]
            llm.reset()
            llm.eval(tokens[:n_prompt])
            for t in tokens[n_prompt:n_prompt + then]:
                llm.eval([t])
            # the last decode's one output row (logits_all off: llama-cpp-python keeps no scores)
            rows[case] = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32)
        np.savez(out / f"{name}.npz", **rows)
        meta["models"][name] = {"tokens": tokens, "cases": MODELS[name]}
        print(name, {k: int(v.argmax()) for k, v in rows.items()})
    (out / "reference.json").write_text(json.dumps(meta))


if __name__ == "__main__":
    main(dict(arg.split("=", 1) for arg in sys.argv[1:]))

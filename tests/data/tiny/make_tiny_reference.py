"""Reference outputs of llama.cpp for the tiny models, through llama-cpp-python 0.3.36 built natively from the
tree behind every reference here (build 0c1e570; ../shared/tools/build_llamacpp.sh makes that venv).

Usage: $LLAMACPP/venv/bin/python tests/data/tiny/make_tiny_reference.py [name ...]
Writes tests/data/tiny/<name>.json (tokens, greedy completion) and <name>.npz (logits, float32):
  prompts: for each text, llama.cpp's tokens and the logits of every position ("prompt_<i>", (n, n_vocab))
  greedy: 64 greedy tokens after the first prompt, and the logits that chose each ("greedy", (64, n_vocab))
  tokenize (gpt-oss, whose vocabulary runs the "gpt-4o" pre-tokenizer): llama.cpp's tokens of TOKENIZE_TEXTS
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama

HERE = Path(__file__).parent
# REFERENCE_VARIANT=avx2 (with LLAMA_CPP_LIB_PATH at llama.cpp built for AVX2) writes into avx2/ instead
OUT = HERE / os.environ.get("REFERENCE_VARIANT", "")
PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world! 1 2 3",
           "def add(a, b):\n    return a + b\n"]
# flash attention runs its tiled kernel from 64 tokens of a ubatch: the -fa references add a prompt that long
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 4 + "Hello, world!"
N_GREEDY = 64
# digits, punctuation, case changes, contractions, CJK, accents, emoji, runs of spaces, tabs and newlines
TOKENIZE_TEXTS = ["In 2024, GPT-4o's tokenizer split 1234567 into 123|456|7 - didn't it? YES I'LL",
                  "  leading spaces,\ttabs\n\nand  double   spaces  ",
                  "日本語のテキスト、中文字符，한국어 텍스트!",
                  "CamelCaseWords and ALLCAPS or mixedCASE: https://example.com/path/to?x=1&y=2",
                  "naïve café – «quotes» and émojis 🙂👍🏽",
                  "line1\r\nline2\n\n\n  x/y//z\n /\n"]
TOKENIZE = ("gpt-oss",)  # the models whose references record TOKENIZE_TEXTS


def reference(name: str) -> None:
    """<name>-fa: the model tiny-<name>.gguf with flash attention on (gemma2: its soft-capped flash kernels);
    <name>-long: with n_ctx 1024, past the LongRoPE models' original context of 512 (their long factors)."""
    model, flash = (name[: -len("-fa")], True) if name.endswith("-fa") else (name, False)
    model, n_ctx = (model[: -len("-long")], 1024) if model.endswith("-long") else (model, 512)
    llm = Llama(model_path=str(HERE / f"tiny-{model}.gguf"), n_ctx=n_ctx, n_batch=512, n_threads=2,
                logits_all=True, verbose=False, seed=0, flash_attn=flash)
    out: dict = {"model": f"tiny-{model}.gguf", "prompts": [], "n_vocab": llm.n_vocab()}
    if n_ctx != 512:
        out["n_ctx"] = n_ctx
    if flash:
        out["flash_attn"] = True
    arrays = {}
    for i, text in enumerate(PROMPTS + [LONG_PROMPT] if flash else PROMPTS):
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
    if name in TOKENIZE:
        out["tokenize"] = [{"text": t, "tokens": llm.tokenize(t.encode(), add_bos=False, special=True)}
                           for t in TOKENIZE_TEXTS]
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(out, indent=1))
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    print(name, [len(p["tokens"]) for p in out["prompts"]], gen[:8])


if __name__ == "__main__":
    for name in sys.argv[1:] or ["qwen2", "qwen3", "llama3", "yarn", "mamba2", "mamba2-s128", "lfm2", "qwen3moe",
                                 "mixtral", "phi3", "gemma2", "gemma2-fa", "smollm3", "granite", "gpt-oss",
                                 "gpt-oss-fa", "gpt-oss-mxfp4", "mistral3", "phi3-longrope", "phi3-longrope-long",
                                 "phi4-mini", "phi4-mini-long"]:
        reference(name)

"""llama.cpp's tokens and embeddings for the tiny BERT model (tiny-bert.gguf, make_tiny_bert.py), through
llama-cpp-python 0.3.36 built from the tree behind every reference here (build 0c1e570).

Usage: $LLAMACPP/venv/bin/python tests/data/tiny/make_tiny_bert_reference.py
(REFERENCE_VARIANT=avx2 with LLAMA_CPP_LIB_PATH at llama.cpp built for AVX2 writes into avx2/ instead, and
REFERENCE_VARIANT=znver, llama.cpp built natively on Zen 4/5, into znver/: its mean pooling sums
ggml_vec_dot_f32's tail as GCC's AMD tuning compiled it.)
Writes tests/data/tiny/bert.json and bert.npz:
  json: "texts"; "tokens" (llm.tokenize with add_special, WPM [CLS] ... [SEP]) and "tokens_plain" (without);
        "pooling_type" (what llama.cpp read from the file)
  npz, for fa in ("fa", "nofa") (flash_attn True / False) and pooling in none, mean, cls, last:
        "<fa>_<pooling>_<i>": text i embedded alone, unnormalized (embed(normalize=False)): (n_tokens, n_embd)
            for none, (n_embd,) otherwise, float32 as llama.cpp returns them;
        "<fa>_<pooling>_batch_<i>": the same, all texts in one batch (embed(list): one llama_decode);
        "<fa>_mean_norm_<i>": embed(normalize=True) (llama-cpp-python's float64 normalization), float64.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from llama_cpp import Llama

HERE = Path(__file__).parent
OUT = HERE / os.environ.get("REFERENCE_VARIANT", "")
MODEL = HERE / "tiny-bert.gguf"
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, World! Is this the free software you want?",
    "Café naïve résumé: ÀÉÎÕÜ façade",
    "unknownwordz xyzzy qwerty... (tests) [brackets] {braces}",
    "中文 and 日本語 text, 中 文 mixed",
    "  leading   spaces\tand\ttabs\nnewlines  ",
    "GNU General Public License, version 3, 29 June 2007. Copyright (C) 2007 Free Software Foundation, Inc. "
    "Everyone is permitted to copy and distribute verbatim copies of this license document, but changing it "
    "is not allowed.",
    "a",
]
POOLINGS = {"none": 0, "mean": 1, "cls": 2, "last": 3}


def main() -> None:
    arrays: dict[str, np.ndarray] = {}
    meta: dict = {"texts": TEXTS}
    for fa in ("fa", "nofa"):
        for name, pooling in POOLINGS.items():
            llm = Llama(str(MODEL), embedding=True, pooling_type=pooling, flash_attn=fa == "fa", n_ctx=512,
                        n_batch=512, n_ubatch=512, verbose=False)
            if fa == "fa" and name == "none":
                meta["tokens"] = [llm.tokenize(t.encode(), add_bos=True, special=False) for t in TEXTS]
                meta["tokens_plain"] = [llm.tokenize(t.encode(), add_bos=False, special=False) for t in TEXTS]
                meta["tokens_special"] = llm.tokenize(b"[CLS] hello [SEP] [MASK] world", add_bos=True, special=True)
            for i, text in enumerate(TEXTS):
                arrays[f"{fa}_{name}_{i}"] = np.asarray(llm.embed(text), np.float32)
            for i, vec in enumerate(llm.embed(TEXTS)):
                arrays[f"{fa}_{name}_batch_{i}"] = np.asarray(vec, np.float32)
            if name == "mean":
                for i, text in enumerate(TEXTS):
                    arrays[f"{fa}_mean_norm_{i}"] = np.asarray(llm.embed(text, normalize=True), np.float64)
            del llm
    default = Llama(str(MODEL), embedding=True, verbose=False, n_ctx=512, n_batch=512, n_ubatch=512)
    meta["pooling_type"] = int(default.pooling_type())
    arrays["default_0"] = np.asarray(default.embed(TEXTS[0]), np.float32)
    OUT.mkdir(exist_ok=True)
    (OUT / "bert.json").write_text(_compact_json(meta))
    np.savez_compressed(OUT / "bert.npz", **arrays)
    print(f"wrote {OUT / 'bert.json'} and bert.npz ({len(arrays)} arrays)")


def _compact_json(meta: dict) -> str:
    """One line per key, one line per token list."""
    items = []
    for key, value in meta.items():
        if isinstance(value, list) and value and isinstance(value[0], list):
            body = ",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in value)
            items.append(f" {json.dumps(key)}: [\n{body}\n ]")
        else:
            items.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(items) + "\n}\n"


if __name__ == "__main__":
    main()

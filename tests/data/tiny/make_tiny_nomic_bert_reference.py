"""llama.cpp's tokens and embeddings for the tiny nomic-bert model (tiny-nomic-bert.gguf, make_tiny_nomic_bert.py),
through llama-cpp-python 0.3.36 built from the tree behind every reference here (build 0c1e570), flash attention
off, n_ctx = n_batch = n_ubatch = 512.

Usage: $LLAMACPP/venv/bin/python tests/data/tiny/make_tiny_nomic_bert_reference.py
(REFERENCE_VARIANT=avx2 with LLAMA_CPP_LIB_PATH at llama.cpp built for AVX2 writes into avx2/ instead.)
Writes tests/data/tiny/nomic-bert.json and nomic-bert.npz:
  json: "texts" (five of make_tiny_bert_reference.py's); "tokens" (llm.tokenize with add_special: [CLS] ... [SEP]);
        "pooling_type" (what llama.cpp read from the file)
  npz, for pooling in none, mean, cls, last:
        "<pooling>_<i>": text i embedded alone, unnormalized (embed(normalize=False)): (n_tokens, n_embd) for none,
            (n_embd,) otherwise, float32 as llama.cpp returns them;
        "<pooling>_batch_<i>": the same, all texts in one batch (embed(list): one llama_decode).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama

sys.path.insert(0, str(Path(__file__).parent))
from make_tiny_bert_reference import POOLINGS  # noqa: E402
from make_tiny_bert_reference import TEXTS as BERT_TEXTS  # noqa: E402

# make_tiny_bert_reference.py's texts of 26, 48, 19, 83 and 3 tokens (179 together): each token count n has
# n % 64 < 16 or n % 8 <= 4, so the tail of ggml_vec_dot_f32 over n (attention's P*V, mean pooling) is vectorized
# the same way whichever x86-64 tuning GCC compiled ggml for (a Zen 4 build and the build behind
# tests/data/tiny/bert.npz differ on the other tails: texts 0, 1 and 5, of 31, 23 and 23 tokens)
TEXTS = [BERT_TEXTS[i] for i in (2, 3, 4, 6, 7)]
HERE = Path(__file__).parent
OUT = HERE / os.environ.get("REFERENCE_VARIANT", "")
MODEL = HERE / "tiny-nomic-bert.gguf"


def main() -> None:
    arrays: dict[str, np.ndarray] = {}
    meta: dict = {"texts": TEXTS}
    for name, pooling in POOLINGS.items():
        llm = Llama(str(MODEL), embedding=True, pooling_type=pooling, flash_attn=False, n_ctx=512, n_batch=512,
                    n_ubatch=512, verbose=False)
        meta["tokens"] = [llm.tokenize(t.encode(), add_bos=True, special=False) for t in TEXTS]
        for i, text in enumerate(TEXTS):
            arrays[f"{name}_{i}"] = np.asarray(llm.embed(text), np.float32)
        for i, vec in enumerate(llm.embed(TEXTS)):
            arrays[f"{name}_batch_{i}"] = np.asarray(vec, np.float32)
        del llm
    default = Llama(str(MODEL), embedding=True, verbose=False, n_ctx=512, n_batch=512, n_ubatch=512)
    meta["pooling_type"] = int(default.pooling_type())
    del default
    OUT.mkdir(exist_ok=True)
    tokens = ",\n".join("  " + json.dumps(t) for t in meta.pop("tokens"))
    head = json.dumps(meta, ensure_ascii=False)[:-1]
    (OUT / "nomic-bert.json").write_text(f'{head}, "tokens": [\n{tokens}\n]}}\n')
    np.savez_compressed(OUT / "nomic-bert.npz", **arrays)
    print(f"wrote {OUT / 'nomic-bert.json'} and nomic-bert.npz ({len(arrays)} arrays)")


if __name__ == "__main__":
    main()

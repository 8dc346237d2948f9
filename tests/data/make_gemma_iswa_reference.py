"""Record llama.cpp's Gemma 3 logits past the sliding window, with and without its full-size SWA cache, for
tests/test_gemma_iswa.py (llama_kv_cache_iswa).

Usage: $LLAMACPP/venv/bin/python tests/data/make_gemma_iswa_reference.py [full_rows.npz]
(llama-cpp-python 0.3.36, build 0c1e570, 2 threads.) Gemma-3-270M Q4_K_M (n_swa 512), a 1536-token prompt (BOS +
the GPL-3 head, then the Zen of Python, repeated as needed), `Llama(n_ctx=2048, n_batch=512, logits_all=True,
flash_attn=False, swa_full=...)`: the prompt in three 512-token ubatches, then 32 greedy tokens one at a time.

The full rows are 262144 logits each, too many to keep, so per row and configuration it stores:
- `top_ids` (n_rows, 64) int32 / `top` float32: llama.cpp's 64 highest logits (swa_full=False's ids for both);
- `sample` (n_rows, 512) float32: the logits of 512 fixed token ids (`sample_ids`, seed 0);
- `sha256`: a digest of each full float32 row, so a test can still require bit-identical rows;
- `argmax` (n_rows,): the top token of each full row.
Rows 0..63 are prompt positions 1472..1535; rows 64..95 are the logits after decoding greedy token 0..31 (swa_full
False's greedy tokens for both). `spread` in the json: llama.cpp against itself (swa_full true vs false) over the full
rows, max |dlogit| and top-1 agreement, prompt rows and greedy rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama

HERE = Path(__file__).parent
# REFERENCE_VARIANT=avx2 (with LLAMA_CPP_LIB_PATH at llama.cpp built for AVX2) writes into its avx2/ folder
OUT = HERE / "gemma3-270m-q4_k_m" / os.environ.get("REFERENCE_VARIANT", "")
N_PROMPT, N_LAST, N_GEN, N_TOP, N_SAMPLE = 1536, 64, 32, 64, 512


def gemma_path() -> str:
    """The GGUF that llamactx.embedded.gemma3_path() assembles into the repo's .venv (this venv lacks the package)."""
    return str(HERE.parents[1] / ".venv" / "share" / "llamactx" / "gemma-3-270m-q4_k_m.gguf")


def prompt_tokens(llm: Llama) -> list[int]:
    text = (HERE / "gpl3_head.txt").read_text() + "\n\n" + (HERE / "zen.txt").read_text()
    toks = llm.tokenize(text.encode(), add_bos=True, special=False)
    while len(toks) < N_PROMPT:
        toks += llm.tokenize(text.encode(), add_bos=False, special=False)
    return toks[:N_PROMPT]


def run(path: str, swa_full: bool, forced: list[int] | None) -> tuple[list[int], list[int], np.ndarray]:
    """(prompt, greedy tokens, full rows (96, n_vocab)); with `forced`, those greedy tokens are decoded instead."""
    llm = Llama(path, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2, logits_all=True,
                flash_attn=False, swa_full=swa_full, verbose=False)
    prompt = prompt_tokens(llm)
    llm.eval(prompt)
    rows = [np.array(llm.scores[N_PROMPT - N_LAST : N_PROMPT], np.float32)]
    greedy = []
    nxt = int(np.argmax(rows[0][-1]))
    for k in range(N_GEN):
        tok = forced[k] if forced is not None else nxt
        greedy.append(tok)
        llm.eval([tok])
        row = np.array(llm.scores[N_PROMPT + k], np.float32)
        rows.append(row[None])
        nxt = int(np.argmax(row))
    return prompt, greedy, np.concatenate(rows)


def spread(a: np.ndarray, b: np.ndarray) -> dict:
    d = np.abs(a - b).max(axis=1)
    top = a.argmax(axis=1) == b.argmax(axis=1)
    return {"prompt_max_dlogit": float(d[:N_LAST].max()), "prompt_top1_agree": int(top[:N_LAST].sum()),
            "greedy_max_dlogit": float(d[N_LAST:].max()), "greedy_top1_agree": int(top[N_LAST:].sum())}


def main() -> None:
    path = gemma_path()
    prompt, greedy, rows_f = run(path, False, None)
    _, _, rows_t = run(path, True, greedy)
    n_vocab = rows_f.shape[1]
    top_ids = np.argsort(-rows_f, axis=1, kind="stable")[:, :N_TOP].astype(np.int32)  # (96, 64)
    sample_ids = np.sort(np.random.default_rng(0).choice(n_vocab, N_SAMPLE, replace=False)).astype(np.int32)
    arrays = {"top_ids": top_ids, "sample_ids": sample_ids}
    meta = {"model": "gemma-3-270m-q4_k_m.gguf", "llama_cpp_python": "0.3.36", "n_ctx": 2048, "n_batch": 512,
            "n_ubatch": 512, "prompt": prompt, "greedy": greedy, "first_pos": N_PROMPT - N_LAST,
            "spread": spread(rows_f, rows_t)}
    for key, rows in (("swa", rows_f), ("full", rows_t)):
        arrays[f"{key}_top"] = np.take_along_axis(rows, top_ids, axis=1)
        arrays[f"{key}_sample"] = rows[:, sample_ids]
        arrays[f"{key}_argmax"] = rows.argmax(axis=1).astype(np.int32)
        meta[f"{key}_sha256"] = [hashlib.sha256(r.tobytes()).hexdigest() for r in rows]
    np.savez_compressed(OUT / "iswa.npz", **arrays)
    (OUT / "iswa.json").write_text(json.dumps(meta, indent=1))
    if len(sys.argv) > 1:  # a path: also the full rows, for measurements outside the suite (not committed)
        np.savez(sys.argv[1], swa=rows_f, full=rows_t)
    print(json.dumps(meta["spread"]))


if __name__ == "__main__":
    main()

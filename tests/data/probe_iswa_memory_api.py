"""Record what llama.cpp's iSWA cache (llama_kv_cache_iswa, Gemma 3) answers to the memory API past the window:
seq_rm of ranges the SWA cache holds or no longer holds, seq_pos_min / seq_pos_max as the window slides, seq_cp /
seq_keep, can_shift. tests/memory/test_kv_cache_iswa.py replays the script on llamactx's KVCacheISWA.

Usage: $LLAMACPP/venv/bin/python tests/data/probe_iswa_memory_api.py
Writes tests/data/gemma3-270m-q4_k_m/iswa_memory_api.json: the context parameters, the script (OPS), and after each
op its result and [seq_pos_min, seq_pos_max] of sequences 0..N_SEQ-1. llama-cpp-python 0.3.36 (build 0c1e570),
low-level API, Gemma-3-270M Q4_K_M (n_swa 512), n_ctx 2048, n_ubatch 256, n_seq_max 2, kv_unified on (llamactx's
cells are one pool), swa_full off: a 2048-cell base cache and a GGML_PAD(min(2048, 512*2 + 256), 256) = 1280-cell
SWA cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp as L

HERE = Path(__file__).parent
OUT = HERE / "gemma3-270m-q4_k_m" / "iswa_memory_api.json"
MODEL = HERE.parents[1] / ".venv" / "share" / "llamactx" / "gemma-3-270m-q4_k_m.gguf"
N_SEQ, N_CTX, N_UBATCH = 2, 2048, 256

# ["decode", [[seq_ids, n_tokens], ...]]: one batch; each entry continues its sequences after their last position
OPS = [
    ["can_shift"],
    ["decode", [[[0], 1000]]],
    ["decode", [[[0], 400]]],    # past the SWA cache's 1280 cells: it drops what no window sees
    ["decode", [[[0], 1]]],
    ["seq_rm", 0, 1300, 1350],   # a middle range both caches hold
    ["seq_rm", 0, 100, 200],     # a middle range only the base cache still holds
    ["seq_rm", 0, 1380, -1],     # the tail
    ["decode", [[[1], 40]]],
    ["seq_rm", 1, -1, -1],
    ["seq_cp", 0, 1, 0, 800],    # a prefix the SWA cache no longer holds
    ["seq_rm", 1, -1, -1],
    ["seq_cp", 0, 1, -1, -1],
    ["decode", [[[1], 5]]],
    ["seq_rm", 0, 0, 1200],      # a prefix
    ["seq_rm", 0, 1000, -1],     # the tail from a position before the SWA cache's range
    ["decode", [[[0], 10], [[1], 10]]],
    ["seq_keep", 1],
    ["seq_rm", -1, 1380, 1390],  # every sequence, a partial range
    ["decode", [[[1], 3]]],
    ["seq_rm", -1, -1, -1],
    ["decode", [[[0], 5]]],
]


def run() -> list:
    model = L.llama_model_load_from_file(str(MODEL).encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = N_CTX, N_CTX, N_UBATCH, N_SEQ
    cp.n_threads = cp.n_threads_batch = 2
    cp.kv_unified = True
    cp.swa_full = False
    cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    mem = L.llama_get_memory(ctx)
    out = [[op, apply(ctx, mem, op), positions(mem)] for op in OPS]
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out


def apply(ctx, mem, op):
    kind, *args = op
    if kind == "can_shift":
        return bool(L.llama_memory_can_shift(mem))
    if kind == "decode":
        return decode(ctx, mem, args[0])
    res = getattr(L, f"llama_memory_{kind}")(mem, *args)
    return bool(res) if kind == "seq_rm" else None


def decode(ctx, mem, entries) -> int:
    n = sum(k for _, k in entries)
    batch = L.llama_batch_init(n, 0, N_SEQ)
    i = 0
    for seq_ids, k in entries:
        p0 = L.llama_memory_seq_pos_max(mem, seq_ids[0]) + 1
        for j in range(k):
            batch.token[i] = 1000 + (p0 + j) % 5000
            batch.pos[i] = p0 + j
            batch.n_seq_id[i] = len(seq_ids)
            for s, sid in enumerate(seq_ids):
                batch.seq_id[i][s] = sid
            batch.logits[i] = j == k - 1
            i += 1
    batch.n_tokens = n
    ret = L.llama_decode(ctx, batch)
    L.llama_batch_free(batch)
    return int(ret)


def positions(mem) -> list:
    return [[L.llama_memory_seq_pos_min(mem, s), L.llama_memory_seq_pos_max(mem, s)] for s in range(N_SEQ)]


if __name__ == "__main__":
    L.llama_backend_init()
    rows = run()
    OUT.write_text(json.dumps({"n_ctx": N_CTX, "n_ubatch": N_UBATCH, "n_seq_max": N_SEQ, "kv_unified": True,
                               "swa_full": False, "ops": rows}, indent=1))
    for op, res, pos in rows:
        print(f"  {json.dumps(op):40s} -> {res!s:6s} {pos}")

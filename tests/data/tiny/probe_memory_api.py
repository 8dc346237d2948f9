"""Record what llama.cpp's recurrent and hybrid memories answer to the memory API (seq_rm / seq_cp / seq_keep /
seq_add / seq_div, seq_pos_min / seq_pos_max, can_shift, coupled batches), for tests/memory/test_recurrent_api.py
to replay the same script on llamactx.

Usage: $LLAMACPP/venv/bin/python tests/data/tiny/probe_memory_api.py
Writes tests/data/tiny/memory_api.json: per model, the script (OPS) and after each op its result and
[seq_pos_min, seq_pos_max] of sequences 0..N_SEQ-1. llama-cpp-python 0.3.36 (build 0c1e570), low-level API,
n_ctx 256, n_seq_max 4; mamba2 with llama.cpp's default kv_unified off, lfm2 with kv_unified on (its KV cache
aborts on a partial seq_cp between the per-sequence streams of kv_unified off; llamactx's KV cache is one pool).
"""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp as L

HERE = Path(__file__).parent
N_SEQ = 4

# ["decode", [[seq_ids, n_tokens], ...]]: one batch; each entry continues its sequences after their last position
OPS = [
    ["can_shift"],
    ["decode", [[[0], 10]]],
    ["decode", [[[1], 6], [[2], 4]]],
    ["seq_rm", 0, 3, 5],     # a middle range
    ["seq_rm", 0, 5, -1],    # the tail from a middle position
    ["seq_rm", 0, 0, 5],     # a prefix that does not reach the last position
    ["seq_rm", 0, 10, -1],   # past the last position
    ["seq_rm", 0, 9, 10],    # exactly the last position
    ["seq_rm", -1, 3, 5],    # every sequence, a partial range
    ["seq_rm", -1, 4, 4],    # every sequence, an empty range
    ["seq_cp", 0, 3, 0, 3],  # a partial range of the source
    ["seq_add", 1, 0, -1, 5],
    ["seq_add", 1, 0, 3, 5],  # a range without the last position
    ["seq_div", 2, 0, -1, 2],
    ["decode", [[[0], 3], [[3], 2]]],
    ["seq_rm", 3, 0, -1],
    ["seq_cp", 0, 3, -1, -1],
    ["decode", [[[0], 1], [[3], 1]]],
    ["seq_keep", 1],
    ["decode", [[[0], 2]]],
    ["decode", [[[0, 1], 1]]],  # coupled sequences that have diverged: an invalid batch
    ["seq_rm", -1, -1, -1],     # every sequence
    ["seq_rm", 1, 0, -1],
    ["seq_rm", 0, -1, -1],
    ["decode", [[[0, 1], 2]]],  # tokens shared by two empty sequences: needs a non-sequential split
    ["decode", [[[2], 3]]],
]


KV_UNIFIED = {"mamba2": False, "lfm2": True}


def run(name: str) -> list:
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(str(HERE / f"tiny-{name}.gguf").encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 256, 256, 256, N_SEQ
    cp.n_threads = cp.n_threads_batch = 2
    cp.kv_unified = KV_UNIFIED[name]
    ctx = L.llama_init_from_model(model, cp)
    mem = L.llama_get_memory(ctx)
    tokens = json.loads((HERE / f"{name}.json").read_text())["prompts"][0]["tokens"]
    out = []
    for op in OPS:
        out.append([op, apply(ctx, mem, op, tokens), positions(mem)])
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out


def apply(ctx, mem, op, tokens):
    kind, *args = op
    if kind == "can_shift":
        return bool(L.llama_memory_can_shift(mem))
    if kind == "decode":
        return decode(ctx, mem, args[0], tokens)
    fn = getattr(L, f"llama_memory_{kind}")
    res = fn(mem, *args)
    return bool(res) if kind == "seq_rm" else None


def decode(ctx, mem, entries, tokens) -> int:
    n = sum(k for _, k in entries)
    batch = L.llama_batch_init(n, 0, N_SEQ)
    i = 0
    for seq_ids, k in entries:
        p0 = L.llama_memory_seq_pos_max(mem, seq_ids[0]) + 1
        for j in range(k):
            batch.token[i] = tokens[(p0 + j) % len(tokens)]
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
    result = {"n_seq_max": N_SEQ, "n_ctx": 256, "kv_unified": KV_UNIFIED,
              "models": {name: run(name) for name in ("mamba2", "lfm2")}}
    (HERE / "memory_api.json").write_text(json.dumps(result, indent=1))
    for name, rows in result["models"].items():
        print(name)
        for op, res, pos in rows:
            print(f"  {json.dumps(op):40s} -> {res!s:6s} {pos}")

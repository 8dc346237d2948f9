"""llama.cpp's rerank scores for the tiny BERT rerankers (tiny-bert-rerank.gguf and tiny-bert-rerank-labels.gguf,
make_tiny_rerank.py), through llama-cpp-python 0.3.36 built from the tree behind every reference here (build
0c1e570): `Llama(..., embedding=True, pooling_type=4 (rank), flash_attn=False)`, n_ctx = n_batch = n_ubatch = 512.

Usage: $LLAMACPP/venv/bin/python tests/data/tiny/make_tiny_rerank_reference.py
(REFERENCE_VARIANT=avx2 with LLAMA_CPP_LIB_PATH at llama.cpp built for AVX2 writes into avx2/ instead.)
Writes tests/data/tiny/rerank.json:
  "query", "documents": the (query, document) pairs scored;
  "tokens": each pair as llama-server's format_prompt_rerank makes it for a model without a rerank template
      ([BOS] query [EOS] [SEP] document [EOS], each special token where the vocabulary's add_bos / add_eos /
      add_sep asks for it, EOS falling back to SEP), the texts tokenized without special tokens;
  per model ("rerank", "rerank-labels", and "no-head": tiny-bert.gguf under pooling rank): "n_cls_out" and
      "labels" (llama_model_n_cls_out / llama_model_cls_label), "alone" (each pair decoded alone as sequence 0:
      its n_cls_out floats from llama_get_embeddings_seq) and "batch" (all pairs in one llama_decode, pair i as
      sequence i), float32 values stored as their exact hex (float.hex) so that a test can require the same bits;
  "server": what llama-server itself answered (below), when a llama-server sits beside the library.

The "server" entry: `llama-server -m tests/data/tiny/tiny-bert-rerank.gguf --reranking -fa off -c 512 -np 1
--host 127.0.0.1 --port <free>`, then POST /v1/rerank {"query": query, "documents": the first three documents}; its
response is stored as it came ("results" in llama-server's order, scores as JSON doubles) next to its usage.
`-np 1` scores the pairs one at a time, as `llamactx serve --reranking` does; with several slots llama-server may
put the pairs of one request into one batch, whose scores differ in the last bits ("batch" above).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
from llama_cpp import Llama, llama_cpp

HERE = Path(__file__).parent
OUT = HERE / os.environ.get("REFERENCE_VARIANT", "")
MODELS = {"rerank": HERE / "tiny-bert-rerank.gguf", "rerank-labels": HERE / "tiny-bert-rerank-labels.gguf",
          "no-head": HERE / "tiny-bert.gguf"}  # pooling rank without a classifier head
# llama-server beside the library llama-cpp-python loads (LLAMA_CPP_LIB_PATH: the AVX2 build), else the native one
SERVER = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(os.environ.get(
    "LLAMACPP", Path.home() / ".cache/llamactx-llamacpp")) / "bin") / "llama-server"
QUERY = "What is free software?"
# Every pair, and all of them together, is a token count n with n % 64 < 16 or n % 8 <= 4: the tail of
# ggml_vec_dot_f32 over n (attention's P*V, mean pooling) is then vectorized the same way whichever x86-64 tuning
# GCC compiled ggml for (a Zen 4 build and the build behind tests/data/tiny/bert.npz differ on the other tails).
DOCUMENTS = [
    "Free software is software that everyone can copy, change and share.",
    "The quick brown fox jumps over the dog.",
    "a",
    "Everyone is permitted to copy and distribute verbatim copies of this license document, but changing it is "
    "not allowed. The GNU General Public License is a free, copyleft license for software and other kinds of "
    "works, intended to guarantee your freedom to share and change all versions of a program.",
    "中文 and 日本語 text, 中 文 mixed",
]
N_SERVER_DOCS = 3


def pair_tokens(llm: Llama, query: str, doc: str) -> list[int]:
    """server-common.cpp format_prompt_rerank without a rerank template."""
    vocab = llm._model.vocab
    eos = llama_cpp.llama_vocab_eos(vocab)
    if eos == -1:  # LLAMA_TOKEN_NULL
        eos = llama_cpp.llama_vocab_sep(vocab)
    out = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
    out += llm.tokenize(query.encode(), add_bos=False, special=False)
    out += [eos] if llama_cpp.llama_vocab_get_add_eos(vocab) else []
    out += [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
    out += llm.tokenize(doc.encode(), add_bos=False, special=False)
    out += [eos] if llama_cpp.llama_vocab_get_add_eos(vocab) else []
    return out


def scores(llm: Llama, token_lists: list[list[int]], n_cls_out: int) -> list[list[str]]:
    """One llama_decode of the token lists, list i as sequence i: each sequence's n_cls_out floats (as hex)."""
    llm._batch.reset()
    for s, tokens in enumerate(token_lists):
        llm._batch.add_sequence(tokens, s, True)
    llm._ctx.kv_cache_clear()
    llm._ctx.decode(llm._batch)
    out = []
    for s in range(len(token_lists)):
        ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, s)
        out.append([float(np.float32(ptr[k])).hex() for k in range(n_cls_out)])
    llm._batch.reset()
    return out


def server_response(model: Path, query: str, documents: list[str]) -> dict | None:
    """llama-server's own /v1/rerank answer (the module docstring's command), or None without llama-server."""
    if not SERVER.exists():
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(SERVER), "-m", str(model), "--reranking", "-fa", "off", "-c", "512", "-np", "1", "--host",
           "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"query": query, "documents": documents}).encode()
        req = urllib.request.Request(url + "/v1/rerank", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            res = json.loads(r.read())
        return {"command": " ".join(["llama-server", "-m", model.name] + cmd[3:-1] + ["<free>"]), "response": res}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    meta: dict = {"query": QUERY, "documents": DOCUMENTS}
    for name, path in MODELS.items():
        llm = Llama(str(path), embedding=True, pooling_type=4, flash_attn=False, n_ctx=512, n_batch=512,
                    n_ubatch=512, verbose=False)
        assert int(llm.pooling_type()) == 4
        n_cls_out = int(llama_cpp.llama_model_n_cls_out(llm._model.model))
        labels = [(llama_cpp.llama_model_cls_label(llm._model.model, i) or b"").decode() for i in range(n_cls_out)]
        tokens = [pair_tokens(llm, QUERY, doc) for doc in DOCUMENTS]
        if "tokens" in meta:
            assert meta["tokens"] == tokens  # the same vocabulary
        meta["tokens"] = tokens
        meta[name] = {"n_cls_out": n_cls_out, "labels": labels,
                      "alone": [scores(llm, [t], n_cls_out)[0] for t in tokens],
                      "batch": scores(llm, tokens, n_cls_out)}
        del llm
    server = server_response(MODELS["rerank"], QUERY, DOCUMENTS[:N_SERVER_DOCS])
    if server is not None:
        meta["server"] = server
    OUT.mkdir(exist_ok=True)
    (OUT / "rerank.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT / 'rerank.json'}")


if __name__ == "__main__":
    main()

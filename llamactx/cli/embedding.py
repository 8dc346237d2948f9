"""`llamactx embedding`: llama-embedding (llama.cpp's examples/embedding/embedding.cpp).

The text of -p or -f is split at --embd-separator (default a newline; a file's final newline ends its last line)
and each part is embedded by `Embedder` (llamactx.embedding), alone from an empty memory: tokenized with
add_special and parse_special (llama-embedding's `common_tokenize`), pooled over its tokens as --pooling says
(none, mean, cls, last, rank; by default the model's `pooling_type`, mean for a model without one; none: each
token's vector is one embedding) and L2-normalised (`--embd-normalize 2`; rank scores are not). Printed as
llama-embedding prints it:
`embedding N: ...` (the whole vector for one text; the first 16 values and the cosine similarity matrix for
several), or --embd-output-format json (OpenAI's list shape), json+ (and the similarity matrix), array
([[...],[...]]) or raw (one vector a line).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from llamactx.cli.args import CommandError
from llamactx.embedding import Embedder

OUTPUT_FORMATS = ("", "json", "json+", "array", "raw")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("embedding", help="mean-pooled, normalised embeddings of -p / -f text (llama-embedding)")
    p.add_argument("-p", "--prompt", default=None, help="text; each line is embedded on its own")
    p.add_argument("-f", "--file", default=None, help="read the text from a file")
    p.add_argument("--embd-output-format", default="", choices=OUTPUT_FORMATS, metavar="FORMAT",
                   help="empty = llama-embedding's listing, json, json+, array or raw")
    p.add_argument("--embd-separator", default="\n", metavar="STRING", help="separator of the texts (default \\n)")
    return p


def split_texts(text: str, separator: str, from_file: bool) -> list[str]:
    """llama-embedding's `split_lines`; a file's trailing separator does not start an empty last text."""
    if from_file and separator and text.endswith(separator):
        text = text[: -len(separator)]
    return text.split(separator) if separator else [text]


def run_embedding(model, text: str, args) -> int:
    texts = split_texts(text, args.embd_separator, args.file is not None)
    inputs = [model.vocab.tokenize(t, add_special=True, parse_special=True) for t in texts]
    for i, tokens in enumerate(inputs):
        if not tokens:
            raise CommandError(f"embedding: text {i} ({texts[i]!r}) has no tokens to embed")
    from llamactx.lora import load_adapters

    pooling = getattr(args, "pooling", None)  # None: the model's pooling_type (embedding.default_pooling)
    embedder = Embedder(model, n_ctx=args.ctx_size, lora=load_adapters(model, args.lora), pooling=pooling,
                        n_ubatch=args.ubatch_size, n_threads=args.threads,
                        n_threads_batch=args.threads_batch or args.threads, type_k=args.cache_type_k,
                        type_v=args.cache_type_v, flash_attn=args.flash_attn)
    if embedder.pooling == "none":  # llama-embedding: every token's vector is one "embedding"
        per_token = embedder.embed_tokens(inputs)  # [(n_tokens_i, n_embd)]
        emb = np.concatenate(per_token)  # (sum n_tokens_i, n_embd)
        texts = [t for t, rows in zip(texts, per_token, strict=True) for _ in range(len(rows))]
    else:
        emb = embedder.embed(inputs)  # (n_texts, n_embd); (n_texts, 1) rank scores
    sys.stdout.write(format_embeddings(emb, texts, args.embd_output_format))
    return 0


def format_embeddings(emb: np.ndarray, texts: list[str], fmt: str) -> str:
    """llama-embedding's stdout for the normalised `emb` (n_texts, n_embd): C's %9.6f / %1.7f / %6.2f."""
    if fmt == "raw":
        body = "".join(" ".join(f"{v:1.7f}" for v in row) + "\n" for row in emb)
    elif fmt == "array":
        body = "[" + ",".join("[" + ",".join(f"{v:1.7f}" for v in row) + "]" for row in emb) + "]\n"
    elif fmt in ("json", "json+"):
        items = ",\n".join(f'    {{\n      "object": "embedding",\n      "index": {j},\n      "embedding": ['
                           + ",".join(f"{v:1.7f}" for v in row) + "]\n    }" for j, row in enumerate(emb))
        body = '{\n  "object": "list",\n  "data": [\n' + items + "\n  ]"
        if fmt == "json+" and len(emb) > 1:
            sim = cosine_similarity(emb)
            body += ',\n  "cosineSimilarity": [\n' + ",\n".join(
                "    [" + ", ".join(f"{s:6.2f}" for s in row) + " ]" for row in sim) + "\n  ]"
        body += "\n}\n"
    else:
        n = emb.shape[1] if len(emb) == 1 else min(16, emb.shape[1])
        body = "\n" + "".join(f"embedding {j}: " + "".join(f"{v:9.6f} " for v in row[:n]) + "\n"
                              for j, row in enumerate(emb))
        if len(emb) > 1:
            sim = cosine_similarity(emb)
            body += "\ncosine similarity matrix:\n\n" + "".join(f"{t[:6]:>6} " for t in texts) + "\n"
            body += "".join("".join(f"{s:6.2f} " for s in row) + texts[i][:10] + "\n" for i, row in enumerate(sim))
    return body + "\n"


def cosine_similarity(emb: np.ndarray) -> np.ndarray:
    """common.cpp `common_embd_similarity_cos` for every pair: double sums; two zero vectors are similar (1), one
    zero vector is not (0). -> (n, n)"""
    e = emb.astype(np.float64)  # (n, n_embd)
    dots = e @ e.T  # (n, n)
    norms = np.sqrt(np.diag(dots))  # (n,)
    with np.errstate(invalid="ignore", divide="ignore"):
        sim = dots / np.outer(norms, norms)
    zero = norms == 0
    sim[np.ix_(zero, ~zero)] = sim[np.ix_(~zero, zero)] = 0.0
    sim[np.ix_(zero, zero)] = 1.0
    return sim

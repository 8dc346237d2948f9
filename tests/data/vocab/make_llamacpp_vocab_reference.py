"""Record llama.cpp's tokenizer outputs on its own ggml-vocab-*.gguf files, for
tests/vocab/test_llamacpp_vocab_files.py.

Usage: PYTHONPATH=<llama-cpp-python 0.3.36 sources> LLAMA_CPP_LIB_PATH=<libllama.so of 0c1e570> \
       python tests/data/vocab/make_llamacpp_vocab_reference.py <llama.cpp>/models
(the low-level bindings only: llama_model_load_from_file with vocab_only, llama_tokenize, llama_detokenize.)

Per vocabulary, on the texts of its .inp file as test-tokenizer-0 splits them (the vocabularies without one, and
the tiny ones of this folder that make_tiny_vocabs.py writes for tokenizer models llama.cpp ships no file of, take
ggml-vocab-llama-bpe.gguf.inp's texts, or their own <name>.gguf.inp here):
- `ids` (only for vocabularies without .out; the others' are their .out lines): add_special false, parse_special
  false, test-tokenizer-0's call;
- `detokenized`: common_detokenize of those ids (llama_detokenize, remove_special false, unparse_special true),
  what test-tokenizer-0 prints as "res";
- `ids_special`: add_special true, parse_special true (a prompt's call);
- `detokenized_remove_special`: llama_detokenize of ids_special with remove_special true, unparse_special false.
"""

from __future__ import annotations

import ctypes
import json
import sys
import types
from pathlib import Path

sys.modules.setdefault("diskcache", types.ModuleType("diskcache")).Cache = object  # llama_cpp's cache, unused here
import llama_cpp as lc  # noqa: E402

SEP = "\n__ggml_vocab_test__\n"
OUT = Path(__file__).parent / "llamacpp_vocab_reference.json"


def read_texts(path: Path) -> list[str]:
    """test-tokenizer-0's read_tests: the .inp file cut at each separator; a trailing separator adds no text."""
    raw, texts, pos = path.read_bytes().decode("utf-8"), [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    return texts


def tokenize(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    n = len(data) + 16
    buf = (lc.llama_token * n)()
    k = lc.llama_tokenize(vocab, data, len(data), buf, n, add_special, parse_special)
    if k < 0:
        raise RuntimeError(f"llama_tokenize failed on {text!r}")
    return list(buf[:k])


def detokenize(vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> str:
    arr = (lc.llama_token * max(1, len(ids)))(*ids)
    n = 4096 + 64 * len(ids)
    buf = ctypes.create_string_buffer(n)
    k = lc.llama_detokenize(vocab, arr, len(ids), buf, n, remove_special, unparse_special)
    if k < 0:
        raise RuntimeError("llama_detokenize: buffer too small")
    return buf.raw[:k].decode("utf-8", errors="replace")


def main(models: Path) -> None:
    lc.llama_backend_init()
    fallback = models / "ggml-vocab-llama-bpe.gguf.inp"
    out = {}
    for path in sorted(models.glob("ggml-vocab-*.gguf")) + sorted(Path(__file__).parent.glob("tiny-*.gguf")):
        params = lc.llama_model_default_params()
        params.vocab_only = True
        model = lc.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp did not load {path}")
        vocab = lc.llama_model_get_vocab(model)
        inp = Path(f"{path}.inp")
        has_out = inp.exists() and Path(f"{path}.out").exists()
        source = inp if inp.exists() else fallback
        texts = read_texts(source)
        ids = [tokenize(vocab, t, False, False) for t in texts]
        ids_special = [tokenize(vocab, t, True, True) for t in texts]
        entry = {"texts": source.name}
        if not has_out:
            entry["ids"] = ids
        entry["detokenized"] = [detokenize(vocab, i, False, True) for i in ids]
        entry["ids_special"] = ids_special
        entry["detokenized_remove_special"] = [detokenize(vocab, i, True, False) for i in ids_special]
        out[path.name] = entry
        lc.llama_model_free(model)
    OUT.write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

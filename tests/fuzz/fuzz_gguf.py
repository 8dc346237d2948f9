"""Fuzz target: the GGUF reader and everything `Model.load` builds on it (hparams, vocab, tensor checks).

Each input is a file: GGUFFile must parse it or raise GGUFError; a file it parses goes on to `Model.load`, which
must load it or raise a LlamactxError (ModelLoadError, HParamsError, VocabError); a model that loads must then
describe itself, tokenize and detokenize without any other exception. Seeds: two tiny complete models (SPM and
byte-level BPE vocabularies, tests/gguf/tiny_model.py) and the first 64 KiB of each embedded model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.fuzz.harness import input_file, instrumented, main, scratch_file
from tests.gguf.tiny_model import write_tiny_llama

with instrumented():
    from llamactx.embedded import ModelNotInstalledError, gemma3_path, smollm2_path
    from llamactx.errors import LlamactxError
    from llamactx.gguf.reader import GGUFError, GGUFFile
    from llamactx.model import Model

HEAD_BYTES = 64 << 10
TINY = {"n_embd": 32, "n_ff": 32, "n_layer": 1, "n_head": 2, "n_head_kv": 1}
TEXT = "The cat <s> sat\n\t on  the mat: 12345 ☃ </s><|endoftext|>"
INPUT = scratch_file("gguf")


def seeds() -> dict[str, bytes]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tokenizer in ("spm", "bpe"):
            path = write_tiny_llama(Path(tmp) / f"{tokenizer}.gguf", tokenizer=tokenizer, **TINY)
            out[f"tiny-{tokenizer}.gguf"] = path.read_bytes()
    for name, where in (("smollm2", smollm2_path), ("gemma3", gemma3_path)):
        try:
            with open(where(), "rb") as f:
                out[f"{name}-head.gguf"] = f.read(HEAD_BYTES)
        except ModelNotInstalledError:
            pass
    return out


def exercise(model: Model) -> None:
    """What a caller does with a freshly loaded model before any context exists."""
    model.card()
    vocab = model.vocab
    for parse_special in (False, True):
        tokens = vocab.tokenize(TEXT, add_special=True, parse_special=parse_special)
        vocab.detokenize(tokens, remove_special=True, unparse_special=True)
    ids = range(min(vocab.n_tokens, 600))
    vocab.detokenize(ids, unparse_special=True)
    for t in ids:
        vocab.token_to_piece(t, special=True)
        vocab.is_eog(t)
    vocab.nl  # noqa: B018 - a property that tokenizes


def test_one_input(data: bytes) -> None:
    with input_file(INPUT, data) as path:
        try:
            with GGUFFile(path) as f:
                for name in f.tensors:
                    f.tensor_data(name)[:64].sum()
        except GGUFError:
            return
        try:
            model = Model.load(path)
        except LlamactxError:
            return
    try:
        exercise(model)
    except LlamactxError:
        pass
    finally:
        model.close()


if __name__ == "__main__":
    corpus = seeds()
    for data in corpus.values():  # warm up: lazy imports (HF tokenizers) are not a hang
        test_one_input(data)
    main(test_one_input, corpus)

"""Write tokenizer-only GGUFs for the tokenizer models that llama.cpp ships no ggml-vocab file of, for
tests/vocab/test_llamacpp_vocab_files.py (make_llamacpp_vocab_reference.py then records llama.cpp's outputs on them).

- tiny-rwkv.gguf (rwkv6, tokenizer model "rwkv"): '<s>' (CONTROL), the 256 single bytes, then the 400 most frequent
  2..6-byte pieces of ggml-vocab-llama-bpe.gguf.inp's texts, their texts written as convert_hf_to_gguf's
  _set_vocab_rwkv_world writes them (repr(bytes)[2:-1]), then 8 '[PADi]' (UNUSED).
- tiny-plamo2.gguf (plamo2, tokenizer model "plamo2"): the '<|plamo:*|>' controls, the 256 '<0xXX>' byte tokens,
  '</s>', then the corpus's characters (emoji and a few others left out, so that they fall back to bytes) and its
  500 most frequent 2..6-character pieces, scored -(1 + (rank % 37) / 4) so that many tie; as _set_vocab_plamo
  writes them (add_space_prefix false, EOT '<|plamo:op|>').
- tiny-whitespace.gguf (bert, tokenizer model and pre "whitespace", normalizer.lowercase true): a 700-token BPE on
  raw UTF-8 that HF tokenizers learns from the corpus split at whitespace, then the 256 '<0xXX>' byte tokens.
- tiny-hybriddna.gguf (llama, tokenizer model "hybriddna", pre "gpt-2"): a 600-token byte-level BPE learnt from the
  corpus, '<dna>' '</dna>' (CONTROL) and '<oov>', then the 4096 six-letter ACGT k-mers + U+E000 as
  _set_vocab_hybriddna writes them; its texts are tiny-hybriddna.gguf.inp (DNA spans among plain text).
- tiny-test.gguf (llama, tokenizer model "test", llama.cpp's dummy): 997 tokens, '<s>' (CONTROL) then 't1'...

Usage: python tests/data/vocab/make_tiny_vocabs.py <llama.cpp>/models
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import gguf

HERE = Path(__file__).parent


def rwkv_tokens(corpus: bytes) -> list[bytes]:
    counts: Counter[bytes] = Counter()
    for n in range(2, 7):
        counts.update(corpus[i : i + n] for i in range(len(corpus) - n + 1))
    pieces = [p for p, _ in counts.most_common(400)]
    return [bytes([b]) for b in range(256)] + sorted(pieces, key=lambda p: (len(p), p))


def write_rwkv(models: Path) -> None:
    corpus = (models / "ggml-vocab-llama-bpe.gguf.inp").read_bytes().replace(b"\n__ggml_vocab_test__\n", b"\n")
    tokens = [b"<s>"] + [repr(t)[2:-1].encode("utf-8") for t in rwkv_tokens(corpus)]
    types = [gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (len(tokens) - 1)
    tokens += [f"[PAD{i}]".encode() for i in range(len(tokens), len(tokens) + 8)]
    types += [gguf.TokenType.UNUSED] * 8
    writer = gguf.GGUFWriter(str(HERE / "tiny-rwkv.gguf"), arch="rwkv6")
    writer.add_name("tiny rwkv world vocab")
    writer.add_tokenizer_model("rwkv")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def corpus_text(models: Path) -> str:
    raw = (models / "ggml-vocab-llama-bpe.gguf.inp").read_text(encoding="utf-8")
    return raw.replace("\n__ggml_vocab_test__\n", "\n")


def train_bpe(text: str, vocab_size: int, byte_level: bool) -> tuple[list[str], list[str]]:
    """(tokens by id, merges) of a BPE that HF tokenizers learns from `text`."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if byte_level:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else []
    tok.train_from_iterator([text.lower() if not byte_level else text], trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False))
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write_vocab(name: str, arch: str, tokens: list[str], types: list[int], merges: list[str], **keys) -> None:
    writer = gguf.GGUFWriter(str(HERE / f"{name}.gguf"), arch=arch)
    writer.add_name(f"{name} vocab")
    writer.add_tokenizer_model(keys.pop("model"))
    writer.add_tokenizer_pre(keys.pop("pre"))
    writer.add_token_list([t.encode("utf-8") for t in tokens])
    writer.add_token_types(types)
    if merges:
        writer.add_token_merges(merges)
    for key, value in keys.items():
        writer.add_bool(f"tokenizer.ggml.{key}", value) if isinstance(value, bool) else writer.add_uint32(
            f"tokenizer.ggml.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_whitespace(models: Path) -> None:
    tokens, merges = train_bpe(corpus_text(models), 700, byte_level=False)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.NORMAL] * (len(tokens) - 256) + [gguf.TokenType.BYTE] * 256
    write_vocab("tiny-whitespace", "bert", tokens, types, merges, model="whitespace", pre="whitespace",
                **{"normalizer.lowercase": True})


def write_hybriddna(models: Path) -> None:
    from itertools import product

    tokens, merges = train_bpe(corpus_text(models), 600, byte_level=True)
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens += ["<dna>", "</dna>", "<oov>"]
    types += [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED]
    kmers = ["".join(k) + "\ue000" for k in product("ACGT", repeat=6)]
    tokens += kmers
    types += [gguf.TokenType.NORMAL] * len(kmers)
    write_vocab("tiny-hybriddna", "llama", tokens, types, merges, model="hybriddna", pre="gpt-2",
                bos_token_id=0, eos_token_id=0)


def write_plamo2(models: Path) -> None:
    corpus = (models / "ggml-vocab-llama-bpe.gguf.inp").read_text(encoding="utf-8").replace("\n__ggml_vocab_test__\n",
                                                                                            "\n")
    controls = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>", "<|plamo:op|>"]
    tokens = controls + [f"<0x{b:02X}>" for b in range(256)] + ["</s>"]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 4 + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL]
    chars = sorted({c for c in corpus if ord(c) < 0x1F000 and c not in "ᄀ។"})
    counts: Counter[str] = Counter()
    for n in range(2, 7):
        counts.update(corpus[i : i + n] for i in range(len(corpus) - n + 1))
    pieces = chars + [p for p, _ in counts.most_common(500) if p not in chars]
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-(1 + (rank % 37) / 4) for rank in range(len(pieces))]
    writer = gguf.GGUFWriter(str(HERE / "tiny-plamo2.gguf"), arch="plamo2")
    writer.add_name("tiny plamo2 vocab")
    writer.add_tokenizer_model("plamo2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t.encode("utf-8") for t in tokens])
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(3)
    writer.add_unk_token_id(0)
    writer.add_eot_token_id(4)
    writer.add_add_space_prefix(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_test(models: Path) -> None:
    tokens = ["<s>"] + [f"t{i}" for i in range(1, 997)]
    types = [gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * 996
    write_vocab("tiny-test", "llama", tokens, types, [], model="test", pre="default")


if __name__ == "__main__":
    write_rwkv(Path(sys.argv[1]))
    write_plamo2(Path(sys.argv[1]))
    write_whitespace(Path(sys.argv[1]))
    write_hybriddna(Path(sys.argv[1]))
    write_test(Path(sys.argv[1]))

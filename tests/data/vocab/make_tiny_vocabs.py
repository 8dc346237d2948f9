"""Write tokenizer-only GGUFs for the tokenizer models that llama.cpp ships no ggml-vocab file of, for
tests/vocab/test_llamacpp_vocab_files.py (make_llamacpp_vocab_reference.py then records llama.cpp's outputs on them).

- tiny-rwkv.gguf (rwkv6, tokenizer model "rwkv"): '<s>' (CONTROL), the 256 single bytes, then the 400 most frequent
  2..6-byte pieces of ggml-vocab-llama-bpe.gguf.inp's texts, their texts written as convert_hf_to_gguf's
  _set_vocab_rwkv_world writes them (repr(bytes)[2:-1]), then 8 '[PADi]' (UNUSED).
- tiny-plamo2.gguf (plamo2, tokenizer model "plamo2"): the '<|plamo:*|>' controls, the 256 '<0xXX>' byte tokens,
  '</s>', then the corpus's characters (emoji and a few others left out, so that they fall back to bytes) and its
  500 most frequent 2..6-character pieces, scored -(1 + (rank % 37) / 4) so that many tie; as _set_vocab_plamo
  writes them (add_space_prefix false, EOT '<|plamo:op|>').

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


if __name__ == "__main__":
    write_rwkv(Path(sys.argv[1]))
    write_plamo2(Path(sys.argv[1]))

"""The UGM, RWKV and PLaMo-2 tokenizer models on bad or edge input, and vocab_only loading of architectures.

Their ids against llama.cpp are in test_llamacpp_vocab_files.py; here a vocabulary llama.cpp refuses at load is
refused naming the key, and what llama.cpp cannot do (an RWKV byte no token covers, with no UNK) is a VocabError
instead of its endless loop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter, TokenType

from llamactx import Model
from llamactx.gguf.reader import GGUFFile
from llamactx.hparams import HParamsError
from llamactx.vocab import Vocab, VocabError
from llamactx.vocab.rwkv import unescape_rwkv_token

DATA = Path(__file__).parents[1] / "data" / "vocab"


def nomic_meta(llamacpp_src: Path) -> dict[str, object]:
    return dict(GGUFFile(llamacpp_src / "models" / "ggml-vocab-nomic-bert-moe.gguf").meta)


@pytest.mark.parametrize(
    ("charsmap", "message"),
    [
        (np.zeros(3, np.uint8), "too small for its XCDA size header"),
        (np.frombuffer((1000).to_bytes(4, "little") + b"\0" * 64, np.uint8), "XCDA size 1000 exceeds"),
        (np.zeros(64, np.float32), "not an array of 8-bit integers"),
    ],
)
def test_ugm_charsmap_refused_at_load_naming_the_key(llamacpp_src, charsmap, message):
    meta = nomic_meta(llamacpp_src)
    with pytest.raises(VocabError, match=f"precompiled_charsmap.*{message}"):
        Vocab.from_gguf_meta({**meta, "tokenizer.ggml.precompiled_charsmap": charsmap})


def test_ugm_without_charsmap_keeps_text_and_merges_spaces(llamacpp_src):
    meta = nomic_meta(llamacpp_src)
    full = Vocab.from_gguf_meta(meta)
    bare = Vocab.from_gguf_meta({k: v for k, v in meta.items() if k != "tokenizer.ggml.precompiled_charsmap"})
    text = "Hello   world"  # remove_extra_whitespaces: the run of spaces is one '▁' either way
    assert bare.tokenize(text, add_special=False) == full.tokenize(text, add_special=False)
    assert full.detokenize(full.tokenize(text, add_special=False)) == "Hello world"
    # the charsmap folds the full-width letters (NFKC); without it they stay as they are
    assert full.tokenize("ＡＢＣ", add_special=False) == full.tokenize("ABC", add_special=False)
    assert bare.tokenize("ＡＢＣ", add_special=False) != full.tokenize("ABC", add_special=False)


def test_plamo2_without_every_byte_token_refused_at_load():
    meta = dict(GGUFFile(DATA / "tiny-plamo2.gguf").meta)
    types = np.array(meta["tokenizer.ggml.token_type"])
    types[meta["tokenizer.ggml.tokens"].index("<0x41>")] = TokenType.NORMAL
    with pytest.raises(VocabError, match="byte token '<0x41>' is not set"):
        Vocab.from_gguf_meta({**meta, "tokenizer.ggml.token_type": types})


def rwkv_meta(tokens: list[str]) -> dict[str, object]:
    return {
        "general.architecture": "rwkv6",
        "tokenizer.ggml.model": "rwkv",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([TokenType.CONTROL] + [TokenType.NORMAL] * (len(tokens) - 1), np.int32),
    }


def test_rwkv_greedy_longest_match_and_uncovered_bytes():
    vocab = Vocab.from_gguf_meta(rwkv_meta(["<s>", "a", "b", "ab", "abc", "\\n", "\\x41"]))
    assert vocab.tokenize("abab", add_special=True) == [3, 3]  # never a BOS or EOS, whatever add_special
    assert vocab.tokenize("abcab\nA") == [4, 3, 5, 6]
    with pytest.raises(VocabError, match="no token starts with byte 0x78 and there is no UNK"):
        vocab.tokenize("abx")
    partial = Vocab.from_gguf_meta(rwkv_meta(["<s>", "a", "bc"]))  # 'b' is on the trie's path, no token
    with pytest.raises(VocabError, match="no token covers the bytes at offset 1"):
        partial.tokenize("abd")


def test_rwkv_unescape_as_llama_cpp():
    # llama_unescape_rwkv_token: \t \n \r, \xHH in lower-case hex, \c for any other c
    assert unescape_rwkv_token(r"\x41\n\t\r\\\'x") == b"A\n\t\r\\'x"
    assert unescape_rwkv_token(r"\xff\xc3\xa9") == b"\xff\xc3\xa9"


def write_vocab_gguf(path: Path, arch: str) -> Path:
    writer = GGUFWriter(str(path), arch=arch)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([b"<unk>", b"<s>", b"</s>", b"\xe2\x96\x81a"])
    writer.add_token_scores([0.0, 0.0, 0.0, -1.0])
    writer.add_token_types([TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.NORMAL])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_vocab_only_of_an_architecture_llamacpp_does_not_know_is_refused(tmp_path):
    path = write_vocab_gguf(tmp_path / "x.gguf", "no-such-arch")
    with pytest.raises(HParamsError, match="'no-such-arch' is not an architecture llama.cpp knows"):
        Model.load(path, vocab_only=True)


def test_vocab_only_of_an_architecture_without_a_graph(tmp_path):
    path = write_vocab_gguf(tmp_path / "x.gguf", "bloom")
    model = Model.load(path, vocab_only=True)
    assert (model.arch, model.hparams.n_vocab, model.hparams.n_layer) == ("bloom", 4, 0)
    assert model.vocab.tokenize("a a") == [1, 3, 3]
    with pytest.raises(HParamsError, match="architecture 'bloom' is not supported"):
        Model.load(path)


def test_gemma4_adds_bos_whatever_its_file_says(llamacpp_src):
    # llama_vocab::impl::load: "workaround for Gemma 4" (PR 21500) sets add_bos when the file clears it
    meta = dict(GGUFFile(llamacpp_src / "models" / "ggml-vocab-gemma-4.gguf").meta)
    vocab = Vocab.from_gguf_meta({**meta, "tokenizer.ggml.add_bos_token": False})
    assert vocab.add_bos and vocab.tokenize("Hi")[0] == vocab.bos == meta["tokenizer.ggml.bos_token_id"]
    spm = Vocab.from_gguf_meta({**nomic_meta(llamacpp_src), "tokenizer.ggml.add_bos_token": False})
    assert not spm.add_bos  # not for the others


def test_kimi_k2_may_come_without_merges(llamacpp_src):
    meta = {k: v for k, v in GGUFFile(llamacpp_src / "models" / "ggml-vocab-gpt-2.gguf").meta.items()
            if k != "tokenizer.ggml.merges"}
    with pytest.raises(VocabError, match="tokenizer.ggml.merges"):
        Vocab.from_gguf_meta(meta)  # the others need them, as in llama.cpp
    kimi = Vocab.from_gguf_meta({**meta, "tokenizer.ggml.pre": "kimi-k2"})
    ids = kimi.tokenize("Hi 日本", add_special=False)  # no merges: one byte-level symbol per token
    assert [kimi.token_get_text(i) for i in ids] == ["H", "i", "Ġ", *"æĹ¥æľ¬"]
    assert kimi.detokenize(ids) == "Hi 日本"

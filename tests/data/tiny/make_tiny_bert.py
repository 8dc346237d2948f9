"""Write tests/data/tiny/tiny-bert.gguf: a tiny synthetic BERT encoder (llama.cpp's LLM_ARCH_BERT) with a WordPiece
vocabulary, laid out as convert_hf_to_gguf.py writes a BERT model (all-MiniLM, bge).

The vocabulary (a few hundred pieces) is cut from real English text (tests/data/zen.txt and gpl3_head.txt): [PAD]
[UNK] [CLS] [SEP] [MASK] (CONTROL), the most frequent words as word starts, every letter, digit and punctuation
mark as a word start and as a continuation, and common suffixes as continuations. As in a converted BERT file,
a word-start piece carries the "▁" prefix and a continuation piece is stored without its "##". Two CJK
characters are in the vocabulary, other CJK characters are unknown.

The model: 2 layers, n_embd 64, 4 heads, n_ff 128, 128 positions, token-type and position embeddings, q/k/v,
output and FFN biases, LayerNorm eps 1e-12, `bert.pooling_type` mean, `bert.attention.causal` false. Layer 0's
matrices are F32, layer 1's F16; embeddings and norms F32.

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_bert.py
Then make llama.cpp's outputs for it with make_tiny_bert_reference.py (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import gguf
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.tiny.make_tiny_models import N_EMBD, OUT, Weights  # noqa: E402
from tests.gguf.tiny_model import finish  # noqa: E402

SPM_SPACE = "\u2581"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUFFIXES = ["s", "es", "ed", "ing", "ly", "er", "est", "tion", "ment", "ness", "able", "ful", "al", "ic", "ity",
            "ive", "ous", "ize", "en", "re", "un", "in", "on", "an", "or", "ar", "le", "se", "te", "ch", "sh", "th"]
PUNCT = list(".,;:!?'\"()[]-/&*%$#@+=<>_`~{}")
CJK = ["中", "文"]
N_WORDS = 200
N_LAYER, N_HEAD, N_FF, N_CTX = 2, 4, 128, 128


def wordpiece_vocab() -> list[str]:
    """The vocabulary as a converted BERT GGUF stores it (word starts "▁w", continuations without "##")."""
    data = Path(__file__).parents[1]
    text = (data / "zen.txt").read_text() + (data / "gpl3_head.txt").read_text()
    counts = Counter(re.findall(r"[a-z]+", text.lower()))
    words = [w for w, _ in counts.most_common(N_WORDS)]
    pieces = list(SPECIALS)
    pieces += [SPM_SPACE + w for w in words]
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    pieces += [SPM_SPACE + c for c in chars + PUNCT + CJK if SPM_SPACE + c not in pieces]
    pieces += [c for c in chars]
    pieces += [s for s in SUFFIXES if s not in pieces]
    return pieces


def add_wordpiece_vocab(w: gguf.GGUFWriter) -> int:
    """The vocabulary's metadata, as convert_hf_to_gguf.py writes a BERT tokenizer; returns its size."""
    tokens = wordpiece_vocab()
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL) for t in tokens])
    w.add_token_type_count(2)
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_bos_token_id(ids["[CLS]"])  # convert_hf_to_gguf: BERT's [CLS] is the BOS token
    w.add_sep_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_mask_token_id(ids["[MASK]"])
    return len(tokens)


def main() -> Path:
    _, w = bert_writer(OUT / "tiny-bert.gguf", "tiny bert", gguf.PoolingType.MEAN)
    return finish(w)


def bert_writer(path: Path, title: str, pooling: gguf.PoolingType) -> tuple[Weights, gguf.GGUFWriter]:
    """The tiny BERT's metadata and tensors, not yet written (make_tiny_rerank.py adds a classifier head)."""
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name(title)
    n_vocab = add_wordpiece_vocab(w)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    wt = Weights(w, 11, T.F32)
    wt.mat("token_embd.weight", N_EMBD, n_vocab, scale=1.0)
    wt.mat("token_types.weight", N_EMBD, 2, scale=0.5)
    wt.mat("position_embd.weight", N_EMBD, N_CTX, scale=0.5)
    wt.vec("token_embd_norm.weight", (N_EMBD,), 1.0)
    wt.vec("token_embd_norm.bias", (N_EMBD,))
    for il in range(N_LAYER):
        b = f"blk.{il}."
        kind = T.F32 if il == 0 else T.F16
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            wt.mat(b + name + ".weight", N_EMBD, N_EMBD, kind=kind)
            wt.vec(b + name + ".bias", (N_EMBD,))
        wt.vec(b + "attn_output_norm.weight", (N_EMBD,), 1.0)
        wt.vec(b + "attn_output_norm.bias", (N_EMBD,))
        wt.mat(b + "ffn_up.weight", N_EMBD, N_FF, kind=kind)
        wt.vec(b + "ffn_up.bias", (N_FF,))
        wt.mat(b + "ffn_down.weight", N_FF, N_EMBD, kind=kind)
        wt.vec(b + "ffn_down.bias", (N_EMBD,))
        wt.vec(b + "layer_output_norm.weight", (N_EMBD,), 1.0)
        wt.vec(b + "layer_output_norm.bias", (N_EMBD,))
    return wt, w


if __name__ == "__main__":
    print(main())

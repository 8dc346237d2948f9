"""The vocabulary: tokenize / detokenize / token_to_piece (src/llama-vocab.*).

    vocab.py        Vocab: the model's tokens, scores, types and special tokens; the public face
    pretok.py       pre-tokenizer regexes per tokenizer.ggml.pre (llama-vocab.cpp, unicode.cpp)
    special.py      special tokens, attributes and the partition of text around them
    tokenizers.py   the SPM and BPE tokenizer sessions
"""

from llamactx.vocab.vocab import TOKEN_NULL, Vocab, VocabError

__all__ = ["TOKEN_NULL", "Vocab", "VocabError"]

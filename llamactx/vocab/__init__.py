"""The vocabulary: tokenize / detokenize / token_to_piece (src/llama-vocab.*).

    vocab.py        Vocab: the model's tokens, scores, types and special tokens; the public face
    pretok.py       unicode_regex_split: the pre-tokenizer regexes run over text (unicode.cpp)
    pre_types.py    tokenizer.ggml.pre -> regexes and settings of each pre-tokenizer type (llama-vocab.cpp)
    special.py      special tokens, attributes and the partition of text around them
    detokenize.py   byte-level BPE pieces back to bytes, and detokenize's clean_spaces passes
    tokenizers.py   the SPM and BPE tokenizer sessions
    bpe_sessions.py the whitespace and hybriddna BPE sessions (text cut before BPE)
    wpm.py          the WPM (BERT WordPiece) tokenizer session
    ugm.py          the UGM (T5 unigram) tokenizer session and its precompiled charsmap
    rwkv.py         the RWKV "world" tokenizer session and its token text escapes
    plamo2.py       the PLaMo-2 tokenizer session
    dummy.py        llama.cpp's dummy "test" tokenizer (hashes of 5-byte chunks)
"""

from llamactx.vocab.vocab import TOKEN_NULL, Vocab, VocabError

__all__ = ["TOKEN_NULL", "Vocab", "VocabError"]

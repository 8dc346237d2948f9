"""Vocab against llama.cpp: tokenization, detokenization, special tokens and attributes.

Golden data: tests/data/*/reference.json (llama.cpp through llama-cpp-python). The few expectations not in
reference.json (EOT of SmolLM2, the other pre-tokenizer types, Gemma with add_space_prefix) were produced with
the same llama.cpp tree (0c1e570) built natively, through llama_tokenize / llama_detokenize / llama_vocab_*.
"""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

import numpy as np
import pytest

from llamactx.embedded import ModelNotInstalledError, gemma3_path, smollm2_path
from llamactx.vocab import Vocab, VocabError
from llamactx.vocab.pretok import GPT2, LLAMA3, QWEN2, PreTokenizer, collapse_char
from llamactx.vocab.special import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNUSED,
    ATTR_USER_DEFINED,
    TOKEN_NULL,
)

DATA = Path(__file__).parents[1] / "data"
MODELS = {
    "smollm2": ("smollm2-135m-instruct-q4_1", smollm2_path),
    "gemma3": ("gemma3-270m-q4_k_m", gemma3_path),
}


def load_meta(path: Path) -> dict[str, object]:
    """GGUF metadata as Vocab.from_gguf_meta takes it (the one place this file reads GGUF)."""
    from llamactx.gguf.reader import GGUFFile

    return GGUFFile(path).meta


@pytest.fixture(scope="module")
def metas() -> dict[str, dict[str, object]]:
    out = {}
    for name, (_, path_fn) in MODELS.items():
        try:
            out[name] = load_meta(path_fn())
        except ModelNotInstalledError as e:
            pytest.skip(str(e))
    return out


@pytest.fixture(scope="module")
def vocabs(metas) -> dict[str, Vocab]:
    return {name: Vocab.from_gguf_meta(meta) for name, meta in metas.items()}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, vocabs) -> tuple[Vocab, dict]:
    ref = json.loads((DATA / MODELS[request.param][0] / "reference.json").read_text())
    return vocabs[request.param], ref


# ---- llama.cpp's reference outputs -------------------------------------------------------------------------


def test_reference_tokenize(model):
    vocab, ref = model
    for case in ref["tokenize"]:
        text = case["text"]
        assert (
            vocab.tokenize(text, add_special=False, parse_special=False)
            == case["add_special_false_parse_special_false"]
        ), text
        assert (
            vocab.tokenize(text, add_special=True, parse_special=True)
            == case["add_special_true_parse_special_true"]
        ), text


def test_reference_prompts_and_perplexity_tokens(model):
    vocab, ref = model
    for case in ref["prompts"]:
        assert vocab.tokenize(case["text"], add_special=True, parse_special=True) == case["tokens"]
    for case in ref["greedy"]:
        assert vocab.tokenize(case["text"], add_special=True, parse_special=True) == case["prompt_tokens"]
    # the whole zen.txt (856 bytes, not truncated): n_tokens == len(tokens) == 203 for both models
    zen = (DATA / "zen.txt").read_text()
    tokens = vocab.tokenize(zen, add_special=True, parse_special=False)
    assert tokens == ref["perplexity"]["tokens"]
    assert len(tokens) == ref["perplexity"]["n_tokens"]


def test_detokenize_greedy_completions(model):
    vocab, ref = model
    for case in ref["greedy"]:
        assert vocab.detokenize(case["completion_tokens"]) == case["completion_text"]


def test_roundtrip_reference_strings(model):
    # llama.cpp round-trips every reference string for these two models: SmolLM2 (smollm pre-tokenizer) and
    # Gemma 3 (add_space_prefix False) have clean_spaces off, and no text is normalized on the way in
    vocab, ref = model
    for case in ref["tokenize"]:
        text = case["text"]
        assert vocab.detokenize(vocab.tokenize(text, add_special=False)) == text


def test_detokenize_remove_special(vocabs):
    gemma = vocabs["gemma3"]
    tokens = gemma.tokenize("Hi<end_of_turn>", add_special=True, parse_special=True)
    assert tokens[0] == gemma.bos and tokens[-1] == 106
    assert gemma.detokenize(tokens) == "Hi"
    assert gemma.detokenize(tokens, unparse_special=True) == "<bos>Hi<end_of_turn>"
    assert gemma.detokenize(tokens, remove_special=True, unparse_special=True) == "Hi<end_of_turn>"


# ---- pieces, bytes, ids ------------------------------------------------------------------------------------


def test_multibyte_character_split_across_tokens(vocabs):
    smol = vocabs["smollm2"]
    tokens = smol.tokenize("日本語")  # byte-level: one character spans two tokens
    pieces = [smol.token_to_piece(t) for t in tokens]
    assert any(_invalid_utf8(p) for p in pieces)
    assert b"".join(pieces).decode() == "日本語" == smol.detokenize(tokens)

    gemma = vocabs["gemma3"]
    char = "\U0010fffd"  # not in Gemma's vocab: byte fallback <0xF4><0x8F><0xBF><0xBD>
    tokens = gemma.tokenize(char, add_special=False)
    assert [gemma.token_get_text(t) for t in tokens] == ["<0xF4>", "<0x8F>", "<0xBF>", "<0xBD>"]
    assert [gemma.token_to_piece(t) for t in tokens] == [b"\xf4", b"\x8f", b"\xbf", b"\xbd"]
    assert gemma.detokenize(tokens) == char
    assert gemma.detokenize(tokens[:2]) == "\ufffd"  # a cut-off character is U+FFFD, not an exception


def test_invalid_utf8_becomes_replacement_character(vocabs):
    gemma, smol = vocabs["gemma3"], vocabs["smollm2"]
    ff = gemma.tokenize("\U0010fffd", add_special=False)[0]
    assert gemma.detokenize([gemma.tokenize("a", add_special=False)[0], ff]) == "a\ufffd"
    tokens = smol.tokenize("日")  # byte-level: the second token alone holds stray continuation bytes
    assert len(tokens) == 2
    assert set(smol.detokenize(tokens[1:])) == {"\ufffd"}


def test_out_of_range_ids_raise(vocabs):
    for vocab in vocabs.values():
        n = vocab.n_tokens
        calls = [("token_to_piece", n), ("detokenize", [1, -1]), ("token_get_text", n + 5)]
        calls += [("token_get_attr", -2), ("token_get_score", n), ("is_eog", n)]
        for method, arg in calls:
            with pytest.raises(ValueError, match=f"n_tokens={n}"):
                getattr(vocab, method)(arg)
        assert vocab.is_eog(TOKEN_NULL) is False


def test_lone_surrogate_raises(vocabs):
    with pytest.raises(ValueError, match="surrogate"):
        vocabs["smollm2"].tokenize("a\ud800b")


# ---- special tokens and attributes -------------------------------------------------------------------------


def test_special_ids(vocabs):
    smol, gemma = vocabs["smollm2"], vocabs["gemma3"]
    assert (smol.model_type, smol.pre_type, smol.n_tokens) == ("gpt2", "smollm", 49152)
    assert (smol.bos, smol.eos, smol.unk, smol.pad, smol.sep, smol.nl) == (1, 2, 0, 2, TOKEN_NULL, 198)
    assert smol.eot == 0  # llama_vocab_eot: '<|endoftext|>', found by text before '<|im_end|>'
    assert (smol.add_bos, smol.add_eos) == (False, False)
    # '<reponame>' is the FIM repo token, which llama.cpp also counts as end-of-generation
    assert {t for t in range(smol.n_tokens) if smol.is_eog(t)} == {0, 2, 4}

    assert (gemma.model_type, gemma.pre_type, gemma.n_tokens) == ("llama", "default", 262144)
    assert (gemma.bos, gemma.eos, gemma.eot, gemma.unk, gemma.pad, gemma.nl) == (2, 1, 106, 3, 0, 248)
    assert (gemma.add_bos, gemma.add_eos, gemma.add_space_prefix) == (True, False, False)
    assert {t for t in range(gemma.n_tokens) if gemma.is_eog(t)} == {1, 106, 212}  # <eos> <end_of_turn> </s>


def test_token_attributes(vocabs, metas):
    gemma, smol = vocabs["gemma3"], vocabs["smollm2"]
    ids = {gemma.token_get_text(i): i for i in range(300)}
    assert gemma.token_get_attr(ids["<start_of_turn>"]) == ATTR_CONTROL
    assert gemma.token_get_attr(ids["<unused0>"]) == ATTR_CONTROL | ATTR_UNUSED  # control + 'unused' in text
    assert gemma.token_get_attr(ids["\n"]) == ATTR_USER_DEFINED
    assert gemma.token_get_attr(ids["<0x0A>"]) == ATTR_BYTE
    hello = gemma.tokenize("Hello", add_special=False)[0]
    assert gemma.token_get_attr(hello) == ATTR_NORMAL
    assert gemma.is_control(ids["<start_of_turn>"]) and not gemma.is_control(hello)
    assert gemma.token_get_score(hello) == float(metas["gemma3"]["tokenizer.ggml.scores"][hello]) == -8765.0
    assert gemma.token_get_score(gemma.bos) == -1000.0
    assert smol.token_get_score(5) == 0.0  # SmolLM2's GGUF has no scores
    assert smol.token_get_attr(2) == ATTR_CONTROL and smol.token_get_text(2) == "<|im_end|>"
    assert smol.token_get_attr(smol.tokenize("Hello")[0]) == ATTR_NORMAL


def test_token_to_piece(vocabs):
    gemma, smol = vocabs["gemma3"], vocabs["smollm2"]
    sot = gemma.tokenize("<start_of_turn>", add_special=False, parse_special=True)
    assert sot == [105]
    assert gemma.token_to_piece(105) == b"" and gemma.token_to_piece(105, special=True) == b"<start_of_turn>"
    assert gemma.token_to_piece(gemma.tokenize(" Hello", add_special=False)[0]) == b" Hello"  # '▁' -> ' '
    assert gemma.token_to_piece(gemma.tokenize("\t\t", add_special=False)[0]) == b"\t\t"  # user-defined
    assert smol.token_to_piece(smol.tokenize(" world")[0]) == b" world"  # byte-level 'Ġworld'
    assert smol.token_to_piece(1) == b"" and smol.token_to_piece(1, special=True) == b"<|im_start|>"


def test_user_defined_tokens_split_without_parse_special(vocabs):
    # every Gemma USER_DEFINED token (whitespace runs, HTML tags, ...) tokenizes to itself even with
    # parse_special off; CONTROL tokens only with parse_special on. '</s>' is USER_DEFINED in the GGUF but
    # llama.cpp adds CONTROL to every end-of-generation text, so it is cut out only with parse_special.
    gemma = vocabs["gemma3"]
    user = [i for i in range(gemma.n_tokens) if gemma.token_get_attr(i) == ATTR_USER_DEFINED]
    assert len(user) == 164
    assert gemma.token_get_attr(212) == ATTR_USER_DEFINED | ATTR_CONTROL
    assert gemma.tokenize("</s>", add_special=False) == [954, 236751, 236813]
    assert gemma.tokenize("</s>", add_special=False, parse_special=True) == [212]
    for i in user:
        text = gemma.token_get_text(i)
        assert gemma.tokenize(text, add_special=False) == [i], repr(text)
    control = [i for i in gemma.special_cache if gemma.token_get_attr(i) == ATTR_CONTROL]
    for i in control:
        text = gemma.token_get_text(i)
        assert gemma.tokenize(text, add_special=False, parse_special=True) == [i]
        assert gemma.tokenize(text, add_special=False, parse_special=False) != [i]


def test_byte_tokens(vocabs):
    gemma = vocabs["gemma3"]
    byte_ids = [i for i in range(gemma.n_tokens) if gemma.token_get_attr(i) == ATTR_BYTE]
    assert len(byte_ids) == 256
    for i in byte_ids:
        value = int(gemma.token_get_text(i)[3:5], 16)
        assert gemma.token_to_piece(i) == bytes([value])


def test_overlapping_and_nested_specials(vocabs):
    # tokenizer_st_partition cuts the longest special first, everywhere, before any shorter one
    gemma = vocabs["gemma3"]
    assert gemma.tokenize("\n\n\n\n\n", add_special=False) == [111]  # one 5-newline token, not 3+2
    assert gemma.tokenize("x   \t\t<b><start_of_turn>", add_special=False, parse_special=True) == [
        gemma.tokenize("x", add_special=False)[0],
        139,
        255969,
        gemma.tokenize("<b>", add_special=False)[0],
        105,
    ]


# ---- other configurations, checked against the same llama.cpp build ------------------------------------

PRE_TEXT = "Hi 'S there!! 1234567 naïve—\u00a0x\t\t\n\n  y   Ωμέγα 😀 a`b c。d  \r\n<|im_start|> fin 3.14"
_WORDS = "67 665 10095 216 33 34 35 36 37 38 39 15486 46494 1265 15442 104 1656"
_TAIL = "329 256 5664 119 16674 34075 23098 8998 40303 218 253 80 82 265 19076 84 256"
_END = "44 108 306 79 3738 108 46 1501 216 35 30 33 36"
PRE_GOLDEN = {
    "default": f"26843 216 23 {_WORDS} 8866 {_TAIL} 2738 {_END}",
    "falcon": f"26843 216 23 {_WORDS} 8866 {_TAIL} 2738 {_END}",
    "llama-bpe": f"26843 637 {_WORDS} 1116 216 {_TAIL} 2738 {_END}",
    "qwen2": f"26843 637 {_WORDS} 1116 216 {_TAIL} 2738 {_END}",
    "gpt-2": f"26843 637 {_WORDS} 8866 {_TAIL} 201 198 {_END}",
    "deepseek-coder": f"26843 637 {_WORDS} 198 198 216 {_TAIL} 201 198 {_END}",
    "laguna": f"26843 637 {_WORDS} 1116 216 {_TAIL} 201 198 {_END}",
    "bloom": f"26843 637 {_WORDS} 8866 {_TAIL} 2738 {_END}",
}


@pytest.mark.parametrize("pre", list(PRE_GOLDEN))
def test_other_pre_tokenizers_with_smollm_vocab(metas, pre):
    vocab = Vocab.from_gguf_meta({**metas["smollm2"], "tokenizer.ggml.pre": pre})
    expected = [int(t) for t in PRE_GOLDEN[pre].split()]
    assert vocab.tokenize(PRE_TEXT, add_special=False, parse_special=False) == expected


def test_clean_spaces_gpt2(metas):
    # pre 'gpt-2' has clean_spaces on: llama_detokenize's three passes
    vocab = Vocab.from_gguf_meta({**metas["smollm2"], "tokenizer.ggml.pre": "gpt-2"})
    text = "a , b . c ' d 's e 're f 't g 'll ?"
    assert vocab.detokenize(vocab.tokenize(text)) == "a, b. c'd's e're f 't g 'll?"


def test_spm_add_space_prefix(metas):
    meta = {**metas["gemma3"], "tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.add_eos_token": True}
    vocab = Vocab.from_gguf_meta(meta)
    text = "Hello<start_of_turn>world  x"
    expected = "26352 236820 3041 236779 1340 236779 887 236813 12392 138 1123"  # '<start_of_turn>' as text
    assert vocab.tokenize(text, add_special=False) == [int(t) for t in expected.split()]
    tokens = vocab.tokenize(text, add_special=True, parse_special=True)
    assert tokens == [2, 26352, 105, 1902, 138, 1123, 1]
    assert vocab.detokenize(tokens) == " Hello world   x"
    unparsed = vocab.detokenize(tokens, remove_special=True, unparse_special=True)
    assert unparsed == " Hello<start_of_turn> world   x"


def test_spm_segments_merge_like_the_whole_fragment(vocabs):
    # SpmTokenizer cuts fragments into independently merged (and cached) segments: same ids as one merge over
    # the whole fragment, which is what llama.cpp does
    spm = vocabs["gemma3"]._tokenizer()
    rng = random.Random(0)
    cjk = "".join(rng.choice("日本語のテキスト中文文本한국어") for _ in range(300))  # one long segment
    mixed = "".join(
        rng.choice(["a>", "</", " ", "  ", "x", "é", "ab", "<0x41>", "\u2581"]) for _ in range(200)
    )
    texts = [(DATA / "zen.txt").read_text(), cjk, mixed]
    for text in texts:
        escaped = text.replace(" ", "\u2581")
        assert spm.tokenize(escaped) == spm._merge(escaped)


def test_from_gguf_meta_errors(metas):
    meta = metas["smollm2"]
    with pytest.raises(ValueError, match="tokenizer.ggml.model"):
        Vocab.from_gguf_meta({k: v for k, v in meta.items() if k != "tokenizer.ggml.model"})
    with pytest.raises(ValueError, match="'no-such-model' is not supported"):
        Vocab.from_gguf_meta({**meta, "tokenizer.ggml.model": "no-such-model"})
    with pytest.raises(ValueError, match="tokenizer.ggml.pre"):
        Vocab.from_gguf_meta({**meta, "tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(ValueError, match="tokenizer.ggml.tokens"):
        Vocab.from_gguf_meta({**meta, "tokenizer.ggml.tokens": [1, 2, 3]})
    with pytest.raises(ValueError, match="tokenizer.ggml.merges"):
        Vocab.from_gguf_meta({k: v for k, v in meta.items() if k != "tokenizer.ggml.merges"})
    with pytest.raises(ValueError, match="token_type' has 3 entries"):
        Vocab.from_gguf_meta({**meta, "tokenizer.ggml.token_type": meta["tokenizer.ggml.token_type"][:3]})
    with pytest.raises(ValueError, match="twice"):
        Vocab.from_gguf_meta(
            {**meta, "tokenizer.ggml.tokens": ["a", "b", "a"], "tokenizer.ggml.token_type": []}
        )


# ---- hostile vocab metadata (issue 12) --------------------------------------------------------------------


def test_score_and_token_type_arrays_must_match_the_tokens(metas):
    # longer arrays were accepted silently: they cannot describe the same tokens
    meta = metas["gemma3"]
    n = len(meta["tokenizer.ggml.tokens"])
    for key, extra in (("tokenizer.ggml.scores", 0.5), ("tokenizer.ggml.token_type", 1)):
        longer = np.append(meta[key], extra)
        with pytest.raises(VocabError, match=rf"'{key}' has {n + 1} entries for the {n} tokens"):
            Vocab.from_gguf_meta({**meta, key: longer})


@pytest.mark.parametrize("bad, index", [("Ġthe", 7), ("Ġ", 0), ("a ", 3), ("", 12)])
def test_malformed_merges_rejected(metas, bad, index):
    # llama.cpp stores an empty pair for these; we refuse the file, naming the entry
    meta = metas["smollm2"]
    merges = list(meta["tokenizer.ggml.merges"])
    merges[index] = bad
    with pytest.raises(VocabError, match=rf"'tokenizer.ggml.merges'\[{index}\] = {re.escape(repr(bad))} is not two"):
        Vocab.from_gguf_meta({**meta, "tokenizer.ggml.merges": merges})


@pytest.mark.parametrize("value", [49152, 10**9, -3])
def test_out_of_range_special_id_keeps_default_with_llama_cpp_warning(metas, caplog, value):
    # used to fall back to the default silently
    meta = {**metas["smollm2"], "tokenizer.ggml.eos_token_id": value}
    with caplog.at_level(logging.WARNING, logger="llamactx.vocab"):
        vocab = Vocab.from_gguf_meta(meta)
    assert vocab.eos == 11  # BPE's default EOS
    assert f"bad special token: 'tokenizer.ggml.eos_token_id' = {value} is outside [0, 49152), using default " \
           "id 11" in caplog.text


def test_non_integer_special_id_rejected(metas):
    with pytest.raises(VocabError, match="'tokenizer.ggml.bos_token_id' = 'one' is not an integer token id"):
        Vocab.from_gguf_meta({**metas["smollm2"], "tokenizer.ggml.bos_token_id": "one"})


def test_tokens_that_are_not_utf8_stay_their_bytes(metas):
    # the reader keeps undecodable bytes as surrogates: a CONTROL token of them used to raise UnicodeEncodeError at
    # load, and HF's BPE vocab refused them at the first tokenize
    meta = metas["smollm2"]
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[4] = b"<\xff\xfe>".decode("utf-8", "surrogateescape")  # '<reponame>', a CONTROL token
    tokens[300] = b"\xc3".decode("utf-8", "surrogateescape")  # a NORMAL token
    vocab = Vocab.from_gguf_meta({**meta, "tokenizer.ggml.tokens": tokens})
    assert vocab.token_to_piece(4, special=True) == b"<\xff\xfe>"
    assert vocab.token_to_piece(300).startswith(b"[UNK_BYTE_0x")
    assert vocab.tokenize("Hello world", add_special=False) == [19556, 905]


# ---- the hand-written splitters of unicode.cpp, ported line by line as oracles -------------------------


def _flag(text: str, pos: int) -> str | None:
    # unicode_cpt_flags of one codepoint as W(hitespace) / L(etter) / N(umber) / O(ther); None out of range
    if not 0 <= pos < len(text):
        return None
    c = text[pos]
    k = c if c.isascii() else collapse_char(c)
    if k in "\t\n\x0b\x0c\r ":
        return "W"
    if k.isascii() and k.isalpha() or k == "\xd2":
        return "L"
    return "N" if k.isdigit() and k.isascii() or k == "\xd1" else "O"


def _ref_custom(text: str, kind: str) -> list[str]:
    """unicode_regex_split_custom_gpt2 / _llama3 / _qwen2 over one chunk."""
    out: list[str] = []
    prev = pos = 0

    def add(end: int) -> None:
        nonlocal prev
        if end > prev:
            out.append(text[prev:end])
        prev = end

    def low(c: str) -> str:
        return c.lower() if c.isascii() else c

    n = len(text)
    while pos < n:
        c, f = text[pos], _flag(text, pos)
        if c == "'" and pos + 1 < n:
            nxt = text[pos + 1] if kind == "gpt2" else low(text[pos + 1])
            if nxt in "stmd":
                pos += 2
                add(pos)
                continue
            if pos + 2 < n:
                nxt2 = text[pos + 2] if kind == "gpt2" else low(text[pos + 2])
                if nxt + nxt2 in ("re", "ve", "ll"):
                    pos += 3
                    add(pos)
                    continue
        if kind != "gpt2":
            if not (c in "\r\n" or f == "N") and (f == "L" or _flag(text, pos + 1) == "L"):
                pos += 1
                while _flag(text, pos) == "L":
                    pos += 1
                add(pos)
                continue
            if f == "N":
                ini = pos
                while _flag(text, pos) == "N" and (kind == "llama3" or pos == ini):
                    pos += 1
                    if kind == "llama3" and pos - ini >= 3:
                        add(pos)
                        ini = pos
                add(pos)
                continue
        f2 = _flag(text, pos + 1) if c == " " else f
        if kind == "gpt2" and f2 in ("L", "N"):
            pos += c == " "
            while _flag(text, pos) == f2:
                pos += 1
            add(pos)
            continue
        if f2 not in ("W", "L", "N") and (kind != "gpt2" or f2 is not None):
            pos += c == " "
            while _flag(text, pos) == "O":
                pos += 1
            while kind != "gpt2" and pos < n and text[pos] in "\r\n":
                pos += 1
            add(pos)
            continue
        nws, last_rn = 0, 0
        while _flag(text, pos + nws) == "W":
            if text[pos + nws] in "\r\n":
                last_rn = pos + nws + 1
            nws += 1
        if kind != "gpt2" and last_rn > 0:
            pos = last_rn
        elif nws > 1 and pos + nws < n:
            pos += nws - 1
        elif nws > 0:
            pos += nws
        else:
            pos += 1
        add(pos)
    return out


@pytest.mark.parametrize(("kind", "expr"), [("gpt2", GPT2), ("llama3", LLAMA3), ("qwen2", QWEN2)])
def test_custom_splitters_match_unicode_cpp(kind, expr):
    pre = PreTokenizer((expr,))
    rng = random.Random(1)
    alphabet = "aZ'sStTdDmMlLrReEvV \t\n\r\x0b\x0c09.,!-é日١\u00a0\u3000😀\u0301…\u0378ſK"
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert pre.split(text) == _ref_custom(text, kind), repr(text)


def test_unicode_categories_follow_llama_tables():
    # unicode-data.cpp is Unicode 15.1: newer than Python 3.11's unicodedata for these
    assert collapse_char("\U0002ebf0") == "\xd2"  # CJK Extension I: letter
    assert collapse_char("\U0001fa75") == "\xd5"  # symbol added in Unicode 15
    assert collapse_char("\u0cf3") == "\xd4"  # Kannada sign: mark
    assert collapse_char("\u3000") == "\x0b" and collapse_char("\u0085") == "\x0b"  # whitespace
    assert collapse_char("\u0378") == "\xd0" and collapse_char("\u00ad") == "\xd0"  # unassigned, format


def _invalid_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_spm_vocab_without_a_byte_token_raises_vocab_error(metas):
    # found by tests/fuzz/fuzz_gguf.py: a bare ValueError (llama.cpp's byte_to_token throws out_of_range)
    meta = metas["gemma3"]
    tokens = list(meta["tokenizer.ggml.tokens"])
    tab = tokens.index("\t")
    tokens[tab], tokens[tokens.index("<0x09>")] = "[no tab]", "[no tab byte]"
    vocab = Vocab.from_gguf_meta({**meta, "tokenizer.ggml.tokens": tokens})
    with pytest.raises(VocabError, match="SPM vocab has no byte token '<0x09>' for character '\\\\t'"):
        vocab.tokenize("a\tb")

"""llama.cpp's own tokenizer test data: every models/ggml-vocab-*.gguf of 0c1e570, loaded as a user would.

tests/test-tokenizer-0.cpp loads each vocabulary with vocab_only, cuts its .inp file into texts at
"\\n__ggml_vocab_test__\\n", reads one line of ids per text from its .out file, tokenizes each text with
add_special false and parse_special false and requires exactly those ids; it prints common_detokenize of them
(llama_detokenize with unparse_special). tests/data/vocab/llamacpp_vocab_reference.json holds what llama.cpp
0c1e570 gives for that detokenization, for add_special / parse_special true, and for the four vocabularies that
ship no .inp / .out and the tiny ones of tests/data/vocab (tokenizer models llama.cpp ships no file of, written by
make_tiny_vocabs.py) on ggml-vocab-llama-bpe.gguf.inp's texts; make_llamacpp_vocab_reference.py made it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamactx import Model
from llamactx.hparams import HParamsError
from llamactx.models import ARCHITECTURES
from llamactx.models.llm_arch import vocab_only_hparams
from llamactx.vocab import Vocab
from llamactx.vocab.pre_types import PRE_TYPES, REGEX_EXPRS

DATA = Path(__file__).parents[1] / "data" / "vocab"
REFERENCE = json.loads((DATA / "llamacpp_vocab_reference.json").read_text())
WITH_TESTS = (
    "bert-bge command-r deepseek-coder deepseek-llm falcon gemma-4 gpt-2 llama-bpe llama-spm mpt phi-3 qwen2 qwen35 "
    "refact starcoder"
).split()
WITHOUT_TESTS = "aquila baichuan gpt-neox nomic-bert-moe".split()
TINY = ["tiny-rwkv", "tiny-plamo2", "tiny-whitespace", "tiny-hybriddna", "tiny-test"]  # tests/data/vocab/<name>.gguf
SEP = "\n__ggml_vocab_test__\n"


def read_texts(inp: Path) -> list[str]:
    """test-tokenizer-0's read_tests, its texts: cut at the separator (a trailing one adds no text)."""
    raw, texts, pos = inp.read_bytes().decode("utf-8"), [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    return texts


def read_tests(inp: Path, out: Path) -> list[tuple[str, list[int]]]:
    """test-tokenizer-0's read_tests: the texts, and one line of ids each from the .out file."""
    texts = read_texts(inp)
    lines = out.read_text(encoding="utf-8").split("\n")
    lines = lines[:-1] if lines and lines[-1] == "" else lines  # std::getline: no line after the last newline
    assert len(texts) == len(lines), f"{inp.name}: {len(texts)} texts but {len(lines)} lines of ids"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


def vocab_path(src: Path, name: str) -> Path:
    return DATA / f"{name}.gguf" if name in TINY else src / "models" / f"ggml-vocab-{name}.gguf"


@pytest.fixture(scope="module", params=WITH_TESTS + WITHOUT_TESTS + TINY)
def loaded(request, llamacpp_src) -> Iterator[tuple[str, Model, dict]]:
    """One vocabulary at a time (module scope groups the tests by it), loaded the way a user loads one."""
    path = vocab_path(llamacpp_src, request.param)
    model = Model.load(path, vocab_only=True)
    yield request.param, model, REFERENCE[path.name]
    model.close()


def texts_and_ids(src: Path, name: str, ref: dict) -> list[tuple[str, list[int]]]:
    path = vocab_path(src, name)
    if name in WITH_TESTS:
        return read_tests(Path(f"{path}.inp"), Path(f"{path}.out"))
    inp = DATA / ref["texts"] if (DATA / ref["texts"]).exists() else src / "models" / ref["texts"]
    return list(zip(read_texts(inp), ref["ids"], strict=True))


def test_the_vocabularies_are_those_llamacpp_ships(llamacpp_src):
    models = llamacpp_src / "models"
    names = {p.name[len("ggml-vocab-"):-len(".gguf")] for p in models.glob("ggml-vocab-*.gguf")}
    with_tests = {n for n in names if Path(f"{models}/ggml-vocab-{n}.gguf.inp").exists()}
    assert sorted(with_tests) == sorted(WITH_TESTS)
    assert sorted(names - with_tests) == sorted(WITHOUT_TESTS)
    assert sorted(REFERENCE) == sorted([f"ggml-vocab-{n}.gguf" for n in names] + [f"{n}.gguf" for n in TINY])


def test_ids_as_test_tokenizer_0(loaded, llamacpp_src):
    name, model, ref = loaded
    cases = texts_and_ids(llamacpp_src, name, ref)
    assert len(cases) >= (7 if name in TINY else 46)
    wrong = [(text, ids) for text, ids in cases if model.vocab.tokenize(text, add_special=False) != ids]
    assert wrong == [], f"{name}: {len(wrong)} of {len(cases)} texts tokenize differently, first {wrong[0][0]!r}"


def test_detokenize_as_test_tokenizer_0_prints_it(loaded, llamacpp_src):
    name, model, ref = loaded
    cases = texts_and_ids(llamacpp_src, name, ref)
    got = [model.vocab.detokenize(ids, unparse_special=True) for _, ids in cases]
    assert got == ref["detokenized"]
    # llama.cpp gives most texts back (not all: BERT lower-cases, clean_spaces drops " ," spaces, ...), we too
    back = sum(text == d for (text, _), d in zip(cases, got, strict=True))
    assert back == sum(text == d for (text, _), d in zip(cases, ref["detokenized"], strict=True))


def test_add_special_and_parse_special(loaded, llamacpp_src):
    name, model, ref = loaded
    texts = [text for text, _ in texts_and_ids(llamacpp_src, name, ref)]
    vocab: Vocab = model.vocab
    assert [vocab.tokenize(t, add_special=True, parse_special=True) for t in texts] == ref["ids_special"]
    got = [vocab.detokenize(ids, remove_special=True) for ids in ref["ids_special"]]
    assert got == ref["detokenized_remove_special"]


def test_vocab_only_loads_any_architecture_llamacpp_names(loaded, llamacpp_src):
    name, model, _ = loaded
    path = vocab_path(llamacpp_src, name)
    assert model.arch == model.meta["general.architecture"]
    assert model.hparams.n_vocab == model.vocab.n_tokens == len(model.meta["tokenizer.ggml.tokens"])
    if model.arch not in ARCHITECTURES:  # gpt2, falcon, command-r, gemma4, mpt, refact, starcoder2, ...
        with pytest.raises(HParamsError, match=f"architecture '{model.arch}' is not supported"):
            Model.load(path)  # the graph is what llamactx lacks, and a full load says so


def test_an_architecture_llamacpp_does_not_know_is_refused():
    meta = {"general.architecture": "no-such-arch", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(HParamsError, match="'no-such-arch' is not an architecture llama.cpp knows"):
        vocab_only_hparams(meta, "no-such-arch")


# ---- the pre-tokenizer tables, against src/llama-vocab.cpp itself --------------------------------------------


def _c_string(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r", "t": "\t"}.get(m.group(1), m.group(1)), s)


def test_regex_exprs_are_llama_vocab_cpps(llamacpp_src):
    # llm_tokenizer_bpe::llm_tokenizer_bpe: each case's regex_exprs, literal for literal
    src = (llamacpp_src / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")
    start = src.index("struct llm_tokenizer_bpe : llm_tokenizer {")
    body = src[start:src.index("std::vector<std::string> regex_exprs;", start)]
    family = {pt.name: pt.family for pt in PRE_TYPES.values()}
    cases = 0
    for block in re.split(r"\n\s*break;", body):
        names = re.findall(r"case LLAMA_VOCAB_PRE_TYPE_(\w+):", block) or (["DEFAULT"] if "default:" in block else [])
        at = block.find("regex_exprs = {")
        if at < 0:
            continue
        lines = [ln for ln in block[at:block.index("};", at)].split("\n") if not ln.strip().startswith("//")]
        exprs = tuple(_c_string(s) for s in re.findall(r'"((?:[^"\\]|\\.)*)"', "\n".join(lines)))
        for name in names:
            cases += 1
            assert REGEX_EXPRS[family[name.lower()]] == exprs, name
    assert cases == len(family) >= 55


def test_pre_type_names_and_settings_are_llama_vocab_cpps(llamacpp_src):
    # llama_vocab::impl::load: each tokenizer.ggml.pre name, the type it selects and the flags that branch sets
    src = (llamacpp_src / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")
    start = src.index('} else if (tokenizer_pre == "default") {')
    chain = src[start:src.index("unknown pre-tokenizer type", start)]
    seen = set()
    for branch in chain.split("} else if")[1:]:
        pre = re.search(r"pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", branch).group(1).lower()
        expected = (pre, "clean_spaces = false" not in branch, "ignore_merges = true" in branch,
                    "add_bos = true" in branch, "add_sep = true" in branch, "escape_whitespaces = true" in branch)
        for name in re.findall(r'tokenizer_pre == "([^"]+)"', branch):
            pt = PRE_TYPES[name]
            got = (pt.name, pt.clean_spaces, pt.ignore_merges, pt.add_bos, pt.add_sep, pt.escape_whitespaces)
            assert got == expected, name
            seen.add(name)
    assert seen == set(PRE_TYPES)


def test_min_tokens_is_a_lower_bound(loaded, llamacpp_src):
    # Vocab.min_tokens refuses over-long prompts before tokenizing: it must never exceed the real count, also for
    # the tokenizers that drop whitespace (WPM, UGM, whitespace) and the dummy one (five bytes a token)
    name, model, ref = loaded
    vocab = model.vocab
    texts = [text for text, _ in texts_and_ids(llamacpp_src, name, ref)]
    for text in texts + [" " * 300, "\t\n" * 200 + "a", "\u3000" * 100, "\u200b" * 50 + "x", "é" * 40]:
        assert vocab.min_tokens(text) <= len(vocab.tokenize(text, add_special=False)), (name, text[:40])
    assert vocab.min_tokens("word " * 400) >= 1

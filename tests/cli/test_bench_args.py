"""`llamactx bench`'s flags, parsed as llama-bench parses them (lists, ranges, -pg, -d), without a model."""

from __future__ import annotations

import pytest

from llamactx.cli import main
from llamactx.cli.args import CommandError
from llamactx.cli.bench import BenchTest, expand_tests, parse_int_list
from llamactx.cli.commands import build_parser


def _tests(*argv: str) -> list[BenchTest]:
    return expand_tests(build_parser().parse_args(["bench", *argv]))


@pytest.mark.parametrize("text, values", [
    ("512", [512]),
    ("64,512", [64, 512]),
    ("0,4096", [0, 4096]),
    ("1-4", [1, 2, 3, 4]),
    ("16-64+16", [16, 32, 48, 64]),
    ("16-128*2", [16, 32, 64, 128]),
    ("1-3,8", [1, 2, 3, 8]),
    ("5-4", []),  # llama-bench's loop runs zero times
])
def test_int_lists_are_llama_bench_ranges(text, values):
    assert parse_int_list(text, "-p") == values


@pytest.mark.parametrize("text", ["", "a", "1,,2", "-1", "1-", "4-8*1", "1.5", "1-8/2"])
def test_bad_int_lists_name_the_flag(text):
    with pytest.raises(CommandError, match="-p"):
        parse_int_list(text, "-p")


def test_defaults_are_pp512_and_tg128():
    tests = _tests()
    assert [(t.name, t.n_threads, t.n_batch, t.n_ubatch, t.type_k) for t in tests] == [
        ("pp512", 2, 2048, 512, "f16"), ("tg128", 2, 2048, 512, "f16")]


def test_lists_multiply_in_llama_bench_order():
    tests = _tests("-p", "64,512", "-n", "16,128", "-t", "1,2", "-d", "0,4096")
    # threads outside depth, depth outside the tests; pp tests before tg tests
    want = [(nt, nd, p, g) for nt in (1, 2) for nd in (0, 4096) for p, g in ((64, 0), (512, 0), (0, 16), (0, 128))]
    assert [(t.n_threads, t.n_depth, t.n_prompt, t.n_gen) for t in tests] == want
    assert tests[5].name == "pp512 @ d4096"


def test_pg_is_a_prompt_then_generation():
    tests = _tests("-p", "0", "-n", "0", "-pg", "512,128", "-pg", "64,16")
    assert [(t.n_prompt, t.n_gen, t.name) for t in tests] == [(512, 128, "pp512+tg128"), (64, 16, "pp64+tg16")]


def test_zero_entries_are_skipped_and_cache_types_listed():
    tests = _tests("-p", "0,32", "-n", "0", "-ctk", "f16,q8_0", "-b", "256", "-ub", "64,128")
    assert [(t.n_ubatch, t.type_k, t.n_prompt) for t in tests] == [
        (64, "f16", 32), (64, "q8_0", 32), (128, "f16", 32), (128, "q8_0", 32)]
    assert {t.n_batch for t in tests} == {256}


@pytest.mark.parametrize("argv, message", [
    (["-p", "0", "-n", "0"], "nothing to measure"),
    (["-pg", "512"], "-pg '512' must be two numbers PP,TG"),
    (["-pg", "a,1"], "two numbers"),
    (["-t", "0"], "-t 0 must be >= 1"),
    (["-r", "0"], "-r 0 must be >= 1"),
    (["-d", "x"], "-d 'x'"),
])
def test_bad_flags_are_one_line_errors(argv, message, capsys):
    assert main(["bench", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err

"""The command line's parsing of llama.cpp's flags, without a model: escapes, -fa, -ngl, --version, bad flags."""

from __future__ import annotations

import pytest

from llamactx.cli import main
from llamactx.cli.args import CommandError, process_escapes
from llamactx.cli.commands import build_parser


@pytest.mark.parametrize("text, expected", [
    (r"a\nb\tc\rd", "a\nb\tc\rd"),
    (r"\"quoted\" and \'single\'", "\"quoted\" and 'single'"),
    ("back\\\\slash", "back\\slash"),
    (r"\x41\x42C", "ABC"),
    (r"\xC3\xA9t\xC3\xA9", "été"),  # bytes, put together as UTF-8
    (r"\x4", r"\x4"),  # \x needs two characters after it
    (r"\x41\x4", r"A\x4"),
    (r"\xZZ", r"\xZZ"),  # not a number: kept
    (r"\x 9", "\t"),  # strtol skips leading white space
    (r"\x+1", "\x01"),  # and takes a sign
    (r"\q\w", r"\q\w"),  # unknown escapes are kept, backslash and all
    (r"\u00e9", r"\u00e9"),  # llama.cpp's string_process_escapes has no \u
    ("ends with \\", "ends with \\"),
    ("", ""),
])
def test_escapes_are_llama_cpp_string_process_escapes(text, expected):
    assert process_escapes(text, "prompt") == expected


def test_escapes_that_make_invalid_utf8_are_an_error():
    with pytest.raises(CommandError, match="not UTF-8"):
        process_escapes(r"\xff", "prompt")


@pytest.mark.parametrize("argv, flash_attn", [
    ([], "auto"),
    (["-fa"], "enabled"),  # llama.cpp's old bare -fa
    (["-fa", "on"], "enabled"),
    (["-fa", "off"], "disabled"),
    (["--flash-attn", "auto"], "auto"),
    (["-fa", "1"], "enabled"),
    (["-fa", "false"], "disabled"),
])
def test_flash_attn_values_map_to_context_params(argv, flash_attn):
    args = build_parser().parse_args(["run", "-p", "x", *argv])
    assert args.flash_attn == flash_attn and args.file is None  # -fa never opens a file named "a"


def test_ngl_is_its_own_flag_not_n():
    args = build_parser().parse_args(["run", "-ngl", "99", "-p", "x"])
    assert args.n_gpu_layers == "99" and args.n_predict == -1
    assert build_parser().parse_args(["chat", "--n-gpu-layers", "all"]).n_gpu_layers == "all"


def test_escape_is_on_by_default_as_in_llama_cpp():
    parse = build_parser().parse_args
    assert parse(["run", "-p", "x"]).escape and parse(["run", "-p", "x", "-e"]).escape
    assert not parse(["run", "-p", "x", "--no-escape"]).escape


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("llamactx 0.1.0") and "llama.cpp build 0c1e570" in out


@pytest.mark.parametrize("argv, message", [
    (["run", "-p", "x", "-fa", "maybe"], "'maybe' is not on, off or auto"),
    (["run", "-p", "x", "-ngl", "lots"], "'lots' is not a number, 'auto' or 'all'"),
    (["run", "-p", "x", "--bogus"], "unrecognized arguments: --bogus"),
    (["run", "-p", "x", "-n", "ten"], "invalid int value: 'ten'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["run", "-p", "x", "--n-probs", "-1"], "argument --n-probs: '-1' is not a number >= 0"),
    (["run", "-p", "x", "--stop", ""], "--stop: an empty string"),
    (["run", "-p", "x", "-r", ""], "-r / --reverse-prompt: an empty string"),
    (["run", "-p", r"\xff\xfe"], "prompt: after escapes (-e), byte 0 is not UTF-8"),
    (["embedding"], "embedding needs a prompt"),
])
def test_bad_flags_are_one_line_and_status_1(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_serve_takes_the_context_and_sampling_flags_llama_server_takes():
    """`serve -fa off --temp 0.8 --seed 42 --n-predict 64` (what llama.cpp's server tests pass to every server):
    the context flags are the other tools' (one declaration), the sampling flags become every request's
    defaults."""
    from llamactx.cli.serve import config_from_args

    args = build_parser().parse_args(["serve", "-fa", "off", "--temp", "0.5", "--seed", "42", "--n-predict", "64",
                                      "-c", "2048", "--top-k", "7", "--swa-full", "-ngl", "99",
                                      "--dry-multiplier", "0.8", "--xtc-probability", "0.5", "--top-nsigma", "1.5",
                                      "--dynatemp-range", "0.3", "--repeat-last-n", "32", "--samplers", "top_k;temp",
                                      "--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "."])
    cfg = config_from_args(args)
    assert (cfg.runtime.flash_attn, cfg.runtime.n_ctx, cfg.runtime.swa_full) == ("disabled", 2048, True)
    # only the flags given: a request's own fields, then llama-server's defaults, fill the rest
    assert cfg.request_defaults == {"n_predict": 64, "temperature": 0.5, "top_k": 7, "seed": 42, "dry_multiplier": 0.8,
                            "xtc_probability": 0.5, "top_n_sigma": 1.5, "dynatemp_range": 0.3,
                            "repeat_last_n": 32, "samplers": ["top_k", "temp"],
                            "dry_sequence_breakers": ["\n", "."]}


@pytest.mark.parametrize("argv, message", [
    (["--temp", "1000"], "temperature"),
    (["--json-schema", "{nope"], "--json-schema is not JSON"),
])
def test_serve_refuses_a_bad_sampling_default_at_start(argv, message, capsys):
    assert main(["serve", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_serve_takes_llama_servers_reranking_sleep_and_prompt_cache_flags():
    from llamactx.cli.serve import config_from_args

    cfg = config_from_args(build_parser().parse_args(["serve"]))
    assert (cfg.reranking, cfg.sleep_idle_seconds, cfg.cache_ram, cfg.cache_idle_slots) == (False, -1, 0, True)
    cfg = config_from_args(build_parser().parse_args(["serve", "--rerank", "--sleep-idle-seconds", "30",
                                                      "--cache-ram", "100", "--no-cache-idle-slots"]))
    assert (cfg.reranking, cfg.sleep_idle_seconds, cfg.cache_ram, cfg.cache_idle_slots) == (True, 30, 100, False)


@pytest.mark.parametrize("argv, expected", [([], 8), (["-ctxcp", "0"], 0), (["--ctx-checkpoints", "3"], 3)])
def test_ctx_checkpoints_reach_the_engine_params(argv, expected):
    """llama-server's -ctxcp / --ctx-checkpoints on serve and run (engine/checkpoints.py; 0 = off)."""
    from llamactx.cli.args import runtime_params
    from llamactx.cli.serve import config_from_args

    assert config_from_args(build_parser().parse_args(["serve", *argv])).runtime.n_ctx_checkpoints == expected
    assert runtime_params(build_parser().parse_args(["run", "-p", "x", *argv])).n_ctx_checkpoints == expected

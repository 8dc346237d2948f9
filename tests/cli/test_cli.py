"""The `llamactx` command: run, chat, bench, perplexity, tokenize, info."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from llamactx.cli import main
from tests.conftest import DATA


def llamactx(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamactx", *args], input=stdin, capture_output=True, text=True,
                          timeout=600)


def test_run_prints_llama_cpp_greedy_text(smollm, smollm_ref):
    proc = llamactx("run", "-p", "1, 2, 3, 4, 5,", "-n", "24", "--temp", "0")
    assert proc.returncode == 0, proc.stderr
    expected = smollm.vocab.detokenize(smollm_ref["greedy"][3]["completion_tokens"][:24])
    assert proc.stdout.rstrip("\n") == expected


def test_perplexity_matches_llama_perplexity(capsys):
    assert main(["perplexity", "-f", str(DATA / "gpl3_head.txt"), "-c", "128"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\[10\]\d+\.\d+,", out)
    ppl = float(re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out).group(1))
    assert abs(ppl / 23.9134 - 1) < 0.01, ppl  # llama-perplexity -c 128 (tests/data/REFERENCE.md)


def test_bench_json_has_llama_bench_keys(capsys):
    assert main(["bench", "-p", "32", "-n", "4", "-r", "1", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(32, 0), (0, 4)]
    for r in rows:
        for key in ("n_prompt", "n_gen", "avg_ts", "stddev_ts", "n_threads", "model_type", "model_size",
                    "model_n_params", "type_k", "type_v"):
            assert key in r
        assert r["model_type"] == "llama 135M Q4_1" and r["avg_ts"] > 0


def test_bench_table(capsys):
    assert main(["bench", "-p", "16", "-n", "2", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert "| model" in out and "pp16" in out and "tg2" in out


def test_chat_save_clear_load(tmp_path):
    session = tmp_path / "conv.bin"
    script = f"Name three colors.\n/save {session}\n/clear\n/load {session}\n/exit\n"
    proc = llamactx("chat", "--temp", "0", "-n", "30", stdin=script)
    assert proc.returncode == 0, proc.stderr
    assert "1. Red\n2. Blue\n3. Green" in proc.stdout
    assert re.search(r"saved \d+ tokens", proc.stdout) and "conversation cleared" in proc.stdout
    assert re.search(r"loaded \d+ tokens, 2 messages", proc.stdout)


def test_tokenize_and_info(capsys):
    assert main(["tokenize", "-p", "<|im_start|>user"]) == 0
    out = capsys.readouterr().out
    assert "1 -> '<|im_start|>'" in out and "2 tokens" in out
    assert main(["info", "-m", "gemma3"]) == 0
    out = capsys.readouterr().out
    assert "gemma3 270M Q4_K_M" in out and "kernels:" in out


@pytest.mark.parametrize("argv, message", [
    (["info", "-m", "/nonexistent/model.gguf"], "does not exist"),
    (["run", "-n", "1"], "needs a prompt"),
])
def test_errors_are_reported_not_raised(argv, message, capsys):
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_run_with_grammar_and_json_schema():
    proc = llamactx("run", "-p", "Is the sky blue? Answer:", "-n", "8", "--seed", "1", "--grammar",
                    'root ::= " yes" | " no"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("yes", "no")
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], ' \
             '"additionalProperties": false}'
    proc = llamactx("run", "-p", "A JSON object with a number:", "-n", "40", "--seed", "2", "--json-schema", schema)
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(proc.stdout)["n"], int)


@pytest.mark.parametrize("error", ["GenerationError", "GrammarDeadEnd", "StateError"])
def test_a_llamactx_error_is_one_line_not_a_traceback(monkeypatch, capsys, error):
    import llamactx.cli.commands as cli_main
    from llamactx.engine import GenerationError
    from llamactx.sampling.grammar import GrammarDeadEnd
    from llamactx.state_io import StateError

    exc = {"GenerationError": GenerationError, "GrammarDeadEnd": GrammarDeadEnd, "StateError": StateError}[error]

    def failing(args):
        raise exc("what went wrong, named")

    monkeypatch.setattr(cli_main, "cmd_run", failing)
    assert main(["run", "-p", "x"]) == 1
    err = capsys.readouterr().err
    assert err == "llamactx: error: what went wrong, named\n"

"""The `llamactx` command: run, chat, bench, perplexity, tokenize, info."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from llamactx.cli import main
from tests.conftest import DATA, LLAMACPP_SRC, VARIANT


def llamactx(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamactx", *args], input=stdin, capture_output=True, text=True,
                          timeout=600)


def test_run_prints_llama_cpp_greedy_text(smollm, smollm_ref):
    proc = llamactx("run", "-p", "1, 2, 3, 4, 5,", "-n", "24", "--temp", "0")
    assert proc.returncode == 0, proc.stderr
    expected = smollm.vocab.detokenize(smollm_ref["greedy"][3]["completion_tokens"][:24])
    assert proc.stdout.rstrip("\n") == expected


PERPLEXITY = {  # llama-perplexity's lines for gpl3_head.txt, as the build of this run's arithmetic prints them
    "avx512": ("128", 10, [("smollm2", [], "23.9134 +/- 2.80064"),  # flash attention on, as llama.cpp's default `auto`
                           ("smollm2", ["-fa", "off"], "23.9922 +/- 2.81594"),
                           ("gemma3", [], "18.3342 +/- 2.04578")]),
    # AVX2 build at -c 512 (two chunks, where its default equals -kvu; at -c 128 its default splits each chunk
    # into 51-row pieces that flash attention's one-chunk kernel takes, and llamactx prints the -kvu numbers)
    "avx2": ("512", 2, [("smollm2", [], "17.7185 +/- 2.16952"), ("smollm2", ["-fa", "off"], "17.7841 +/- 2.17413"),
                        ("gemma3", [], "13.9358 +/- 1.73980")]),
}
N_CTX, N_CHUNKS, PPL_CASES = PERPLEXITY["avx2" if VARIANT == "avx2" else "avx512"]


@pytest.mark.parametrize("model, flags, final", PPL_CASES)
def test_perplexity_prints_llama_perplexitys_numbers(capsys, model, flags, final):
    """`llamactx perplexity` prints what llama-perplexity prints, digit for digit (tests/data/REFERENCE.md), by
    default (flash attention) and with -fa off."""
    assert main(["perplexity", "-m", model, "-f", str(DATA / "gpl3_head.txt"), "-c", N_CTX, *flags]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"\[{N_CHUNKS}\]\d+\.\d+,", out)
    assert f"Final estimate: PPL = {final}" in out


def test_bench_json_has_llama_bench_keys(capsys):
    assert main(["bench", "-p", "32", "-n", "4", "-r", "1", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(32, 0), (0, 4)]
    for r in rows:
        for key in ("build_commit", "backends", "n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "n_threads",
                    "model_type", "model_size", "model_n_params", "type_k", "type_v", "test_time", "samples_ns"):
            assert key in r
        assert r["model_type"] == "llama 135M Q4_1" and r["avg_ts"] > 0


def test_bench_table(capsys):
    assert main(["bench", "-p", "16", "-n", "2", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert "| model" in out and "pp16" in out and "tg2" in out


def test_chat_save_clear_load(tmp_path):
    session = tmp_path / "conv.bin"
    script = f"Name three colors, as a numbered list.\n/save {session}\n/clear\n/load {session}\n/exit\n"
    proc = llamactx("chat", "--temp", "0", "-n", "30", stdin=script)
    assert proc.returncode == 0, proc.stderr
    assert "1. Red\n2. Blue\n3. Green" in proc.stdout
    assert re.search(r"saved \d+ tokens", proc.stdout) and "conversation cleared" in proc.stdout
    assert re.search(r"loaded \d+ tokens, 2 messages", proc.stdout)


def test_tokenize_and_info(capsys):
    assert main(["tokenize", "-p", "<|im_start|>user"]) == 0
    out = capsys.readouterr().out
    assert "1 -> '<|im_start|>'" in out and "2 tokens" in out
    # llama-tokenize reads the vocabulary only: a vocab file of an architecture without a graph here (gpt2)
    vocab = LLAMACPP_SRC / "models" / "ggml-vocab-gpt-2.gguf"
    assert main(["tokenize", "--no-bos", "-m", str(vocab), "-p", "Hello world"]) == 0
    assert "15496 -> 'Hello'" in capsys.readouterr().out
    assert main(["info", "-m", "gemma3"]) == 0
    out = capsys.readouterr().out
    assert "gemma3 270M Q4_K_M" in out and "kernels:" in out
    assert "memory:         llama_kv_cache_iswa (3 global layers, 15 sliding-window layers of 512 tokens" in out


GPL = str(DATA / "gpl3_head.txt")


@pytest.mark.parametrize("argv, message", [
    (["info", "-m", "/nonexistent/model.gguf"], "does not exist"),
    (["run", "-n", "1"], "needs a prompt"),
    (["run", "-m", str(DATA), "-p", "x"], "is a directory: give a .gguf file"),
    (["run", "-f", str(DATA), "-n", "1"], "prompt file '" + str(DATA) + "' is a directory"),
    (["run", "-f", str(DATA / "missing.txt"), "-n", "1"], "does not exist"),
    (["perplexity", "-f", GPL, "-c", "0"], "you need at least 16384 tokens"),
    (["perplexity", "-f", GPL, "-c", "1"], "too small"),
    (["perplexity", "-f", GPL, "-c", "2"], "too small"),
    (["perplexity", "-f", GPL, "-c", "1024"], "you need at least 2048 tokens to evaluate perplexity with a context of "
                                              "1024; the text tokenizes to only 1320 tokens"),
    (["perplexity", "-f", str(DATA)], "is a directory"),
    (["bench", "-p", "0", "-n", "0"], "nothing to measure"),
    (["run", "-p", "x", "-n", "-5"], "-n / --n-predict = -5 must be >= -1"),
    (["run", "-p", "x", "-n", "1", "--json-schema", "{bad"], "json_schema: not valid JSON"),
    (["run", "-p", "x", "-n", "1", "--temp", "nan"], "temperature"),
    (["serve", "-np", "0"], "--parallel = 0 must be >= 1"),
])
def test_errors_are_reported_not_raised(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_run_with_grammar_and_json_schema():
    proc = llamactx("run", "-p", "Is the sky blue? Answer:", "-n", "8", "--seed", "1", "--grammar",
                    'root ::= " yes" | " no"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("yes", "no")
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], ' \
             '"additionalProperties": false}'
    proc = llamactx("run", "-p", "A JSON object with a number:", "-n", "40", "--temp", "0", "--json-schema", schema)
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


def test_chat_failed_save_and_load_change_nothing(tmp_path):
    (tmp_path / "other.bin").write_bytes(b"LLCTXSF\0" + b"\0" * 12)  # a session file without its messages
    (tmp_path / "bad.bin.messages.json").write_text('[{"role": "user"}]')
    script = (f"Name three colors.\n/save {tmp_path}/missing/dir.bin\n/load {tmp_path}/other.bin\n"
              f"/load {tmp_path}/bad.bin\n/save {tmp_path}/good.bin\n/exit\n")
    proc = llamactx("chat", "--temp", "0", "-n", "30", stdin=script)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "could not save" in proc.stdout and proc.stdout.count("could not load") == 2
    saved = re.search(r"saved (\d+) tokens", proc.stdout)
    assert saved and int(saved.group(1)) > 30  # the conversation survived the failed commands
    assert len(json.loads((tmp_path / "good.bin.messages.json").read_text())) == 2


# llama-perplexity -c 384 -t 2 on gpl3_head.txt: three chunks in one batch (n_seq = 5), by default and with -kvu
THREE_CHUNKS = {"avx512": ("[1]16.4574,[2]19.2502,[3]20.6658,", "[1]16.4366,[2]19.2234,[3]20.6427,"),
                "avx2": ("[1]15.9047,[2]18.8631,[3]20.3917,", "[1]15.9384,[2]18.9258,[3]20.4161,")}


def test_perplexity_is_llama_perplexity_kvu_and_the_default_differs_by_its_ubatch_split(smollm, capsys):
    """llamactx perplexity evaluates each chunk in one ubatch, as llama-perplexity -kvu does (one KV stream), and
    prints its numbers. Without -kvu llama-perplexity gives each chunk of a batch its own stream and ggml's
    split_equal cuts a ubatch into n_ubatch // 3 = 170 rows of each of the three chunks (170, 170, 44); for fewer
    than 64 rows per stream flash attention takes its one-chunk kernel (q rounded to f16, an f16 accumulator).
    Decoding each chunk in those pieces, with the kernel picked by the ubatch's rows (ggml_single_row), gives the
    default run's numbers: that is the whole difference (docs/numerics.md)."""
    from llamactx import Context, ContextParams
    from llamactx.backend.reference import ReferenceOps
    from llamactx.cli.perplexity import chunk_nll

    default, kvu = THREE_CHUNKS["avx2" if VARIANT == "avx2" else "avx512"]
    assert main(["perplexity", "-f", str(DATA / "gpl3_head.txt"), "-c", "384", "-t", "2"]) == 0
    assert kvu in capsys.readouterr().out
    tokens = smollm.vocab.tokenize((DATA / "gpl3_head.txt").read_text(), add_special=True, parse_special=False)
    ops = ReferenceOps()
    ops.ggml_single_row = True
    ctx = Context(smollm, ContextParams(n_ctx=384, n_batch=384, n_ubatch=384, n_threads=2), ops=ops)
    nll, line = [], ""
    for c in range(3):
        nll.extend(chunk_nll(ctx, tokens[c * 384:(c + 1) * 384], 170))  # SmolLM2 adds no BOS
        line += f"[{c + 1}]{math.exp(sum(nll) / len(nll)):.4f},"
    assert line == default

"""`llamactx run` and `chat` with llama.cpp's flags: accepted-and-ignored ones, -fa, -r, --stop, --ignore-eos, -e,
--context-shift, -sys, --n-probs, and Ctrl-C."""

from __future__ import annotations

import math
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from llamactx.cli import main
from llamactx.llm import LLM
from tests.cli.test_cli import llamactx
from tests.conftest import reference_logits

COUNT = "1, 2, 3, 4, 5,"


@pytest.fixture(scope="module")
def count_text(smollm, smollm_ref) -> str:
    """llama.cpp's greedy continuation of COUNT: ' 6, 7, 8, 9, 10, ...'"""
    return smollm.vocab.detokenize(smollm_ref["greedy"][3]["completion_tokens"][:24])


def n_generated(err: str) -> int:
    return int(re.search(r"generation: (\d+) tokens", err).group(1))


def test_ignored_flags_say_so_once_and_change_nothing(count_text, capsys):
    assert main(["run", "-p", COUNT, "-n", "8", "--temp", "0", "-ngl", "99", "--mlock", "--no-mmap", "-no-cnv"]) == 0
    out, err = capsys.readouterr()
    assert out == " 6, 7, 8\n" and count_text.startswith(out.rstrip("\n"))  # 8 tokens
    notices = [line for line in err.splitlines() if " ignored: " in line]
    assert [n.split(" ignored")[0] for n in notices] == ["llamactx: -ngl/--n-gpu-layers", "llamactx: --mlock",
                                                          "llamactx: --no-mmap", "llamactx: -no-cnv/--no-conversation"]


def test_flash_attn_reaches_the_context(capsys):
    assert main(["run", "-p", "x", "-n", "1", "-fa", "off", "-ctv", "q8_0"]) == 1  # a quantized V cache needs it
    err = capsys.readouterr().err
    assert "requires flash_attn" in err and "'disabled'" in err and err.count("\n") == 1
    assert main(["run", "-p", "x", "-n", "1", "-fa", "on", "-ctv", "q8_0"]) == 0


def test_reverse_prompt_is_printed_stop_is_not(capsys):
    assert main(["run", "-p", COUNT, "-n", "24", "--temp", "0", "-r", r" \x38,"]) == 0  # -r goes through escapes
    out, err = capsys.readouterr()
    assert out == " 6, 7, 8,\n" and n_generated(err) == 9
    assert main(["run", "-p", COUNT, "-n", "24", "--temp", "0", "--stop", " 9", "--stop", " 8,"]) == 0
    assert capsys.readouterr().out == " 6, 7,\n"


def test_escapes_in_the_prompt(capsys):
    assert main(["run", "-p", r"Line one\nLine two\t", "-n", "1", "--temp", "0", "--verbose-prompt"]) == 0
    assert capsys.readouterr().out.startswith("Line one\nLine two\t")
    assert main(["run", "-p", r"Line one\nLine two", "-n", "1", "--temp", "0", "--verbose-prompt",
                 "--no-escape"]) == 0
    assert capsys.readouterr().out.startswith(r"Line one\nLine two")


SYS = ["-sys", "You are terse.", "-p", "What is the capital of France?", "--temp", "0"]


def test_system_prompt_makes_run_one_chat_turn(smollm, capsys):
    assert main(["run", *SYS, "-n", "40", "--verbose-prompt"]) == 0
    out, err = capsys.readouterr()
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the capital of France?"}]
    llm = LLM(smollm, n_ctx=512)
    reply = llm.chat(messages, max_tokens=40, temperature=0)
    assert reply.finish_reason == "stop" and n_generated(err) == len(reply.tokens) < 40
    assert out == llm.template.render(messages, add_generation_prompt=True) + reply.text + "\n"
    # --ignore-eos: the end-of-turn token is never sampled, so it runs to -n
    assert main(["run", *SYS, "-n", str(len(reply.tokens) + 3), "--ignore-eos"]) == 0
    out, err = capsys.readouterr()
    assert n_generated(err) == len(reply.tokens) + 3 and out.startswith(reply.text)
    # -no-cnv: llama-completion's plain prompt, -sys ignored
    assert main(["run", *SYS, "-n", "1", "--verbose-prompt", "-no-cnv"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("What is the capital of France?") and "-sys ignored" in err and "-no-cnv/" not in err


def test_context_shift_goes_past_a_full_context(capsys):
    long_count = ", ".join(str(i) for i in range(1, 64)) + ","  # ~240 tokens of the 256 a context holds at least
    argv = ["run", "-p", long_count, "-c", "256", "-n", "40", "--temp", "0", "--ignore-eos"]
    assert main(argv) == 0
    assert n_generated(capsys.readouterr().err) < 40  # the context is full: it stops
    assert main([*argv, "--context-shift"]) == 0
    assert n_generated(capsys.readouterr().err) == 40


def test_n_probs_lists_llama_cpp_probabilities(smollm, smollm_ref, capsys):
    prompt = "The capital of France is"
    assert main(["run", "-p", prompt, "-n", "2", "--temp", "0", "--n-probs", "3", "-fa", "off"]) == 0
    out = capsys.readouterr().out
    text, listing = out.split("\n\nprobabilities: each token, then the 3 most likely at its position\n")
    lines = listing.splitlines()
    assert text == " Paris." and len(lines) == 2
    # the first token's probabilities: the softmax of llama.cpp's logits for this prompt
    logits = reference_logits("smollm2", 0).astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    top = smollm_ref["prompts"][0]["top20_ids"][:3]
    piece = [f'"{smollm.vocab.token_to_piece(t).decode()}"' for t in top]
    assert lines[0] == (f"{piece[0]:>16} {p[top[0]]:.4f} | "
                        + "  ".join(f"{piece[i]} {p[top[i]]:.4f}" for i in range(3)))
    assert math.isclose(sum(float(v) for v in re.findall(r" (\d\.\d{4})", lines[0].split("|")[1])),
                        float(p[top].sum()), abs_tol=2e-4)


def test_ctrl_c_stops_prints_timings_and_exits_130():
    # a shell's background job (no job control) starts with SIGINT ignored, which a child inherits, and Python
    # then installs no KeyboardInterrupt handler: the child starts as a terminal's foreground process does
    proc = subprocess.Popen([sys.executable, "-m", "llamactx", "run", "-p", "Once upon a time", "-n", "-1",
                             "--ignore-eos", "--temp", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stdout.read(8)  # generation has started
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted by user" in err
    assert n_generated(err) >= 2 and len(first + out) > 8


def test_chat_stops_at_reverse_prompt_and_stop_and_lists_probs():
    proc = llamactx("chat", "--temp", "0", "-n", "30", "-r", "Blue", "--stop", "3.", "--n-probs", "2",
                    stdin="Name three colors, as a numbered list.\n/exit\n")
    assert proc.returncode == 0, proc.stderr
    answer, listing = proc.stdout.split("\nprobabilities: each token, then the 2 most likely at its position\n")
    assert answer.endswith("> 1. Red\n2. \n") and "Blue" not in answer  # the turn came back at "Blue"
    assert listing.splitlines()[-3].startswith('         " Blue" ')  # the token that ended it is listed

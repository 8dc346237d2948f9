"""Speculative decoding reaches every front end: `LLM(spec=...)`, `Llama(draft_model=LlamaPromptLookupDecoding())`,
`llamactx run --spec-type` and `llamactx serve --spec-type` (timings' draft_n, /metrics' spec_decode_* counters),
each giving the tokens it gives without drafts; llama.cpp's removed flags are refused as llama.cpp refuses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamactx import Llama, LlamaPromptLookupDecoding
from llamactx.cli import main
from llamactx.engine.speculative import NgramParams, SpecParams
from llamactx.llm import LLM

CODE = (Path(__file__).parent / "data" / "spec_code.txt").read_text()[1500:2400]
PROMPT = (f"<|im_start|>user\nRepeat this code exactly.\n```python\n{CODE}```<|im_end|>\n"
          "<|im_start|>assistant\n```python\n")
SPEC = SpecParams(types=("ngram-simple",), ngram_simple=NgramParams(size_n=4, size_m=16))


def test_llm_with_drafts_gives_the_same_text_in_fewer_decodes(smollm):
    plain = LLM(smollm, n_ctx=1024)
    fast = LLM(smollm, n_ctx=1024, spec=SPEC)
    a = plain.complete(PROMPT, max_tokens=40, temperature=0)
    b = fast.complete(PROMPT, max_tokens=40, temperature=0)
    assert b.text == a.text
    assert fast.engine.stats.n_draft_accepted > 0
    assert fast.engine.stats.n_decode < plain.engine.stats.n_decode


def test_llama_prompt_lookup_decoding_keeps_the_output(smollm):
    kw = dict(n_ctx=1024, verbose=False)
    a = Llama(str(smollm.path), **kw)(PROMPT, max_tokens=32, temperature=0)
    fast = Llama(str(smollm.path), draft_model=LlamaPromptLookupDecoding(max_ngram_size=4, num_pred_tokens=10), **kw)
    b = fast(PROMPT, max_tokens=32, temperature=0)
    assert b["choices"][0]["text"] == a["choices"][0]["text"]
    assert fast._engine.stats.n_draft_accepted > 0


def test_run_with_spec_type_prints_the_same_text(capsys):
    argv = ["run", "-p", PROMPT, "-n", "24", "--temp", "0", "-c", "1024", "--no-escape"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main([*argv, "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4"]) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize("flag", ["--draft-max", "--draft"])
def test_llama_cpps_removed_draft_flags_are_refused(flag, capsys):
    assert main(["run", "-p", "x", flag, "4"]) == 1
    assert "has been removed" in capsys.readouterr().err


def test_serve_reports_drafts_in_timings_and_metrics():
    from tests.server.conftest import running_server

    with running_server(model="smollm2", n_slots=1, n_ctx=1024, metrics=True, spec=SPEC) as srv, \
            srv.client() as c:
        body = {"prompt": PROMPT, "n_predict": 32, "temperature": 0}
        res = c.post("/completion", json=body).json()
        metrics = c.get("/metrics").text
    t = res["timings"]
    assert t["draft_n"] >= t["draft_n_accepted"] > 0
    accepted = next(line for line in metrics.splitlines()
                    if line.startswith("llamacpp:spec_decode_num_accepted_tokens_total"))
    assert float(accepted.split()[-1]) == t["draft_n_accepted"]

"""The fuzz targets as tests: each runs for LLAMACTX_FUZZ_SECONDS (10 s in the suite; `make fuzz` sets 60) and
must end without a crash, a hang over 1 s or an allocation over 1 GiB (tests/fuzz/harness.py). A failure shows
libFuzzer's report and where the input that did it was written; `python -m tests.fuzz.<target> <that file>`
runs it again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

ROOT = Path(__file__).parents[2]
SECONDS = int(os.environ.get("LLAMACTX_FUZZ_SECONDS", "10"))
TARGETS = ["fuzz_gguf", "fuzz_state", "fuzz_chat_template"]


def run_target(module: str, seconds: int, tmp: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Fuzz from the seeds for `seconds`, with the corpus and any failing input under `tmp`."""
    (tmp / "corpus").mkdir()
    cmd = [sys.executable, "-m", f"tests.fuzz.{module}", f"-max_total_time={seconds}", f"-artifact_prefix={tmp}/",
           str(tmp / "corpus")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 300,
                          env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout + proc.stderr


def report(out: str) -> str:
    lines = [line for line in out.splitlines() if not line.startswith("INFO: Instrumenting")]
    return "\n".join(lines[-60:])


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target(target, tmp_path):
    rc, out = run_target(target, SECONDS, tmp_path)
    assert rc == 0, f"{target} failed (inputs in {tmp_path}):\n{report(out)}"
    execs = int(re.search(r"stat::number_of_executed_units: (\d+)", out).group(1))
    print(f"\n{target}: {execs} executions in {SECONDS} s, no failure")
    assert execs > 0


@pytest.mark.parametrize("mode, message", [("raise", "KeyError: 'not a documented error'"),
                                           ("hang", "ERROR: libFuzzer: timeout"), ("alloc", "MemoryError")])
def test_harness_fails_a_crash_a_hang_and_a_big_allocation(tmp_path, mode, message):
    rc, out = run_target("fuzz_selftest", 5, tmp_path, {"LLAMACTX_FUZZ_SELFTEST": mode})
    assert rc != 0 and message in out, report(out)
    assert list(tmp_path.glob("crash-*")) + list(tmp_path.glob("timeout-*")), "no failing input was written"


def test_findings_stay_fixed():
    """What the targets found, kept as plain regression tests (each raised an undocumented exception)."""
    from llamactx.chat_template import ChatTemplate, ChatTemplateError

    # a template nested deeper than jinja2's parser can recurse: RecursionError while compiling
    with pytest.raises(ChatTemplateError, match="nested too deeply to compile"):
        ChatTemplate("{{ " + "[" * 2000 + " }}")
    # (fuzz_state: an empty context's state did not load back, see tests/test_state.py)

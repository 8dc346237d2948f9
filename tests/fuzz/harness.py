"""What every fuzz target shares: its seeds, its limits, and running atheris (libFuzzer) on it.

A target module builds `seeds` (name -> bytes, taken from valid files) and a `test_one_input(data)` that lets
only the documented error classes out, then calls `main(test_one_input, seeds)`. Anything else fails the run: an
exception the target lets out (a crash), an input that runs longer than `-timeout` (1 s, libFuzzer's alarm), and
an allocation past 1 GiB (the address space is capped 1 GiB above what the target holds after its setup, so a
bigger numpy or bytes allocation raises MemoryError, which no target lets out). The input is written to
`-artifact_prefix` (crash-<sha1>, timeout-<sha1>).

    python -m tests.fuzz.fuzz_gguf -max_total_time=60     # fuzz from the seeds for 60 s
    python -m tests.fuzz.fuzz_gguf crash-1234abcd          # run one input again (a file libFuzzer wrote)

tests/fuzz/test_fuzz.py runs every target for LLAMACTX_FUZZ_SECONDS (10 s in the suite, 60 s under `make fuzz`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import resource
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import atheris

ALLOC_LIMIT = 1 << 30  # bytes a target may allocate beyond its setup before the run fails
_SLACK = 128 << 20  # libFuzzer's own thread stacks and corpus


def instrumented(*also: str):
    """`with instrumented(): import llamactx...`: atheris coverage for llamactx's modules (and the packages named
    in `also`), except llamactx.ggml's, whose bytecode numba compiles (and would not recognise instrumented)."""
    root = Path(importlib.util.find_spec("llamactx").submodule_search_locations[0])  # not imported yet
    ggml = [".".join(("llamactx", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
            for p in (root / "ggml").rglob("*.py")]
    return atheris.instrument_imports(include=["llamactx", *also], exclude=ggml)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def cap_address_space() -> None:
    """Make any allocation past ALLOC_LIMIT (beyond what is mapped now) fail with MemoryError."""
    limit = _status_kb("VmSize") * 1024 + ALLOC_LIMIT + _SLACK
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def scratch_file(name: str) -> Path:
    """A path for a target to write its inputs to (in RAM where /dev/shm exists)."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return root / f"llamactx-fuzz-{os.getpid()}-{name}"


@contextmanager
def input_file(path: Path, data: bytes) -> Iterator[Path]:
    """`data` as the file at `path` while the block runs. A map of it (GGUFFile) stays valid after the unlink."""
    path.write_bytes(data)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _crash_on_exception(test_one_input: Callable[[bytes], None], prefix: str) -> Callable[[bytes], None]:
    """Report an exception the target lets out and leave at once. atheris would exit through Python's
    finalization, which can wait forever on numba's worker threads; this writes the input where libFuzzer writes
    its crash inputs and ends the process with os._exit."""

    def run(data: bytes) -> None:
        try:
            test_one_input(data)
        except BaseException:
            traceback.print_exc()
            path = f"{prefix}crash-{hashlib.sha1(data).hexdigest()}"
            Path(path).write_bytes(data)
            print(f"==llamactx-fuzz== uncaught exception; the input is in {path}", file=sys.stderr, flush=True)
            os._exit(77)

    return run


def main(test_one_input: Callable[[bytes], None], seeds: dict[str, bytes], argv: list[str] | None = None) -> None:
    """Run libFuzzer on `test_one_input`. The corpus is the directories in `argv` (the first one, if empty, gets
    `seeds`), or a temporary one of `seeds`; a file in `argv` is one input to run again. Defaults: -timeout=1,
    -rss_limit_mb = peak RSS so far + 1 GiB, -print_final_stats=1."""
    args = list(sys.argv if argv is None else argv)
    flags = [a for a in args[1:] if a.startswith("-")]
    paths = [a for a in args[1:] if not a.startswith("-")] or [tempfile.mkdtemp(prefix="llamactx-fuzz-corpus-")]
    corpus = Path(paths[0])
    if corpus.is_dir() and not any(corpus.iterdir()):
        for name, data in seeds.items():
            (corpus / name).write_bytes(data)
    # libFuzzer compares getrusage's ru_maxrss with its limit: a peak that Linux keeps across fork + exec, so a
    # target started by a big process (the whole suite's pytest) begins at its parent's peak; and numba's first
    # compile during a target's set-up can push it above the current RSS. Start from that peak.
    peak_mb = max(_status_kb("VmRSS"), _status_kb("VmHWM"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) // 1024
    defaults = {"-timeout": "1", "-rss_limit_mb": str(peak_mb + 1024), "-print_final_stats": "1"}
    given = {f.split("=", 1)[0] for f in flags}
    flags += [f"{k}={v}" for k, v in defaults.items() if k not in given]
    prefix = next((f.split("=", 1)[1] for f in flags if f.startswith("-artifact_prefix=")), "")
    cap_address_space()
    atheris.Setup([args[0], *flags, *paths], _crash_on_exception(test_one_input, prefix))
    atheris.Fuzz()

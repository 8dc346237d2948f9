"""llama.cpp's own server tests (tools/server/tests/unit, from the llama-cpp-python 0.3.36 sdist) against
`llamactx serve` and, for the baseline, the native `llama-server`, both serving SmolLM2 (issue 22). Not part of
`make test`: it starts a server per test (hundreds), and fetches nothing.

The suite starts `$LLAMA_SERVER_BIN_PATH` with llama-server's flags. Here that is a stand-in that drops the hub
and download flags (`--hf-repo`, `--hf-file`, `--model-url`, `--offline`, `--mmproj-url`), adds `-m` with the
embedded SmolLM2 when no model is given, and runs `llamactx serve` (or the native binary) with the rest,
unchanged. Reported: pass / fail / skip per test and server, and llamactx's pass rate over the tests the native
server passes, with the first line of every failure.

Usage: python bench/llama_server_suite.py [--server llamactx|llama-server|both] [-k EXPR] [--files test_a.py,...]
           [--sdist DIR] [--llamacpp DIR] [--out results.json] [--baseline earlier-results.json]
Needs the suite's client packages: make llama-server-suite installs them into .venv and runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

CACHE = Path(os.environ.get("LLAMACPP", Path.home() / ".cache" / "llamactx-llamacpp"))
SDIST = "llama_cpp_python-0.3.36"
SUITE = Path("vendor/llama.cpp/tools/server/tests")
DROP_WITH_VALUE = {"--hf-repo", "-hfr", "--hf-file", "-hff", "--model-url", "-mu", "--mmproj-url"}
DROP_FLAG = {"--offline", "--no-mmproj"}


def standin(kind: str, argv: list[str], llamacpp: Path) -> None:
    """Exec the server for `kind` with the suite's arguments, minus the hub flags, plus SmolLM2."""
    from llamactx.embedded import resolve_model_path

    out, i = [], 0
    while i < len(argv):
        if argv[i] in DROP_WITH_VALUE:
            i += 2
            continue
        if argv[i] not in DROP_FLAG:
            out.append(argv[i])
        i += 1
    if "-m" not in out and "--model" not in out:
        out = ["-m", str(resolve_model_path("smollm2")), *out]
    if kind == "llamactx":
        cmd = [sys.executable, "-m", "llamactx", "serve", *out]
    else:
        cmd = [str(llamacpp / "bin" / "llama-server"), *out]
    os.execv(cmd[0], cmd)


def run_suite(kind: str, sdist: Path, llamacpp: Path, select: list[str], keyword: str | None,
              work: Path) -> dict[str, tuple[str, str]]:
    """{test id ("unit/test_x.py::test_y[...]"): (outcome, first line of the reason)} for one server; `select`
    holds test files of unit/ or test ids."""
    tests = work / f"tests-{kind}" / "tools" / "server" / "tests"  # llama.cpp's layout: some tests find its root
    shutil.copytree(sdist / SUITE, tests)
    bin_path = work / f"llama-server-{kind}"
    bin_path.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} --standin {kind} "
                        f"--llamacpp {llamacpp} -- \"$@\"\n")
    bin_path.chmod(0o755)
    report = work / f"{kind}.xml"
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(bin_path), "LLAMA_CACHE": str(work / "cache")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
           *(f if "::" in f else f"unit/{f}" for f in select)]
    if keyword:
        cmd += ["-k", keyword]
    print(f"{kind}: {len(select) or 'all'} test files / ids{f', -k {keyword}' if keyword else ''}", flush=True)
    subprocess.run(cmd, cwd=tests, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return parse_junit(report)


def parse_junit(path: Path) -> dict[str, tuple[str, str]]:
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, reason = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                text = (child.get("message") or child.text or "").strip()
                reason = text.splitlines()[0][:200] if text else ""
                break
        out[name] = (outcome, reason)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--standin", choices=["llamactx", "llama-server"], help=argparse.SUPPRESS)
    ap.add_argument("--server", choices=["llamactx", "llama-server", "both"], default="both")
    ap.add_argument("--files", default="", help="comma-separated test files of unit/ (default: all)")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    ap.add_argument("--sdist", type=Path, default=CACHE / "sdist" / SDIST)
    ap.add_argument("--llamacpp", type=Path, default=CACHE, help="where build_llamacpp.sh put bin/llama-server")
    ap.add_argument("--out", type=Path, default=None, help="write every outcome as JSON")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a previous --out file: its llama-server outcomes stand in for a new native run")
    args, rest = ap.parse_known_args()
    if args.standin:
        standin(args.standin, rest[1:] if rest[:1] == ["--"] else rest, args.llamacpp)
        return
    if not (args.sdist / SUITE).is_dir():
        sys.exit(f"{args.sdist / SUITE} is missing: pip download --no-deps --no-binary :all: "
                 f"llama-cpp-python==0.3.36 and unpack it under {args.sdist.parent}")
    kinds = ["llama-server", "llamactx"] if args.server == "both" else [args.server]
    if "llama-server" in kinds and not args.baseline and not (args.llamacpp / "bin" / "llama-server").exists():
        sys.exit(f"no {args.llamacpp / 'bin' / 'llama-server'}: build it with ../shared/tools/build_llamacpp.sh")
    select = [f for f in args.files.split(",") if f]
    results = {}
    if args.baseline:
        saved = json.loads(args.baseline.read_text())["llama-server"]  # bench/data/llama_server_suite_baseline.json
        results["llama-server"] = {t: (o, r) for t, (o, r) in saved.items()}
        kinds = [k for k in kinds if k != "llama-server"] or ["llamactx"]
    with tempfile.TemporaryDirectory(prefix="llama-server-suite-") as tmp:
        for kind in kinds:
            if kind == "llamactx" and "llama-server" in results:  # only what the baseline passes (of --files)
                select = [t for t, (o, _) in results["llama-server"].items()
                          if o == "passed" and (not select or t.split("::")[0].removeprefix("unit/") in select)]
            results[kind] = run_suite(kind, args.sdist, args.llamacpp, select, args.keyword, Path(tmp))
            counts = {}
            for outcome, _ in results[kind].values():
                counts[outcome] = counts.get(outcome, 0) + 1
            print(f"{kind}: {json.dumps(counts)}")
    ours = results.get("llamactx", {})
    if "llama-server" in results:
        files = [f for f in args.files.split(",") if f]
        base = [t for t, (o, _) in results["llama-server"].items()
                if o == "passed" and (not files or t.split("::")[0].removeprefix("unit/") in files)]
        passed = [t for t in base if ours.get(t, ("missing", ""))[0] == "passed"]
        print(f"llamactx passes {len(passed)} of the {len(base)} tests llama-server passes "
              f"({100 * len(passed) / max(len(base), 1):.0f}%)")
        failing = [t for t in base if t not in passed]
    else:
        failing = [t for t, (o, _) in ours.items() if o in ("failed", "error")]
    for t in failing:
        outcome, reason = ours.get(t, ("missing", ""))
        print(f"  {outcome:>7} {t}: {reason}")
    if args.out:
        args.out.write_text(json.dumps({k: {t: list(v) for t, v in r.items()} for k, r in results.items()},
                                       indent=1))


if __name__ == "__main__":
    main()

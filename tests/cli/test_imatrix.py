"""`llamactx imatrix`: llama-imatrix's file byte for byte on SmolLM2 (the embedded model) over tests/data/zen.txt,
and `llamactx quantize --imatrix` with it: llama-quantize's files (sha256 in tests/data/quantize_k)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from llamactx.cli import main
from llamactx.cli.imatrix import Collector
from llamactx.embedded import smollm2_path
from llamactx.gguf import imatrix_file
from tests.conftest import VARIANT_DIR

DATA = Path(__file__).parents[1] / "data"
REF = json.loads((DATA / "quantize_k" / "llama_quantize.json").read_text())
# the imatrix is made of this arithmetic's activations: llama-imatrix's hashes on the build of the same arithmetic
IMATRIX_SHA256 = REF["imatrix_sha256"][VARIANT_DIR]
QUANTIZE_SHA256 = REF["imatrix_quantize_sha256"][VARIANT_DIR]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """model.gguf and zen.txt, the names llama-imatrix and llama-quantize were run with (they are recorded)."""
    d = tmp_path_factory.mktemp("imatrix")
    assert _sha256(Path(smollm2_path())) == REF["input_sha256"], "the embedded model changed: remake the references"
    os.symlink(smollm2_path(), d / "model.gguf")
    shutil.copy(DATA / "zen.txt", d / "zen.txt")
    return d


def _run(workdir: Path, *argv: str) -> int:
    cwd = Path.cwd()
    os.chdir(workdir)
    try:
        return main(list(argv))
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def imatrix(workdir) -> Path:
    code = _run(workdir, "imatrix", "-m", "model.gguf", "-f", "zen.txt", "-o", "smol.imatrix.gguf", "-c", "64", "-b",
                "64", "-t", "2")
    assert code == 0
    return workdir / "smol.imatrix.gguf"


def test_imatrix_file_is_llama_imatrixs(imatrix, capsys):
    assert _sha256(imatrix) == IMATRIX_SHA256
    im = imatrix_file.load(imatrix)
    assert (im.datasets, im.chunk_count, im.chunk_size) == (["zen.txt"], 3, 64)
    assert len(im.entries) == 30 * 7 and "output.weight" not in im.entries  # 7 matmuls a layer, no output
    sums, counts = im.entries["blk.0.ffn_down.weight"]
    assert sums.shape == (1536,) and list(counts) == [192] and (sums > 0).all()


@pytest.mark.parametrize("case", ["Q4_K_M", "mix", "iq4", "iq3s", "iq2xs"])
def test_quantize_with_the_imatrix_is_llama_quantizes(workdir, imatrix, case):
    """ggml's imatrix-weighted quantizers (quantize_row_q*_K_impl, the weighted Q4_0 / Q5_0 / Q5_1) and the
    quantize.imatrix.* keys; iq4 / iq3s / iq2xs: IQ4_NL / IQ4_XS / IQ3_S / IQ2_XS with weights."""
    args = {"mix": [*REF["mix_args"], "Q4_K_M"], "iq4": [*REF["iq4_args"], "Q8_0"],
            "iq3s": [*REF["iq3s_args"], "Q8_0"], "iq2xs": [*REF["iq2xs_args"], "Q8_0"]}.get(case, [case])
    out = f"{case}-imatrix.gguf"
    assert _run(workdir, "quantize", "--allow-requantize", "--imatrix", imatrix.name, *args[:-1], "model.gguf", out,
                args[-1]) == 0
    assert _sha256(workdir / out) == QUANTIZE_SHA256[case]


def test_collector_sums_rows_in_order_and_skips_small_batches():
    c = Collector(chunk_size=4)
    x = np.array([[1e8, 1.0], [1.0, 2.0], [-1e8, 3.0]] * 6, np.float32)  # (18, 2)
    assert not c.wants("blk.0.attn_q.weight", 15) and not c.wants("output.weight", 64)
    assert c.wants("blk.0.attn_q.weight", 16) and Collector(4, process_output=True).wants("output.weight", 16)
    c.add_rows("blk.0.attn_q.weight", x)
    want = np.zeros(2, np.float32)
    for row in x:  # float32, row after row: 1e16 + 1 + 1e16 ... is not the float64 sum
        want += row * row
    sums, counts = c.stats["blk.0.attn_q.weight"]
    assert np.array_equal(sums[0], want) and list(counts) == [18] and c.last_chunk == 4
    sel = np.array([[1, 0], [1, 1]])
    c.add_expert_rows("blk.0.ffn_up_exps.weight", np.ones((2, 2, 3), np.float32) * 2, sel, n_expert=3)
    sums, counts = c.stats["blk.0.ffn_up_exps.weight"]
    assert list(counts) == [1, 3, 0] and sums[1].tolist() == [12.0] * 3 and sums[2].tolist() == [0.0] * 3


def test_bad_input(workdir, capsys):
    assert _run(workdir, "imatrix", "-m", "model.gguf", "-f", "zen.txt", "-c", "512", "-o", "x.gguf") == 1
    err = capsys.readouterr().err
    assert "you need at least 1024 tokens for a context of 512 tokens" in err and err.count("\n") == 1
    assert _run(workdir, "imatrix", "-m", "model.gguf", "-f", "missing.txt") == 1
    assert "missing.txt" in capsys.readouterr().err
    assert _run(workdir, "imatrix", "-m", "model.gguf", "-f", "zen.txt", "-c", "64", "-b", "100") == 1
    assert "must be below --ctx-size 64 or a multiple of it" in capsys.readouterr().err
    assert not (workdir / "x.gguf").exists()

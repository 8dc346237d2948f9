"""`llamactx perplexity --kl-divergence-base FILE [--kl-divergence]` against llama-perplexity 0c1e570's own runs
(tests/data/kld/make_kld_reference.sh: SmolLM2 Q4_1, 3 chunks of 128 tokens, the base with -fa off, the second run
with flash attention)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json

import numpy as np
import pytest

from llamactx.cli import kld, main
from tests.conftest import DATA, VARIANT

KLD = DATA / "kld"
NAME = "avx2" if VARIANT == "avx2" else "avx512"
GPL = str(DATA / "gpl3_head.txt")


def _reference(name: str):
    path = KLD / name
    if not path.exists():
        pytest.fail(f"missing reference {path}: run tests/data/kld/make_kld_reference.sh")
    return path


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """llamactx's base file, exit status and stdout for the reference settings."""
    path = tmp_path_factory.mktemp("kld") / "base.bin"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["perplexity", "-f", GPL, "-c", "128", "-b", "128", "--chunks", "3", "-t", "2", "-fa", "off",
                   "--kl-divergence-base", str(path)])
    return path, rc, out.getvalue()


def test_base_file_is_byte_identical_to_llama_perplexitys(base_run):
    """With bit-identical logits (-fa off) the saved file is llama-perplexity's, byte for byte, and the perplexity
    printed beside it (computed from the same float log-softmax) is its too."""
    path, rc, out = base_run
    ref = json.loads(_reference(f"base_{NAME}.json").read_text())
    assert rc == 0
    data = path.read_bytes()
    assert len(data) == ref["base_size"]
    assert hashlib.sha256(data).hexdigest() == ref["base_sha256"]
    assert ref["chunks"] in out and ref["final"] in out


def test_kl_divergence_prints_llama_perplexitys_table_and_statistics(base_run, capsys):
    """Every digit of the per-chunk table and of the three statistics blocks (PPL ratio, KLD quantiles, Δp,
    same top p) equals llama-perplexity's, reading the same base file."""
    path = base_run[0]
    assert main(["perplexity", "-c", "128", "-b", "128", "-t", "2", "--kl-divergence-base", str(path),
                 "--kl-divergence"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("chunk "):].rstrip("\n") + "\n"
    assert table == _reference(f"kld_{NAME}.txt").read_text(encoding="utf-8")


def test_compressed_rows_decode_to_the_log_softmax():
    """The uint16 form: two floats, then (logit - min_logit) / scale rounded, zero below max - 16, a zero pad
    for an odd vocabulary; decoding gives the log-softmax within half a step."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((3, 101)) * 6).astype(np.float32)
    logits[2] = 1.5  # a flat row: scale 0, every value 0
    rows, nll = kld.compress_log_probs(logits, np.array([0, 5, 7]))
    assert rows.shape == (3, kld.row_width(101)) == (3, 106) and (rows[:, -1] == 0).all()
    for r in range(2):
        scale, min_log_prob = rows[r, :4].copy().view(np.float32)
        x = logits[r].astype(np.float64)
        log_softmax = x - x.max() - np.log(np.exp(x - x.max()).sum())
        kept = x > max(x.min(), x.max() - 16)
        decoded = scale * rows[r, 4:105].astype(np.float64) + min_log_prob
        assert np.abs(decoded[kept] - log_softmax[kept]).max() <= 0.5 * scale + 1e-5
        assert (rows[r, 4:105][~kept] == 0).all() and rows[r, 4:105].max() == 65535
    assert rows[2, :2].tolist() == [0, 0] and (rows[2, 4:] == 0).all()
    assert nll[2] == pytest.approx(np.log(101), rel=1e-6)

    same = kld.KLDivergence()
    same.add(logits[:2], rows[:2], np.array([0, 5]))
    assert same.count == 2 and same.n_same_top == 2 and abs(same.sum_kld) < 1e-4


def _write_base(path, n_ctx=128, n_vocab=49152, n_chunk=3, tokens=None):
    with open(path, "wb") as f:
        kld.write_header(f, n_ctx, n_vocab, n_chunk, tokens if tokens is not None else [1] * (n_ctx * n_chunk))


@pytest.mark.parametrize("case, message", [
    ("magic", "does not look like a file containing log-probabilities"),
    ("vocab", "inconsistent vocabulary (1000 in the file vs 49152 in the model)"),
    ("tokens", "failed reading the 384 evaluation tokens"),
    ("token_id", "a token id out of range [0, 49152)"),
    ("n_ctx", "has been computed with n_ctx 128, while the current context is 64"),
    ("missing", "cannot open it"),
    ("no_base", "--kl-divergence needs --kl-divergence-base FILE"),
])
def test_bad_base_files_are_refused_naming_the_file(case, message, tmp_path, capsys):
    path = tmp_path / "base.bin"
    ctx = "128"
    if case == "magic":
        path.write_bytes(b"_notlogits_" + bytes(20))
    elif case == "vocab":
        _write_base(path, n_vocab=1000)
    elif case == "tokens":
        _write_base(path)
        path.write_bytes(path.read_bytes()[:100])
    elif case == "token_id":
        _write_base(path, tokens=[49152] * 384)
    elif case == "n_ctx":
        _write_base(path)
        ctx = "64"
    argv = ["perplexity", "-c", ctx, "--kl-divergence"]
    if case != "no_base":
        argv += ["--kl-divergence-base", str(path)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err, err
    if case not in ("no_base",):
        assert str(path) in err


def test_perplexity_without_a_text_is_refused(capsys):
    assert main(["perplexity", "-c", "128"]) == 1
    assert "-f FILE (the text to evaluate) is required" in capsys.readouterr().err

"""`llamactx embedding --pooling` on an embedding model (the tiny BERT, tests/data/tiny/tiny-bert.gguf): llama.cpp's
vectors for each pooling type, the model's own pooling by default; `llamactx run` on it refused with the reason."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamactx.cli import main


def _bert_reference():
    from tests.conftest import reference_path
    from tests.models.tiny import TINY

    ref = json.loads(reference_path(TINY, "bert.json").read_text())
    with np.load(reference_path(TINY, "bert.npz")) as npz:
        arrays = {k: npz[k] for k in npz.files}
    return str(TINY / "tiny-bert.gguf"), ref, arrays


@pytest.mark.parametrize("pooling", [None, "mean", "cls", "last", "none"])
def test_bert_pooling_flag_gives_llama_cpps_normalized_vectors(pooling, capsys):
    """`llamactx embedding --pooling P` prints llama.cpp's pooled embedding (flash attention on: -fa auto)
    normalised as llama-embedding does; without --pooling the model's own (mean); none: one row per token."""
    from llamactx.embedding import embd_normalize

    path, ref, arrays = _bert_reference()
    argv = ["embedding", "-m", path, "-p", ref["texts"][0], "--embd-output-format", "json"]
    assert main(argv + (["--pooling", pooling] if pooling else [])) == 0
    got = np.array([d["embedding"] for d in json.loads(capsys.readouterr().out)["data"]])  # 7 decimals
    raw = arrays[f"fa_{pooling or 'mean'}_0"]
    expected = np.stack([embd_normalize(r) for r in raw]) if pooling == "none" else embd_normalize(raw)[None]
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 5e-8


def test_bert_run_is_refused_naming_the_reason(capsys):
    path, _, _ = _bert_reference()
    assert main(["run", "-m", path, "-p", "the quick brown fox", "-n", "4"]) == 1
    err = capsys.readouterr().err
    assert "encoder" in err and "cannot generate" in err and err.count("\n") == 1, err

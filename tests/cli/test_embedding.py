"""`llamactx embedding`: llama-embedding's output shapes over the Embedder that LLM.embed and the server use."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from llamactx.cli import main
from llamactx.cli.embedding import cosine_similarity, format_embeddings, split_texts
from llamactx.embedding import Embedder

TEXTS = ["The cat sat on the mat.", "A dog slept on the rug.", "Quarterly revenue grew by 4%."]


@pytest.fixture(scope="module")
def vectors(smollm):
    tokens = [smollm.vocab.tokenize(t, add_special=True, parse_special=True) for t in TEXTS]
    return Embedder(smollm, n_ctx=512).embed(tokens)  # (3, n_embd)


def test_json_output_is_the_embedders_vectors(vectors, tmp_path, capsys):
    prompt_file = tmp_path / "texts.txt"
    prompt_file.write_text("\n".join(TEXTS) + "\n")  # the file's last newline does not add an empty text
    assert main(["embedding", "-f", str(prompt_file), "-c", "512", "--embd-output-format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1, 2]
    got = np.array([d["embedding"] for d in out["data"]])  # printed with 7 decimals
    assert got.shape == vectors.shape and np.abs(got - vectors).max() <= 5e-8


def test_default_listing_array_and_raw(vectors, capsys):
    assert main(["embedding", "-p", TEXTS[0], "-c", "512"]) == 0
    out = capsys.readouterr().out
    values = [float(v) for v in re.fullmatch(r"\nembedding 0: (.*) \n\n", out, re.S).group(1).split()]
    assert len(values) == vectors.shape[1] and np.abs(np.array(values) - vectors[0]).max() <= 5e-7
    assert main(["embedding", "-p", r"The cat sat on the mat.\nA dog slept on the rug.", "-c", "512",
                 "--embd-output-format", "array"]) == 0  # \n is an escape: two texts
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and np.abs(np.array(rows) - vectors[:2]).max() <= 5e-8
    assert main(["embedding", "-p", f"{TEXTS[0]}<#>{TEXTS[2]}", "--embd-separator", "<#>", "-c", "512",
                 "--embd-output-format", "raw"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2] == ""
    assert np.abs(np.array([[float(v) for v in line.split()] for line in lines[:2]]) - vectors[[0, 2]]).max() <= 5e-8


def test_several_texts_print_16_values_and_the_similarity_matrix(vectors):
    out = format_embeddings(vectors, TEXTS, "")
    lines = out.split("\n")
    assert lines[0] == "" and all(len(lines[1 + j].split()) == 2 + 16 for j in range(3))
    assert lines[5] == "cosine similarity matrix:" and lines[7] == "The ca A dog  Quarte "  # C's %6.6s
    sim = cosine_similarity(vectors)
    assert lines[8] == "".join(f"{s:6.2f} " for s in sim[0]) + "The cat sa"
    assert np.allclose(np.diag(sim), 1.0) and sim[0, 1] > sim[0, 2]  # the two animal sentences are closer
    plus = json.loads(format_embeddings(vectors, TEXTS, "json+"))
    assert np.allclose(plus["cosineSimilarity"], np.round(sim, 2))


def test_similarity_of_zero_vectors_is_llama_cpps():
    sim = cosine_similarity(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]], np.float32))
    assert sim.tolist() == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]


def test_split_texts():
    assert split_texts("a\nb\n", "\n", from_file=True) == ["a", "b"]
    assert split_texts("a\nb\n", "\n", from_file=False) == ["a", "b", ""]
    assert split_texts("a<s>b", "<s>", from_file=False) == ["a", "b"]


def test_an_empty_text_is_an_error(capsys):
    assert main(["embedding", "-p", r"one\n\ntwo", "-c", "512"]) == 1
    err = capsys.readouterr().err
    assert "text 1 ('') has no tokens" in err and err.count("\n") == 1

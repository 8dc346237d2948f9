"""Split GGUF models (llama.cpp's `-00001-of-0000N.gguf` files) and `llamactx gguf-split`: the files are
byte-identical to llama-gguf-split's (tests/data/split/llama-gguf-split.json holds its outputs' hashes), a split
model loads from its first file and computes llama.cpp's logits, and a broken set is refused naming the file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from llamactx import Model
from llamactx.cli.commands import main
from llamactx.gguf.reader import GGUFFile
from llamactx.gguf.split import GGUFSplit, merge, plan_split, split_path, split_prefix, write_split
from llamactx.gguf.values import GGUFError
from tests.models.tiny import TINY, decode_all, load_tiny, new_ctx

DATA = Path(__file__).parents[1] / "data" / "split"
SOURCE = TINY / "tiny-llama3.gguf"


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    return json.loads((DATA / "llama-gguf-split.json").read_text())["sha256"]


@pytest.fixture()
def parts(tmp_path) -> list[str]:
    """tiny-llama3 in three files, eight tensors each at most, as `llamactx gguf-split` writes them."""
    assert main(["gguf-split", "--split-max-tensors", "8", str(SOURCE), str(tmp_path / "a")]) == 0
    return [split_path(str(tmp_path / "a"), i, 3) for i in range(3)]


def test_split_names():
    assert split_path("/m/x", 0, 3) == "/m/x-00001-of-00003.gguf"
    assert split_prefix("/m/x-00002-of-00003.gguf", 1, 3) == "/m/x"
    assert split_prefix("/m/x-00002-of-00003.gguf", 0, 3) is None
    assert split_prefix("-00001-of-00003.gguf", 0, 3) is None


def test_split_and_merge_byte_identical_to_llama_gguf_split(tmp_path, parts, reference):
    for p in parts:
        assert sha256(p) == reference[Path(p).name], p
    assert main(["gguf-split", "--split-max-tensors", "11", "--no-tensor-first-split", str(SOURCE),
                 str(tmp_path / "b")]) == 0
    for i in range(3):
        p = split_path(str(tmp_path / "b"), i, 3)
        assert sha256(p) == reference[Path(p).name], p
    with GGUFFile(split_path(str(tmp_path / "b"), 0, 3)) as first:
        assert first.tensors == {}  # --no-tensor-first-split: metadata only
    assert main(["gguf-split", "--merge", parts[0], str(tmp_path / "am.gguf")]) == 0
    assert sha256(tmp_path / "am.gguf") == reference["am.gguf"]


def test_split_model_computes_llama_cpp_logits(parts):
    """A model given by its first file loads all three, with every weight a read-only view; its logits are
    llama.cpp's for the unsplit file (tests/data/tiny), with and without mmap."""
    _, _, ref, arrays = load_tiny("llama3")
    for use_mmap in (True, False):
        model = Model.load(parts[0], use_mmap=use_mmap)
        assert isinstance(model.gguf, GGUFSplit) and len(model.gguf.files) == 3
        assert {info.split for info in model.tensor_infos.values()} == {0, 1, 2}
        assert not any(a.flags.writeable for a in model.tensors.values())
        tokens = ref["prompts"][0]["tokens"]
        np.testing.assert_array_equal(decode_all(new_ctx(model), tokens), arrays["prompt_0"])
        model.close()


def test_plan_matches_file_order_and_limits():
    with GGUFFile(SOURCE) as g:
        plan = plan_split(g, max_tensors=8)
        assert [len(p) for p in plan.parts] == [8, 8, 6]
        assert [n for p in plan.parts for n in p] == list(g.tensors)
        with pytest.raises(GGUFError, match="0 tensors"):
            plan_split(g, max_bytes=1)  # the first tensor alone is over the limit


def _refused(path: str, match: str) -> None:
    with pytest.raises(GGUFError, match=match):
        Model.load(path)


def test_missing_part_refused_naming_it(parts):
    Path(parts[2]).unlink()
    _refused(parts[0], r"a-00003-of-00003\.gguf: the file is missing")


def test_loaded_from_a_later_part_refused(parts):
    _refused(parts[1], "must be loaded with the first split")


def test_parts_out_of_order_refused(parts):
    tmp = parts[1] + ".tmp"
    shutil.move(parts[1], tmp)
    shutil.move(parts[2], parts[1])
    shutil.move(tmp, parts[2])
    _refused(parts[0], r"invalid split file idx: 2 \(file: .*a-00002-of-00003\.gguf\), expected 1")


def test_foreign_part_refused(tmp_path, parts):
    """A part of another split of the same model (four files) put in place of part 2."""
    other = tmp_path / "other"
    other.mkdir()
    with GGUFFile(SOURCE) as g:
        written = write_split(g, plan_split(g, max_tensors=6), str(other / "a"))
    shutil.copy(written[1], parts[1])
    _refused(parts[0], "'split.count' is 4 but the first file's is 3")


def test_first_file_misnamed_refused(tmp_path, parts):
    renamed = tmp_path / "model.gguf"
    shutil.copy(parts[0], renamed)
    _refused(str(renamed), "invalid split file name")


def test_merge_refusals(tmp_path, parts):
    with pytest.raises(GGUFError, match="does not contain split.count"):
        merge(str(SOURCE), str(tmp_path / "x.gguf"))
    (tmp_path / "exists.gguf").write_bytes(b"")
    with pytest.raises(GGUFError, match="already exists"):
        merge(parts[0], str(tmp_path / "exists.gguf"))
    assert main(["gguf-split", "--merge", "--split-max-tensors", "4", parts[0], str(tmp_path / "y.gguf")]) == 1
    assert main(["gguf-split", "--split-max-size", "12K", str(SOURCE), str(tmp_path / "z")]) == 1
    assert not (tmp_path / "y.gguf").exists()

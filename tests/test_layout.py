"""The package's shape: what `import llamactx` loads, one error base, decode's status values."""

from __future__ import annotations

import subprocess
import sys

import pytest

import llamactx
from llamactx import DecodeStatus, LlamactxError


def test_importing_the_api_compiles_and_loads_no_kernel():
    code = ("import sys, llamactx, llamactx.llm\n"
            "print(sorted(m for m in sys.modules if m.startswith('llamactx.ggml.kernels')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_decode_status_equals_llama_decode_ints():
    assert (DecodeStatus.OK, DecodeStatus.NO_SLOT, DecodeStatus.ABORTED) == (0, 1, 2)


@pytest.mark.parametrize("name", ["GGUFError", "ModelLoadError", "ContextParamsError", "DecodeError", "StateError"])
def test_public_errors_share_one_base_and_keep_value_error(name):
    cls = getattr(llamactx, name)
    assert issubclass(cls, LlamactxError) and issubclass(cls, ValueError)


def test_every_llamactx_exception_class_has_the_base():
    import importlib
    import pkgutil

    names = [info.name for info in pkgutil.walk_packages(llamactx.__path__, "llamactx.")]
    assert "llamactx.server.worker" in names  # every package is walked, the server's too
    missing = []
    for name in names:
        if ".kernels" in name or name.endswith("__main__"):
            continue
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            if (isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == name
                    and not issubclass(obj, LlamactxError)):
                missing.append(f"{name}.{obj.__name__}")
    assert missing == []

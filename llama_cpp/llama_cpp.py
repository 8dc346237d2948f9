"""llama-cpp-python's llama_cpp.llama_cpp: llama.h's functions and constants, here llamactx's own objects behind
the same names (llamactx.llama_h; no ctypes, no C library). A llama.h name that llamactx does not provide raises
an AttributeError naming it, so `hasattr` answers honestly."""

from __future__ import annotations

from llamactx import llama_h
from llamactx.llama_h import *  # noqa: F403

_NAMES = [n for n in vars(llama_h) if n.startswith(("llama_", "LLAMA_", "GGML_"))]
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name.startswith(("llama_", "LLAMA_", "ggml_", "GGML_")):
        raise AttributeError(f"llama_cpp.{name}: llama.h's {name} is not provided by llamactx (no C library); "
                             f"see llamactx.llama_h for the functions it implements")
    raise AttributeError(f"module 'llama_cpp.llama_cpp' has no attribute {name!r}")

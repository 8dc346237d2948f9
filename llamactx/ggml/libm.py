"""The C library's float functions that ggml and llama.cpp call outside the kernels (logf, fmaf), through ctypes,
and float32 rounding: for the few scalars (YaRN factors, correction dims) that must round exactly as in C."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np


class Libm:
    """logf / fmaf from libm (what GCC calls for them), and float32 rounding."""

    def __init__(self):
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        self._logf, self._fmaf = lib.logf, lib.fmaf
        self._logf.restype, self._logf.argtypes = ctypes.c_float, [ctypes.c_float]
        self._fmaf.restype, self._fmaf.argtypes = ctypes.c_float, [ctypes.c_float] * 3

    @staticmethod
    def f32(x: float) -> float:
        return float(np.float32(x))

    def logf(self, x: float) -> float:
        return float(self._logf(x))

    def fmaf(self, a: float, b: float, c: float) -> float:
        return float(self._fmaf(a, b, c))


@functools.lru_cache(maxsize=1)
def libm() -> Libm:
    return Libm()

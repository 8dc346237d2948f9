"""What the CPU can do, which kernel path and arithmetic run on it, and how many threads the kernels (and BLAS) use.

The **target** is the CPU numba compiles for: the host, or `NUMBA_CPU_NAME` (an LLVM CPU name such as `haswell`,
`skylake-avx512`, `znver4`) with `NUMBA_CPU_FEATURES` when set. Its features, not the host's, pick every variant:
the VNNI kernel path (`vpdpbusd` on 256-bit vectors needs AVX512-VNNI + AVX512-VL, Ice Lake / Zen 4 and newer, or
AVX-VNNI, Alder Lake and newer) and the arithmetic that depends on the ISA (`arithmetic()`): ggml's float vector
width `F32_EPR` (16 lanes with AVX-512, 8 with AVX2), which orders its float sums, and flash attention's f16
accumulator in half precision with AVX512-FP16; and its CPU name, which decides GCC's tuning of the f32 dot
product's tail (`F32_TAIL_EPILOGUE`: Intel or AMD). So one machine builds and tests for another CPU that it can run:
a target whose features the host lacks is refused (its code would stop on an illegal instruction).

numba compiles for `NUMBA_CPU_NAME` with the *host's* features unless `NUMBA_CPU_FEATURES` is set, which would make
`haswell` on an AVX-512 host emit AVX-512; so for a named CPU without a feature string this module sets numba's
feature string to "" (LLVM's own features of that CPU) before anything is compiled, and takes the features from
`CPU_FEATURES` below. `LLAMACTX_NO_VNNI=1` forces the portable path, read once at import.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping

import llvmlite.binding as llvm
import numba

from llamactx.errors import LlamactxError

PATH_VNNI = "vnni"
PATH_PORTABLE = "portable"
NO_VNNI_ENV = "LLAMACTX_NO_VNNI"

# the ISA features cpu_features() reports (and `llamactx info` prints): the ones that pick a kernel or arithmetic
ISA_FEATURES = ("avx2", "f16c", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avxvnni", "avx512fp16",
             "avx512bf16")

# The ISA features that matter here of the LLVM CPU names a user is likely to target (LLVM's X86.td).
_V3 = frozenset({"avx", "avx2", "fma", "f16c", "bmi2"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
_VNNI = _V4 | {"avx512vnni"}
_SPR = _VNNI | {"avx512bf16", "avx512fp16", "avxvnni"}
CPU_FEATURES: dict[str, frozenset[str]] = {
    "x86-64": frozenset(), "generic": frozenset(), "x86-64-v2": frozenset(), "x86-64-v3": _V3, "x86-64-v4": _V4,
    "haswell": _V3, "broadwell": _V3, "skylake": _V3, "alderlake": _V3 | {"avxvnni"}, "raptorlake": _V3 | {"avxvnni"},
    "skylake-avx512": _V4, "cascadelake": _VNNI, "cooperlake": _VNNI | {"avx512bf16"}, "icelake-client": _VNNI,
    "icelake-server": _VNNI, "tigerlake": _VNNI, "rocketlake": _VNNI, "sapphirerapids": _SPR,
    "emeraldrapids": _SPR, "graniterapids": _SPR, "znver1": _V3, "znver2": _V3, "znver3": _V3,
    "znver4": _VNNI | {"avx512bf16"}, "znver5": _VNNI | {"avx512bf16", "avxvnni"},
}


class TargetError(LlamactxError, ValueError):
    """NUMBA_CPU_NAME / NUMBA_CPU_FEATURES name a CPU or feature llamactx cannot compile for on this host."""


def _parse_features(text: str, known: Mapping[str, bool]) -> tuple[set[str], set[str]]:
    """NUMBA_CPU_FEATURES ("+avx2,-avx512f,...") -> (features on, features off); each item must be +name or -name
    with a name LLVM knows for x86."""
    on: set[str] = set()
    off: set[str] = set()
    for item in filter(None, (t.strip() for t in text.split(","))):
        name = item[1:]
        if item[0] not in "+-" or name not in known:
            raise TargetError(f"NUMBA_CPU_FEATURES item {item!r} is not +FEATURE or -FEATURE with a feature LLVM "
                              f"knows (e.g. +avx2,-avx512f)")
        (on if item[0] == "+" else off).add(name)
    return on, off


def _resolve_target(name: str | None, features: str | None) -> tuple[str, frozenset[str], str | None]:
    """(cpu name, its features, None) for the target numba compiles for, or (name, no features, the error
    message) when the environment names a CPU or features that cannot run here."""
    host = llvm.get_host_cpu_features()
    host_on = frozenset(f for f, v in host.items() if v)
    cpu = name if name not in (None, "", "host") else llvm.get_host_cpu_name()
    try:
        if name in (None, "", "host"):
            feats = set(host_on)
        elif name in CPU_FEATURES:
            feats = set(CPU_FEATURES[name])
        else:
            raise TargetError(f"NUMBA_CPU_NAME = {name!r} is not a CPU llamactx knows; use one of "
                              f"{', '.join(sorted(CPU_FEATURES))}, or leave it unset for this CPU")
        if features is not None:
            on, off = _parse_features(features, host)
            feats = (feats | on) - off
        missing = sorted(f for f in feats & set(ISA_FEATURES) if f not in host_on)
        if missing:
            raise TargetError(f"the target {cpu!r} needs {', '.join(missing)}, which this CPU "
                              f"({llvm.get_host_cpu_name()}) lacks: its code would stop on an illegal instruction")
        return cpu, frozenset(feats), None
    except TargetError as e:
        return cpu, frozenset(), str(e)


def _configure_numba() -> tuple[str, frozenset[str], str | None]:
    """Resolve the target from numba's config and make numba compile for exactly that target (see module doc)."""
    name, features = numba.config.CPU_NAME, numba.config.CPU_FEATURES
    target = _resolve_target(name, features)
    if target[2] is not None:  # refused by check_target(); until then LLVM must not see a name it cannot use
        numba.config.CPU_NAME = numba.config.CPU_FEATURES = None
    elif name not in (None, "", "host") and features is None:
        numba.config.CPU_FEATURES = ""  # the named CPU's own features, not the host's
        os.environ["NUMBA_CPU_FEATURES"] = ""  # so that numba's config reload (and a child process) keeps it
    return target


_TARGET = _configure_numba()

# ggml's float vector width on the target (GGML_F32_EPR, simd-mappings.h): 16 with AVX-512, 8 with AVX / AVX2. A
# compile-time constant of the kernels; numba's cache keys them by the target's CPU name and features.
F32_EPR = 16 if "avx512f" in _TARGET[1] else 8

# How GCC vectorized the tail of ggml_vec_dot_f32 (`sumf += x[i]*y[i]` over the last n % 64 elements) in the
# AVX-512 build: 8 at a time, and with Intel tuning (native on Emerald Rapids) 4 more when more than 4 remain after
# 2+ blocks; with AMD tuning (native on Zen 4/5: GCC 12's -march=native is znver3 + the AVX-512 flags) no such
# epilogue. The compiler's tuning, not the ISA, decides it, so it follows the target's LLVM CPU name
# (docs/numerics.md). A compile-time constant of dot_vec, like F32_EPR.
F32_TAIL_EPILOGUE = F32_EPR == 16 and not _TARGET[0].startswith("znver")

# Whether decode's matmuls prefetch the weights in software (kernels/legacy.py PREFETCH_BYTES). The host's
# hardware decides, not the target: on Intel (Emerald Rapids) the hardware prefetcher alone read ~60% of what
# software prefetch reached; on AMD Zen 4 software prefetch made a single stream slower (one thread, Gemma 3's Q8_0
# output matrix from DRAM: 24.6 GB/s without, 9.9 with). Speed only: no result depends on it.
DECODE_PREFETCH = not llvm.get_host_cpu_name().startswith("znver")


def check_target() -> None:
    """Raise TargetError (one line for the user) if NUMBA_CPU_NAME / NUMBA_CPU_FEATURES cannot be used here."""
    if _TARGET[2] is not None:
        raise TargetError(_TARGET[2])


@functools.lru_cache(maxsize=1)
def cpu_features() -> dict[str, object]:
    """The target as the kernels see it: {"cpu": LLVM CPU name, "vnni": bool, "<feature>": bool, ...}.

    "vnni": the target has a 256-bit `vpdpbusd` (AVX512-VNNI + VL or AVX-VNNI)."""
    cpu, feats, _ = _TARGET
    out: dict[str, object] = {"cpu": cpu}
    out.update({f: f in feats for f in ISA_FEATURES})
    out["vnni"] = bool((out["avx512vnni"] and out["avx512vl"]) or out["avxvnni"])
    return out


def arithmetic() -> dict[str, object]:
    """Which llama.cpp build's arithmetic the target gives, and the switches that select it.

    "f32_epr": ggml's float vector width (16 AVX-512, 8 AVX2), which orders softmax, SiLU, f16 dot products and
    tinyBLAS sums. "fp16_accumulator": flash attention's one-chunk kernel accumulates in half precision (ggml built
    with AVX512-FP16). "bf16_dot": BF16 weights are multiplied with `_mm512_dpbf16_ps` (ggml built with
    AVX512_BF16, llamactx.ggml.vecdot_bf16; its tests' reference folder is that build's). "f32_tail_epilogue":
    ggml_vec_dot_f32's tail has GCC's 4-wide epilogue (an AVX-512 build with Intel tuning; F32_TAIL_EPILOGUE).
    "variant": the name of that arithmetic ("avx512-fp16", "avx512", "avx512-znver", "avx2"), which picks the
    tests' references. "build": the llama.cpp build whose logits llamactx's equal on this target."""
    feats = cpu_features()
    fp16 = bool(feats["avx512fp16"])
    if F32_EPR == 16:
        variant = "avx512-fp16" if fp16 else "avx512"
        build = "AVX-512 with AVX512-FP16, without AMX" if fp16 else "AVX-512 without AVX512-FP16"
        if F32_TAIL_EPILOGUE:
            build += ", the f32 dot product's tail as GCC 12 tunes it for Intel (native on Emerald Rapids)"
        else:
            variant += "-znver"
            build += ", the f32 dot product's tail as GCC 12 tunes it for AMD (native on Zen 4/5)"
    else:
        variant = "avx2"
        build = "GGML_NATIVE=OFF GGML_AVX=ON GGML_AVX2=ON GGML_FMA=ON GGML_F16C=ON (native on Haswell to Raptor " \
            "Lake, Zen 1-3)"
    bf16_dot = F32_EPR == 16 and bool(feats["avx512bf16"])
    return {"f32_epr": F32_EPR, "fp16_accumulator": fp16, "bf16_dot": bf16_dot,
            "f32_tail_epilogue": F32_TAIL_EPILOGUE, "variant": variant, "build": build}


def path_for(environ: Mapping[str, str]) -> str:
    """The kernel path for an environment: "vnni" when the CPU has it and LLAMACTX_NO_VNNI is not set, else
    "portable"."""
    forced_off = environ.get(NO_VNNI_ENV, "").strip() not in ("", "0")
    return PATH_VNNI if cpu_features()["vnni"] and not forced_off else PATH_PORTABLE


_ACTIVE_PATH = path_for(os.environ)


def active_path() -> str:
    """The path `matmul` uses by default in this process: "vnni" or "portable"."""
    return _ACTIVE_PATH


# numba's thread count is per calling thread, and asking numba for it costs more than a dict lookup: remember it.
_set_here = threading.local()


def set_threads(n_threads: int) -> None:
    """Use `n_threads` threads in the numba kernels launched from this thread and in BLAS (threadpoolctl), so that
    at most one pool is busy at a time (with a core busy in a second pool, a prange launch waits for it: hundreds
    of times slower). Nearly free when nothing changes. Raises ValueError outside 1..NUMBA_NUM_THREADS."""
    if getattr(_set_here, "n_threads", None) == n_threads:
        return
    if not 1 <= n_threads <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"n_threads = {n_threads} must be in 1..{numba.config.NUMBA_NUM_THREADS}")
    numba.set_num_threads(n_threads)
    _limit_blas(n_threads)
    _set_here.n_threads = n_threads


def _limit_blas(n_threads: int) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n_threads, user_api="blas")


def cache_is_warm() -> bool:
    """Whether numba's on-disk cache already holds the matmul kernel of the active path (if not, the first matmul
    of this process compiles it, which takes seconds: the CLI says so)."""
    from pathlib import Path

    if numba.config.CACHE_DIR:
        return any(Path(numba.config.CACHE_DIR).rglob(f"matmul.matmul_{_ACTIVE_PATH}-*.nbi"))
    cache = Path(__file__).parent / "kernels" / "__pycache__"
    return any(cache.glob(f"matmul.matmul_{_ACTIVE_PATH}-*.nbi"))

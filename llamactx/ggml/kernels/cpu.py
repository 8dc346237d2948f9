"""What the CPU can do, which kernel path runs on it, and how many threads the kernels (and BLAS) use.

The features are LLVM's view of the host (`llvmlite.binding.get_host_cpu_features`), i.e. exactly what numba
compiles for, so a path is only chosen when its instructions can be emitted. `vpdpbusd` on 256-bit vectors needs
AVX512-VNNI + AVX512-VL (Ice Lake, Zen 4 and newer) or AVX-VNNI (Alder Lake and newer). `LLAMACTX_NO_VNNI=1`
forces the portable path, read once at import.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping

import llvmlite.binding as llvm
import numba

PATH_VNNI = "vnni"
PATH_PORTABLE = "portable"
NO_VNNI_ENV = "LLAMACTX_NO_VNNI"

_REPORTED = ("avx2", "f16c", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avxvnni", "avx512fp16")


@functools.lru_cache(maxsize=1)
def cpu_features() -> dict[str, object]:
    """The host CPU as the kernels see it: {"cpu": LLVM CPU name, "vnni": bool, "<feature>": bool, ...}.

    "vnni" is False when numba is told to compile for another CPU (NUMBA_CPU_NAME, e.g. "generic" for portable
    caches): the VNNI kernel would then not compile."""
    feats = llvm.get_host_cpu_features()
    out: dict[str, object] = {"cpu": llvm.get_host_cpu_name()}
    out.update({f: bool(feats.get(f, False)) for f in _REPORTED})
    host_target = numba.config.CPU_NAME in (None, "host")
    out["vnni"] = host_target and bool((out["avx512vnni"] and out["avx512vl"]) or out["avxvnni"])
    return out


def path_for(environ: Mapping[str, str]) -> str:
    """The kernel path for an environment: "vnni" when the CPU has it and LLAMACTX_NO_VNNI is not set, else
    "portable"."""
    forced_off = environ.get(NO_VNNI_ENV, "").strip() not in ("", "0")
    return PATH_VNNI if cpu_features()["vnni"] and not forced_off else PATH_PORTABLE


_ACTIVE_PATH = path_for(os.environ)


def active_path() -> str:
    """The path `matmul` uses by default in this process: "vnni" or "portable"."""
    return _ACTIVE_PATH


# numba's thread count is per calling thread, and numba.get_num_threads() costs ~1 us: remember what was set.
_set_here = threading.local()


def set_threads(n_threads: int) -> None:
    """Use `n_threads` threads in the numba kernels launched from this thread and in BLAS (threadpoolctl), so that
    at most one pool is busy at a time (with the other core busy in a second pool, a prange launch was measured at
    0.93 ms instead of 2 us). ~0.1 us when nothing changes. Raises ValueError
    outside 1..NUMBA_NUM_THREADS."""
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
    cache = Path(__file__).parent / "__pycache__"
    return any(cache.glob(f"matmul.matmul_{_ACTIVE_PATH}-*.nbi"))

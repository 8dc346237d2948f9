"""Fast CPU kernels (numba): quantized matmul with ggml's precision, embedding lookup, CPU/thread control.

    pw = pack_weight(weight)              # once per model: repack to the kernels' layout (repack.py)
    pw = pack_weights([wq, wk, wv])       # or several (same type and k) as one matrix: one call, rows stacked
    y = matmul(x, pw, n_threads)          # (n, k) float32 -> (n, n_rows), as ggml_mul_mat
    e = get_rows(weight, ids)             # (n, k) float32, as ggml_get_rows
    cpu_features(), active_path()         # the target's {"vnni": True, ...}, "vnni" | "portable" (LLAMACTX_NO_VNNI=1)
    arithmetic(), check_target()          # which llama.cpp build's bits; TargetError for a bad NUMBA_CPU_NAME
    set_threads(n)                        # numba + BLAS thread counts

attention.py runs attention over the f16 KV cache, flash.py flash attention over it (the tiled kernel's
arithmetic), compute.py a recorded forward graph (llamactx.ggml.graph) in one compiled call; llamactx.backend.fast
(FastOps) uses all of them.

Results are bit-identical to ggml-cpu's x86 vec_dot for every quantized type (matmul.py). The first matmul of a
process compiles the kernel of its path (seconds), later processes load numba's on-disk cache. That cache
only tracks the file of each entry point: after editing a module under kernels/, delete
kernels/__pycache__/*.nbi and *.nbc.
"""

from llamactx.ggml.cpu import (
    TargetError,
    active_path,
    arithmetic,
    cache_is_warm,
    check_target,
    cpu_features,
    path_for,
    set_threads,
)
from llamactx.ggml.kernels.get_rows import get_rows
from llamactx.ggml.kernels.matmul import matmul
from llamactx.ggml.kernels.repack import PACKABLE_TYPES, PackedWeight, can_pack, pack_weight, pack_weights

__all__ = [
    "PACKABLE_TYPES",
    "PackedWeight",
    "TargetError",
    "active_path",
    "arithmetic",
    "cache_is_warm",
    "can_pack",
    "check_target",
    "cpu_features",
    "get_rows",
    "matmul",
    "pack_weight",
    "pack_weights",
    "path_for",
    "set_threads",
]

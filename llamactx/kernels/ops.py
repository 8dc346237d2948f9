"""FastOps: the ops layer on the numba kernels. Same interface and numbers as `ReferenceOps` (llamactx/ops.py);
only the weight-side operations are replaced: matmuls run on weights packed once per model, embedding rows are
decoded straight from the file. Everything else (norms, RoPE, attention) is inherited.
"""

from __future__ import annotations

import numba
import numpy as np

from llamactx.kernels.cpu import set_threads
from llamactx.kernels.get_rows import get_rows
from llamactx.kernels.matmul import matmul
from llamactx.kernels.repack import can_pack, pack_weight
from llamactx.ops import ReferenceOps
from llamactx.vecdot import EXACT_TYPES

_KERNEL_EXACT = frozenset(int(t) for t in EXACT_TYPES)  # 32-block types: bit-identical to ggml in the kernels


class FastOps(ReferenceOps):
    """Kernel-backed ops for one context. Packed weights live on the model (`model.derived`), so every context
    of a model shares one packed copy; `threads` is set by the context before each decode."""

    name = "fast"

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model
        self.threads = 1

    def set_threads(self, n_threads: int) -> None:
        # numba cannot start more threads than NUMBA_NUM_THREADS (the core count): more would only oversubscribe
        self.threads = min(n_threads, numba.config.NUMBA_NUM_THREADS)
        set_threads(self.threads)

    def _packed(self, weight):
        return self.model.derived(("packed", weight.name), lambda: pack_weight(weight))

    def matmul(self, x: np.ndarray, weight) -> np.ndarray:
        # The kernels reproduce ggml's vec_dot; for K-quants llama.cpp uses repacked / tiled kernels with another
        # order (llamactx/vecdot_k.py), so those weights stay on the exact reference until the kernels port it.
        if x.shape[0] == 0 or not can_pack(weight.ggml_type) or weight.ggml_type not in _KERNEL_EXACT:
            return super().matmul(x, weight)
        return matmul(np.ascontiguousarray(x, np.float32), self._packed(weight), self.threads)

    def get_rows(self, weight, ids: np.ndarray) -> np.ndarray:
        return get_rows(weight, np.asarray(ids))

"""FastOps: the ops layer on the numba kernels. Same interface and numbers as `ReferenceOps` (llamactx/ops.py);
only the weight-side operations are replaced: matmuls run on weights packed once per model, embedding rows are
decoded straight from the file. Everything else (norms, RoPE, attention) is inherited.
"""

from __future__ import annotations

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.ggml.attention import attention_f16_cells
from llamactx.ggml.kernels.cpu import set_threads
from llamactx.ggml.kernels.get_rows import get_rows, get_rows_q8_0_packed
from llamactx.ggml.kernels.matmul import matmul
from llamactx.ggml.kernels.repack import can_pack, pack_weight, pack_weights
from llamactx.ggml.ops import ReferenceOps
from llamactx.ggml.vecdot import EXACT_TYPES
from llamactx.ggml.vecdot_k import is_exact_k
from llamactx.lora import AdaptedWeight, is_adapted, lora_matmuls

_Q8_0 = int(T.Q8_0)
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
        return self.model.derived(("packed", weight.name), lambda: pack_weight(weight), replaces=(weight.name,))

    def matmul(self, x: np.ndarray, weight) -> np.ndarray:
        # The kernels reproduce ggml's vec_dot, and for the K-quants llama.cpp repacks or tiles (vecdot_k) its
        # order too; the other weights (F32/F16, Q5_K, Q4_K with ne1 % 8 != 0) stay on the reference.
        if isinstance(weight, AdaptedWeight):  # LoRA: the base product on the kernels, then the adapters'
            return lora_matmuls(self, x, [weight])[0]
        order = self._kernel_order(weight)
        if x.shape[0] == 0 or order is None:
            return super().matmul(x, weight)
        return matmul(x, self._packed(weight), self.threads, llama_order=order)

    def matmuls(self, x: np.ndarray, weights) -> list[np.ndarray]:
        # weights of one kernel type run as one matrix (rows stacked): one activation quantization and one thread
        # launch; every output row is computed as in its own matmul, so the bits do not change
        if is_adapted(weights):
            return lora_matmuls(self, x, weights)
        kinds = {self._kernel_order(w) for w in weights}
        types = {(w.ggml_type, w.shape[0]) for w in weights}
        if x.shape[0] == 0 or len(types) != 1 or len(kinds) != 1 or None in kinds:
            return super().matmuls(x, weights)
        key = ("packed", tuple(w.name for w in weights))
        pw, cols = self.model.derived(key, lambda: (pack_weights(weights), _column_ranges(weights)),
                                      replaces=tuple(w.name for w in weights))
        y = matmul(x, pw, self.threads, llama_order=kinds.pop())  # (n, sum of ne1)
        return [y[:, a:b] for a, b in cols]

    @staticmethod
    def _kernel_order(weight) -> bool | None:
        """llama_order for the kernels' matmul of this weight, None where the reference computes it."""
        if weight.ggml_type in _KERNEL_EXACT:
            return False
        return True if can_pack(weight.ggml_type) and is_exact_k(weight) else None

    def attention_kv(self, q, kv, il, mask, vis, kq_scale, flash, n_threads=1):
        # an f16 cache without flash attention is read in place: no f32 copy of the layer's cache per step
        if kv.type_k != "f16" or kv.type_v != "f16" or flash or q.shape[-1] % 16:
            return super().attention_kv(q, kv, il, mask, vis, kq_scale, flash, n_threads)
        n_head_kv = kv.n_embd_k_gqa // q.shape[-1]
        return attention_f16_cells(q, kv.k_stored(il), kv.v_stored(il), n_head_kv, vis, kq_scale,
                                   self.ggml_single_row)

    def get_rows(self, weight, ids: np.ndarray) -> np.ndarray:
        """Embedding rows. A Q8_0 table (SmolLM2's and Gemma's, tied to the output matrix) is read from its packed
        copy, so its file pages stay released: q * d is exact in float32, the same bits as dequantizing."""
        ids = np.asarray(ids)
        if weight.ggml_type != _Q8_0:
            return get_rows(weight, ids)
        return get_rows_q8_0_packed(self._packed(weight), ids)


def _column_ranges(weights) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each weight's outputs in the stacked matmul's columns."""
    stops = np.cumsum([w.n_rows for w in weights]).tolist()
    return tuple(zip([0, *stops[:-1]], stops, strict=True))

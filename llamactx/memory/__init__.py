"""Context memory: the `Memory` interface (llama_memory_i), KV cells bookkeeping, the KV cache and the iSWA cache.

    base.py         Memory: what a context remembers of its sequences (llama_memory_i, src/llama-memory.h)
    kv_cells.py     KVCells: which position and sequences each cell holds (src/llama-kv-cells.h)
    kv_cache.py     KVCache: keys and values per layer, in type_k / type_v (src/llama-kv-cache.*)
    kv_cache_iswa.py  KVCacheISWA: a global and a sliding-window cache behind one Memory (llama_kv_cache_iswa)
    recurrent.py    recurrent memory: one fixed-size state per sequence (llama_memory_recurrent)
    hybrid.py       hybrid memory: a KV cache and recurrent states behind one Memory (llama_memory_hybrid)
"""

from __future__ import annotations

from llamactx.memory.base import Memory, MemoryOpError
from llamactx.memory.kv_cache import KVCache, KVCacheAllocError
from llamactx.memory.kv_cache_iswa import KVCacheISWA
from llamactx.memory.kv_cells import KVCells

__all__ = ["KVCache", "KVCacheAllocError", "KVCacheISWA", "KVCells", "Memory", "MemoryOpError"]

"""Context memory: the `Memory` interface (llama_memory_i), KV cells bookkeeping, the KV cache and the iSWA cache."""

from __future__ import annotations

from llamactx.memory.base import Memory, MemoryOpError
from llamactx.memory.kv_cache import KVCache, KVCacheAllocError
from llamactx.memory.kv_cache_iswa import KVCacheISWA
from llamactx.memory.kv_cells import KVCells

__all__ = ["KVCache", "KVCacheAllocError", "KVCacheISWA", "KVCells", "Memory", "MemoryOpError"]

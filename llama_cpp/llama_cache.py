"""llama-cpp-python's prompt caches (llama_cpp/llama_cache.py): `Llama.set_cache(cache)` makes each completion
start from the saved state of the longest cached prefix of its prompt and save its own state after. A key is a
token sequence; a lookup answers the entry sharing the longest prefix with it (KeyError when none shares one)."""

from __future__ import annotations

import hashlib
import os
import pickle
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence

from llamactx.llama_cpp_options import LlamaState


def _longest_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class BaseLlamaCache(ABC):
    """A cache of LlamaState keyed by token sequences, holding at most `capacity_bytes` of states."""

    def __init__(self, capacity_bytes: int = (2 << 30)):
        self.capacity_bytes = capacity_bytes

    @property
    @abstractmethod
    def cache_size(self) -> int: ...

    @abstractmethod
    def _keys(self) -> list[tuple[int, ...]]: ...

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        best, best_len = None, 0
        for k in self._keys():
            n = _longest_prefix(k, key)
            if n > best_len:
                best, best_len = k, n
        return best

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    @abstractmethod
    def __getitem__(self, key: Sequence[int]) -> LlamaState: ...

    @abstractmethod
    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None: ...


class LlamaRAMCache(BaseLlamaCache):
    """States in RAM, least recently used dropped first past capacity_bytes."""

    def __init__(self, capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        self.cache_state: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(state.llama_state_size for state in self.cache_state.values())

    def _keys(self) -> list[tuple[int, ...]]:
        return list(self.cache_state)

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = self._find_longest_prefix_key(tuple(int(t) for t in key))
        if found is None:
            raise KeyError("Key not found")
        self.cache_state.move_to_end(found)
        return self.cache_state[found]

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        key = tuple(int(t) for t in key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        while self.cache_size > self.capacity_bytes and self.cache_state:
            self.cache_state.popitem(last=False)


LlamaCache = LlamaRAMCache  # llama-cpp-python's older name


class LlamaDiskCache(BaseLlamaCache):
    """States pickled into `cache_dir`, one file per key (named by the key's hash) plus an index of the keys;
    the oldest entries are dropped past capacity_bytes. A lookup takes the entry out of the cache, as
    llama-cpp-python's does (the next completion saves it again)."""

    def __init__(self, cache_dir: str = ".cache/llama_cache", capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        self.cache_dir = cache_dir
        os.makedirs(cache_dir, exist_ok=True)
        self._index_path = os.path.join(cache_dir, "index.pkl")
        self._index: OrderedDict[tuple[int, ...], str] = OrderedDict()
        if os.path.exists(self._index_path):
            with open(self._index_path, "rb") as f:
                self._index = pickle.load(f)

    def _path(self, key: tuple[int, ...]) -> str:
        return os.path.join(self.cache_dir, hashlib.sha256(repr(key).encode()).hexdigest() + ".state")

    def _save_index(self) -> None:
        with open(self._index_path, "wb") as f:
            pickle.dump(self._index, f)

    @property
    def cache_size(self) -> int:
        return sum(os.path.getsize(p) for p in self._index.values() if os.path.exists(p))

    def _keys(self) -> list[tuple[int, ...]]:
        return list(self._index)

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = self._find_longest_prefix_key(tuple(int(t) for t in key))
        if found is None:
            raise KeyError("Key not found")
        path = self._index.pop(found)
        with open(path, "rb") as f:
            value = pickle.load(f)
        os.remove(path)
        self._save_index()
        return value

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        key = tuple(int(t) for t in key)
        path = self._path(key)
        with open(path, "wb") as f:
            pickle.dump(value, f)
        self._index.pop(key, None)
        self._index[key] = path
        while self.cache_size > self.capacity_bytes and len(self._index) > 1:
            _, old = self._index.popitem(last=False)
            if os.path.exists(old):
                os.remove(old)
        self._save_index()

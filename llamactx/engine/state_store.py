"""Where the session tier keeps sequence states (engine/session_tier.py): `StateRam`, states in RAM bounded in bytes,
least recently used out first (also the server's --cache-ram, server/prompt_cache.py: the one store of states in
RAM), and `StateDisk`, entry files in a directory bounded in bytes, least recently used (mtime) deleted first.

An entry file is `<n_tokens>-<key>.state`, key = sha256(context key || the tokens as i32 little-endian)
(`prefix_keys`): magic b"LLCTXSE\\0" | u32 version | context key (32 bytes) | key (32) | u32 n_tokens | u64 n_state
| sha256 of all of it before this field, the tokens and the state (32) | i32 tokens[n_tokens] | state[n_state].
`decode_entry` refuses a file that is cut short, fails its checksum, carries another context key (another model
or context parameters) or whose tokens do not hash to its name.

Several processes may share one directory (replicas): a file is written whole under a temporary name and renamed
(`os.replace`), a reader touches the file it used (its mtime is the LRU clock) and takes a file that vanished as a
miss, and whoever writes deletes the least recently used files past the bound.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamactx.engine.sequence import EngineError
from llamactx.state_io import StateError

ENTRY_MAGIC = b"LLCTXSE\0"
ENTRY_VERSION = 1
ENTRY_HEADER = struct.Struct("<8sI32s32sIQ")  # magic, version, context key, key, n_tokens, n_state
CHECKSUM_SIZE = 32
SUFFIX = ".state"
TMP_PREFIX = ".tmp-"
TMP_STALE_S = 600.0  # a temporary file this old was left by a writer that died: deleted when room is made


class SessionEntryError(StateError):
    """A session tier entry that cannot be used: cut short, corrupt, or saved by another model or context."""


@dataclass(frozen=True, slots=True)
class SessionEntry:
    """A sequence state and the tokens it holds (positions [0, len(tokens))); `context`: the context key it was
    stored under (the session tier's; empty for the server's prompt cache)."""

    tokens: tuple[int, ...]
    state: bytes
    context: bytes = b""

    @property
    def nbytes(self) -> int:
        return len(self.state) + 4 * len(self.tokens)


class StateRam:
    """Sequence states in RAM by key, least recently used first, at most `limit` bytes of them (0: no bound). The
    one store of states in RAM: the session tier's RAM level and the server's --cache-ram (server/prompt_cache.py)."""

    def __init__(self, limit: int = 0):
        self.limit = limit
        self.entries: OrderedDict[Hashable, SessionEntry] = OrderedDict()
        self.lengths: Counter[int] = Counter()  # n_tokens -> how many entries hold that many
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.entries

    def items(self) -> Iterator[tuple[Hashable, SessionEntry]]:
        """(key, entry) pairs, least recently used first."""
        return iter(list(self.entries.items()))

    def fits(self, entry: SessionEntry) -> bool:
        return not self.limit or entry.nbytes <= self.limit

    def put(self, key: Hashable, entry: SessionEntry) -> list[tuple[Hashable, SessionEntry]]:
        """Keep `entry` under `key` as the most recently used (replacing what the key held); returns what was
        dropped to stay within the bound, least recently used first (the entry itself when it alone is over)."""
        if not self.fits(entry):
            return [(key, entry)]
        self.pop(key)
        self.entries[key] = entry
        self.lengths[len(entry.tokens)] += 1
        self.nbytes += entry.nbytes
        dropped = []
        while self.limit and self.nbytes > self.limit:
            old = next(iter(self.entries))
            dropped.append((old, self.pop(old)))
        return dropped

    def get(self, key: Hashable) -> SessionEntry | None:
        """The entry under `key` (now the most recently used), None without one."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def pop(self, key: Hashable) -> SessionEntry | None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry.nbytes
            self.lengths[len(entry.tokens)] -= 1
            if not self.lengths[len(entry.tokens)]:
                del self.lengths[len(entry.tokens)]
        return entry


class StateDisk:
    """Entry files in `path` named `<n_tokens>-<key>.state`, at most `limit` bytes of them, least recently used
    (mtime) deleted first; safe for several processes sharing the directory (module docstring)."""

    def __init__(self, path: str | os.PathLike, limit: int):
        self.path = Path(path)
        self.limit = limit
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise EngineError(f"session directory {str(self.path)!r} cannot be created: {e}") from None
        if not self.path.is_dir():
            raise EngineError(f"session directory {str(self.path)!r} is not a directory")
        self._listing: tuple[int, dict[str, int]] = (-1, {})  # (directory mtime_ns, key -> n_tokens)

    @staticmethod
    def name(n_tokens: int, key: str) -> str:
        return f"{n_tokens}-{key}{SUFFIX}"

    def index(self) -> dict[str, int]:
        """key -> n_tokens of the entries in the directory, read from the file names (again only when the
        directory changed: another process may have written or deleted entries)."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        if mtime != self._listing[0]:
            found = {}
            for name in os.listdir(self.path):
                parsed = _parse_name(name)
                if parsed is not None:
                    found[parsed[1]] = parsed[0]
            self._listing = (mtime, found)
        return self._listing[1]

    def exists(self, n_tokens: int, key: str) -> bool:
        """Whether the entry is there; it is touched (now the most recently used) if so."""
        try:
            os.utime(self.path / self.name(n_tokens, key))
            return True
        except FileNotFoundError:
            return False

    def read(self, n_tokens: int, key: str) -> bytes | None:
        """The entry file's bytes (touched: now the most recently used), None when it is not there."""
        path = self.path / self.name(n_tokens, key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # another process deleted it since the listing
            return None
        try:
            os.utime(path)
        except FileNotFoundError:
            pass
        return data

    def write(self, n_tokens: int, key: str, parts: Seq[bytes]) -> bool:
        """Write an entry (its bytes in `parts`) under a temporary name and rename it into place, after deleting
        the least recently used entries it needs room for; False when it is larger than the whole bound."""
        size = sum(len(p) for p in parts)
        if size > self.limit:
            return False
        tmp = self.path / f"{TMP_PREFIX}{os.getpid()}-{time.monotonic_ns()}-{self.name(n_tokens, key)}"
        try:
            with open(tmp, "wb") as f:
                for p in parts:
                    f.write(p)
            self._make_room(size)
            os.replace(tmp, self.path / self.name(n_tokens, key))
        finally:
            tmp.unlink(missing_ok=True)
        self._make_room(0)  # another writer may have added its entry meanwhile
        return True

    def remove(self, n_tokens: int, key: str) -> None:
        (self.path / self.name(n_tokens, key)).unlink(missing_ok=True)

    def files(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every entry file, least recently used first."""
        out = []
        for name in os.listdir(self.path):
            if _parse_name(name) is None:
                continue
            try:
                st = (self.path / name).stat()
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, st.st_size, self.path / name))
        return sorted(out)

    @property
    def nbytes(self) -> int:
        return sum(size for _, size, _ in self.files())

    def _make_room(self, n_bytes: int) -> None:
        """Delete the least recently used entries until `n_bytes` more fit within the bound, and temporary files
        left by writers that died."""
        files = self.files()
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total + n_bytes <= self.limit:
                break
            path.unlink(missing_ok=True)
            total -= size
        now = time.time()
        for name in os.listdir(self.path):
            if name.startswith(TMP_PREFIX):
                try:
                    if now - (self.path / name).stat().st_mtime > TMP_STALE_S:
                        (self.path / name).unlink(missing_ok=True)
                except FileNotFoundError:
                    pass


def prefix_keys(ctx_key: bytes, tokens: Seq[int], lengths: Seq[int]) -> dict[int, str]:
    """{n: hex sha256(ctx_key || tokens[:n] as i32 little-endian)} for each n of `lengths` (ascending, each at
    most len(tokens)), hashing the tokens once."""
    data = np.asarray(tokens[: max(lengths)], dtype="<i4").tobytes()  # (n_max * 4,)
    h = hashlib.sha256(ctx_key)
    out, done = {}, 0
    for n in lengths:
        h.update(data[4 * done : 4 * n])
        done = n
        out[n] = h.copy().hexdigest()
    return out


def encode_entry(ctx_key: bytes, key: bytes, tokens: Seq[int], state: bytes) -> list[bytes]:
    """An entry file's bytes, in parts (the state is not copied): header, checksum, tokens, state."""
    toks = np.asarray(tokens, dtype="<i4").tobytes()  # (n_tokens * 4,)
    head = ENTRY_HEADER.pack(ENTRY_MAGIC, ENTRY_VERSION, ctx_key, key, len(tokens), len(state))
    h = hashlib.sha256(head)
    h.update(toks)
    h.update(state)
    return [head, h.digest(), toks, state]


def decode_entry(data: bytes, ctx_key: bytes, key: str) -> SessionEntry:
    """Check an entry file's bytes and return its entry; SessionEntryError when it is cut short, fails its
    checksum, was saved under another context key (another model or context parameters) or its tokens do not
    hash to `key`, its name."""
    n_head = ENTRY_HEADER.size + CHECKSUM_SIZE
    if len(data) < n_head:
        raise SessionEntryError(f"entry is truncated: {len(data)} bytes, its header alone needs {n_head}")
    magic, version, entry_ctx, entry_key, n_tokens, n_state = ENTRY_HEADER.unpack_from(data)
    if magic != ENTRY_MAGIC:
        raise SessionEntryError("not a llamactx session entry: wrong magic")
    if version != ENTRY_VERSION:
        raise SessionEntryError(f"entry version {version} is not supported (expected {ENTRY_VERSION})")
    if len(data) != n_head + 4 * n_tokens + n_state:
        raise SessionEntryError(f"entry is truncated or padded: its header says {n_head + 4 * n_tokens + n_state} "
                                f"bytes ({n_tokens} tokens, a {n_state}-byte state), the file has {len(data)}")
    view = memoryview(data)
    h = hashlib.sha256(view[: ENTRY_HEADER.size])
    h.update(view[n_head:])
    if h.digest() != bytes(view[ENTRY_HEADER.size : n_head]):
        raise SessionEntryError("entry fails its checksum: it was changed or cut short since it was written")
    if entry_ctx != ctx_key:
        raise SessionEntryError(f"entry was saved by another model or with other context parameters (context key "
                                f"{entry_ctx.hex()[:16]}, this context's {ctx_key.hex()[:16]})")
    tokens = np.frombuffer(view[n_head : n_head + 4 * n_tokens], dtype="<i4")  # (n_tokens,)
    if entry_key.hex() != key or prefix_keys(ctx_key, tokens, [n_tokens])[n_tokens] != key:
        raise SessionEntryError(f"entry's tokens do not hash to its name's key {key[:16]}")
    return SessionEntry(tuple(tokens.tolist()), bytes(view[n_head + 4 * n_tokens :]), entry_ctx)


def _parse_name(name: str) -> tuple[int, str] | None:
    """(n_tokens, key) of an entry file name `<n_tokens>-<64 hex>.state`; None for any other file."""
    if not name.endswith(SUFFIX):
        return None
    n, sep, key = name[: -len(SUFFIX)].partition("-")
    if not sep or not n.isdigit() or len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        return None
    return int(n), key

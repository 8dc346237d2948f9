"""A session tier below the KV pool: the sequence states of evicted slots, kept in RAM and then on disk, so that
an evicted conversation comes back without its prompt being decoded again (llama-server's `--cache-ram` keeps
slot states in RAM, tools/server/server-task.cpp `server_prompt_cache`; this adds a disk level under it and finds
states by a hash of their token prefix, as vLLM's prefix caching finds KV blocks).

When the prefix cache drops what an idle slot holds (LRU eviction, or a new request taking the slot), the slot's
state (`Context.state_seq_get_data`, llama.cpp's sequence state) goes to the RAM level, bounded in bytes, least
recently used out first; what falls out goes to the disk level: a directory bounded in bytes, least recently used
(mtime) deleted first. A request whose prompt starts with a stored prefix longer than what the cells give it gets
that state back (`state_seq_set_data`) and decodes only the rest: the cells are the stored bytes, and since
attention sums follow positions (docs/numerics.md) the logits equal those of the uninterrupted conversation.

A state is stored at its slot's full length and found again by hashing the prompt's prefixes at the lengths
stored (each level keeps its lengths; the disk level reads them from its file names, `<n_tokens>-<key>.state`).
A state is restored only at its own end: a KV cache's could serve shorter prefixes, but an iSWA cache holds only
the window at its end and a recurrent state exists only there, so every memory is treated alike.

key = sha256(context key || the tokens as i32 little-endian), the context key being sha256 of what changes the
bits of a state or of what is computed from it: the model (arch, fingerprint), the state format, the KV types,
flash attention, swa_full, kv_layout_exact, n_ubatch (K-quant kernels depend on a ubatch's rows), RoPE / YaRN,
the LoRA adapters in effect and the target's arithmetic (ggml.cpu.arithmetic).

Entries live in engine/state_store.py: `StateRam` and `StateDisk` (a directory several processes may share), and
the entry file format. A file that is cut short, fails its checksum, comes from another model or context
parameters, or whose tokens do not hash to its name is refused, deleted and logged, never loaded. A state that
passes and that the context still cannot take now (too few free cells: StateError, memory unchanged) stays, and
the prompt is decoded instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from llamactx.engine.sequence import EngineError
from llamactx.engine.state_store import (
    SessionEntry,
    SessionEntryError,
    StateDisk,
    StateRam,
    decode_entry,
    encode_entry,
    prefix_keys,
)
from llamactx.ggml.cpu import arithmetic
from llamactx.state import STATE_VERSION
from llamactx.state_io import StateError

log = logging.getLogger("llamactx.engine")


@dataclass(frozen=True, slots=True)
class SessionParams:
    """The session tier's levels: RAM (`ram_bytes`, 0 = none), disk (`disk_dir` bounded by `disk_bytes`, None =
    none), and the shortest state worth storing (`min_tokens`). Off when neither level is given."""

    ram_bytes: int = 0
    disk_dir: str | None = None
    disk_bytes: int = 0
    min_tokens: int = 64

    def __post_init__(self):
        for name in ("ram_bytes", "disk_bytes", "min_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EngineError(f"session {name} = {value!r} must be an integer >= 0")
        if self.min_tokens < 1:
            raise EngineError(f"session min_tokens = {self.min_tokens} must be >= 1")
        if (self.disk_dir is None) != (self.disk_bytes == 0):
            raise EngineError(f"session disk_dir = {self.disk_dir!r} and disk_bytes = {self.disk_bytes}: the disk "
                              "level needs both a directory and a bound > 0")

    @property
    def enabled(self) -> bool:
        return self.ram_bytes > 0 or self.disk_dir is not None


@dataclass(slots=True)
class SessionStats:
    n_stored: int = 0  # states taken from a slot
    n_restored_ram: int = 0
    n_restored_disk: int = 0
    n_refused: int = 0  # disk entries refused (cut short, corrupt, foreign) and deleted


class SessionTier:
    """The RAM and disk levels of one context's evicted sequence states (module docstring). Runs on the engine's
    thread, as the prefix cache that calls it."""

    def __init__(self, ctx, params: SessionParams):
        self.ctx = ctx
        self.params = params
        self.ram = StateRam(params.ram_bytes) if params.ram_bytes else None
        self.disk = StateDisk(params.disk_dir, params.disk_bytes) if params.disk_dir is not None else None
        self.stats = SessionStats()
        self._context: tuple[object, bytes] = (None, b"")  # (the adapters it was computed for, context key)

    def context_key(self) -> bytes:
        """sha256 of what changes the bits of a state (module docstring); recomputed when the adapters change."""
        loras = self.ctx.adapters_lora
        if self._context[0] != loras or not self._context[1]:
            self._context = (loras, context_key(self.ctx))
        return self._context[1]

    def store(self, seq_id: int, tokens: Seq[int]) -> bool:
        """Keep the state of `seq_id`, which holds exactly `tokens`: in RAM (what falls out goes to disk), else on
        disk. False when it is shorter than min_tokens or larger than the levels' bounds."""
        n = len(tokens)
        if n < self.params.min_tokens:
            return False
        ctx_key = self.context_key()
        key = prefix_keys(ctx_key, tokens, [n])[n]
        if self.ram is not None and self.ram.get(key) is not None:
            return True  # already here (restored and evicted again unchanged): now the most recently used
        on_disk = self.disk is not None and self.disk.exists(n, key)
        if on_disk and self.ram is None:
            return True
        entry = SessionEntry(tuple(tokens), self.ctx.state_seq_get_data(seq_id), ctx_key)
        self.stats.n_stored += 1
        if self.ram is not None and self.ram.fits(entry):
            for old_key, old in self.ram.put(key, entry):
                self._spill(old_key, old)
            return True
        return on_disk or self._spill(key, entry)

    def _spill(self, key: str, entry: SessionEntry) -> bool:
        """Write an entry that leaves RAM (or never fit there) to the disk level, unless it is there already."""
        if self.disk is None:
            return False
        n = len(entry.tokens)
        if self.disk.exists(n, key):
            return True
        return self.disk.write(n, key, encode_entry(entry.context, bytes.fromhex(key), entry.tokens, entry.state))

    def held(self) -> list[tuple[int, ...]]:
        """The token histories whose states the RAM level holds, least recently used first (what a replica tells
        its router it can restore without the disk level, which replicas may share: cluster/replica.py)."""
        return [entry.tokens for _, entry in self.ram.items()] if self.ram is not None else []

    def find(self, prompt: Seq[int], limit: int) -> int:
        """The longest stored prefix of `prompt` of at most `limit` tokens (0 without one); nothing is loaded."""
        found = self._candidates(prompt, limit, 0)
        return found[0][0] if found else 0

    def restore(self, seq_id: int, prompt: Seq[int], n_min: int, limit: int) -> int:
        """Load into `seq_id` the longest stored prefix of `prompt` longer than `n_min` and of at most `limit`
        tokens, replacing what `seq_id` held; returns its length, or 0 (memory unchanged) when none loads. A disk
        entry that is cut short, corrupt or foreign is deleted on the way; one the context cannot take now (too
        few free cells) stays."""
        for n, key in self._candidates(prompt, limit, n_min):
            entry = self.ram.get(key) if self.ram is not None else None
            if entry is not None and self._load(seq_id, entry, prompt, n):
                self.stats.n_restored_ram += 1
                return n
            entry = self._read_disk(n, key) if entry is None else None
            if entry is not None and self._load(seq_id, entry, prompt, n):
                self.stats.n_restored_disk += 1
                if self.ram is not None:  # in use again: back to RAM, the least recently used out
                    for old_key, old in self.ram.put(key, entry):
                        self._spill(old_key, old)
                return n
        return 0

    def _candidates(self, prompt: Seq[int], limit: int, n_min: int) -> list[tuple[int, str]]:
        """(n_tokens, key) of the stored prefixes of `prompt` with n_min < n_tokens <= limit, longest first."""
        ram = self.ram.lengths if self.ram is not None else {}
        disk = self.disk.index() if self.disk is not None else {}
        lengths = {n for n in (*ram, *disk.values()) if n_min < n <= min(limit, len(prompt))}
        if not lengths:
            return []
        keys = prefix_keys(self.context_key(), prompt, sorted(lengths))
        return sorted(((n, k) for n, k in keys.items() if (self.ram is not None and k in self.ram) or k in disk),
                      reverse=True)

    def _read_disk(self, n: int, key: str) -> SessionEntry | None:
        if self.disk is None:
            return None
        data = self.disk.read(n, key)
        if data is None:
            return None
        try:
            return decode_entry(data, self.context_key(), key)
        except SessionEntryError as e:
            self.stats.n_refused += 1
            self.disk.remove(n, key)
            log.warning("session tier: %s refused and deleted: %s", StateDisk.name(n, key), e)
            return None

    def _load(self, seq_id: int, entry: SessionEntry, prompt: Seq[int], n: int) -> bool:
        if entry.tokens != tuple(prompt[:n]):
            return False  # another prefix under the same hash: never in practice, and never loaded
        try:
            self.ctx.state_seq_set_data(entry.state, seq_id)
        except StateError as e:
            log.info("session tier: a %d-token state was not loaded into seq %d: %s", n, seq_id, e)
            return False
        return True


def context_key(ctx) -> bytes:
    """sha256 of what changes the bits of a state or of the logits computed from it (module docstring)."""
    p, model = ctx.params, ctx.model
    target = arithmetic()
    fields = {
        "arch": model.arch, "fingerprint": model.fingerprint, "state_version": STATE_VERSION,
        "type_k": p.type_k, "type_v": p.type_v, "flash_attn": p.flash_attn, "swa_full": p.swa_full,
        "kv_layout_exact": p.kv_layout_exact, "n_ubatch": p.n_ubatch, "causal_attn": p.causal_attn,
        "rope": [repr(getattr(p, f)) for f in ("rope_freq_base", "rope_freq_scale", "yarn_ext_factor",
                                                "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow")],
        "n_ctx_orig_yarn": p.n_ctx_orig_yarn, "rope_scaling_type": p.rope_scaling_type,
        "lora": [_adapter_identity(a, s) for a, s in ctx.adapters_lora],
        "arithmetic": [target["variant"], target["bf16_dot"]],
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).digest()


def _adapter_identity(adapter, scale: float) -> list:
    try:
        size = adapter.path.stat().st_size
    except OSError:
        size = -1
    return [adapter.path.name, size, repr(adapter.alpha), len(adapter.weights), repr(scale)]

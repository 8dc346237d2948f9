"""Prompts kept in RAM beyond the slots (llama-server's `--cache-ram` and `--cache-idle-slots`: server-task.cpp
`server_prompt_cache` alloc / load, server-context.cpp `get_available_slot`, `prompt_save` / `prompt_load` and the
idle-slot save on launching a task).

With `--cache-ram N` (MiB) the server picks the slot of each new generation itself, as llama-server does: the one
asked for, else the idle slot whose tokens share the most of the prompt (over 10% of it), else the least recently
used one, whose context is then saved here ("updating prompt cache") and replaced by the cached prompt that best
matches the new one. With idle-slot caching on (the default with --cache-ram), launching a request also saves
every other idle slot here and, with a unified KV pool, clears it, so its cells go to the running requests and
it comes back from RAM when asked for. The states are the context's sequence states (`state_seq_get_data`),
held in the engine's one store of states in RAM (engine/state_store.py `StateRam`, which the session tier's RAM
level is too); the oldest go first past N MiB. Everything here runs on the engine thread, through the engine's
slot API.
"""

from __future__ import annotations

import itertools
import logging

from llamactx.engine import Engine
from llamactx.engine.prefix_cache import common_prefix
from llamactx.engine.state_store import SessionEntry, StateRam
from llamactx.errors import LlamactxError

log = logging.getLogger("llamactx.server")

SLOT_PROMPT_SIMILARITY = 0.1  # llama-server's --slot-prompt-similarity default


class PromptCache:
    """Saved slot states, oldest first, at most `limit_mib` MiB of them (< 0: no limit)."""

    def __init__(self, limit_mib: float, cache_idle_slots: bool, kv_unified: bool):
        # by their tokens, oldest first; a bound of 0 is no limit (--cache-ram -1)
        self.states = StateRam(int(limit_mib * 1024 * 1024) if limit_mib > 0 else 0)
        self.cache_idle_slots = cache_idle_slots
        self.kv_unified = kv_unified
        self._tick = itertools.count(1)
        self._last_used: dict[int, int] = {}
        self._reserved: set[int] = set()  # slots given to requests added since the last step (not yet running)
        if cache_idle_slots:
            log.debug("idle slots will be saved to the prompt cache%s upon starting a new task",
                      " and cleared" if kv_unified else "")
            log.debug("__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")

    @property
    def size(self) -> int:
        return self.states.nbytes

    def launch(self, engine: Engine, prompt: list[int], id_slot: int) -> int:
        """Before `prompt` is added to the engine: choose its slot (the id to add it with; -1 when no slot is
        idle, and the engine places it later), updating the cache as llama-server does, then save (and clear)
        the other idle slots."""
        if not -1 <= id_slot < engine.n_slots:
            return id_slot  # the engine refuses it, naming the range
        slot = self._select(engine, prompt, id_slot)
        if slot >= 0:
            self._last_used[slot] = next(self._tick)
            self._reserved.add(slot)
            if self.cache_idle_slots:
                for other in self._idle(engine):
                    self._save_idle(engine, other)
        return slot

    def stepped(self) -> None:
        """After an engine step: the requests added before it hold their slots now (or wait for them)."""
        self._reserved.clear()

    def _idle(self, engine: Engine) -> list[int]:
        return [i for i in range(engine.n_slots) if engine.slot_request(i) is None and i not in self._reserved]

    def _select(self, engine: Engine, prompt: list[int], id_slot: int) -> int:
        """get_available_slot: by id, by the longest common prefix, else least recently used."""
        idle = self._idle(engine)
        ret, f_sim_best, update = id_slot, 0.0, False
        for i in idle:
            held = engine.slot_tokens(i)
            if (id_slot >= 0 and i != id_slot) or not held:
                continue
            f_sim = common_prefix(held, prompt) / len(prompt)
            if f_sim > f_sim_best and f_sim > SLOT_PROMPT_SIMILARITY:
                ret, f_sim_best = i, f_sim
        if ret >= 0:
            held = engine.slot_tokens(ret)
            update = bool(held) and f_sim_best * len(prompt) / len(held) < 0.5  # it would lose most of its context
        elif idle:
            ret = min(idle, key=lambda i: self._last_used.get(i, 0))
            log.debug("slot %d selected by LRU", ret)
            update = True
        if ret >= 0 and update and ret in idle:
            log.debug("updating prompt cache")
            self._save(engine, ret)
            self._load(engine, ret, prompt)
        return ret

    def _save_idle(self, engine: Engine, slot: int) -> None:
        if self._save(engine, slot):
            log.debug("slot %d: __TEST_TAG_CACHE_IDLE_SLOT__", slot)
        if self.kv_unified:  # without a unified pool a cleared slot frees nothing another slot could use
            engine.clear_slot(slot)

    def _save(self, engine: Engine, slot: int) -> bool:
        """server_prompt_cache::alloc: False for an empty slot, one already held whole, or one over the limit."""
        tokens = engine.slot_tokens(slot)
        if not tokens or any(common_prefix(s.tokens, tokens) == len(tokens) for _, s in self.states.items()):
            return False
        entry = SessionEntry(tuple(tokens), engine.ctx.state_seq_get_data(slot))
        if not self.states.fits(entry):
            log.warning("prompt state of %d bytes exceeds --cache-ram, not cached", entry.nbytes)
            return False
        for key, s in self.states.items():
            if common_prefix(s.tokens, tokens) == len(s.tokens):  # obsolete: the new one holds all of it
                self.states.pop(key)
        self.states.put(entry.tokens, entry)  # the oldest go past the limit
        return True

    def _load(self, engine: Engine, slot: int, prompt: list[int]) -> None:
        """server_prompt_cache::load: bring the cached prompt that keeps the most of itself and covers the most
        of `prompt` into `slot`, if it beats what the slot holds; it leaves the cache."""
        held = engine.slot_tokens(slot)
        lcp = common_prefix(held, prompt)
        f_keep_best = lcp / len(held) if held else -1.0
        f_sim_best = lcp / len(prompt)
        best = None
        for _, s in self.states.items():
            n = common_prefix(s.tokens, prompt)
            f_keep, f_sim = n / len(s.tokens), n / len(prompt)
            if f_keep >= 0.25 and f_keep > f_keep_best and f_sim > f_sim_best:
                best, f_keep_best, f_sim_best = s, f_keep, f_sim
        if best is None:
            return
        engine.clear_slot(slot)
        try:
            engine.ctx.state_seq_set_data(best.state, slot)
        except LlamactxError as e:  # memory unchanged: the slot simply starts empty
            log.warning("could not restore a cached prompt into slot %d: %s", slot, e)
            return
        engine.set_slot_tokens(slot, list(best.tokens))
        self.states.pop(best.tokens)

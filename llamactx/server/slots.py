"""GET /slots and POST /slots/{id}?action=save|restore|erase (llama-server's `handle_slots_action`).

A slot file is the context's sequence session file (state_seq_save_file: the tokens and their KV cells) under
--slot-save-path. File names are plain names: no directory part, no "..", nothing outside that directory is read
or written. Every function here runs on the engine thread (EngineWorker.call).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from llamactx.api.protocol import ProtocolError
from llamactx.engine import Engine

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def slot_path(directory: Path, filename: str) -> Path:
    """`directory / filename` for a plain file name; ProtocolError for anything else (paths, "..", hidden)."""
    if not _NAME.fullmatch(filename) or ".." in filename:
        raise ProtocolError(f"filename {filename!r} is not a plain file name ([A-Za-z0-9._-], no path, no '..')")
    path = (directory / filename).resolve()
    if path.parent != directory.resolve():
        raise ProtocolError(f"filename {filename!r} leaves the slot directory")
    return path


def slots_info(engine: Engine) -> list[dict]:
    out = []
    for id_slot in range(engine.n_slots):
        seq = engine.slot_request(id_slot)
        out.append({
            "id": id_slot, "n_ctx": engine.n_ctx_slot, "is_processing": seq is not None,
            "id_task": seq.id if seq is not None else -1, "n_tokens": len(engine.slot_tokens(id_slot)),
            "next_token": [{"has_next_token": seq is not None,
                            "n_remain": (seq.limits.max_tokens - seq.n_output
                                         if seq is not None and seq.limits.max_tokens >= 0 else -1),
                            "n_decoded": seq.n_output if seq is not None else 0}],
        })
    return out


def _idle(engine: Engine, id_slot: int) -> None:
    if not 0 <= id_slot < engine.n_slots:
        raise ProtocolError(f"id_slot {id_slot} is outside [0, {engine.n_slots})", 404, "not_found_error")
    if engine.slot_request(id_slot) is not None:
        raise ProtocolError(f"slot {id_slot} is processing a request; try again when it is idle", 409,
                            "invalid_request_error")


def save(engine: Engine, id_slot: int, path: Path) -> dict:
    _idle(engine, id_slot)
    if path.is_dir():
        raise ProtocolError(f"filename {path.name!r} names a directory under --slot-save-path, not a file")
    t0 = time.perf_counter()
    tokens = engine.slot_tokens(id_slot)
    engine.ctx.state_seq_save_file(path, id_slot, tokens)
    return {"id_slot": id_slot, "filename": path.name, "n_saved": len(tokens), "n_written": path.stat().st_size,
            "timings": {"save_ms": (time.perf_counter() - t0) * 1000}}


def restore(engine: Engine, id_slot: int, path: Path) -> dict:
    """Load a slot file into an idle slot: checked whole first (StateError, slot unchanged, for a bad file)."""
    _idle(engine, id_slot)
    if not path.is_file():
        raise ProtocolError(f"slot file {path.name!r} does not exist", 404, "not_found_error")
    t0 = time.perf_counter()
    tokens = engine.ctx.state_seq_load_file(path, id_slot, n_token_capacity=engine.n_ctx_slot)
    bad = [t for t in tokens if not 0 <= t < engine.model.hparams.n_vocab]
    if bad:  # the KV is loaded but its tokens are not ours: forget both
        engine.clear_slot(id_slot)
        raise ProtocolError(f"slot file {path.name!r} holds token id {bad[0]}, outside the vocab")
    engine.set_slot_tokens(id_slot, tokens)
    return {"id_slot": id_slot, "filename": path.name, "n_restored": len(tokens), "n_read": path.stat().st_size,
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1000}}


def erase(engine: Engine, id_slot: int) -> dict:
    _idle(engine, id_slot)
    n = len(engine.slot_tokens(id_slot))
    engine.clear_slot(id_slot)
    return {"id_slot": id_slot, "n_erased": n}

"""Resuming an evicted conversation from the session tier (engine/session_tier.py) against prefilling it again
(issue 24's targets: from RAM >= 10x faster, from disk >= 5x).

A 2,000-token first turn (SmolLM2, greedy, then 8 generated tokens) is evicted from its slot; the second turn adds
`--n-new` tokens. Measured, alternating, `--rounds` times: the second turn's time to its first token (prompt_ms:
admission to first sampled token) when its slot starts empty and the tier is off (re-prefill), when the first
turn's cells are still in its slot (a plain prompt-cache hit: the floor), when its state is in the RAM level, and
when it is only on disk (the file's pages dropped from the page cache first
with posix_fadvise(DONTNEED) after an fsync, where the kernel honours it). Also reported: the restore alone
(state_seq_set_data from RAM; read + checksum + set from disk) against the prefill of the first turn alone.
Wall time on the calling thread: note the machine's load (printed from os.getloadavg()).

Usage: python bench/session_tier_bench.py [-m smollm2] [-n 2000] [--n-new 16] [--rounds 3] [-t 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from llamactx import Model
from llamactx.embedded import resolve_model_path
from llamactx.engine import Engine, Limits, SessionParams
from llamactx.engine.state_store import decode_entry, prefix_keys
from llamactx.sampling import SamplerChain, SamplingParams

TEXT = Path(__file__).parents[1] / "tests" / "data" / "gpl3_head.txt"


def greedy(model) -> SamplerChain:
    return SamplerChain.default(SamplingParams(temperature=0.0), model.hparams.n_vocab, model.vocab, n_ctx=4096)


def run(engine: Engine, model, prompt: list[int], n: int):
    seq = engine.add_request(prompt, greedy(model), Limits(max_tokens=n, ignore_eos=True))
    while engine.has_work:
        engine.step()
    return seq


def drop_page_cache(directory: str) -> None:
    """Ask the kernel to forget the directory's files' pages, so that the next read comes from the disk."""
    for path in Path(directory).iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-n", "--n-tokens", type=int, default=2000, help="the first turn's prompt tokens")
    ap.add_argument("--n-new", type=int, default=16, help="the second turn's new tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    model = Model.load(resolve_model_path(args.model))
    tokens = model.vocab.tokenize(TEXT.read_text())
    while len(tokens) < args.n_tokens + args.n_new + 8:
        tokens = tokens + tokens
    first, new = tokens[: args.n_tokens], tokens[args.n_tokens + 8 : args.n_tokens + 8 + args.n_new]
    other = model.vocab.tokenize("Hello there")  # takes the slot: the conversation is evicted (stored)
    n_ctx = 1 << (args.n_tokens + args.n_new + 64).bit_length()
    common = dict(n_slots=1, n_ctx=n_ctx, n_threads=args.threads, n_threads_batch=args.threads)
    workdir = tempfile.mkdtemp(prefix="llamactx-session-bench-")
    engines = {
        "prefill": Engine(model, **common),
        "cells": Engine(model, **common),
        "ram": Engine(model, session=SessionParams(ram_bytes=4 << 30), **common),
        "disk": Engine(model, session=SessionParams(disk_dir=workdir, disk_bytes=4 << 30), **common),
    }
    for engine in engines.values():
        engine.warmup()
    t_first = run(engines["prefill"], model, first, 8).timings.prompt_ms
    held = engines["prefill"].slot_tokens(0)
    state = engines["prefill"].ctx.state_seq_get_data(0)
    for name in ("cells", "ram", "disk"):  # the same first turn, then evicted into the tier
        engines[name].ctx.state_seq_set_data(state, 0)
        engines[name].set_slot_tokens(0, held)
        if name != "cells":
            run(engines[name], model, other, 1)
    prompt2 = held + new
    ttft: dict[str, list[float]] = {name: [] for name in engines}
    restore: dict[str, list[float]] = {"ram": [], "disk": []}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            if name == "cells":  # the first turn's cells still in the slot: a plain prompt-cache hit
                engine.ctx.memory.seq_rm(0, len(held), -1)
                engine.set_slot_tokens(0, held)
            else:
                engine.clear_slot(0)  # (the tier keeps its copy: clear_slot stores nothing)
            if name == "disk":
                drop_page_cache(workdir)
            seq = run(engine, model, prompt2, 1)
            assert seq.n_cached == (0 if name == "prefill" else len(held)), (name, seq.n_cached)
            ttft[name].append(seq.timings.prompt_ms)
        for name in ("ram", "disk"):
            restore[name].append(_restore_ms(engines[name], held, workdir if name == "disk" else None))

    med = {k: statistics.median(v) for k, v in ttft.items()}
    print(f"{args.model}: a {len(held)}-token conversation, +{args.n_new} new tokens, -t {args.threads}, "
          f"{args.rounds} rounds alternating; load average {os.getloadavg()[0]:.2f}")
    print(f"  first-turn prefill ({args.n_tokens} tokens): {t_first:.0f} ms")
    print(f"  time to first token: re-prefill {med['prefill']:.0f} ms, from RAM {med['ram']:.1f} ms "
          f"({med['prefill'] / med['ram']:.1f}x), from disk {med['disk']:.1f} ms "
          f"({med['prefill'] / med['disk']:.1f}x); cells still in the slot {med['cells']:.1f} ms")
    for name in ("ram", "disk"):
        ms = statistics.median(restore[name])
        print(f"  restore alone from {name}: {ms:.1f} ms ({t_first / ms:.1f}x the first turn's prefill)")
    print("  rounds (ms): " + "; ".join(f"{k} " + " ".join(f"{v:.0f}" for v in vs) for k, vs in ttft.items()))
    size = sum(p.stat().st_size for p in Path(workdir).iterdir())
    print(f"  state on disk: {size / (1 << 20):.1f} MiB")
    shutil.rmtree(workdir)


def _restore_ms(engine: Engine, held: list[int], workdir: str | None) -> float:
    """The restore alone: state_seq_set_data of the stored state (after the file's read and checks for disk)."""
    tier = engine.session
    engine.clear_slot(0)
    if workdir is not None:
        drop_page_cache(workdir)
    t0 = time.perf_counter()
    if workdir is None:
        entry = tier.ram.get(prefix_keys(tier.context_key(), held, [len(held)])[len(held)])
    else:
        key = prefix_keys(tier.context_key(), held, [len(held)])[len(held)]
        entry = decode_entry(tier.disk.read(len(held), key), tier.context_key(), key)
    engine.ctx.state_seq_set_data(entry.state, 0)
    ms = (time.perf_counter() - t0) * 1000
    engine.clear_slot(0)
    return ms


if __name__ == "__main__":
    main()

"""The session tier below the KV pool (engine/session_tier.py): a conversation evicted to RAM, then to disk, then
resumed decodes only its new tokens and gives the next-token logits of the uninterrupted conversation, bit for bit
(SmolLM2's KV cache, Gemma 3's iSWA cache past its 512-token window, a tiny mamba2's recurrent state); corrupt,
truncated and foreign entry files are refused and deleted; RAM and disk stay within their bounds."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from llamactx import Model
from llamactx.engine import Engine, EngineError, Limits, SessionParams
from llamactx.engine.session_tier import SessionTier
from llamactx.engine.state_store import SessionEntry, StateDisk, prefix_keys
from tests.engine.test_engine import chain

DATA = Path(__file__).parents[1] / "data"
TEXT = "".join((DATA / f).read_text() for f in ("gpl3_head.txt", "spec_code.txt", "zen.txt"))  # ~3,400 tokens
TINY = DATA / "tiny"
N_NEW = 30  # the second turn's new tokens


def turn(engine: Engine, model, prompt: list[int], n: int):
    """Run one request to its end; returns it and the logits its last prompt token gave (what it sampled from)."""
    seq = engine.add_request(prompt, chain(model), Limits(max_tokens=n))
    first = []

    def keep_first_logits():
        if not first and seq.n_output:
            first.append(engine.ctx.get_logits_ith(-1).copy())

    for _ in range(2000):
        if not engine.has_work:
            break
        engine.step()
        keep_first_logits()
    assert not engine.has_work
    return seq, first[0]


def conversation(model, n_first: int):
    """A first turn of `n_first` prompt tokens and the tokens a second turn adds."""
    tokens = model.vocab.tokenize(TEXT)
    assert len(tokens) >= n_first + N_NEW + 40
    return tokens[:n_first], tokens[n_first + 8 : n_first + 8 + N_NEW]


@pytest.mark.parametrize("name", ["smollm", "gemma"])
def test_a_conversation_evicted_to_ram_then_disk_resumes_bit_identical(name, request, tmp_path):
    model = request.getfixturevalue(name)
    first, new = conversation(model, 2000)  # the 2,000-token conversation, past Gemma's 512-token window
    other = model.vocab.tokenize("Hello there")  # a short request that takes the slot (too short to be stored)

    plain = Engine(model, n_slots=1, n_ctx=4096)
    t1, _ = turn(plain, model, first, 8)
    held = plain.slot_tokens(0)  # the first turn as memory holds it: prompt and output but the last token
    entry_bytes = len(plain.ctx.state_seq_get_data(0)) + 4 * len(held)
    prompt2 = held + new
    t2, want = turn(plain, model, prompt2, 1)
    assert t2.n_cached == len(held)  # the uninterrupted conversation: its cells were still there
    want_state = plain.ctx.state_seq_get_data(0)

    # RAM holds one such state: a second one sends the first to disk
    params = SessionParams(ram_bytes=entry_bytes * 3 // 2, disk_dir=str(tmp_path), disk_bytes=4 * entry_bytes)
    engine = Engine(model, n_slots=1, n_ctx=4096, session=params)
    tier = engine.session
    turn(engine, model, first, 8)
    assert engine.slot_tokens(0) == held
    turn(engine, model, other, 2)  # takes the slot: the first turn goes to RAM
    assert len(tier.ram) == 1 and not list(tmp_path.iterdir())
    resumed, got = turn(engine, model, prompt2, 1)
    assert (resumed.n_cached, resumed.timings.prompt_n) == (len(held), N_NEW)  # only the new part was decoded
    assert tier.stats.n_restored_ram == 1
    np.testing.assert_array_equal(got, want)

    turn(engine, model, other, 2)  # the second turn goes to RAM, the first one falls to disk
    assert len(tier.ram) == 1 and [p.name.split("-")[0] for p in tmp_path.iterdir()] == [str(len(held))]
    resumed, got = turn(engine, model, prompt2, 1)  # the second turn is the whole prompt: the disk one is used
    assert (resumed.n_cached, resumed.timings.prompt_n) == (len(held), N_NEW)
    assert tier.stats.n_restored_disk == 1
    np.testing.assert_array_equal(got, want)
    if not model.hparams.n_swa:  # (an iSWA cache may have reused other cells, outside every window, on the way)
        assert engine.ctx.state_seq_get_data(0) == want_state  # the uninterrupted conversation's cells

    stored = tier.ram.get(prefix_keys(tier.context_key(), held, [len(held)])[len(held)])  # back in RAM from disk
    engine.clear_slot(0)
    assert tier.restore(0, held + [0], 0, len(held)) == len(held)
    assert engine.ctx.state_seq_get_data(0) == stored.state  # the cells come back bit for bit


def _stored_on_disk(model, tmp_path: Path, tokens: list[int]) -> tuple[Engine, Path]:
    """A one-slot engine with a disk-only tier whose one entry holds `tokens` (stored when another request took
    the slot)."""
    params = SessionParams(disk_dir=str(tmp_path), disk_bytes=64 << 20, min_tokens=16)
    engine = Engine(model, n_slots=1, n_ctx=512, session=params)
    turn(engine, model, tokens, 1)
    turn(engine, model, [1, 2, 3], 1)
    files = list(tmp_path.iterdir())
    assert [f.name.split("-")[0] for f in files] == [str(len(tokens))]
    return engine, files[0]


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_damaged_or_foreign_entries_are_refused_and_deleted(damage, smollm, gemma, tmp_path, caplog):
    first, new = conversation(smollm, 48)
    engine, path = _stored_on_disk(smollm, tmp_path / "smollm", first)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-100]))
    else:  # the same tokens stored by Gemma 3, under the name SmolLM2 looks up
        _, theirs = _stored_on_disk(gemma, tmp_path / "gemma", first)
        assert theirs.name != path.name  # the model is part of the key: never found by name
        shutil.copyfile(theirs, path)
    with caplog.at_level(logging.WARNING, logger="llamactx.engine"):
        seq, _ = turn(engine, smollm, first + new, 1)
    assert seq.n_cached == 0  # reprocessed: nothing was loaded
    assert not path.exists() and engine.session.stats.n_refused == 1
    reason = {"flip": "checksum", "truncate": "truncated", "foreign": "another model"}[damage]
    assert any("refused and deleted" in r.message and reason in r.message for r in caplog.records)


def test_ram_and_disk_stay_within_their_bounds(smollm, tmp_path):
    engine = Engine(smollm, n_slots=1, n_ctx=512)
    turn(engine, smollm, smollm.vocab.tokenize(TEXT)[:100], 1)
    size = len(engine.ctx.state_seq_get_data(0))
    params = SessionParams(ram_bytes=size * 5 // 2, disk_dir=str(tmp_path), disk_bytes=size * 7 // 2, min_tokens=8)
    tier = SessionTier(engine.ctx, params)  # its state, stored under 8 different token lists
    keys = []
    for i in range(8):
        tokens = list(range(i, i + 64 + 8 * i))
        assert tier.store(0, tokens)
        keys.append(prefix_keys(tier.context_key(), tokens, [len(tokens)])[len(tokens)])
        assert tier.ram.nbytes <= params.ram_bytes and tier.disk.nbytes <= params.disk_bytes
    assert [k for k, _ in tier.ram.items()] == keys[-2:]  # the most recent in RAM, the three before on disk
    assert sorted(StateDisk.name(64 + 8 * i, keys[i]) for i in (3, 4, 5)) == sorted(p.name for p in tmp_path.iterdir())
    big = SessionEntry(tuple(range(10)), bytes(params.disk_bytes))
    assert tier.ram.put("big", big) == [("big", big)] and "big" not in tier.ram  # over the whole bound: not kept
    with pytest.raises(EngineError, match="disk level needs both"):
        SessionParams(disk_dir=str(tmp_path))


@pytest.mark.parametrize("name", ["mamba2", "lfm2"])
def test_a_recurrent_or_hybrid_state_is_restored_at_its_end(name, tmp_path):
    """tiny mamba2 (recurrent) and lfm2 (hybrid), disk level only: the first turn's state comes back at its last
    position, the second turn decodes only its new tokens and samples from the uninterrupted conversation's
    logits."""
    model = Model.load(TINY / f"tiny-{name}.gguf")
    rng = np.random.default_rng(0)
    first, new = rng.integers(3, model.hparams.n_vocab, 40).tolist(), rng.integers(3, model.hparams.n_vocab, 9).tolist()
    plain = Engine(model, n_slots=1, n_ctx=256)
    turn(plain, model, first, 4)
    held = plain.slot_tokens(0)
    _, want = turn(plain, model, held + new, 1)

    params = SessionParams(disk_dir=str(tmp_path), disk_bytes=16 << 20, min_tokens=16)
    engine = Engine(model, n_slots=1, n_ctx=256, session=params)
    turn(engine, model, first, 4)
    turn(engine, model, [5, 6, 7], 1)  # the recurrent state of the first turn goes to disk
    resumed, got = turn(engine, model, held + new, 1)
    assert (resumed.n_cached, resumed.timings.prompt_n) == (len(held), len(new))
    assert engine.ctx.memory.seq_pos_max(0) == len(held) + len(new) - 1
    np.testing.assert_array_equal(got, want)


def test_serve_flags_reach_the_runtime_params(tmp_path):
    from llamactx.cli.args import CommandError
    from llamactx.cli.commands import build_parser
    from llamactx.cli.serve import config_from_args

    def session(*argv):
        return config_from_args(build_parser().parse_args(["serve", *argv])).runtime.session

    assert session() is None  # off by default
    assert session("--session-ram", "64", "--session-dir", str(tmp_path), "--session-disk", "256") == \
        SessionParams(ram_bytes=64 << 20, disk_dir=str(tmp_path), disk_bytes=256 << 20, min_tokens=64)
    assert session("--session-ram", "1.5", "--session-min-tokens", "128") == \
        SessionParams(ram_bytes=3 << 19, min_tokens=128)
    with pytest.raises(CommandError, match="go together"):
        session("--session-dir", str(tmp_path))

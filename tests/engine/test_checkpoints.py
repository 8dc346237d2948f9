"""Context checkpoints (engine/checkpoints.py, llama-server's --ctx-checkpoints): a recurrent (mamba2) or hybrid
(lfm2) slot whose next prompt diverges inside what it holds restores the latest checkpoint before the divergence
and decodes only the rest, with the logits and tokens of a fresh engine on the same prompt, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamactx import Model
from llamactx.engine import Engine, Limits, RequestOptions
from llamactx.engine.checkpoints import CHECKPOINT_TAIL, CheckpointParams, Checkpoints
from llamactx.engine.sequence import EngineError
from llamactx.memory.recurrent import RecurrentMemory
from llamactx.models import ARCHITECTURES
from llamactx.sampling import SamplerChain, SamplingParams
from llamactx.state_io import StateError

TINY = Path(__file__).parent.parent / "data" / "tiny"
NAMES = [name for name in ("mamba2", "lfm2", "lfm2moe", "qwen35", "qwen35moe", "qwen3next", "granitehybrid",
                           "nemotron_h") if name in ARCHITECTURES]
N_BATCH = 16  # the checkpoint interval: one checkpoint before each prompt chunk


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    ref = json.loads((TINY / f"{request.param}.json").read_text())
    prompts = [p["tokens"] for p in ref["prompts"]]
    return Model.load(TINY / f"tiny-{request.param}.gguf"), prompts[0] + prompts[1] + prompts[2], prompts[1]


def greedy(model) -> SamplerChain:
    return SamplerChain.default(SamplingParams(temperature=0.0), model.hparams.n_vocab, model.vocab, n_ctx=256)


def engine_for(model, **kw) -> Engine:
    return Engine(model, n_ctx=256, n_batch=N_BATCH, n_threads=2, **kw)


def generate(engine: Engine, prompt, n: int, **options):
    """Greedy `n` tokens; returns the sequence and the logits of the prompt's last token (n = 1: the engine's
    last decode is that token's)."""
    seq = engine.add_request(prompt, greedy(engine.model), Limits(max_tokens=n), RequestOptions(**options))
    for _ in range(500):
        if not engine.has_work:
            break
        engine.step()
    assert seq.is_finished
    return seq, engine.ctx.get_logits()[-1].copy()


def fresh(model, prompt, n: int):
    return generate(engine_for(model), prompt, n)


@pytest.mark.parametrize("cut", [-2, 25])  # diverge in the last part / in the middle of the first turn's prompt
def test_diverging_turn_restores_a_checkpoint(tiny, cut):
    model, conv, new = tiny
    engine = engine_for(model)
    generate(engine, conv, 8)
    items = engine.scheduler.cache.slots[0].checkpoints.items
    assert [c.n_tokens for c in items] == [16, 32, len(conv) - CHECKPOINT_TAIL]
    second = conv[:cut] + new
    seq, logits = generate(engine, second, 1)
    n_common = len(conv[:cut])
    assert 0 < seq.n_cached <= n_common
    assert seq.timings.prompt_n == len(second) - seq.n_cached <= len(new) + N_BATCH
    ref, ref_logits = fresh(model, second, 1)
    assert ref.n_cached == 0
    assert np.array_equal(logits, ref_logits)
    # those past the divergence are gone; the second prompt left its own
    assert all(list(c.tokens) == second[: c.n_tokens] for c in engine.scheduler.cache.slots[0].checkpoints.items)


def test_greedy_tokens_equal_a_fresh_engine(tiny):
    model, conv, new = tiny
    engine = engine_for(model)
    generate(engine, conv, 8)
    second = conv[:-3] + new
    seq, _ = generate(engine, second, 16)
    assert seq.n_cached == len(conv) - CHECKPOINT_TAIL
    assert seq.output == fresh(model, second, 16)[0].output


def test_checkpoint_of_another_slot(tiny):
    model, conv, new = tiny
    engine = engine_for(model, n_slots=2)
    generate(engine, conv, 4, id_slot=0)
    second = conv[:40] + new
    seq, logits = generate(engine, second, 1, id_slot=1)
    assert seq.n_cached == 32
    assert np.array_equal(logits, fresh(model, second, 1)[1])


@pytest.mark.parametrize("off", [dict(n_ctx_checkpoints=0), dict(checkpoint_max_bytes=0)], ids=["n0", "bytes0"])
def test_checkpoints_off_reprocess_the_whole_prompt(tiny, off):
    """No checkpoints (none allowed, or a budget of 0 bytes that holds none): the prompt is decoded again in
    full, with the same logits, never wrong ones."""
    model, conv, new = tiny
    engine = engine_for(model, **off)
    generate(engine, conv, 8)
    assert engine.scheduler.cache.slots[0].checkpoints.items == []
    second = conv[:-2] + new
    seq, logits = generate(engine, second, 1)
    assert seq.n_cached == 0 and seq.timings.prompt_n == len(second)
    assert np.array_equal(logits, fresh(model, second, 1)[1])


def test_checkpoint_bounds(tiny):
    model, conv, _ = tiny
    engine = engine_for(model, n_ctx_checkpoints=2)
    generate(engine, conv, 1)
    items = engine.scheduler.cache.slots[0].checkpoints.items
    assert [c.n_tokens for c in items] == [32, len(conv) - CHECKPOINT_TAIL]  # the oldest went first
    size = len(items[0].data)
    engine = engine_for(model, checkpoint_max_bytes=size)
    generate(engine, conv, 1)
    items = engine.scheduler.cache.slots[0].checkpoints.items
    assert [c.n_tokens for c in items] == [len(conv) - CHECKPOINT_TAIL]
    assert sum(len(c.data) for c in items) <= size


def test_checkpoint_params_are_checked():
    with pytest.raises(EngineError, match="n_ctx_checkpoints = -1"):
        CheckpointParams(n_max=-1)
    ckpts = Checkpoints(CheckpointParams(n_max=3))
    for n in (4, 8, 12):
        ckpts.add(list(range(n)), b"x" * n)
    ckpts.add(list(range(6)), b"y")  # a new history from 6 on: 8 and 12 belong to the old one
    assert [c.n_tokens for c in ckpts.items] == [4, 6]
    assert ckpts.best([0, 1, 2, 3, 4, 5, 9], limit=6).n_tokens == 6
    assert ckpts.best([0, 1, 2, 3, 9], limit=6).n_tokens == 4
    assert ckpts.best([1], limit=6) is None


def test_recurrent_checkpoint_load_checks_its_position():
    """A blob restores one sequence exactly; a blob for another position is refused and changes nothing."""
    mem = RecurrentMemory([0, 1], n_seq_max=2, n_embd_r=3, n_embd_s=4)
    rng = np.random.default_rng(0)
    mem.r[:] = rng.standard_normal(mem.r.shape)
    mem.s[:] = rng.standard_normal(mem.s.shape)
    mem.pos[:] = [5, 9]
    blob = mem.checkpoint_write(0)
    before = (mem.pos.copy(), mem.r.copy(), mem.s.copy())
    with pytest.raises(StateError, match="expected \\[2\\]"):
        mem.checkpoint_load(1, blob, 3)
    assert all(np.array_equal(a, b) for a, b in zip(before, (mem.pos, mem.r, mem.s), strict=True))
    mem.checkpoint_load(1, blob, 6)
    assert mem.seq_pos_max(1) == 5
    assert np.array_equal(mem.r[:, 1], mem.r[:, 0]) and np.array_equal(mem.s[:, 1], mem.s[:, 0])

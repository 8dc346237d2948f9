"""Context checkpoints over Gemma 3's iSWA cache (engine/checkpoints.py, memory/kv_cache_iswa.py): once the sliding
window has moved past where a new prompt diverges from a slot's history, the slot restores the latest checkpoint
before the divergence (the window's cells at that point; the base cache keeps every position) and decodes only the
rest, instead of the whole prompt (llama-server's --ctx-checkpoints / --swa-checkpoints). The logits equal a fresh
engine's on the same prompt, bit for bit, because both decode every position in the same chunks: ggml's kernels are
not row invariant (a repacked Q4_K weight takes its last n % 4 activation rows through the gemv, which rounds once
per super-block instead of once per 64 elements; Q6_K below 8 rows takes ggml_vec_dot), so a position's bits depend
on where its chunk ends, in llama.cpp as here. The second turns are long enough (>= 512 tokens past the checkpoint)
that a fresh engine cuts the prompt where the first turn did."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llamactx.engine import Engine, Limits, RequestOptions
from llamactx.sampling import SamplerChain, SamplingParams
from llamactx.state_io import StateError

DATA = Path(__file__).parent.parent / "data"
N_BATCH = 512  # the checkpoint interval: one checkpoint before each prompt chunk
N_CTX = 4096  # one slot: a 1024-cell SWA cache beside the 4096-cell base cache


@pytest.fixture(scope="module")
def conversation(gemma):
    """A 2,600-token first turn, and a second turn that keeps its first 2,000 tokens and goes on otherwise (57
    tokens: to 2,057, so the fresh engine's chunks end at 1,536 as the first turn's do)."""
    text = (DATA / "gpl3_head.txt").read_text()
    first = gemma.vocab.tokenize(text + "\n\n" + text, add_special=True)[:2600]
    new = gemma.vocab.tokenize(
        " Summarize the preamble above in one sentence, please. Then name three freedoms it promises to the users of"
        " free software, say in a few words who may change the program and share the changed versions, and what a"
        " distributor must pass on to the people who receive a copy from them.", add_special=False)
    return first, first[:2000] + new


def engine_for(model, **kw) -> Engine:
    return Engine(model, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=2, **kw)


def generate(engine: Engine, prompt, n: int, **options):
    """Greedy `n` tokens; returns the sequence and the logits of the prompt's last token (n = 1)."""
    sampler = SamplerChain.default(SamplingParams(temperature=0.0), engine.model.hparams.n_vocab, engine.model.vocab,
                                   n_ctx=N_CTX)
    seq = engine.add_request(prompt, sampler, Limits(max_tokens=n), RequestOptions(**options))
    for _ in range(200):
        if not engine.has_work:
            break
        engine.step()
    assert seq.is_finished
    return seq, engine.ctx.get_logits()[-1].copy()


@pytest.fixture(scope="module")
def fresh_second(gemma, conversation):
    return generate(engine_for(gemma), conversation[1], 1)


def test_second_turn_restores_a_checkpoint(gemma, conversation, fresh_second):
    first, second = conversation
    engine = engine_for(gemma)
    generate(engine, first, 1)
    assert not engine.ctx.memory.can_continue(0, 2000)  # the window has left position 2000 behind
    items = engine.scheduler.cache.slots[0].checkpoints.items
    assert [c.n_tokens for c in items] == [512, 1024, 1536, 2048, 2088, 2596]
    seq, logits = generate(engine, second, 1)
    assert seq.n_cached == 1536  # the latest checkpoint before the divergence at 2000
    assert seq.timings.prompt_n == len(second) - 1536 <= (len(second) - 2000) + N_BATCH
    ref, ref_logits = fresh_second
    assert ref.n_cached == 0
    assert np.array_equal(logits, ref_logits)


def test_greedy_tokens_equal_a_fresh_engine(gemma, conversation):
    first, second = conversation
    engine = engine_for(gemma)
    generate(engine, first, 1)
    seq, _ = generate(engine, second, 12)
    assert seq.n_cached == 1536
    assert seq.output == generate(engine_for(gemma), second, 12)[0].output


def test_checkpoint_of_another_slot(gemma, conversation):
    """Slot 1 takes slot 0's cells up to its checkpoint (seq_cp) and the checkpoint's window. Two slots have a
    1536-cell SWA cache, so the prompt diverges earlier, at 1000."""
    first, second = conversation
    second = first[:1000] + second[2000:]
    engine = engine_for(gemma, n_slots=2)
    generate(engine, first, 1, id_slot=0)
    seq, logits = generate(engine, second, 1, id_slot=1)
    assert seq.n_cached == 512
    assert np.array_equal(logits, generate(engine_for(gemma), second, 1)[1])
    assert engine.ctx.memory.seq_pos_max(0) == len(first) - 1  # slot 0 keeps its own history


def test_without_checkpoints_the_prompt_is_reprocessed(gemma, conversation, fresh_second):
    first, second = conversation
    engine = engine_for(gemma, n_ctx_checkpoints=0)
    generate(engine, first, 1)
    assert engine.scheduler.cache.slots[0].checkpoints.items == []
    seq, _ = generate(engine, second, 1)
    assert seq.n_cached == 0 and seq.timings.prompt_n == len(second)


def test_min_step_spaces_the_mid_prompt_checkpoints(gemma, conversation):
    engine = engine_for(gemma, checkpoint_min_step=1024)
    generate(engine, conversation[0], 1)
    items = engine.scheduler.cache.slots[0].checkpoints.items
    assert [c.n_tokens for c in items] == [512, 1536, 2088, 2596]  # the last two are near the prompt's end


def test_swa_full_takes_no_checkpoints(gemma, conversation):
    """With --swa-full the window never loses a position: the cache itself is cut back."""
    first, second = conversation
    engine = engine_for(gemma, swa_full=True)
    assert not engine.ctx.memory.needs_checkpoints
    generate(engine, first, 1)
    assert engine.scheduler.cache.slots[0].checkpoints.items == []
    seq, _ = generate(engine, second, 1)
    assert seq.n_cached == 2000


def test_a_foreign_checkpoint_is_refused_and_changes_nothing(gemma, conversation):
    engine = engine_for(gemma, n_slots=2)
    generate(engine, conversation[0], 1, id_slot=0)
    mem = engine.ctx.memory
    ckpt = engine.scheduler.cache.slots[0].checkpoints.items[2]  # the window before position 1536
    before = (mem.base.cells.pos.copy(), mem.swa.cells.pos.copy(), mem.swa.cells.seq.copy())
    with pytest.raises(StateError, match="not the window"):
        mem.checkpoint_load(0, ckpt.data, 1024)  # another position
    with pytest.raises(StateError, match="base cache"):
        mem.checkpoint_load(1, ckpt.data, ckpt.n_tokens)  # seq 1 holds nothing in the base cache
    with pytest.raises(StateError, match="trailing"):
        mem.checkpoint_load(0, ckpt.data + b"\0", ckpt.n_tokens)
    after = (mem.base.cells.pos, mem.swa.cells.pos, mem.swa.cells.seq)
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))

"""The context runtime: batches, ubatches, many sequences, memory operations, errors, outputs and perf."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx import Batch, Context, ContextParams, ContextParamsError, DecodeError, DecodeStatus

PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return",
    "Once upon a time, there was a little",
    "1, 2, 3, 4, 5,",
]


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.vocab.tokenize(p, add_special=True, parse_special=True) for p in PROMPTS]


def seq_batch(items: list[tuple[int, list[int], int]], logits: str = "last") -> Batch:
    """A batch of (seq_id, tokens, first position) runs; output flags on the last token of each run or all."""
    n = sum(len(t) for _, t, _ in items)
    batch = Batch(n, n_seq_max=1)
    for seq, toks, p0 in items:
        for j, t in enumerate(toks):
            batch.add(t, p0 + j, (seq,), logits == "all" or j == len(toks) - 1)
    return batch


def memory_image(ctx) -> tuple:
    kv = ctx.memory
    return (kv.cells.pos.copy(), kv.cells.seq.copy(), kv.cells.shift.copy(), kv.k.copy(), kv.v.copy())


def assert_same_memory(a: tuple, b: tuple) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def alone(model, tokens: list[int]) -> np.ndarray:
    ctx = Context(model, ContextParams(n_ctx=256))
    assert ctx.decode(Batch.get_one(tokens)) == 0
    return np.array(ctx.get_logits_ith(-1))


def test_get_one_continues_sequence_zero(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=256))
    toks = prompts[0]
    assert ctx.decode(Batch.get_one(toks[:3])) == 0
    assert ctx.decode(Batch.get_one(toks[3:])) == 0
    assert ctx.memory.seq_pos_min(0) == 0 and ctx.memory.seq_pos_max(0) == len(toks) - 1
    np.testing.assert_allclose(ctx.get_logits_ith(-1), alone(smollm, toks), atol=1e-4)
    assert ctx.get_logits().shape == (1, smollm.hparams.n_vocab)


def test_ubatch_split_equals_whole_batch(smollm, prompts):
    toks = prompts[2]
    logits = []
    for n_ubatch in (3, 512):
        ctx = Context(smollm, ContextParams(n_ctx=256, n_ubatch=n_ubatch))
        assert ctx.decode(seq_batch([(0, toks, 0)], logits="all")) == 0
        logits.append(np.array(ctx.get_logits()))
    assert logits[0].shape == (len(toks), smollm.hparams.n_vocab)
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-4)


def test_four_sequences_in_one_batch_match_each_alone(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=512, n_seq_max=4))
    batch = seq_batch([(s, toks, 0) for s, toks in enumerate(prompts)])
    assert ctx.decode(batch) == 0
    ends = np.cumsum([len(t) for t in prompts]) - 1
    for s, toks in enumerate(prompts):
        np.testing.assert_allclose(ctx.get_logits_ith(int(ends[s])), alone(smollm, toks), atol=1e-4)
    # then greedy, one token per sequence per step, all four in one batch
    together = [[int(np.argmax(ctx.get_logits_ith(int(e))))] for e in ends]
    for _ in range(5):
        batch = seq_batch([(s, [together[s][-1]], len(prompts[s]) + len(together[s]) - 1) for s in range(4)])
        assert ctx.decode(batch) == 0
        for s in range(4):
            together[s].append(int(np.argmax(ctx.get_logits_ith(s))))
    for s, toks in enumerate(prompts):
        solo = Context(smollm, ContextParams(n_ctx=256))
        solo.decode(Batch.get_one(toks))
        out = []
        for _ in range(6):
            out.append(int(np.argmax(solo.get_logits_ith(-1))))
            solo.decode(Batch.get_one([out[-1]]))
        assert together[s] == out


def test_seq_cp_shares_the_prefix(smollm):
    vocab = smollm.vocab
    prefix = vocab.tokenize("The following is a list of facts about animals.", add_special=False)
    suffixes = [vocab.tokenize(s, add_special=False) for s in (" Cats", " Dogs are loyal", " Birds can")]
    ctx = Context(smollm, ContextParams(n_ctx=256, n_seq_max=4))
    assert ctx.decode(seq_batch([(0, prefix, 0)])) == 0
    for s in (1, 2, 3):
        ctx.memory.seq_cp(0, s)
    ctx.memory.seq_rm(0)
    batch = seq_batch([(s + 1, suf, len(prefix)) for s, suf in enumerate(suffixes)])
    assert ctx.decode(batch) == 0
    assert ctx.memory.used == len(prefix) + sum(len(s) for s in suffixes)
    ends = np.cumsum([len(s) for s in suffixes]) - 1
    for s, suf in enumerate(suffixes):
        np.testing.assert_allclose(ctx.get_logits_ith(int(ends[s])), alone(smollm, prefix + suf), atol=1e-4)


def test_seq_rm_then_redecode_reproduces_logits(smollm, prompts):
    toks = prompts[2]
    ctx = Context(smollm, ContextParams(n_ctx=256))
    ctx.decode(Batch.get_one(toks))
    first = np.array(ctx.get_logits_ith(-1))
    assert ctx.memory.seq_rm(0, len(toks) - 4, -1)
    assert ctx.memory.seq_pos_max(0) == len(toks) - 5
    ctx.decode(Batch.get_one(toks[-4:]))
    np.testing.assert_array_equal(ctx.get_logits_ith(-1), first)


def test_seq_add_shift_keeps_relative_positions(smollm):
    """Dropping the first tokens and shifting the rest back (the context shift) must continue like the same
    memory without the shift: RoPE scores depend on relative positions only, and the K-shift re-rotates keys."""
    vocab = smollm.vocab
    toks = vocab.tokenize("Alice went to the market to buy apples. " * 4 + "Then Alice went home and", False)
    n_discard = 16
    results = []
    for shift in (False, True):
        ctx = Context(smollm, ContextParams(n_ctx=256))
        ctx.decode(Batch.get_one(toks[:-1]))
        ctx.memory.seq_rm(0, 0, n_discard)
        if shift:
            ctx.memory.seq_add(0, n_discard, -1, -n_discard)
            assert ctx.memory.seq_pos_min(0) == 0
            assert ctx.memory.seq_pos_max(0) == len(toks) - 2 - n_discard
        assert ctx.decode(Batch.get_one(toks[-1:])) == 0
        results.append(np.array(ctx.get_logits_ith(-1)))
    unshifted, shifted = results
    assert np.argmax(shifted) == np.argmax(unshifted)
    assert np.abs(shifted - unshifted).mean() < 0.3


def test_seq_keep_and_clear(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=512, n_seq_max=3))
    ctx.decode(seq_batch([(s, prompts[s], 0) for s in range(3)]))
    ctx.memory.seq_keep(1)
    assert [ctx.memory.seq_pos_max(s) for s in range(3)] == [-1, len(prompts[1]) - 1, -1]
    assert ctx.memory.used == len(prompts[1])
    ctx.memory.clear()
    assert ctx.memory.used == 0 and ctx.memory.seq_pos_max(1) == -1


def test_seq_div_halves_positions(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=256))
    ctx.decode(Batch.get_one(prompts[2]))
    ctx.memory.seq_div(0, 0, -1, 2)
    assert ctx.memory.seq_pos_max(0) == (len(prompts[2]) - 1) // 2
    assert ctx.memory.can_shift


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda v: Batch.get_one([]), "empty"),
        (lambda v: Batch.get_one([1, v, 2]), "token 1: id 49152 is outside the vocab"),
        (lambda v: Batch.get_one([1, -5]), "token 1: id -5"),
        (lambda v: seq_batch([(4, [1, 2], 0)]), "token 0: seq_id 4 is outside"),
        (lambda v: seq_batch([(0, [1, 2, 3], 10)]), "positions must continue at 5"),
        (lambda v: seq_batch([(1, [1, 2], 0), (1, [3], 5)]), "not continuous"),
        (lambda v: seq_batch([(1, [1, 2], 3), (1, [3], 1)]), "lower than the previous"),
        (lambda v: Batch.get_one(list(range(300))), "more than n_batch = 256"),
    ],
)
def test_invalid_batch_raises_and_leaves_memory(smollm, prompts, make, message):
    ctx = Context(smollm, ContextParams(n_ctx=256, n_batch=256, n_seq_max=4))
    ctx.decode(Batch.get_one(prompts[0]))
    before = memory_image(ctx)
    with pytest.raises(DecodeError, match=message) as info:
        ctx.decode(make(smollm.hparams.n_vocab))
    assert info.value.code == -1
    assert_same_memory(before, memory_image(ctx))


def test_embeddings_mode_requires_every_output(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=256, embeddings=True))
    with pytest.raises(DecodeError, match="every token to be an output"):
        ctx.decode(seq_batch([(0, prompts[0], 0)], logits="last"))
    assert ctx.memory.used == 0


def test_full_kv_returns_1_with_memory_unchanged(smollm):
    ctx = Context(smollm, ContextParams(n_ctx=256, n_batch=256, n_ubatch=64))
    assert ctx.decode(Batch.get_one([42] * 250)) == 0
    before = memory_image(ctx)
    assert ctx.decode(Batch.get_one([42] * 10)) == 1
    assert_same_memory(before, memory_image(ctx))


def test_abort_callback_returns_2_with_memory_unchanged(smollm, prompts):
    calls = []

    def abort() -> bool:
        calls.append(1)
        return len(calls) > 1  # let the first ubatch run, abort the second

    ctx = Context(smollm, ContextParams(n_ctx=256, n_ubatch=4, abort_callback=abort))
    cells_before = ctx.memory.cells.snapshot()
    assert ctx.decode(Batch.get_one(prompts[2])) == 2
    np.testing.assert_array_equal(ctx.memory.cells.pos, cells_before.pos)
    assert ctx.memory.used == 0


def test_logits_index_rules(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=256))
    toks = prompts[0]
    ctx.decode(seq_batch([(0, toks, 0)]))
    np.testing.assert_array_equal(ctx.get_logits_ith(len(toks) - 1), ctx.get_logits_ith(-1))
    with pytest.raises(IndexError, match="batch index 0 has no output"):
        ctx.get_logits_ith(0)
    with pytest.raises(IndexError, match="out of range"):
        ctx.get_logits_ith(-2)
    assert not ctx.get_logits().flags.writeable


def test_embeddings_and_pooling(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=256, n_seq_max=2, embeddings=True, pooling_type="mean"))
    batch = seq_batch([(0, prompts[0], 0), (1, prompts[1], 0)], logits="all")
    assert ctx.decode(batch) == 0
    embd = ctx.get_embeddings()
    assert embd.shape == (len(prompts[0]) + len(prompts[1]), smollm.hparams.n_embd)
    np.testing.assert_allclose(ctx.get_embeddings_seq(0), embd[: len(prompts[0])].mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(ctx.get_embeddings_seq(1), embd[len(prompts[0]) :].mean(axis=0), atol=1e-6)
    np.testing.assert_array_equal(ctx.get_embeddings_ith(0), embd[0])


def test_encode_attends_within_the_batch_only(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=256, embeddings=True, pooling_type="last"))
    assert ctx.encode(Batch.get_one(prompts[0])) == 0
    assert ctx.memory.used == 0
    dec = Context(smollm, ContextParams(n_ctx=256, embeddings=True, pooling_type="last"))
    dec.decode(seq_batch([(0, prompts[0], 0)], logits="all"))
    np.testing.assert_allclose(ctx.get_embeddings_seq(0), dec.get_embeddings_seq(0), atol=1e-3)


def test_params_are_validated_and_frozen(smollm):
    params = ContextParams(n_ctx=300, n_seq_max=2)
    ctx = Context(smollm, params)
    params.n_ctx = 4096
    assert ctx.params.n_ctx == 512  # padded to 256 per sequence, and not changed by the caller's edit
    assert ctx.params.n_ctx_seq == 256
    with pytest.raises(AttributeError):
        ctx.params.n_ctx = 1  # type: ignore[misc]
    for field, value, msg in [("n_seq_max", 300, "n_seq_max = 300 is outside"), ("type_k", "q6_k", "type_k"),
                              ("pooling_type", "max", "pooling_type"), ("n_batch", 0, "n_batch = 0"),
                              ("rope_freq_base", float("nan"), "rope_freq_base")]:
        with pytest.raises(ContextParamsError, match=msg):
            Context(smollm, ContextParams(**{field: value}))
    with pytest.raises(ContextParamsError, match="requires flash_attn"):
        Context(smollm, ContextParams(type_v="q8_0", flash_attn="disabled"))


def test_perf_counts_prompt_and_generation(smollm, prompts):
    ctx = Context(smollm, ContextParams(n_ctx=256))
    ctx.decode(Batch.get_one(prompts[0]))
    ctx.decode(Batch.get_one([42]))
    perf = ctx.perf()
    assert perf.n_p_eval == len(prompts[0]) and perf.n_eval == 1
    assert perf.t_p_eval_ms > 0 and perf.t_eval_ms > 0


def test_closed_context_refuses_work(smollm, prompts):
    with Context(smollm, ContextParams(n_ctx=256)) as ctx:
        ctx.decode(Batch.get_one(prompts[0]))
    with pytest.raises(RuntimeError, match="closed"):
        ctx.decode(Batch.get_one(prompts[0]))


def test_more_contexts_grow_rss_by_their_own_buffers_only(smollm, prompts):
    """Contexts share the model's weights (and its packed copies); each adds only its KV cache and outputs."""
    psutil = pytest.importorskip("psutil")
    proc = psutil.Process()
    first = Context(smollm, ContextParams(n_ctx=512))
    first.decode(Batch.get_one(prompts[0]))  # packs the weights once, for every context
    before = proc.memory_info().rss
    extra = [Context(smollm, ContextParams(n_ctx=512)) for _ in range(4)]
    for ctx in extra:
        assert ctx.decode(Batch.get_one(prompts[1])) == 0
    grown = proc.memory_info().rss - before
    own = sum(sum(ctx.memory_breakdown().values()) for ctx in extra)
    assert grown <= own + 32 * 2**20, (grown, own)
    assert grown < smollm.size / 2  # nowhere near a copy of the weights


def test_a_sequence_in_scattered_cells_gives_the_bits_it_gives_alone(smollm, prompts):
    """Cells reused out of position order (a busy server's cache) change no bit: attention sums by position."""
    toks = (prompts[2] + prompts[3])[:9]
    ctx = Context(smollm, ContextParams(n_ctx=256, n_seq_max=3))
    assert ctx.decode(seq_batch([(0, list(range(100, 110)), 0), (1, list(range(200, 210)), 0)])) == 0
    ctx.memory.seq_rm(0, 5, -1)  # cells 5-9 free
    assert ctx.decode(seq_batch([(2, toks[:3], 0)])) == 0  # positions 0-2 in cells 5-7
    ctx.memory.seq_rm(0)  # cells 0-4 free
    assert ctx.decode(seq_batch([(2, toks[3:], 3)])) == 0  # positions 3-7 in cells 0-4, 8 in cell 8
    np.testing.assert_array_equal(ctx.get_logits_ith(-1), alone(smollm, toks))


def test_kv_split_gives_each_sequence_at_most_n_ctx_seq_cells(smollm):
    # kv_unified=False: as llama.cpp's per-sequence streams, a sequence stops at n_ctx_seq cells even with cells free
    ctx = Context(smollm, ContextParams(n_ctx=512, n_seq_max=2))
    assert (ctx.params.n_ctx, ctx.params.n_ctx_seq) == (512, 256)
    assert ctx.decode(seq_batch([(0, [42] * 250, 0)])) == 0
    assert (ctx.memory.room(0), ctx.memory.room(1)) == (6, 256)
    assert ctx.memory.can_fit(6, 0) and not ctx.memory.can_fit(7, 0)
    before = memory_image(ctx)
    assert ctx.decode(seq_batch([(0, [42] * 7, 250)])) == DecodeStatus.NO_SLOT
    assert_same_memory(before, memory_image(ctx))
    assert ctx.decode(seq_batch([(0, [42] * 6, 250), (1, [42] * 8, 0)])) == 0
    assert ctx.memory.seq_pos_max(0) == 255 and ctx.memory.room(0) == 0

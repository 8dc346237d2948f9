"""Speculative decoding with n-gram drafts (engine/speculative.py, engine/ngram.py): the same tokens as without it,
fewer decodes where the output repeats the input, the sampler advanced over accepted tokens only, rejected draft
tokens gone from memory, and the parameters' limits."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from llamactx import Model
from llamactx.cli.args import ArgumentParser, CommandError, add_speculative, spec_params
from llamactx.engine import Engine, EngineError, Limits
from llamactx.engine.ngram import NgramBackoff, NgramMapK, NgramMod, NgramSimple
from llamactx.engine.speculative import (
    DecodeCost,
    DraftBudget,
    NgramParams,
    SpecParams,
    SpecParamsError,
    Speculator,
)
from llamactx.sampling import SamplerChain, SamplingParams
from tests.engine.test_engine import chain

CODE = (Path(__file__).parents[1] / "data" / "spec_code.txt").read_text()  # a frozen copy of some Python code
SIMPLE = SpecParams(types=("ngram-simple",))
SHORT = SpecParams(types=("ngram-simple",), ngram_simple=NgramParams(size_n=4, size_m=16))
TINY = Path(__file__).parent.parent / "data" / "tiny"


def grounded(model, chat: tuple[str, str, str], n_chars: int) -> list[int]:
    """A prompt whose answer repeats its input: code to copy, the answer's first line already given."""
    user, end, assistant = chat
    text = f"{user}Repeat this code exactly.\n```python\n{CODE[1500:1500 + n_chars]}```{end}{assistant}```python\n"
    return model.vocab.tokenize(text, parse_special=True)


def generate(model, prompts, spec=None, temp=0.0, max_tokens=32, **kw):
    """Every prompt's output, run together on one engine; and the engine."""
    engine = Engine(model, n_slots=len(prompts), n_ctx=2048, spec=spec, n_threads=2, **kw)
    seqs = [engine.add_request(p, chain(model, temp, seed=i), Limits(max_tokens=max_tokens))
            for i, p in enumerate(prompts)]
    for _ in range(2000):
        if not engine.has_work:
            break
        engine.step()
    return [s.output for s in seqs], engine


def check_memory(engine: Engine) -> None:
    """Each slot's memory holds exactly the tokens the slot says it holds: no rejected draft is left."""
    for i in range(engine.n_slots):
        held = engine.slot_tokens(i)
        assert engine.ctx.memory.seq_pos_max(i) == len(held) - 1


@pytest.fixture(scope="module")
def smollm_prompt(smollm):
    return grounded(smollm, ("<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n"), 1100)


# -- the engine ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [SIMPLE, SHORT, SpecParams(types=("ngram-map-k",)),
                                  SpecParams(types=("ngram-mod",), ngram_mod_n_match=8, ngram_mod_n_min=2),
                                  SpecParams(types=("ngram-backoff",))],
                         ids=["simple", "simple-4-16", "map-k", "mod", "backoff"])
def test_one_stream_greedy_is_unchanged_and_takes_fewer_decodes(smollm, smollm_prompt, spec):
    (plain,), e0 = generate(smollm, [smollm_prompt], max_tokens=48)
    (fast,), e1 = generate(smollm, [smollm_prompt], spec, max_tokens=48)
    assert fast == plain
    st = e1.stats
    assert st.n_draft_accepted > 0 and st.n_draft_tokens >= st.n_draft_accepted
    assert st.n_decode < e0.stats.n_decode
    assert e0.stats.n_draft_tokens == 0
    check_memory(e1)


@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_concurrent_slots_give_the_same_tokens(smollm, smollm_prompt, temp):
    """SmolLM2's kernels are row invariant (docs/numerics.md), so each position's logits do not depend on the
    draft beside it: with the same seeds, sampled outputs are identical too (the sampler draws once per token)."""
    prompts = [smollm_prompt, smollm.vocab.tokenize("1, 2, 3, 4, 5,"), smollm_prompt[:300],
               smollm.vocab.tokenize("The capital of France is")]
    plain, _ = generate(smollm, prompts, temp=temp, n_batch=64)  # prompts prefill in chunks beside drafts
    fast, e1 = generate(smollm, prompts, SHORT, temp=temp, n_batch=64)
    assert fast == plain
    assert e1.stats.n_draft_accepted > 0
    check_memory(e1)


def test_limits_inside_a_draft(smollm, smollm_prompt):
    """max_tokens and a stop string that fall inside an accepted draft end the output where they would."""
    for limits in (Limits(max_tokens=5), Limits(max_tokens=40, stop=("prefix",))):
        out = []
        for spec in (None, SHORT):
            engine = Engine(smollm, n_slots=1, n_ctx=2048, spec=spec, n_threads=2)
            seq = engine.add_request(smollm_prompt, chain(smollm), limits)
            list(engine.generate(seq))
            out.append((seq.output, seq.result().text, seq.finish_reason))
            check_memory(engine)
        assert out[0] == out[1]


def test_a_seeded_sampled_run_is_reproducible_and_counted(smollm, smollm_prompt):
    runs = [generate(smollm, [smollm_prompt], SHORT, temp=1.0, max_tokens=40) for _ in range(2)]
    assert runs[0][0] == runs[1][0]
    assert runs[0][1].stats.n_draft_verif_steps > 0


def test_timings_count_each_requests_drafts(smollm, smollm_prompt):
    engine = Engine(smollm, n_slots=1, n_ctx=2048, spec=SHORT, n_threads=2)
    seq = engine.add_request(smollm_prompt, chain(smollm), Limits(max_tokens=24))
    list(engine.generate(seq))
    t = seq.timings
    assert t.draft_n == engine.stats.n_draft_tokens > 0
    assert t.draft_n_accepted == engine.stats.n_draft_accepted > 0


def test_gemma_greedy_across_the_sliding_window(gemma):
    """Gemma 3's iSWA cache (n_swa 512): rejected drafts are removed from both caches and the window still holds
    what the next token sees. Its Q4_K / Q6_K matmuls follow llama.cpp's per-ubatch kernel choice, so its logits
    are not row invariant; greedy tokens are the same here (engine/speculative.py's docstring)."""
    prompt = grounded(gemma, ("<start_of_turn>user\n", "<end_of_turn>\n", "<start_of_turn>model\n"), 1700)
    assert len(prompt) > gemma.hparams.n_swa
    prompts = [prompt, gemma.vocab.tokenize("1, 2, 3, 4, 5,")]
    plain, _ = generate(gemma, prompts, max_tokens=32, n_batch=128)
    fast, e1 = generate(gemma, prompts, SHORT, max_tokens=32, n_batch=128)
    assert fast == plain
    assert e1.stats.n_draft_accepted > 0
    check_memory(e1)


@pytest.mark.parametrize("n_chars", [250, 900, 1500])
@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_gemma_one_stream_is_token_for_token_unchanged(gemma, n_chars, temp):
    """Gemma's Q4_K / Q6_K matmuls run a row alone and a row among four differently (llama.cpp's gemv / gemm);
    a lone stream's drafts are capped so that its ubatch stays at GEMV_ROWS rows, each computed as alone: greedy
    and seeded outputs are those without drafts, token for token."""
    prompt = grounded(gemma, ("<start_of_turn>user\n", "<end_of_turn>\n", "<start_of_turn>model\n"), n_chars)
    (plain,), _ = generate(gemma, [prompt], temp=temp, max_tokens=48)
    (fast,), e1 = generate(gemma, [prompt], SHORT, temp=temp, max_tokens=48)
    assert fast == plain
    assert e1.stats.n_draft_tokens > 0


def test_gemma_seeded_runs_with_drafts_are_reproducible(gemma):
    prompt = grounded(gemma, ("<start_of_turn>user\n", "<end_of_turn>\n", "<start_of_turn>model\n"), 900)
    runs = [generate(gemma, [prompt], SHORT, temp=0.8, max_tokens=48) for _ in range(2)]
    assert runs[0][0] == runs[1][0]
    assert runs[0][1].stats.n_draft_tokens > 0


def oracle_drafter(engine: Engine, outputs: dict[tuple[int, ...], list[int]]):
    """Replace the engine's drafter with one that knows each prompt's plain output (keyed by prompt) and drafts
    its next tokens with a planned mistake: right for 0, 1, 2, ... tokens in turn, then one wrong token, so that
    drafts are rejected at once, accepted in part, and (when the mistake falls past n_max) accepted in full."""
    turn = iter(range(10**6))

    def draft(seq_id, request_id, tokens, n_max):
        for prompt, out in sorted(outputs.items(), key=lambda kv: -len(kv[0])):  # the longest that matches
            if tuple(tokens[: len(prompt)]) == prompt:
                done = len(tokens) - len(prompt)
                n_right = next(turn) % 5
                d = out[done : done + n_right] + [(out[done + n_right] + 1) % 7 if done + n_right < len(out) else 0]
                return d[: max(n_max, 0)]
        return []

    engine.speculator.draft = draft


@pytest.mark.parametrize("name", ["mamba2", "lfm2", "lfm2moe", "qwen35", "qwen35moe", "qwen3next", "granitehybrid",
                                  "nemotron_h"])
@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_recurrent_memories_roll_rejected_drafts_back(name, temp):
    """A recurrent state (mamba2) or hybrid memory (lfm2) cannot seq_rm rejected tokens: the engine restores the
    state it snapshot before the verify decode and decodes the accepted tokens again (llama-server's speculative
    checkpoint and replay). Greedy and seeded outputs are those without drafts, token for token, on 4 slots, and
    each slot's memory ends exactly at its tokens."""
    ref = json.loads((TINY / f"{name}.json").read_text())
    model = Model.load(TINY / f"tiny-{name}.gguf")
    prompts = [p["tokens"] * k for p in ref["prompts"][:2] for k in (1, 3)]
    plain, _ = generate(model, prompts, temp=temp, max_tokens=24)
    engine = Engine(model, n_slots=len(prompts), n_ctx=2048, spec=SHORT, n_threads=2)
    assert engine.spec_disabled is None and engine.speculator is not None
    oracle_drafter(engine, {tuple(p): out for p, out in zip(prompts, plain, strict=True)})
    seqs = [engine.add_request(p, chain(model, temp, seed=i), Limits(max_tokens=24)) for i, p in enumerate(prompts)]
    for _ in range(500):
        if not engine.has_work:
            break
        engine.step()
    assert [s.output for s in seqs] == plain
    st = engine.stats
    assert 0 < st.n_draft_accepted < st.n_draft_tokens  # some drafts kept, some rolled back
    check_memory(engine)


def test_the_draft_budget_verifies_what_pays():
    """Under the prior (free_rows rows for the price of one decode) a lone stream at the prior rate 0.8 verifies
    7 draft tokens (8 rows: the most tokens per decode), a batch of free_rows generating sequences none (each
    row already costs what a token costs); a rate near 1 fills the free rows, a poor one drafts less; free_rows 0
    verifies whole drafts, as llama.cpp does."""
    b = DraftBudget(8)
    assert b.rate(0) == pytest.approx(0.8)
    assert b.cap(0, 1, 1, 48) == 7 and b.cap(0, 4, 4, 48) == 4 and b.cap(0, 8, 8, 48) == 0
    for _ in range(5):
        b.record(0, 30, 30)
    assert b.rate(0) > 0.99 and b.cap(0, 1, 1, 48) == 7 and b.cap(0, 8, 8, 48) == 0
    assert b.cap(0, 1, 1, 3) == 3  # never more than the room
    for _ in range(20):
        b.record(0, 30, 1)
    assert b.rate(0) < 0.8 and b.cap(0, 1, 1, 48) == 7  # the free rows cost nothing: still worth filling
    b.forget(0)
    assert b.rate(0) == pytest.approx(0.8)
    assert DraftBudget(0).cap(0, 8, 8, 48) == 48


def expensive_rows(free_rows: int = 8) -> DecodeCost:
    """A cost model as measured with AVX2 arithmetic (SmolLM2, issue #48): each row past the first adds 0.42 of a
    one-row decode, except that 4 rows (a tile) cost less than 3."""
    cost = DecodeCost(free_rows)
    for _ in range(DecodeCost.MIN_SAMPLES):
        for n in range(1, 65):
            cost.observe(n, 0.010 * (1 + 0.42 * (n - 1)) - (0.002 if n == 4 else 0.0))
    return cost


def budget_at(rate: float, cost: DecodeCost) -> DraftBudget:
    """A budget whose slot 0 has seen drafts of 10 tokens, each token accepted with chance `rate` after the ones
    before it were (seeded)."""
    b = DraftBudget(8, cost)
    rng = random.Random(48)
    for _ in range(60):
        n_accepted = 0
        while n_accepted < 10 and rng.random() < rate:
            n_accepted += 1
        b.record(0, 10, n_accepted)
    return b


@pytest.mark.parametrize("accepted", [1.0, 0.95, 0.9])
def test_where_rows_are_expensive_accepted_drafts_grow_long(accepted):
    """Rows that cost 0.42 of a decode each: a stream whose drafts are mostly accepted verifies far more than the 2
    tokens a per-token rule allowed (issue #48), the length that gives the most tokens per second: no shorter or
    longer draft is expected to do better."""
    cost = expensive_rows()
    b = budget_at(accepted, cost)
    a = b.rate(0)
    n = b.cap(0, 1, 1, 48)
    assert n > 2

    def tokens_per_second(k: int) -> float:
        return sum(a ** i for i in range(k + 1)) / cost.seconds(1 + k)

    assert all(tokens_per_second(n) >= tokens_per_second(k) for k in range(49))
    assert tokens_per_second(n) > (1.2 if accepted < 1 else 2.0) * tokens_per_second(0)


def test_where_rows_are_expensive_rejected_drafts_stop():
    """The same costs and draft tokens accepted one in ten: nothing is verified (a lone stream, and
    one beside 7 others), and a tile of 4 rows cheaper than 3 is chosen when it gives more tokens per second."""
    cost = expensive_rows()
    low = budget_at(0.1, cost)
    assert low.rate(0) < 0.2 and low.cap(0, 1, 1, 48) == 0 and low.cap(0, 8, 8, 48) == 0
    mid = DraftBudget(8, cost)  # the prior rate 0.8: 3 tokens, the 4-row tile
    assert mid.cap(0, 1, 1, 48) == 3


def test_the_decode_cost_is_measured_on_the_machine():
    """DecodeCost: the prior (free_rows rows for the price of one) until two row counts are measured, then a
    row count's least time where it has MIN_SAMPLES samples and the line through those elsewhere. A sample from
    a compile or a burst of load (only ever slower) changes neither."""
    cost = DecodeCost(8)
    assert not cost.measured and cost.seconds(8) == 1.0 and cost.seconds(9) == 2.0
    assert "not measured" in cost.summary()
    for n in (1, 4, 10, 1, 4, 10):
        cost.observe(n, 0.010 + 0.005 * n)
    assert cost.measured and cost.line == pytest.approx((0.010, 0.005))
    assert cost.seconds(7) == pytest.approx(0.045)  # not tried: the line
    cost.observe(10, 5.0)  # one decode that waited for a compile
    assert cost.seconds(10) == pytest.approx(0.060) and cost.line[1] == pytest.approx(0.005)
    for _ in range(3):
        cost.observe(4, 0.020)
    assert cost.seconds(4) == pytest.approx(0.020)  # its own time, below the line (a tile)
    cost.observe(0, 1.0)
    cost.observe(3, -1.0)
    assert 0 not in cost._samples and 3 not in cost._samples
    assert "ms/row" in cost.summary()
    steep = DraftBudget(8, DecodeCost(8))
    for n in (1, 4, 10) * 2:
        steep.cost.observe(n, 0.010 + 0.005 * n)
    for _ in range(10):
        steep.record(0, 10, 0)
    assert steep.rate(0) < 0.3 and steep.cap(0, 1, 1, 48) == 0
    flat = DraftBudget(8, DecodeCost(8))
    for n in (1, 4, 10) * 2:
        flat.cost.observe(n, 0.010 + 0.0001 * n)
    for _ in range(5):
        flat.record(0, 30, 30)
    assert flat.cap(0, 1, 1, 48) == 48


def test_a_full_batch_verifies_no_drafts_and_a_lone_stream_long_ones(smollm, smollm_prompt):
    """On the engine: 8 streams copying at the prior rate draft nothing (the batch is already compute-bound), one
    stream drafts and the outputs are the same."""
    (one,), e1 = generate(smollm, [smollm_prompt], SIMPLE, max_tokens=40)
    assert e1.stats.n_draft_tokens > 7  # longer than the free rows
    outs, e8 = generate(smollm, [smollm_prompt] * 8, SIMPLE, max_tokens=40)
    assert e8.stats.n_draft_tokens == 0 and outs == [one] * 8


def test_eight_slots_verifying_whole_drafts_give_the_same_tokens(smollm, smollm_prompt):
    """8 concurrent slots, every draft verified whole (free_rows 0, as llama.cpp): greedy outputs are those
    without drafts, and no rejected token is left in memory."""
    prompts = [smollm_prompt[: len(smollm_prompt) - 20 * i] for i in range(8)]
    plain, _ = generate(smollm, prompts, max_tokens=24)
    fast, e8 = generate(smollm, prompts, SpecParams(types=("ngram-simple",), free_rows=0,
                                                    ngram_simple=NgramParams(size_n=4, size_m=16)), max_tokens=24)
    assert fast == plain
    assert e8.stats.n_draft_accepted > 0
    check_memory(e8)


def test_kv_layout_exact_decodes_without_drafts(smollm):
    engine = Engine(smollm, n_slots=1, n_ctx=256, spec=SIMPLE, kv_layout_exact=True)
    assert engine.speculator is None and "kv_layout_exact" in engine.spec_disabled


# -- the drafters (llama.cpp's common/ngram-map.cpp, ngram-mod.cpp) ----------------------------------------------


def test_ngram_simple_drafts_what_followed_the_latest_match():
    s = NgramSimple(3, 4)
    history = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2]
    assert s.draft(0, history, 3) == [4, 5, 6, 7]
    assert s.draft(0, [1, 2, 3, *history[4:]], 3) == []  # a match at position 0 does not count
    assert s.draft(0, history, 99) == []
    assert s.draft(0, history[:7], 3) == []  # fewer than n + m + 2 tokens
    later = [*history[:-2], 1, 2, 3, 40, 41, 42, 43, 44, 1, 2]
    assert s.draft(0, later, 3) == [40, 41, 42, 43]


def test_ngram_map_k_cuts_a_key_to_what_was_accepted():
    k = NgramMapK(3, 4)
    history = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2]
    k.begin(0, history)
    assert k.draft(0, history, 3) == [4, 5, 6, 7]
    k.accept(0, 2, False)
    assert k.draft(0, history, 3) == [4, 5]


def test_ngram_mod_chains_lookups_and_drops_short_drafts():
    m = NgramMod(3, 2, 8, size=1024)
    history = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2]
    m.begin(0, history)
    assert m.draft(0, history, 3) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert NgramMod(3, 2, 8, size=1024).draft(0, history, 3) == []  # nothing learnt yet


def test_ngram_backoff_shortens_its_key_where_the_longest_finds_nothing():
    b = NgramBackoff(12, 4)
    assert b.sizes == [12, 6, 3]
    assert b.draft(0, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], 3) == [4, 5, 6, 7]  # only the 3-gram occurs
    assert b.draft(0, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], 42) == []  # no key length occurs
    key = [10, 11, 12, 13, 14, 15, 16, 17, 18, 1, 2]  # with the sampled 3: a 12-gram
    history = [0, *key, 3, 20, 21, 22, 23, 1, 2, 3, 99, 98, 97, 96, *key]
    assert b.draft(0, history, 3) == [20, 21, 22, 23]  # the longest key's match, not the 3-gram's later one
    same = NgramSimple(12, 12).draft(0, history, 3)  # where ngram-simple drafts, the same draft
    assert same == NgramBackoff(12, 12).draft(0, history, 3) == [20, 21, 22, 23, 1, 2, 3, 99, 98, 97, 96, 10]


def test_ngram_backoff_drafts_through_a_loop_shorter_than_its_key():
    history = [9, 5, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # the sampled token 4 goes on a period-4 loop
    assert NgramSimple(12, 2).draft(0, history, 4) == []  # its match one period back leaves a 3-token draft < n
    assert NgramBackoff(12, 10).draft(0, history, 4) == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    loop = [7, 8, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41]  # period 14: ngram-simple drafts 13 tokens
    history = [0, *loop, *loop, *loop[:-1]]
    assert NgramSimple(12, 20).draft(0, history, 41) == [*loop[:-1]]
    assert NgramBackoff(12, 20).draft(0, history, 41) == [*loop, *loop[:6]]
    assert NgramBackoff(3, 5).sizes == [3]


def test_ngram_backoff_drafts_the_copy_again_right_after_an_edit():
    """A copy with one token inserted, replaced or dropped: the first token after the edit that the text holds
    is found near the cursor's place and the copy is drafted from there, where no 3-token key matches yet."""
    text = list(range(10, 40))
    history = [1, *text, 10, 11, 12]  # copying the text: the sampled 13, then the text's 14, 15, ...
    prefix = [*history, 13]
    for edit, output in [("insert", [99, 14]), ("replace", [99, 15]), ("drop", [15])]:
        b = NgramBackoff(12, 4)
        assert b.draft(0, history, 13) == [14, 15, 16, 17]
        if len(output) == 2:
            assert b.draft(0, prefix, 99) == [], edit  # the edit itself: 99 is nowhere near
        h, sampled = [*prefix, *output[:-1]], output[-1]
        assert b.draft(0, h, sampled) == list(range(sampled + 1, sampled + 5)), edit
        assert b.draft(0, h, sampled) == list(range(sampled + 1, sampled + 5)), edit  # asking twice: the same
        assert NgramBackoff(12, 4).draft(0, h, sampled) == [], edit  # without the cursor no 3-token key matches
    b = NgramBackoff(12, 4)  # a cursor past CURSOR_MAX tokens ago is not used
    b.draft(0, history, 13)
    far = [*prefix, *[99] * b.CURSOR_MAX]
    assert b.draft(0, far, 14 + b.CURSOR_MAX) == []
    assert b.draft(0, far[:-1], 13 + b.CURSOR_MAX) == [14 + b.CURSOR_MAX, 15 + b.CURSOR_MAX, 16 + b.CURSOR_MAX,
                                                       17 + b.CURSOR_MAX]  # one token nearer: still used
    b.draft(0, history, 13)
    b.begin(0, history)  # a new request forgets the cursor
    assert b.draft(0, [*prefix, 99], 14) == []


def test_ngram_backoff_prefers_the_cursor_to_a_short_key_elsewhere():
    """The 3-gram (5, 6, 7) occurs later in the history than the copy being made; the copy's own place wins."""
    text = [20, 21, 5, 6, 7, 22, 23, 24, 25, 26]
    history = [1, *text, 30, 5, 6, 7, 40, 41, 42, 43, 20, 21]
    b = NgramBackoff(12, 4)
    assert b.draft(0, history, 5) == [6, 7, 22, 23]
    assert b.draft(0, [*history, 5, 6], 7) == [22, 23, 24, 25]
    assert NgramBackoff(12, 4).draft(0, [*history, 5, 6], 7) == [40, 41, 42, 43]  # the latest 3-gram match


def test_the_speculator_cuts_drafts_and_begins_each_request():
    sp = Speculator(SpecParams(types=("ngram-mod", "ngram-simple"), ngram_simple=NgramParams(3, 4)))
    assert [type(d).__name__ for d in sp.drafters] == ["NgramSimple", "NgramMod"]  # llama.cpp's preference
    history = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3]
    assert sp.draft(0, 7, history, 2) == [4, 5]
    assert sp.draft(0, 7, history, 0) == []


# -- parameters -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(n_max=-1), dict(n_min=-2), dict(p_min=1.5), dict(types=("foo",)),
                                dict(types=("draft-simple",)), dict(types="ngram-simple"),
                                dict(ngram_simple=NgramParams(size_n=0)), dict(ngram_map_k=NgramParams(size_m=2000)),
                                dict(ngram_mod_n_match=0), dict(ngram_mod_n_max=1025)])
def test_bad_params_are_refused(kw):
    with pytest.raises(SpecParamsError):
        SpecParams(**kw)


def test_spec_off_and_bad_engine_argument(smollm):
    assert not SpecParams().enabled and not SpecParams(types=("none",)).enabled
    assert Engine(smollm, n_ctx=256, spec=SpecParams()).speculator is None
    with pytest.raises(EngineError, match="spec"):
        Engine(smollm, n_ctx=256, spec="ngram-simple")


def test_cli_flags_make_spec_params():
    p = ArgumentParser(prog="llamactx serve")
    add_speculative(p)
    assert spec_params(p.parse_args([])) is None
    sp = spec_params(p.parse_args(["--spec-type", "ngram-simple,ngram-mod", "--spec-ngram-simple-size-n", "4",
                                   "--spec-ngram-mod-n-max", "32", "--spec-draft-n-max", "8"]))
    assert sp == SpecParams(types=("ngram-simple", "ngram-mod"), n_max=8, ngram_mod_n_max=32,
                            ngram_simple=NgramParams(size_n=4))
    assert spec_params(p.parse_args(["--spec-type", "ngram-backoff"])).types == ("ngram-backoff",)
    assert [type(d).__name__ for d in Speculator(SpecParams(types=("ngram-backoff", "ngram-simple"))).drafters] \
        == ["NgramSimple", "NgramBackoff"]
    for bad, msg in ((["--spec-draft-n-max", "-1"], "outside"), (["--draft-max", "3"], "has been removed"),
                     (["--spec-ngram-simple-size-m", "0"], "outside"), (["--spec-type", "draft-mtp"], "draft model"),
                     (["--spec-type", "nope"], "unknown")):
        with pytest.raises(CommandError, match=msg):
            spec_params(p.parse_args(bad))


def test_a_shadow_draft_is_scored_as_if_verified():
    """A draft not worth verifying is followed: the tokens sampled after it accept its prefix, and the rate comes
    back when the model follows the text again."""
    b = DraftBudget(8)
    for _ in range(10):
        b.record(0, 10, 0)
    low = b.rate(0)
    b.shadow(0, 3, [7, 8, 9])
    assert b.has_shadow(0)
    b.shadow(0, 4, [1])  # one at a time: ignored
    b.follow(0, [1, 2, 3, 7])
    assert b.has_shadow(0) and b.rate(0) > low  # still matching: the matched token is credited at once
    b.follow(0, [1, 2, 3, 7, 8, 9])
    assert not b.has_shadow(0) and b.rate(0) > low  # three accepted, none rejected
    b.shadow(0, 6, [5, 5])
    b.follow(0, [1, 2, 3, 7, 8, 9, 4])
    assert not b.has_shadow(0)
    b.forget(0)
    assert b.rate(0) == pytest.approx(0.8)


def test_outputs_equal_when_drafts_stop_paying(smollm, smollm_prompt):
    """An engine whose measured rows are expensive stops verifying drafts that are mostly rejected and still
    gives the tokens of plain decoding; its shadow drafts keep the rate up to date."""
    (plain,), _ = generate(smollm, [smollm_prompt], max_tokens=40)
    engine = Engine(smollm, n_slots=1, n_ctx=512, spec=SIMPLE)
    cost = engine.speculator.budget.cost
    for n in (1, 2, 3) * 2:
        cost.observe(n, 1.0 + 10.0 * n)  # a draft token pays only if accepted > 10 times in 11
    seq = engine.add_request(smollm_prompt, SamplerChain.default(SamplingParams(temperature=0.0),
                                                                 smollm.hparams.n_vocab, smollm.vocab, n_ctx=512),
                             Limits(max_tokens=40))
    for _ in engine.generate(seq):
        pass
    assert seq.output == plain
    assert engine.speculator.budget.rate(0) != pytest.approx(0.8)  # shadow drafts were scored

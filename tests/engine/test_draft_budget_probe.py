"""DraftBudget picks drafts up again where its cost model had refused them (issue #48): a row count measured only
under a compile or a burst of load, or long ago, is tried again by a slot whose drafts are accepted, and a shadow
draft the model follows raises the slot's rate within a few tokens. Pure Python: no model, no kernels."""

from __future__ import annotations

import pytest

from llamactx.engine.speculative import DecodeCost, DraftBudget


def avx2_seconds(n_rows: int) -> float:
    """A decode's time with AVX2 arithmetic (SmolLM2, issue #48): each row past the first adds 0.42 of one row."""
    return 0.010 * (1 + 0.42 * (n_rows - 1))


def poisoned_cost() -> DecodeCost:
    """One-row decodes measured often; 2 and 16 rows measured twice each while their graphs were planned (10x their
    time): the line through them says every extra row costs far more than a token."""
    cost = DecodeCost(8)
    for _ in range(20):
        cost.observe(1, avx2_seconds(1))
    for n in (2, 16) * 2:
        cost.observe(n, 10 * avx2_seconds(n))
    return cost


def accepting(rate_tokens: int, cost: DecodeCost) -> DraftBudget:
    b = DraftBudget(8, cost)
    for _ in range(rate_tokens):
        b.record(0, 20, 20)
    return b


def test_a_stale_count_is_probed_by_a_slot_that_accepts():
    cost = poisoned_cost()
    assert cost.stale(2) and cost.stale(8) and not cost.stale(1)
    assert cost.seconds(2) > 2 * cost.seconds(1)  # the poisoned line: a draft token never pays
    high = accepting(5, cost)
    assert high.rate(0) >= DraftBudget.PROBE_RATE and high.cap(0, 1, 1, 48) > 0
    low = DraftBudget(8, cost)
    for _ in range(10):
        low.record(0, 20, 2)
    assert low.rate(0) < DraftBudget.PROBE_RATE and low.cap(0, 1, 1, 48) == 0  # no probe on poor drafts


def test_a_count_is_stale_again_after_refresh_decodes():
    cost = DecodeCost(8)
    for _ in range(DecodeCost.MIN_SAMPLES):
        cost.observe(1, avx2_seconds(1))
        cost.observe(8, 5 * avx2_seconds(8))
    assert not cost.stale(8)
    for _ in range(DecodeCost.REFRESH):
        cost.observe(1, avx2_seconds(1))
    assert not cost.stale(8)
    cost.observe(1, avx2_seconds(1))
    assert cost.stale(8) and not cost.stale(1)
    assert cost.hoped(8) == pytest.approx(cost.seconds(1))  # the prior: 8 rows for the price of one
    cost.observe(8, avx2_seconds(8))
    assert not cost.stale(8) and cost.seconds(8) == pytest.approx(avx2_seconds(8))  # the new, faster time


def simulate(budget: DraftBudget, n_tokens: int, copy_from: int) -> tuple[float, int]:
    """A lone stream whose model follows the text from token `copy_from` on, whose drafter always offers 20 tokens
    (right from `copy_from` on, wrong before), on AVX2's row costs: (tokens per second, tokens decoded alone)."""
    tokens: list[int] = []
    seconds, alone = 0.0, 0
    while len(tokens) < n_tokens:
        right = len(tokens) >= copy_from
        draft = [1] * 20 if right else [2] * 20
        n = budget.cap(0, 1, 1, min(20, n_tokens - len(tokens) - 1))
        if n == 0:
            if not budget.has_shadow(0):
                budget.shadow(0, len(tokens), draft)
            tokens.append(1 if right else 3)
            budget.follow(0, tokens)
            alone += right
        else:
            n_acc = n if right else 0
            tokens += [1] * (n_acc + 1)
            budget.record(0, n, n_acc)
        t = avx2_seconds(1 + n)
        budget.cost.observe(1 + n, t)
        seconds += t
    return len(tokens) / seconds, alone


def test_a_followed_copy_gets_its_drafts_back_at_once(monkeypatch):
    """The trap of issue #48's haswell runs: with the poisoned costs and the rate lowered by wrong drafts, a copy
    that starts at token 40 was decoded one token at a time to the end; with the probes and the shadow's credit
    the drafts come back within a few tokens and the copy runs at the speed AVX2's rows allow (1.6x at most)."""
    plain = 1 / avx2_seconds(1)
    tps, alone = simulate(DraftBudget(8, poisoned_cost()), 256, 40)
    assert alone <= 12 and tps > 1.3 * plain
    monkeypatch.setattr(DraftBudget, "PROBE_RATE", 1.01)  # no probes: the old budget
    tps_old, alone_old = simulate(DraftBudget(8, poisoned_cost()), 256, 40)
    assert alone_old > 150 and tps_old < 1.1 * plain


def test_the_shadow_credit_is_not_counted_twice():
    """A shadow draft credited 5 tokens and then settled by a verified draft counts as a draft of 5 accepted
    whole, then the verified one: the same counts as those two drafts verified."""
    b, ref = DraftBudget(8), DraftBudget(8)
    b.record(0, 10, 2)
    ref.record(0, 10, 2)
    b.shadow(0, 0, list(range(10)))
    b.follow(0, list(range(5)))
    assert b.has_shadow(0) and b.rate(0) > ref.rate(0)
    b.record(0, 10, 10)
    ref.record(0, 5, 5)
    ref.record(0, 10, 10)
    assert not b.has_shadow(0) and b.rate(0) == pytest.approx(ref.rate(0))
    b.shadow(0, 20, [1, 2, 3])
    b.follow(0, [0] * 20 + [1, 2])
    b.shadow_drop(0)  # a context shift: the credit stays, as a draft of 2 accepted whole
    ref.record(0, 2, 2)
    assert b.rate(0) == pytest.approx(ref.rate(0))


def line_cost(counts, times=avx2_seconds) -> DecodeCost:
    """A DecodeCost that measured each of `counts` MIN_SAMPLES times at `times(n)`."""
    cost = DecodeCost(8)
    for _ in range(DecodeCost.MIN_SAMPLES):
        for n in counts:
            cost.observe(n, times(n))
    return cost


def test_probes_never_cut_a_draft_the_line_pays_for():
    """AVX2 rows (0.42 of a decode each) measured at 1 and 13 to 16 rows, the counts between never (stale): a slot
    whose copy is accepted verifies the long draft the line pays for, not a short stale count that the prior
    prices at one row (issue #48, haswell: a copy's 12-token drafts were cut to 3 and 7 to probe counts)."""
    cost = line_cost((1, 13, 14, 15, 16))
    assert cost.stale(4) and cost.hoped(4) == pytest.approx(cost.seconds(1))
    b = accepting(5, cost)
    assert b.rate(0) > 0.98
    assert b.cap(0, 1, 1, 48) >= 12
    assert b._best(b.rate(0), 1, 1, 48, probe=True) <= 7  # what probing at every step picked: a short count


def test_a_count_timed_under_load_is_priced_by_the_line():
    """Counts 1 to 16 at AVX2's costs, and 5 and 9 timed MIN_SAMPLES times at 3x (a burst of load): the line is
    fitted without them and prices them, so they are tried again; a full WINDOW of slow samples is the count's own
    time (a tile boundary), and a time below the line is always the count's own."""
    cost = line_cost(range(1, 17), lambda n: avx2_seconds(n) * (3 if n in (5, 9) else 1))
    fixed, per_row = cost.line
    assert per_row == pytest.approx(0.0042) and fixed + per_row == pytest.approx(avx2_seconds(1))
    assert cost.seconds(5) == pytest.approx(avx2_seconds(5)) and cost.seconds(9) == pytest.approx(avx2_seconds(9))
    assert accepting(5, cost).cap(0, 1, 1, 48) > 8
    for _ in range(DecodeCost.WINDOW - DecodeCost.MIN_SAMPLES):
        cost.observe(9, 3 * avx2_seconds(9))
    assert cost.seconds(9) == pytest.approx(3 * avx2_seconds(9))
    for _ in range(DecodeCost.MIN_SAMPLES):
        cost.observe(20, 0.5 * avx2_seconds(20))
    assert cost.seconds(20) == pytest.approx(0.5 * avx2_seconds(20))

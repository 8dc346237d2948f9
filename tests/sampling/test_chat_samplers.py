"""The samplers a chat request adds (model-free, SmolLM2's vocabulary): the reasoning budget (common/reasoning-
budget.cpp's states: counting from the generation prompt's <think>, forcing the message and the end tag token by
token, waiting for a UTF-8 character to end, a natural end) and the tool-call grammar (lazy until <tool_call>,
then the tool's schema; one call unless parallel; "required" from the first token)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.chat_parse import chat_params
from llamactx.chat_sampling import opens_thinking, reasoning_budget, tool_grammar_sampler
from llamactx.sampling.grammar import GrammarDeadEnd
from llamactx.sampling.reasoning_budget import BudgetState, ReasoningBudgetSampler, utf8_is_complete
from llamactx.sampling.token_data import TokenDataArray
from llamactx.tool_calls import call_grammar, functions

GP_THINKING = "<|im_start|>assistant\n<think>\n"
FNS = functions([{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def vocab():
    from llamactx.embedded import smollm2_path
    from llamactx.model import Model

    return Model.load(smollm2_path(), vocab_only=True).vocab


def _tokens(vocab, text: str) -> list[int]:
    return vocab.tokenize(text, add_special=False, parse_special=True)


def _forced(sampler, vocab) -> int | None:
    """The one token `sampler` leaves possible, None when it leaves all."""
    cur = TokenDataArray.from_logits(np.zeros(vocab.n_tokens, dtype=np.float32))
    sampler.apply(cur)
    alive = np.flatnonzero(cur.logits != -np.inf)
    return None if len(alive) == vocab.n_tokens else int(alive[0]) if len(alive) == 1 else -1


def _params(gp: str = GP_THINKING):
    return chat_params("{{ '<think>' }}", gp, tools=[{"type": "function", "function": FNS[0]}])


def test_the_budget_forces_the_end_tag_after_n_thinking_tokens(vocab):
    b = reasoning_budget(vocab, _params(), 3, message=" Enough.")
    # the generation prompt opened the block; its "\n" after <think> is a thinking token already (as upstream's
    # prefill counts it)
    assert (b.state, b.remaining) == (BudgetState.COUNTING, 2)
    for t in _tokens(vocab, "one two")[:2]:
        assert _forced(b, vocab) is None
        b.accept(t)
    assert b.state == BudgetState.FORCING
    expect = _tokens(vocab, " Enough.") + _tokens(vocab, "</think>")
    got = []
    while b.state == BudgetState.FORCING:
        got.append(_forced(b, vocab))
        b.accept(got[-1])
    assert got == expect and b.state == BudgetState.DONE and _forced(b, vocab) is None


def test_a_natural_end_and_a_new_block(vocab):
    b = reasoning_budget(vocab, _params(), 50)
    for t in _tokens(vocab, "short</think>Answer"):
        b.accept(t)
    assert b.state == BudgetState.DONE
    for t in _tokens(vocab, "<think>"):  # a second block gets a fresh budget
        b.accept(t)
    assert b.state == BudgetState.COUNTING and b.remaining == 50
    c = b.clone()
    c.accept(_tokens(vocab, "x")[0])
    assert (c.remaining, b.remaining) == (49, 50)


def test_budget_zero_forces_at_once_and_minus_one_is_no_sampler(vocab):
    assert reasoning_budget(vocab, _params(), 0).state == BudgetState.FORCING
    assert reasoning_budget(vocab, _params(), -1) is None
    assert reasoning_budget(vocab, _params("<|im_start|>assistant\n"), 5).state == BudgetState.IDLE


def test_the_budget_waits_for_a_whole_utf8_character(vocab):
    partial = next(t for t in range(vocab.n_tokens) if vocab.token_to_piece(t)
                   and not utf8_is_complete(vocab.token_to_piece(t)))
    b = ReasoningBudgetSampler(vocab, [[1]], [[2]], [3, 2], 1, BudgetState.COUNTING)
    b.accept(partial)
    assert b.state == BudgetState.WAITING_UTF8 and _forced(b, vocab) is None
    b.accept(_tokens(vocab, "a")[0])
    assert b.state == BudgetState.FORCING and _forced(b, vocab) == 3
    assert utf8_is_complete("é".encode()) and not utf8_is_complete("é".encode()[:1]) and utf8_is_complete(b"")


def test_the_lazy_grammar_waits_for_the_call_then_holds_it_to_the_schema(vocab):
    g = tool_grammar_sampler(vocab, call_grammar(FNS, "generic", "auto", False))
    for t in _tokens(vocab, "Let me check, {not json} "):
        assert _forced(g, vocab) is None  # free text: nothing masked
        g.accept(t)
    for t in _tokens(vocab, '<tool_call>\n{"name": "get_weather", "arguments": {'):
        g.accept(t)
    assert not g.awaiting
    cur = TokenDataArray.from_logits(np.zeros(vocab.n_tokens, dtype=np.float32))
    g.apply(cur)
    allowed = {vocab.token_to_piece(int(t)) for t in np.flatnonzero(cur.logits != -np.inf)}
    assert b'"' in allowed and b"}" not in allowed  # "city" is required
    for t in _tokens(vocab, '"city": "Paris"}}\n</tool_call>'):
        g.accept(t)
    assert g.is_done
    with pytest.raises(GrammarDeadEnd):  # one call unless parallel_tool_calls
        g.accept(_tokens(vocab, "<")[0])


def test_parallel_calls_and_a_trigger_while_thinking(vocab):
    params = _params()
    assert opens_thinking(params)
    g = tool_grammar_sampler(vocab, call_grammar(FNS, "generic", "auto", True), params)
    for t in _tokens(vocab, "maybe <tool_call> later</think>" + CALL + "\n" + CALL):
        g.accept(t)
    assert g.is_accepting and not g.awaiting and len(g.grammar.tokens) > 20


def test_a_required_call_is_constrained_from_the_first_token(vocab):
    g = tool_grammar_sampler(vocab, call_grammar(FNS, "generic", "required", False))
    assert g.can_accept(_tokens(vocab, "<")[0]) and not g.can_accept(_tokens(vocab, "Hello")[0])
    assert call_grammar(FNS, "generic", "none", False) is None
    assert call_grammar(FNS, "mistral", "auto", False) is None  # no lazy grammar for that format here
    assert call_grammar(FNS, "mistral", "required", False).lark.startswith("%llguidance {}\nstart: call")

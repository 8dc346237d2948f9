"""The tool-call grammars of chat formats (llamactx.chat_grammar) and pattern triggers of the lazy grammar, on
SmolLM2's vocabulary: Functionary v3.2's `>>>recipient\\n` messages as common/parsers/functionary-v3-2.cpp builds
their grammar (required: `all\\n` text then a call, or calls at once; auto: lazy, switched on by a tool's name
opening a message)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactx.chat_grammar import PatternGrammar, call_grammar, grammar_sampler, uses_own_format
from llamactx.chat_parse import ChatParams
from llamactx.sampling.grammar import GrammarDeadEnd, GrammarSampler
from llamactx.sampling.lazy_grammar import LazyGrammarSampler
from llamactx.sampling.token_data import TokenDataArray
from llamactx.tool_calls import functions

FNS = functions([{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                 {"type": "function", "function": {"name": "get_time", "parameters": {
                     "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}])
FUNCTIONARY = ChatParams("functionary-v3.2", tools=tuple({"type": "function", "function": f} for f in FNS))


@pytest.fixture(scope="module")
def vocab():
    from llamactx.embedded import smollm2_path
    from llamactx.model import Model

    return Model.load(smollm2_path(), vocab_only=True).vocab


def _tokens(vocab, text: str) -> list[int]:
    return vocab.tokenize(text, add_special=False, parse_special=True)


def _allowed(sampler, vocab) -> set[bytes]:
    cur = TokenDataArray.from_logits(np.zeros(vocab.n_tokens, dtype=np.float32))
    sampler.apply(cur)
    return {vocab.token_to_piece(int(t)) for t in np.flatnonzero(cur.logits != -np.inf)}


def _all_allowed(sampler, vocab) -> bool:
    cur = TokenDataArray.from_logits(np.zeros(vocab.n_tokens, dtype=np.float32))
    sampler.apply(cur)
    return bool(np.all(cur.logits != -np.inf))


def _feed(sampler, vocab, text: str) -> None:
    for t in _tokens(vocab, text):
        sampler.accept(t)


def test_functionary_required_is_a_call_or_all_then_a_call(vocab):
    g = grammar_sampler(vocab, call_grammar(FNS, FUNCTIONARY, "required", False), FUNCTIONARY)
    first = _allowed(g, vocab)
    assert {b"get", b"all"} <= first and b"Hello" not in first and b">>>" not in first
    _feed(g, vocab, 'get_time\n{')
    assert b'"' in _allowed(g, vocab) and b"}" not in _allowed(g, vocab)  # "tz" is required
    _feed(g, vocab, '"tz": "UTC"}')
    assert g.is_accepting
    g = grammar_sampler(vocab, call_grammar(FNS, FUNCTIONARY, "required", False), FUNCTIONARY)
    _feed(g, vocab, "all\nLet me look that up. get_weather\n{\n")
    assert not g.is_accepting  # the text must end in a call
    _feed(g, vocab, '  "city": "Paris"\n}')
    assert g.is_accepting
    with pytest.raises(GrammarDeadEnd):  # llama.cpp's until(">>>"): no second message in the text
        _feed(g, vocab, "all\nok >>>")


def test_a_named_function_allows_that_one_only(vocab):
    named = {"type": "function", "function": {"name": "get_time"}}
    g = grammar_sampler(vocab, call_grammar(FNS, FUNCTIONARY, named, False), FUNCTIONARY)
    _feed(g, vocab, "get_")
    assert b"time" in _allowed(g, vocab) and b"weather" not in _allowed(g, vocab)
    assert uses_own_format(FUNCTIONARY, named, FNS)
    assert not uses_own_format(ChatParams("mistral"), "required", FNS)  # the bare JSON call, parsed as generic


def test_functionary_auto_waits_for_a_tool_opening_a_message(vocab):
    grammar = call_grammar(FNS, FUNCTIONARY, "auto", False)
    assert isinstance(grammar, PatternGrammar)
    g = grammar_sampler(vocab, grammar, FUNCTIONARY)
    _feed(g, vocab, "all\nI will call get_weather\nnow. ")  # a name inside the text is no message to it
    assert g.awaiting and _all_allowed(g, vocab)
    _feed(g, vocab, ">>>get_weather\n")
    assert not g.awaiting and _allowed(g, vocab) == {b"{", b"{\""}
    g = grammar_sampler(vocab, grammar, FUNCTIONARY)
    _feed(g, vocab, "get_time\n")  # a call that opens the reply
    assert not g.awaiting and _allowed(g, vocab) == {b"{", b"{\""}
    _feed(g, vocab, '{"tz": "UTC"}')
    assert g.is_accepting


def test_a_pattern_hands_on_its_first_group_and_clones_keep_it(vocab):
    grammar = GrammarSampler.from_lark(vocab, '%llguidance {}\nstart: "ok" /[0-9]+/\n')
    lazy = LazyGrammarSampler(grammar, (), patterns=(r"@@(ok)",))
    copy = lazy.clone()
    _feed(lazy, vocab, "say ok then @@ok1")  # "@@" stays out of what the grammar reads
    assert not lazy.awaiting and lazy.is_accepting
    assert copy.awaiting and copy.patterns == lazy.patterns
    with pytest.raises(ValueError, match="trigger word or pattern"):
        LazyGrammarSampler(grammar, ())


# format -> a call as its grammar writes it, and its marker (the lazy trigger)
MARKED = {
    "functionary-v3.1": ('<function=get_weather>{"city": "Paris"}</function>', "<function="),
    "nemotron-v2": ('<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>', "<TOOLCALL>"),
    "apriel": ('<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>', "<tool_calls>"),
    "granite": ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "<|tool_call|>"),
}


@pytest.mark.parametrize("fmt", sorted(MARKED))
def test_marked_formats_are_lazy_on_their_marker_and_parse_as_calls(vocab, fmt):
    from llamactx.chat_parse import parse

    call, marker = MARKED[fmt]
    params = ChatParams(fmt, tools=FUNCTIONARY.tools)
    grammar = call_grammar(FNS, params, "auto", False)
    assert grammar.triggers == (marker,) and uses_own_format(params, "required", FNS)
    g = grammar_sampler(vocab, grammar, params)
    _feed(g, vocab, "Let me see. ")
    assert g.awaiting and _all_allowed(g, vocab)
    _feed(g, vocab, call[:call.index('"Paris')])
    assert not g.awaiting and b'"' in _allowed(g, vocab)
    with pytest.raises(GrammarDeadEnd):  # the tool's schema: "city" is a string
        g.clone().accept(_tokens(vocab, "1")[0])
    _feed(g, vocab, call[call.index('"Paris'):])
    assert g.is_accepting
    assert [(c.name, c.arguments) for c in parse(params, "Let me see. " + call).tool_calls] == [
        ("get_weather", '{"city": "Paris"}')]
    required = grammar_sampler(vocab, call_grammar(FNS, params, "required", True), params)
    assert not required.can_accept(_tokens(vocab, "Hello")[0])  # a call from the first token
    _feed(required, vocab, call.replace("get_weather", "get_time").replace("city", "tz"))
    assert required.is_accepting

"""Tool calls streamed while the model writes them (model-free): the name first with empty arguments, then the
arguments in pieces, which add up to the final parse's; a call whose JSON breaks stops growing and ends as
content (llama-server's partial parse and common_chat_msg_diff)."""

from __future__ import annotations

import pytest

from llamactx.chat_parse import ChatMsg, chat_params, diffs, parse, parse_partial
from llamactx.chat_parse.json_prefix import scan

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
HERMES_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<tool_call>{% endif %}"


def _stream(params, text: str) -> list:
    """Every delta of `text` parsed one character at a time, then the final parse's."""
    out, prev = [], ChatMsg()
    for n in range(1, len(text) + 1):
        cur = parse_partial(params, text[:n])
        out += [(n, d) for d in diffs(prev, cur)]
        prev = cur
    return out + [(len(text) + 1, d) for d in diffs(prev, parse(params, text))]


@pytest.mark.parametrize("parallel", [False, True])
def test_a_call_streams_its_name_then_its_arguments(parallel):
    params = chat_params(HERMES_TEMPLATE, "", tools=TOOLS, parallel_tool_calls=parallel)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris", "days": [1, 2]}}\n</tool_call>'
    text = "Checking.\n" + call + ("\n" + call.replace("Paris", "Rome") if parallel else "")
    deltas = _stream(params, text)
    calls = [(n, d) for n, d in deltas if d.tool_index >= 0]
    names = [(n, d) for n, d in calls if d.name]
    assert [(d.tool_index, d.name, d.arguments_delta) for _, d in names] == [
        (i, "get_weather", "") for i in range(2 if parallel else 1)]
    first_args_end = text.index("]}}") + 2
    assert names[0][0] < text.index('"city"') < first_args_end  # the name went out before the arguments
    pieces = [d.arguments_delta for _, d in calls if d.tool_index == 0]
    assert len(pieces) > 10 and "".join(pieces) == '{"city":"Paris", "days": [1, 2]}'  # as written
    final = parse(params, text)
    for i, c in enumerate(final.tool_calls):
        assert "".join(d.arguments_delta for _, d in calls if d.tool_index == i) == c.arguments
    assert "".join(d.content_delta for _, d in deltas) == final.content


def test_broken_json_stops_the_call_and_ends_as_content():
    params = chat_params(HERMES_TEMPLATE, "", tools=TOOLS)
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    deltas = _stream(params, text)
    args = "".join(d.arguments_delta for _, d in deltas if d.tool_index == 0)
    assert args == '{"city":' and parse(params, text).content == text
    assert "".join(d.content_delta for _, d in deltas) == text


def test_a_bare_json_call_streams_too():
    params = chat_params("{{ messages }}", "", tools=TOOLS)  # a template without tools: llamactx's generic format
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    deltas = _stream(params, text)
    assert [d.name for _, d in deltas if d.name] == ["get_weather"]
    assert "".join(d.arguments_delta for _, d in deltas) == '{"city": "Paris"}' == parse(params, text).tool_calls[
        0].arguments
    assert not any(d.content_delta for _, d in deltas)


@pytest.mark.parametrize(("text", "expect"), [
    ('{"a": 1}', (8, True)), ('{"a": [1, {"b": null}], "c": "x\\"y"} tail', (36, True)), ("{}", (2, True)),
    ('{"a": tru', (9, False)), ('{"a": 1.', (8, False)), ('{"a": -', (7, False)), ('"ab', (3, False)),
    ('{"a": </tool', None), ('{"a" 1}', None), ('{"a": 01}', None), ('{"a": "x\ny"}', None), ('{"a": 1]', None),
])
def test_json_prefix_scan(text, expect):
    assert scan(text) == expect


def test_every_prefix_of_a_json_value_is_a_prefix():
    doc = '{"city": "Paris", "n": [1, 2.5e3, true, null, {"x": "\\u00e9"}], "e": {}, "f": false}'
    for k in range(len(doc)):
        assert scan(doc[:k]) == (k, False), doc[:k]
    assert scan(doc) == (len(doc), True)

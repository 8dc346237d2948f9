"""Tool calls (model-free): parsing the Hermes and generic JSON formats, schemas for required calls, tools
described to a template that does not take them."""

from __future__ import annotations

import json

import pytest

from llamactx.tool_calls import ToolCallError, call_schema, functions, parse, prepare, required_function

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def test_hermes_blocks_become_calls_and_the_rest_content():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse(text)
    assert content == "Let me check." and [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"} and calls[0].id.startswith("call_")
    _, two = parse('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
                   '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2}"}</tool_call>')
    assert [json.loads(c.arguments)["a"] for c in two] == [1, 2]


@pytest.mark.parametrize("text, names", [
    ('{"name": "add", "arguments": {"a": 1}}', ["add"]),
    ('{"tool_calls": [{"name": "add", "arguments": {}}, {"name": "get_weather", "arguments": {}}]}',
     ["add", "get_weather"]),
    ('{"tool_call": {"name": "add", "arguments": {}}}', ["add"]),
    ('{"function": {"name": "add", "arguments": "{}"}}', ["add"]),
])
def test_generic_json_calls(text, names):
    content, calls = parse(text)
    assert content is None and [c.name for c in calls] == names


def test_plain_text_and_generic_responses_are_content():
    assert parse("Paris is the capital.") == ("Paris is the capital.", [])
    assert parse('{"response": "Hello"}') == ("Hello", [])
    assert parse('{"a": 1}') == ('{"a": 1}', [])
    assert parse("<tool_call>not json</tool_call>")[1] == []


def test_required_calls_and_their_schema():
    fns = functions(TOOLS)
    assert required_function("auto", fns) is None and required_function("none", fns) is None
    assert required_function("required", fns) == fns
    one = required_function({"type": "function", "function": {"name": "add"}}, fns)
    assert [f["name"] for f in one] == ["add"]
    assert call_schema(one)["properties"]["name"] == {"const": "add"}
    assert len(call_schema(fns)["anyOf"]) == 2
    with pytest.raises(ToolCallError, match="'nope' is not one of the tools"):
        required_function({"type": "function", "function": {"name": "nope"}}, fns)
    with pytest.raises(ToolCallError, match=r"tools\[0\].function.name"):
        functions([{"type": "function", "function": {}}])


def test_a_template_without_tools_gets_them_in_a_system_message():
    fns = functions(TOOLS)
    msgs, pass_tools = prepare("{{ messages }}", [{"role": "user", "content": "hi"}], fns)
    assert not pass_tools and msgs[0]["role"] == "system" and "get_weather" in msgs[0]["content"]
    msgs, pass_tools = prepare("{% if tools %}{{ tools }}{% endif %}", [{"role": "user", "content": "hi"}], fns)
    assert pass_tools and len(msgs) == 1

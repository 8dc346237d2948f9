"""Tool calls streamed while the model writes them (model-free): the name first with the arguments so far ("{"
while none are written: common_chat_peg_mapper's default), then the arguments in pieces, which add up to the final
parse's; a call whose JSON breaks stops growing and ends as content (llama-server's partial parse and
common_chat_msg_diff)."""

from __future__ import annotations

import pytest

from llamactx.chat_parse import ChatMsg, ChatParams, chat_params, diffs, parse, parse_partial
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
        (i, "get_weather", "{") for i in range(2 if parallel else 1)]
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
    assert [(d.name, d.arguments_delta) for _, d in deltas if d.name] == [("get_weather", "{")]
    assert "".join(d.arguments_delta for _, d in deltas) == '{"city": "Paris"}' == parse(params, text).tool_calls[
        0].arguments
    assert not any(d.content_delta for _, d in deltas)


FUNCTIONARY = "{{ messages }}{% if tools %}>>>all{% endif %}>>>${recipient}"
TWO = [*TOOLS, {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("prose", ["", "all\nLet me check.\n"])
def test_functionary_v3_2_streams_a_message_to_a_tool(prose):
    params = chat_params(FUNCTIONARY, ">>>", tools=TWO)
    assert params.format == "functionary-v3.2"
    args = '{\n  "city": "Paris"\n}'
    text = prose + (">>>" if prose else "") + "get_weather\n" + args
    deltas = _stream(params, text)
    named = [(n, d) for n, d in deltas if d.name]
    assert [(d.name, d.arguments_delta) for _, d in named] == [("get_weather", "{")]
    assert named[0][0] == text.index("\n{") + 1  # once the recipient line is complete: "{" before it is written
    assert "".join(d.arguments_delta for _, d in deltas) == args == parse(params, text).tool_calls[0].arguments
    assert "".join(d.content_delta for _, d in deltas) == parse(params, text).content == prose[len("all\n"):]


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


ARGS = '{"city":"Paris", "days": [1, 2.50], "note": "caf\\u00e9 \\"x\\""}'
# format -> what a model of that family writes to call get_weather(ARGS) (the shapes of tests/test-chat.cpp)
FAMILIES = {
    "hermes": 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": @A@}\n</tool_call>',
    "functionary-v3.1": "Checking.<function=get_weather>@A@</function>",
    "functionary-v3.2": "get_weather\n@A@",
    "llama3": '<|python_tag|>{"type": "function", "name": "get_weather", "parameters": @A@}',
    "mistral": "Checking.[TOOL_CALLS]get_weather[CALL_ID]123456789[ARGS]@A@",
    "deepseek": "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                "@A@\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "gpt-oss": "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>@A@",
    "firefunction": ' functools[{"name": "get_weather", "arguments": @A@}]',
    "nemotron-v2": '<TOOLCALL>[{"name": "get_weather", "arguments": @A@}]</TOOLCALL>',
    "apriel": '<tool_calls>[{"name": "get_weather", "arguments": @A@}]</tool_calls>',
    "granite": '<|tool_call|>[{"name": "get_weather", "arguments": @A@}]',
    "command-r-plus": 'Action:\n```json\n[{"tool_name": "get_weather", "parameters": @A@}]\n```',
    "apertus": '<|tools_prefix|>[{"get_weather": @A@}]<|tools_suffix|>',
    "kimi-k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
               "@A@<|tool_call_end|><|tool_calls_section_end|>",
}
MORE = {  # other shapes of the same families
    "mistral-nemo": ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": @A@, "id": "123456789"}]'),
    "deepseek-v3.1": ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>@A@"
                                  "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "devstral": ("mistral", "[TOOL_CALLS]get_weather[ARGS]@A@"),
}


@pytest.mark.parametrize("case", [*FAMILIES, *MORE])
def test_every_family_streams_a_call_while_it_is_written(case):
    """The name goes out once, with the arguments so far, long before the call ends; the arguments then grow
    piece by piece and add up to the final parse's (as written, or as the parser re-serialises them)."""
    fmt, shape = MORE.get(case, (case, FAMILIES.get(case)))
    params = ChatParams(fmt, generation_prompt="<|start|>assistant" if fmt == "gpt-oss" else "",
                        tools=tuple(TWO))
    text = shape.replace("@A@", ARGS)
    final = parse(params, text)
    assert [c.name for c in final.tool_calls] == ["get_weather"], final
    deltas = _stream(params, text)
    named = [(n, d) for n, d in deltas if d.name]
    assert [d.name for _, d in named] == ["get_weather"] and named[0][1].arguments_delta.startswith("{")
    assert named[0][0] < text.index("Paris")
    pieces = [d.arguments_delta for _, d in deltas if d.tool_index == 0 and d.arguments_delta]
    assert len(pieces) > 10 and "".join(pieces) == final.tool_calls[0].arguments
    assert "".join(d.content_delta for _, d in deltas) == final.content


@pytest.mark.parametrize("fmt", ["hermes", "nemotron-v2", "llama3", "mistral"])
def test_parallel_calls_stream_one_after_the_other(fmt):
    one = {"hermes": '<tool_call>\n{"name": "NAME", "arguments": @A@}\n</tool_call>',
           "nemotron-v2": '{"name": "NAME", "arguments": @A@}', "llama3": '{"name": "NAME", "parameters": @A@}',
           "mistral": "[TOOL_CALLS]NAME[ARGS]@A@"}[fmt]
    sep, wrap = {"nemotron-v2": (", ", "<TOOLCALL>[{}]</TOOLCALL>"), "llama3": ("; ", "{}")}.get(fmt, ("\n", "{}"))
    calls = [one.replace("NAME", n).replace("@A@", a) for n, a in (("get_weather", ARGS), ("get_time", "{}"))]
    text = wrap.replace("{}", sep.join(calls), 1) if wrap != "{}" else sep.join(calls)
    params = ChatParams(fmt, tools=tuple(TWO), parallel_tool_calls=True)
    final = parse(params, text)
    assert [c.name for c in final.tool_calls] == ["get_weather", "get_time"]
    deltas = _stream(params, text)
    assert [(d.tool_index, d.name) for _, d in deltas if d.name] == [(0, "get_weather"), (1, "get_time")]
    for i, call in enumerate(final.tool_calls):
        assert "".join(d.arguments_delta for _, d in deltas if d.tool_index == i) == call.arguments


TYPED = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "days": {"type": "integer"}, "city": {"type": "string"}}}}}]


@pytest.mark.parametrize(("fmt", "text"), [
    ("qwen3-coder", "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n"
                    "<parameter=city>\nParis \"is\"\nnice\n</parameter>\n</function>\n</tool_call>"),
    ("glm", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>city</arg_key>\n"
            "<arg_value>Paris \"is\"\nnice</arg_value>\n</tool_call>"),
])
def test_tagged_values_stream_as_the_json_the_parser_builds(fmt, text):
    """XML / tagged arguments: a typed value once whole, a string value while written (its end tag held back),
    all of it the beginning of the final call's JSON."""
    params = ChatParams(fmt, tools=tuple(TYPED))
    final = parse(params, text)
    assert final.tool_calls[0].arguments == '{"days": 3, "city": "Paris \\"is\\"\\nnice"}'
    deltas = _stream(params, text)
    pieces = [d.arguments_delta for _, d in deltas if d.tool_index == 0]
    assert pieces[:3] == ["{", '"days": 3', ', "city": "'] and len(pieces) > 12
    assert "".join(pieces) == final.tool_calls[0].arguments
    assert [d.name for _, d in deltas if d.name] == ["get_weather"]
    assert "".join(d.content_delta for _, d in deltas) == final.content

"""llama.cpp's own template-output parse cases (tests/test-chat.cpp at 0c1e570, test_template_output_peg_parsers)
run through llamactx.chat_parse: for every case of every template, the same content, reasoning and tool calls
(compared as llama.cpp's assert_msg_equals compares them: text stripped, arguments as re-serialized JSON, ids
where the case names one), both parsed whole and summed from the deltas of a stream, as test_peg_parser does.

Continuations of a prefilled message splice it back into the generation prompt, response-format cases parse with
the json_schema flag, and a partial case is checked on what its stream sends. A case the reader cannot evaluate
fails test_the_cases_are_read (none at 0c1e570); a case llamactx parses differently would be a strict xfail with
its reason (none left).
"""

from __future__ import annotations

import json

import pytest

from llamactx.chat_parse import (
    ChatMsg,
    ToolCall,
    chat_params,
    detect_format,
    diffs,
    generation_prompt,
    parse,
    parse_partial,
)
from llamactx.chat_template import ChatTemplate
from tests.chat_parse_cases import load_cases
from tests.conftest import LLAMACPP_SRC


def _scope(case) -> str:
    """Why a case is not run here ("" when it is): only a chain the case reader cannot evaluate."""
    return f"case not read: {case.unsupported}" if case.unsupported else ""


# cases whose template llamactx's jinja does not render yet (llamactx/chat_template.py): the generation prompt,
# and so the thinking prefix, cannot be computed
RENDER_GAPS: dict[str, str] = {}
# cases llamactx parses differently, with the reason
KNOWN_GAPS: dict[str, str] = {}

ALL_CASES = load_cases(LLAMACPP_SRC) if LLAMACPP_SRC.is_dir() else []


def _cases(gaps: dict[str, str]) -> list:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=gaps[c.id])]
                         if c.id in gaps else []) for c in ALL_CASES if not _scope(c)]


CASES = _cases({**RENDER_GAPS, **KNOWN_GAPS})
STREAM_CASES = _cases(RENDER_GAPS)
_TEMPLATES: dict[str, ChatTemplate] = {}


def _messages(case) -> list[dict]:
    """The case's messages as llama.cpp hands them to the template (common_chat_msg::to_json_oaicompat, then
    func_args_not_string: a call's arguments as an object)."""
    out = []
    for m in case.messages or [{"role": "user", "content": "Hey there!"}]:
        msg = {"role": m["role"], "content": m.get("content", "")}
        if m.get("reasoning_content"):
            msg["reasoning_content"] = m["reasoning_content"]
        if m.get("tool_calls"):
            msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": json.loads(c["arguments"] or "{}")}} for c in m["tool_calls"]]
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _template(path: str) -> ChatTemplate:
    if path not in _TEMPLATES:
        source = (LLAMACPP_SRC / path).read_text(encoding="utf-8")
        _TEMPLATES[path] = ChatTemplate(source, "<s>", "</s>")
    return _TEMPLATES[path]


def _normal(args: str) -> object:
    """renormalize_json: arguments compared as JSON, partial (unparseable) ones all alike."""
    try:
        return json.loads(args)
    except json.JSONDecodeError:
        return ""


def _assert_msg_equals(expect: dict, msg) -> None:
    """test-chat.cpp assert_msg_equals(expected, actual, ignore_whitespace_differences = true)."""
    assert msg.content.strip() == expect["content"].strip()
    assert msg.reasoning_content.strip() == expect["reasoning_content"].strip()
    got = [(c.name, _normal(c.arguments), c.id) for c in msg.tool_calls]
    assert got == [(c["name"], _normal(c["arguments"]), c["id"]) for c in expect["tool_calls"]]


def test_the_cases_are_read(llamacpp_src):
    """The extractor reads test-chat.cpp's chains (a change upstream that breaks it shows here)."""
    assert len(ALL_CASES) >= 415
    assert [(c.id, c.unsupported) for c in ALL_CASES if c.unsupported] == []
    assert len(CASES) == len(ALL_CASES)


@pytest.mark.parametrize("case", CASES)
def test_llama_cpp_parse_case(llamacpp_src, case):
    params = _params(case)
    if case.is_partial:  # a reply cut short: what a stream of it sends (test_peg_parser's msg_accum)
        _assert_msg_equals(case.expect, _streamed(params, case.input, final=False))
    else:
        _assert_msg_equals(case.expect, parse(params, case.input))


@pytest.mark.parametrize(("stem", "fmt"), [
    ("Qwen3.5-4B", "qwen3-coder"), ("Qwen-Qwen3-0.6B", "hermes"), ("openai-gpt-oss-120b", "gpt-oss"),
    ("mistralai-Ministral-3-14B-Reasoning-2512", "mistral"), ("deepseek-ai-DeepSeek-V3.1", "deepseek"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"), ("google-gemma-2-2b-it", "generic"),
    ("google-gemma-4-31B-it", "gemma4"), ("MiniMax-M3", "minimax-m3"), ("MiniMax-M2", "minimax-m2"),
    ("ByteDance-Seed-OSS", "seed-oss"), ("openbmb-MiniCPM5-1B", "minicpm5"), ("deepseek-ai-DeepSeek-V3.2",
    "deepseek-v3.2"), ("deepseek-ai-DeepSeek-V4", "deepseek-v4"), ("inclusionai-ling-3.0-flash", "ling3"),
    ("Cohere2MoE", "cohere2moe"), ("Kimi-K3", "kimi-k3"), ("GigaChat3-10B-A1.8B", "gigachat3"),
    ("GigaChat3.1-10B-A1.8B", "gigachat3.1"), ("muse-glimmer", "muse-glimmer"), ("Reka-Edge", "hermes"),
    ("Spark2.5", "glm"), ("Apriel-1.6-15b-Thinker-fixed", "apriel"),
])
def test_format_detected_from_template_text(llamacpp_src, stem, fmt):
    assert detect_format((llamacpp_src / "models" / "templates" / f"{stem}.jinja").read_text()) == fmt


_CONTINUATION = {"COMMON_CHAT_CONTINUATION_CONTENT": "content",
                 "COMMON_CHAT_CONTINUATION_REASONING": "reasoning_content"}


def _params(case):
    """The case's ChatParams as common_chat_templates_apply builds them: a continued message is left out of the
    rendering and spliced back into the generation prompt."""
    template = _template(case.template)
    messages = _messages(case)
    continued = messages.pop() if case.continuation else None
    gp = generation_prompt(template, messages, case.tools or None, {"enable_thinking": case.enable_thinking})
    return chat_params(template.source, gp, tools=case.tools, reasoning_format=case.reasoning_format,
                       enable_thinking=case.enable_thinking, parallel_tool_calls=case.parallel_tool_calls,
                       tool_choice=case.tool_choice, continue_final_message=_CONTINUATION.get(case.continuation, ""),
                       continue_msg=continued, response_format=bool(case.json_schema))


@pytest.mark.parametrize("case", STREAM_CASES)
def test_streamed_deltas_add_up_to_the_message(llamacpp_src, case):
    """As test_peg_parser does: every prefix of the input parsed as a partial reply, the diffs between
    consecutive parses accumulated, then the final parse's: the sum is the whole message (nothing sent twice,
    nothing sent that was later taken back)."""
    params = _params(case)
    final = parse_partial(params, case.input) if case.is_partial else parse(params, case.input)
    acc = _streamed(params, case.input, final=not case.is_partial)
    assert (acc.content, acc.reasoning_content) == (final.content, final.reasoning_content)
    assert [(c.name, c.arguments) for c in acc.tool_calls] == [(c.name, c.arguments) for c in final.tool_calls]


def _streamed(params, text: str, final: bool) -> ChatMsg:
    """The sum of the diffs between the partial parses of every prefix of `text` (and the final parse)."""
    acc = ChatMsg()
    prev = ChatMsg()
    for n in range(1, len(text) + 1):
        cur = parse_partial(params, text[:n])
        _accumulate(acc, diffs(prev, cur))
        prev = cur
    if final:
        _accumulate(acc, diffs(prev, parse(params, text)))
    return acc


def _accumulate(acc: ChatMsg, deltas) -> None:
    for d in deltas:
        acc.reasoning_content += d.reasoning_content_delta
        acc.content += d.content_delta
        if d.tool_index >= 0:
            while len(acc.tool_calls) <= d.tool_index:
                acc.tool_calls.append(ToolCall("", ""))
            call = acc.tool_calls[d.tool_index]
            call.name = d.name or call.name
            call.id = d.id or call.id
            call.arguments += d.arguments_delta


def test_chat_template_parse_output_is_the_openai_message(llamacpp_src):
    """The public entry: ChatTemplate(source).parse_output(...) on Qwen3.5's template, whose generation prompt
    opens the thinking block, so the text starts inside it."""
    source = (llamacpp_src / "models" / "templates" / "Qwen3.5-4B.jinja").read_text()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    text = ("Paris, then.\n</think>\n\nChecking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
            "</parameter>\n</function>\n</tool_call>")
    out = ChatTemplate(source).parse_output(text, messages=[{"role": "user", "content": "Weather?"}], tools=tools)
    call = out["tool_calls"][0]
    assert (out["role"], out["content"].strip(), out["reasoning_content"]) == ("assistant", "Checking.", "Paris, then.")
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    none = ChatTemplate(source).parse_output(text, messages=[{"role": "user", "content": "Weather?"}], tools=tools,
                                             reasoning_format="none")
    assert none["content"].startswith("<think>\nParis, then.\n</think>") and "reasoning_content" not in none
    with pytest.raises(ValueError, match="deepseek-legacy"):
        ChatTemplate(source).parse_output("x", messages=[{"role": "user", "content": "x"}], reasoning_format="r1")


def test_malformed_tool_json_is_content_never_an_error(llamacpp_src):
    source = (llamacpp_src / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    text = '<tool_call>\n{"name": "f", "arguments": {"a": </tool_call>'
    out = ChatTemplate(source).parse_output(text, messages=[{"role": "user", "content": "x"}], tools=tools,
                                            enable_thinking=False)
    assert out["content"] == text and "tool_calls" not in out

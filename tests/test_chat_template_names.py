"""Template names: llama.cpp's built-in names render llama_chat_apply_template's prompts, its detection picks the
same style from a Jinja source, llama-cpp-python's chat_format names render its prompts, and an unknown name is an
error naming the known ones (never a prompt).

References: llama.cpp 0c1e570's own test cases (tests/test-chat-template.cpp, read from the source tree at test
time) and the native library's / llama-cpp-python's outputs recorded in tests/data/chat_templates/ by
make_chat_template_prompts.py.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from llamactx.chat_builtin import LLM_CHAT_TEMPLATES, apply_builtin
from llamactx.chat_detect import detect_builtin
from llamactx.chat_format import CHAT_FORMATS
from llamactx.chat_template import ChatTemplate, ChatTemplateError, is_template_name, known_template_names

DATA = Path(__file__).parent / "data" / "chat_templates"
BUILTIN = json.loads((DATA / "builtin_prompts.json").read_text(encoding="utf-8"))
DETECTED = json.loads((DATA / "detected_prompts.json").read_text(encoding="utf-8"))
FORMATS = json.loads((DATA / "chat_format_prompts.json").read_text(encoding="utf-8"))
CONVERSATIONS = BUILTIN["conversations"]


def _messages(conversation: str) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in CONVERSATIONS[conversation]]


# -- llama.cpp's names -------------------------------------------------------------------------------------------

def test_the_names_are_llama_cpps(llamacpp_src):
    """The same 54 names as llama-chat.cpp's LLM_CHAT_TEMPLATES (read from the source) and as the native
    library's llama_chat_builtin_templates (recorded), in its order."""
    source = (llamacpp_src / "src" / "llama-chat.cpp").read_text(encoding="utf-8")
    table = source[source.index("LLM_CHAT_TEMPLATES = {"):source.index("};", source.index("LLM_CHAT_TEMPLATES = {"))]
    names = re.findall(r'\{ "([^"]+)",\s+LLM_CHAT_TEMPLATE_\w+\s*\}', table)
    assert len(names) == 54 and sorted(names) == list(LLM_CHAT_TEMPLATES) == BUILTIN["names"]


@pytest.mark.parametrize("name", BUILTIN["names"])
def test_every_builtin_name_renders_llama_cpps_prompt(name):
    """ChatTemplate(name) gives llama_chat_apply_template(name, ...)'s prompt for every recorded conversation,
    with and without the generation prompt."""
    cases = [c for c in BUILTIN["cases"] if c["name"] == name]
    assert len(cases) == 2 * len(CONVERSATIONS)
    template = ChatTemplate(name)
    assert template.name == name and template.is_fallback
    for case in cases:
        prompt = template.render(_messages(case["conversation"]), add_generation_prompt=case["add_ass"])
        assert prompt == case["prompt"], (case["conversation"], case["add_ass"])


def test_the_issues_names_no_longer_render_themselves():
    """The five names of issue #43: each renders the conversation, in its own format."""
    messages = _messages("no_system")
    expected_start = {"llama2": "[INST]  Hi\n [/INST]", "phi3": "<|user|>\n Hi\n<|end|>",
                      "zephyr": "<|user|>\n Hi\n<|endoftext|>", "mistral-v7": "[INST]  Hi\n[/INST]",
                      "deepseek3": "<｜User｜> Hi\n<｜Assistant｜>"}
    for name, start in expected_start.items():
        prompt = ChatTemplate(name).render(messages)
        assert prompt.startswith(start) and "What is 2+2?" in prompt, name


def _c_literals(text: str, i: int) -> tuple[str, int]:
    """The C++ string literal(s) starting at text[i] (optionally inside U8C(...), adjacent ones joined)."""
    i = len(text) - len(text[i:].lstrip())
    wrapped = text.startswith("U8C(", i)
    i += 4 if wrapped else 0
    parts = []
    while (m := re.compile(r'\s*"((?:[^"\\]|\\.)*)"', re.S).match(text, i)):
        parts.append(ast.literal_eval('"' + m.group(1) + '"'))  # the escapes used there are Python's too
        i = m.end()
    return "".join(parts), i


def _test_chat_template_cases(cpp: str) -> tuple[list[tuple[str, str]], list[dict]]:
    """tests/test-chat-template.cpp's conversation and its TestCase list (name, template_str, expected_output,
    extra_conversation)."""
    conv_src = cpp[cpp.index("std::vector<llama_chat_message> conversation {"):]
    conv_src = conv_src[:conv_src.index("};")]
    pair = r'\{\s*("(?:[^"\\]|\\.)*")\s*,\s*("(?:[^"\\]|\\.)*")\s*\}'
    conversation = [(ast.literal_eval(r), ast.literal_eval(c)) for r, c in re.findall(pair, conv_src)]
    body = cpp[cpp.index("std::vector<TestCase> test_cases {"):]
    body = body[:body.index("\n    };")]
    cases = []
    for block in re.split(r"\n        \{\n", body)[1:]:
        case = {}
        for field in ("name", "template_str", "expected_output"):
            m = re.search(rf"/\* \.{field}=? \*/", block)
            case[field] = _c_literals(block, m.end())[0]
        extra = re.search(r"/\* \.extra_conversation= \*/(.*)", block, re.S)
        case["extra"] = ([(ast.literal_eval(r), ast.literal_eval(c)) for r, c in re.findall(pair, extra.group(1))]
                         if extra else [])
        cases.append(case)
    return conversation, cases


def test_llama_cpps_own_cases_detect_and_render(llamacpp_src):
    """test-chat-template.cpp's automated cases: llama_chat_apply_template(template_str) detects the style from
    the Jinja source and renders it; so must detect_builtin + apply_builtin (36 cases, about 30 styles)."""
    cpp = (llamacpp_src / "tests" / "test-chat-template.cpp").read_text(encoding="utf-8")
    conversation, cases = _test_chat_template_cases(cpp)
    assert len(conversation) == 6 and conversation[4] == ("assistant", "   I am an assistant   ")
    assert len(cases) == 36 and sum(bool(c["extra"]) for c in cases) == 3
    styles = set()
    for case in cases:
        style = detect_builtin(case["template_str"])
        assert style is not None, case["name"]
        styles.add(style)
        prompt = apply_builtin(style, conversation + case["extra"], True)
        assert prompt == case["expected_output"], case["name"]
    assert len(styles) >= 28
    assert detect_builtin("INVALID TEMPLATE") is None  # the test's invalid template: -1


def test_detection_on_llama_cpps_template_files(llamacpp_src):
    """Every models/templates/*.jinja of llama.cpp's tree: the style detect_builtin finds renders what the native
    llama_chat_apply_template(source) rendered, and no style where it returned -1."""
    prompts = DETECTED["prompts"]
    files = sorted((llamacpp_src / "models" / "templates").glob("*.jinja"))
    assert [p.name for p in files] == sorted(prompts) and len(files) >= 60
    messages = [tuple(m) for m in CONVERSATIONS["default"]]
    for path in files:
        style = detect_builtin(path.read_text(encoding="utf-8"))
        got = None if style is None else apply_builtin(style, messages, True)
        assert got == prompts[path.name], path.name
    assert sum(p is None for p in prompts.values()) < len(prompts) // 2


def test_a_jinja_source_is_rendered_as_jinja_and_named_by_its_style():
    source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    template = ChatTemplate(source)
    assert not template.is_fallback and template.name == "chatml" and template.source == source
    assert ChatTemplate("{{ 'llama2' }}").render(_messages("no_system")) == "llama2"
    assert ChatTemplate("{{ messages[0].content }}").name == "jinja"
    assert is_template_name("llama2") and is_template_name("a long text without any template syntax")
    assert not is_template_name("{{ x }}") and not is_template_name("{% if 1 %}{% endif %}")


# -- llama-cpp-python's chat_format names ------------------------------------------------------------------------

def test_chat_format_names_are_llama_cpp_pythons(llamacpp_src):
    source = (llamacpp_src.parents[1] / "llama_cpp" / "llama_chat_format.py").read_text(encoding="utf-8")
    registered = re.findall(r'@register_chat_format\("([^"]+)"\)', source)
    assert list(CHAT_FORMATS) == registered and len(registered) == 23
    assert sorted({c["name"] for c in FORMATS["cases"]}) == sorted(registered)


@pytest.mark.parametrize("name", list(CHAT_FORMATS))
def test_every_chat_format_renders_llama_cpp_pythons_prompt(name):
    """Llama(chat_format=name) (ChatTemplate.from_chat_format) gives llama-cpp-python's formatter's prompt and stop
    string; a name llama.cpp has no built-in of renders the same as a bare ChatTemplate(name)."""
    cases = [c for c in FORMATS["cases"] if c["name"] == name]
    assert len(cases) == len(CONVERSATIONS)
    template = ChatTemplate.from_chat_format(name)
    bare = ChatTemplate(name)
    for case in cases:
        messages = _messages(case["conversation"])
        assert template.render(messages) == case["prompt"], case["conversation"]
        assert template.stop == case["stop"]
        if name not in LLM_CHAT_TEMPLATES:
            assert bare.render(messages) == case["prompt"] and bare.stop == case["stop"]


def test_a_shared_name_means_llama_cpps_template_unless_asked_as_chat_format():
    shared = sorted(set(CHAT_FORMATS) & set(LLM_CHAT_TEMPLATES))
    assert shared == ["chatglm3", "chatml", "gemma", "openchat", "vicuna", "zephyr"]
    for name in shared:  # llama-cpp-python's chatml, e.g., opens an empty system turn
        llama_cpp, llama_cpp_python = ChatTemplate(name), ChatTemplate.from_chat_format(name)
        assert any(llama_cpp.render(_messages(c)) != llama_cpp_python.render(_messages(c)) for c in CONVERSATIONS)
    # from_chat_format still takes llama.cpp's own names and Jinja
    messages = _messages("default")
    assert ChatTemplate.from_chat_format("mistral-v7").render(messages) == ChatTemplate("mistral-v7").render(messages)


def test_the_runtime_resolves_a_chat_format_name():
    """Llama(chat_format=...) and `serve --chat-template` reach the template through RuntimeParams.chat_template."""
    from llamactx.runtime import Runtime, RuntimeParams

    runtime = Runtime(RuntimeParams(model="smollm2", vocab_only=True, chat_template="llama-2"))
    case = next(c for c in FORMATS["cases"] if c["name"] == "llama-2" and c["conversation"] == "default")
    assert runtime.template.render(_messages("default")) == case["prompt"]
    assert runtime.template.message == "using the built-in llama-2 template"
    # Llama(chat_format="zephyr") means llama-cpp-python's zephyr: from_model(..., chat_format=True)
    zephyr = ChatTemplate.from_model(runtime.model, source="zephyr", chat_format=True)
    case = next(c for c in FORMATS["cases"] if c["name"] == "zephyr" and c["conversation"] == "default")
    assert zephyr.render(_messages("default")) == case["prompt"] and zephyr.stop == "</s>"
    assert ChatTemplate.from_model(runtime.model, source="zephyr").render(_messages("default")) != case["prompt"]
    with pytest.raises(ChatTemplateError, match="'llama-22' is not a known template name"):
        Runtime(RuntimeParams(model="smollm2", vocab_only=True, chat_template="llama-22")).template  # noqa: B018


def test_checkpoints_follow_the_chat_template_given():
    """The engine's user-message delimiters (where checkpoints go) come from --chat-template when one is given: the
    prompts are rendered with it, not with the model's own."""
    from llamactx.runtime import Runtime, RuntimeParams

    def user_start(runtime) -> bytes:
        vocab = runtime.model.vocab
        return b"".join(vocab.token_to_piece(t, special=True) for t in runtime.engine.message_delimiters.user)

    assert user_start(Runtime(RuntimeParams(model="smollm2", n_ctx=256, n_slots=1))) == b"<|im_start|>user"
    assert user_start(Runtime(RuntimeParams(model="smollm2", n_ctx=256, n_slots=1,
                                            chat_template="llama2"))) == b"[INST]"


# -- unknown names -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "LLAMA2", "INVALID TEMPLATE", "mistral", "phi-3", "x" * 500])
def test_an_unknown_name_is_an_error_naming_the_known_ones(name):
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplate(name)
    message = str(e.value)
    assert "is not a known template name" in message and "not a Jinja template" in message
    assert all(known in message for known in known_template_names())
    assert len(message) < 2000  # a long non-name is shown cut short
    with pytest.raises(ChatTemplateError, match="is not a known template name"):
        ChatTemplate.from_chat_format(name)


def test_an_unknown_name_suggests_the_closest():
    with pytest.raises(ChatTemplateError, match=r"did you mean 'llama2'\?"):
        ChatTemplate("lama2")
    with pytest.raises(ChatTemplateError, match=r"did you mean 'mistral-v7'\?"):
        ChatTemplate("mistral-v8")


def test_serve_with_an_unknown_name_is_a_start_up_error(capsys):
    """`llamactx serve --chat-template NAME`: an unknown name stops the server before it loads anything, with one
    line naming the known names (exit status 1)."""
    from llamactx.cli.commands import main

    assert main(["serve", "--chat-template", "llama9", "--port", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llamactx: error: chat template 'llama9' is not a known template name")
    assert "mistral-v7" in err and "llama-2" in err and "Traceback" not in err

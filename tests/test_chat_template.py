"""Chat templates: SmolLM2's own template against llama.cpp's rendered prompts, the chatml fallback, the HF
rendering environment (sandbox, globals, filters, whitespace control) and message validation."""

from __future__ import annotations

import datetime
import json
import warnings

import gguf
import pytest

from llamactx.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    builtin_for_vocab,
    validate_messages,
)
from llamactx.embedded import gemma3_path, smollm2_path

USER = [{"role": "user", "content": "Hi there"}]


class _Vocab:
    def __init__(self, texts: list[str], bos: int, eos: int, add_bos: bool) -> None:
        self.texts, self.bos, self.eos, self.add_bos, self.add_eos = texts, bos, eos, add_bos, False

    def token_get_text(self, token: int) -> str:
        return self.texts[token]


class _Model:
    """The two things ChatTemplate.from_model reads from a model."""

    def __init__(self, chat_template: str | None, vocab: _Vocab) -> None:
        self.chat_template, self.vocab = chat_template, vocab


def _field_str(reader: gguf.GGUFReader, key: str, i: int = 0) -> str:
    field = reader.fields[key]
    return bytes(field.parts[field.data[i]]).decode("utf-8")


@pytest.fixture(scope="module")
def smollm2_model() -> _Model:
    """SmolLM2's template and BOS/EOS texts, straight from its GGUF."""
    reader = gguf.GGUFReader(smollm2_path())
    bos = int(reader.fields["tokenizer.ggml.bos_token_id"].parts[-1][0])
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    texts = {i: _field_str(reader, "tokenizer.ggml.tokens", i) for i in (bos, eos)}
    add_bos = bool(reader.fields["tokenizer.ggml.add_bos_token"].parts[-1][0])
    vocab = _Vocab([texts.get(i, "") for i in range(max(texts) + 1)], bos, eos, add_bos)
    return _Model(_field_str(reader, "tokenizer.chat_template"), vocab)


def test_smollm2_renders_llama_cpp_prompts(smollm2_model, smollm_ref):
    template = ChatTemplate.from_model(smollm2_model)
    assert not template.is_fallback and template.name == "chatml"
    assert (template.bos_token, template.eos_token) == ("<|im_start|>", "<|im_end|>")
    cases = smollm_ref["chat"]
    assert len(cases) >= 2
    for case in cases:
        assert template.render(case["messages"], add_generation_prompt=True) == case["prompt"]


def test_smollm2_without_generation_prompt(smollm2_model):
    prompt = ChatTemplate.from_model(smollm2_model).render(USER, add_generation_prompt=False)
    assert prompt.endswith("<|im_start|>user\nHi there<|im_end|>\n")


def test_gemma_without_template_gets_the_builtin_its_tokens_point_to():
    from llamactx import Model

    gemma = Model.load(gemma3_path(), vocab_only=True)
    assert gemma.chat_template is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the choice is reported once, by the caller, not warned here
        template = ChatTemplate.from_model(gemma, name="gemma3")
    assert template.is_fallback and template.name == "gemma" and template.message == (
        "gemma3 has no chat template; using the built-in gemma template")
    assert template.source == "gemma" and template.bos_token == "<bos>"  # the built-in name, as /props shows
    messages = [{"role": "system", "content": "Be brief."}, *USER, {"role": "assistant", "content": " Hi! "}]
    # llama-chat.cpp's gemma output; <bos> is left to the tokenizer (add_bos)
    assert template.render(messages) == (
        "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHi!<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert builtin_for_vocab(gemma.vocab) == "gemma" and gemma.vocab.is_eog(gemma.vocab.tokenize(
        "<end_of_turn>", add_special=False, parse_special=True)[0])


def test_builtin_templates_by_name_and_chatml_by_default():
    assert ChatTemplate(None).name == "chatml" and ChatTemplate("chatml").source == CHATML_TEMPLATE
    assert ChatTemplate(None, name="m").message == "m has no chat template; using the built-in chatml template"
    # llama-chat.cpp's llama3 writes no BOS (the tokenizer adds it) and trims the content
    llama3 = ChatTemplate("llama3", "<|begin_of_text|>")
    assert llama3.message == "using the built-in llama3 template"
    assert llama3.render([{"role": "user", "content": " Hi there\n"}]) == (
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_gemma3_turn_end_token_stops_a_chat(gemma):
    """The embedded Gemma 3 270M is the pre-trained (not instruction-tuned) model: with the built-in template it
    does not end its turn by itself at temperature 0 (it repeats the question, as llama.cpp's identical logits
    would). What the fallback must give is a turn-end token the vocabulary has and that ends generation."""
    from llamactx.llm import LLM

    llm = LLM(gemma, n_ctx=512)
    end_of_turn = gemma.vocab.tokenize("<end_of_turn>", add_special=False, parse_special=True)[0]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, temperature=0, max_tokens=64, logit_bias={end_of_turn: 100.0})
    assert out.finish_reason == "stop" and out.tokens == [] and out.text == ""


def test_bos_is_stripped_when_the_tokenizer_adds_it():
    source = (
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{{ eos_token }}"
    )
    assert ChatTemplate(source, "<s>", "</s>").render(USER) == "<s>[user] Hi there\n</s>"
    stripped = ChatTemplate(source, "<s>", "</s>", add_bos=True, add_eos=True)
    assert stripped.render(USER) == "[user] Hi there\n"


def test_tools_only_when_given_and_tojson_like_hf():
    source = "{% if tools is defined %}{{ tools | tojson }}{% else %}none{% endif %}"
    template = ChatTemplate(source)
    assert template.render(USER) == "none"
    tools = [{"type": "function", "function": {"name": "f", "description": "a<b & é"}}]
    assert template.render(USER, tools=tools) == json.dumps(tools, ensure_ascii=False)
    indented = ChatTemplate("{{ messages[0] | tojson(indent=2) }}").render(USER)
    assert indented == json.dumps(USER[0], indent=2)


def test_raise_exception_is_a_value_error_with_the_template_message():
    source = (
        "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    template = ChatTemplate(source)
    assert template.render([*USER, {"role": "assistant", "content": "ok"}]) == "Hi thereok"
    with pytest.raises(ValueError, match="^Conversation roles must alternate") as info:
        template.render([*USER, *USER])
    assert isinstance(info.value, ChatTemplateError)


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append({'role': 'x'}) }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ (messages | first).__class__.__base__ }}",
        "{% set m = messages[0] %}{{ m.update({'role': 'system'}) }}",
    ],
)
def test_sandbox_blocks_attribute_abuse(source):
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate(source).render(USER)


def test_sandbox_hides_dunder_attributes():
    assert ChatTemplate("{{ ''.__class__ }}|{{ messages.__len__ }}").render(USER) == "|"


def test_syntax_error_names_the_line():
    with pytest.raises(ChatTemplateError, match="syntax error on line 2"):
        ChatTemplate("ok\n{% for m in %}{% endfor %}")


def test_undefined_errors_and_type_errors_become_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="UndefinedError"):
        ChatTemplate("{{ nothing.at.all }}").render(USER)
    with pytest.raises(ChatTemplateError, match="TypeError"):
        ChatTemplate("{{ messages[0].content + 1 }}").render(USER)


def test_hf_environment_globals_and_extensions():
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}|{{ strftime_now('%Y') }}"
        "|{{ enable_thinking }}"
    )
    two = [*USER, {"role": "assistant", "content": "second"}]
    year = datetime.datetime.now().year
    rendered = ChatTemplate(source).render(two, extra={"enable_thinking": False})
    assert rendered in (f"Hi there|{year}|False", f"Hi there|{year + 1}|False")


@pytest.mark.parametrize("key", ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "self"])
def test_extra_variables_cannot_replace_the_ones_render_sets(key):
    """llama-server's chat_template_kwargs name further variables; one that render sets itself (or jinja's
    `self`) is refused, naming the key (it was a TypeError, a 500 in the server)."""
    with pytest.raises(ChatTemplateError, match=f"chat_template_kwargs: '{key}' is reserved"):
        ChatTemplate("{{ messages }}").render(USER, extra={key: 1})
    assert ChatTemplate("{{ enable_thinking }}").render(USER, extra={"enable_thinking": 2}) == "2"


def test_trim_and_lstrip_blocks():
    source = (
        "{% for m in messages %}\n"
        "    {% if m.role == 'user' %}\n"
        "U:{{ m.content }}\n"
        "    {% endif %}\n"
        "{% endfor %}"
    )
    assert ChatTemplate(source).render(USER) == "U:Hi there\n"


@pytest.mark.parametrize(
    ("messages", "where"),
    [
        ("hello", r"messages: expected a list"),
        ([], r"messages: at least one"),
        ([["user", "hi"]], r"messages\[0\]: expected an object"),
        ([{"content": "hi"}], r"messages\[0\]\.role"),
        ([*USER, {"role": "", "content": "x"}], r"messages\[1\]\.role"),
        ([*USER, {"role": "assistant"}], r"messages\[1\]\.content: missing"),
        ([{"role": "user", "content": 5}], r"messages\[0\]\.content: expected a string"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            r"messages\[0\]\.content\[0\]",
        ),
    ],
)
def test_bad_messages_name_index_and_field(messages, where):
    with pytest.raises(ValueError, match=where):
        ChatTemplate("{{ messages }}").render(messages)


def test_message_normalisation():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "f"}}],
        },
    ]
    out = validate_messages(messages)
    assert out[0]["content"] == "a\nb" and out[1]["content"] == "" and out[1]["tool_calls"]
    assert messages[0]["content"][0]["text"] == "a"  # the caller's messages are not modified


HOSTILE = [
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
    ("{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "characters"),
    ("{{ 'x' * 10000000000 }}", "characters"),
    ("{{ [1] * 10000000000 }}", "characters"),
    ("{{ 2 ** 100000000 }}", "exponent"),
]


@pytest.mark.parametrize(("source", "why"), HOSTILE)
def test_hostile_templates_end_in_bounded_time_with_a_chat_template_error(source, why):
    import time

    template = ChatTemplate(source, name="hostile")
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=why):
        template.render([{"role": "user", "content": "hi"}])
    assert time.perf_counter() - t0 < 5
    assert template.render.__self__ is template  # the template object is still usable
    ok = ChatTemplate("{{ messages[0].content }}", name="ok")
    assert ok.render([{"role": "user", "content": "hi"}]) == "hi"

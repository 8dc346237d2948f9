"""Fuzz target: the chat-template renderer (llamactx/chat_template.py), whose templates come from model files.

An input's first byte picks what the rest is: a template's source (rendered with a fixed conversation), or a
conversation (NUL-separated role / content pairs, rendered with each real template). Compiling and rendering
must succeed or raise ChatTemplateError. Seeds: the real templates (SmolLM2's own, and the built-in chatml,
Gemma and Llama 3 ones) and a conversation.
"""

from __future__ import annotations

from tests.fuzz.harness import instrumented, main

with instrumented("jinja2"):  # jinja2's lexer and parser guide the mutations
    from llamactx.chat_template import BUILTIN_TEMPLATES, ChatTemplate, ChatTemplateError
    from llamactx.embedded import ModelNotInstalledError, smollm2_path
    from llamactx.gguf.reader import GGUFFile

MESSAGES = [
    {"role": "system", "content": "You are <b>helpful</b>. {{ 7 * 7 }} {% raw %}"},
    {"role": "user", "content": "Hi ☃\n\t<|im_end|>"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "two"}]},
]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


def real_templates() -> dict[str, str]:
    out = {name: source for name, (source, _) in BUILTIN_TEMPLATES.items()}
    try:
        with GGUFFile(smollm2_path()) as f:
            out["smollm2"] = str(f.meta["tokenizer.chat_template"])
    except ModelNotInstalledError:
        pass
    return out


TEMPLATES = [ChatTemplate(source, "<s>", "</s>", name) for name, source in real_templates().items()]


def conversation(payload: bytes) -> list[dict[str, str]]:
    fields = payload.decode("utf-8", "replace").split("\0")
    return [{"role": role, "content": content} for role, content in zip(fields[::2], fields[1::2], strict=False)]


def test_one_input(data: bytes) -> None:
    if not data:
        return
    try:
        if data[0] % 2 == 0:
            template = ChatTemplate(data[1:].decode("utf-8", "replace"), "<s>", "</s>", "fuzz")
            template.render(MESSAGES, add_generation_prompt=bool(data[0] & 2), tools=TOOLS if data[0] & 4 else None)
        else:
            messages = conversation(data[1:])
            for template in TEMPLATES:
                template.render(messages, add_generation_prompt=bool(data[0] & 2))
    except ChatTemplateError:
        pass


def seeds() -> dict[str, bytes]:
    out = {f"{name}.jinja": b"\0" + source.encode() for name, source in real_templates().items()}
    out["conversation.txt"] = b"\3" + "\0".join(
        ["system", "Be brief.", "user", "Hi {{ x }} ☃", "assistant", "Hello", "user", "<|im_start|>?"]).encode()
    return out


if __name__ == "__main__":
    corpus = seeds()
    for data in corpus.values():
        test_one_input(data)
    main(test_one_input, corpus)

"""Record llama.cpp's built-in chat template prompts and llama-cpp-python's chat_format prompts.

Run with llama-cpp-python 0.3.36's package on the native llama.cpp 0c1e570 build (no model is needed):

    PYTHONPATH=/path/to/llama_cpp_python-0.3.36:<a dir with diskcache> \\
    LLAMA_CPP_LIB_PATH=~/.cache/llamactx-llamacpp/bin python make_chat_template_prompts.py

Writes, next to this script:
- builtin_prompts.json: `names` (llama_chat_builtin_templates, in its order) and `cases`: for every name, every
  conversation of CONVERSATIONS and add_ass true / false, the prompt llama_chat_apply_template(name, ...) returns.
- detected_prompts.json: for every models/templates/*.jinja of llama.cpp's tree, the prompt
  llama_chat_apply_template(source, ...) returns for conversation "default" with add_ass true (the style
  llm_chat_detect_template finds in the source, rendered), or null where it finds none (-1).
- chat_format_prompts.json: for every name llama_chat_format.py registers with @register_chat_format and every
  conversation, the formatter's prompt and stop string.
"""

from __future__ import annotations

import ctypes
import json
import re
import sys
from pathlib import Path

import llama_cpp
from llama_cpp import llama_chat_format

HERE = Path(__file__).parent

# tests/test-chat-template.cpp's conversation, and a few that reach the other branches: no system message, two
# system messages, tool / function / custom roles, whitespace to trim (ASCII, and a no-break space that C's
# isspace() does not trim), non-ASCII text, a conversation that ends with the assistant
CONVERSATIONS = {
    "default": [("system", "You are a helpful assistant"), ("user", "Hello"), ("assistant", "Hi there"),
                ("user", "Who are you"), ("assistant", "   I am an assistant   "), ("user", "Another question")],
    "no_system": [("user", " Hi\n"), ("assistant", "Hello!"), ("user", "What is 2+2?")],
    "two_systems": [("system", "\tBe brief. "), ("system", "Be kind."), ("user", "Héllo ☃"),
                    ("assistant", "\u00a0Hi\u00a0"), ("user", "{{ not jinja }}")],
    "tools": [("system", "Use tools."), ("user", "Weather?"), ("assistant", "[call]"), ("tool", '{"t": 21}'),
              ("function", "f()"), ("observer", "custom role"), ("user", "Thanks\n\n")],
    "ends_with_assistant": [("user", "Say hi"), ("assistant", " hi \n")],
}


def apply(tmpl: str, messages: list[tuple[str, str]], add_ass: bool) -> str | None:
    """llama_chat_apply_template, growing the buffer once if the prompt is longer; None when it returns -1."""
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(r.encode(), c.encode()) for r, c in messages])
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode(), chat, len(messages), add_ass, buf, len(buf))
    if n < 0:
        return None
    if n > len(buf):
        buf = ctypes.create_string_buffer(n)
        n = llama_cpp.llama_chat_apply_template(tmpl.encode(), chat, len(messages), add_ass, buf, len(buf))
    return buf.raw[:n].decode("utf-8")


def builtin_names() -> list[str]:
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    out = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(out, n)
    return [s.decode() for s in out]


def chat_formats() -> dict[str, object]:
    """name -> formatter function, from the @register_chat_format decorators in llama_chat_format.py."""
    text = Path(llama_chat_format.__file__).read_text(encoding="utf-8")
    pairs = re.findall(r'@register_chat_format\("([^"]+)"\)\ndef (\w+)\(', text)
    return {name: getattr(llama_chat_format, fn) for name, fn in pairs}


def main(templates_dir: Path) -> None:
    names = builtin_names()
    cases = [{"name": name, "conversation": conv, "add_ass": add_ass, "prompt": apply(name, msgs, add_ass)}
             for name in names for conv, msgs in CONVERSATIONS.items() for add_ass in (True, False)]
    meta = {"llama.cpp": "0c1e570 (llama-cpp-python 0.3.36's vendor tree, native build)",
            "conversations": {k: [list(m) for m in v] for k, v in CONVERSATIONS.items()}}
    (HERE / "builtin_prompts.json").write_text(
        json.dumps({**meta, "names": names, "cases": cases}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    detected = {p.name: apply(p.read_text(encoding="utf-8"), CONVERSATIONS["default"], True)
                for p in sorted(templates_dir.glob("*.jinja"))}
    (HERE / "detected_prompts.json").write_text(
        json.dumps({**meta, "prompts": detected}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    formats = []
    for name, fn in chat_formats().items():
        for conv, msgs in CONVERSATIONS.items():
            out = fn(messages=[{"role": r, "content": c} for r, c in msgs])
            formats.append({"name": name, "conversation": conv, "prompt": out.prompt, "stop": out.stop})
    (HERE / "chat_format_prompts.json").write_text(
        json.dumps({**meta, "llama-cpp-python": "0.3.36", "cases": formats}, ensure_ascii=False, indent=1) + "\n",
        encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1
         else Path(llama_chat_format.__file__).parents[1] / "vendor" / "llama.cpp" / "models" / "templates")

"""`llamactx chat` shows the model's thinking apart from its answer and keeps only the answer in the
conversation, as llama-server parses a reply (--reasoning-format as the server has it); `LLM.chat` / `LLM.message`
give the parsed OpenAI message. The embedded SmolLM2 is steered by a grammar into a `<think>` reply."""

from __future__ import annotations

import io
import json

import pytest

from llamactx.cli import main
from llamactx.cli.chat import ReplyWriter
from llamactx.llm import LLM
from llamactx.tool_calls import ToolCallError

THOUGHT, ANSWER = "I should greet", "Hello there."
GRAMMAR = f'root ::= "<think>{THOUGHT}</think>{ANSWER}"'
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def chat_session(monkeypatch, capsys, tmp_path, *flags: str) -> tuple[str, list[dict]]:
    """(stdout, the saved conversation) of one turn of `llamactx chat` under the grammar."""
    saved = tmp_path / "conv.bin"
    monkeypatch.setattr("sys.stdin", io.StringIO(f"Say hello.\n/save {saved}\n/exit\n"))
    assert main(["chat", "--temp", "0", "-n", "24", "--grammar", GRAMMAR, *flags]) == 0
    messages = json.loads((tmp_path / "conv.bin.messages.json").read_text(encoding="utf-8"))
    return capsys.readouterr().out, messages


def test_chat_shows_thinking_apart_and_keeps_only_the_answer(monkeypatch, capsys, tmp_path):
    out, messages = chat_session(monkeypatch, capsys, tmp_path)
    assert f"> [thinking] {THOUGHT}\n[/thinking]\n{ANSWER}\n" in out
    assert "<think>" not in out
    assert messages[-1] == {"role": "assistant", "content": ANSWER}


def test_reasoning_format_none_leaves_the_thinking_in_the_answer(monkeypatch, capsys, tmp_path):
    out, messages = chat_session(monkeypatch, capsys, tmp_path, "--reasoning-format", "none")
    written = f"<think>{THOUGHT}</think>{ANSWER}"
    assert f"> {written}\n" in out and "[thinking]" not in out
    assert messages[-1] == {"role": "assistant", "content": written}


def test_reply_writer_dims_thinking_on_a_terminal_and_shows_calls():
    llm = LLM(n_ctx=256)
    llm.chat([{"role": "user", "content": "Weather in Paris?"}], tools=WEATHER, max_tokens=1, temperature=0)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    writer = ReplyWriter(llm.chat_params, out)
    for piece in ["<think>", "hm", "</think>", "<tool_call>", '{"name": "get_weather", ',
                  '"arguments": {"city": "Paris"}}', "</tool_call>"]:
        writer.feed(piece)
    msg = writer.finish()
    assert out.getvalue() == ('\x1b[2m[thinking] hm\n[/thinking]\x1b[0m\n'
                              '\n[tool call] get_weather({"city": "Paris"})')
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", {"city": "Paris"})]


def test_llm_chat_parses_the_reply_and_constrains_a_required_call():
    llm = LLM(n_ctx=512)
    llm.chat([{"role": "user", "content": "Say hello."}], grammar=GRAMMAR, max_tokens=24, temperature=0)
    assert llm.message() == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}
    llm.chat([{"role": "user", "content": "What is the weather in Paris?"}], tools=WEATHER, tool_choice="required",
             max_tokens=48, temperature=0)
    (call,) = llm.message()["tool_calls"]
    assert call["function"]["name"] == "get_weather" and isinstance(json.loads(call["function"]["arguments"])["city"],
                                                                    str)
    with pytest.raises(ToolCallError, match="tool_choice"):
        llm.chat([{"role": "user", "content": "Hi"}], tools=WEATHER, tool_choice="required", grammar=GRAMMAR)

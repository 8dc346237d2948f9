"""`llamactx chat`: an interactive terminal chat with the model's template (llama-cli's conversation mode).

Commands: /clear forgets the conversation, /save FILE and /load FILE keep it across runs (the sequence's KV
state through the state API, plus the messages beside it in FILE.messages.json), /exit ends. Ctrl-C stops the
answer being generated; what was said so far stays in the conversation. An answer also ends, handing the turn
back, at a -r reverse prompt or a --stop string (neither is kept); --n-probs N lists its tokens' probabilities.

A reply is parsed as llama-server parses it (llamactx.chat_parse, with --reasoning-format / -rea /
--reasoning-budget as the server has them): the model's thinking is shown apart, dim on a terminal, between
"[thinking]" and "[/thinking]" lines, and is not kept in the conversation (llama-server's web UI sends only the
answer back); a tool call the model writes is shown as "[tool call] name(arguments)".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llamactx import chat_parse
from llamactx.chat_template import validate_messages
from llamactx.cli.completion import print_probs

HELP = "commands: /clear, /save FILE, /load FILE, /exit (Ctrl-C stops an answer, Ctrl-D exits)"


def run_chat(llm, options: dict, n_predict: int, system_prompt: str | None) -> int:
    """The chat loop on stdin / stdout; `options` are LLM.chat's (sampling, stop, context_shift, n_probs)."""
    template = llm.template
    print(f"llamactx chat: {llm.model.desc}, template {template.name or 'from the model'}"
          + (f" ({template.message})" if template.is_fallback else ""))
    print(HELP)
    base = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages = list(base)
    while True:
        try:
            line = input("\n> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            messages, done = _command(llm, line.strip(), messages, base)
            if done:
                return 0
            continue
        messages.append({"role": "user", "content": line})
        messages.append({"role": "assistant", "content": _answer(llm, messages, options, n_predict)})


def _answer(llm, messages: list[dict], options: dict, n_predict: int) -> str:
    """Stream the model's reply to `messages`; returns its answer (the content, without the thinking)."""
    stream = llm.chat(messages, max_tokens=n_predict, stream=True, **options)
    reply = ReplyWriter(llm.chat_params, sys.stdout)
    chunks, interrupted = [], False
    try:
        for chunk in stream:
            chunks.append(chunk)
            reply.feed(chunk.text)
    except KeyboardInterrupt:  # closing the stream aborts the request; what was generated stays
        stream.close()
        interrupted = True
    msg = reply.finish()
    sys.stdout.write(" [interrupted]\n" if interrupted else "\n")
    if options.get("n_probs", -1) > 0:
        print_probs(llm.model.vocab, chunks, options["n_probs"])
    return msg.content


class ReplyWriter:
    """Writes a streamed reply as it is parsed: the thinking apart (dim on a terminal), then the answer, then
    any tool calls. `feed` takes each piece of generated text; `finish` parses the whole reply and writes what the
    last parse adds, returning the ChatMsg."""

    DIM, RESET = "\x1b[2m", "\x1b[0m"

    def __init__(self, params: chat_parse.ChatParams, out):
        self.params, self.out = params, out
        self.color = bool(getattr(out, "isatty", lambda: False)())
        self.text, self.shown, self.thinking = "", chat_parse.ChatMsg(), False

    def feed(self, piece: str) -> None:
        self.text += piece
        self._show(chat_parse.parse_partial(self.params, self.text))

    def finish(self) -> chat_parse.ChatMsg:
        msg = chat_parse.parse(self.params, self.text)
        self._show(msg)
        self._end_thinking()
        for call in msg.tool_calls:
            self.out.write(f"\n[tool call] {call.name}({call.arguments})")
        self.out.flush()
        return msg

    def _show(self, cur: chat_parse.ChatMsg) -> None:
        for d in chat_parse.diffs(self.shown, cur):
            if d.reasoning_content_delta:
                if not self.thinking:
                    self.thinking = True
                    self.out.write((self.DIM if self.color else "") + "[thinking] ")
                self.out.write(d.reasoning_content_delta)
            if d.content_delta:
                self._end_thinking()
                self.out.write(d.content_delta)
        self.shown = cur
        self.out.flush()

    def _end_thinking(self) -> None:
        if self.thinking:
            self.thinking = False
            self.out.write("\n[/thinking]" + (self.RESET if self.color else "") + "\n")


def _command(llm, line: str, messages: list[dict], base: list[dict]) -> tuple[list[dict], bool]:
    cmd, _, arg = line.partition(" ")
    arg = arg.strip()
    if cmd in ("/exit", "/quit"):
        return messages, True
    if cmd == "/clear":
        llm.reset()
        print("conversation cleared")
        return list(base), False
    if cmd in ("/save", "/load") and not arg:
        print(f"usage: {cmd} FILE")
        return messages, False
    if cmd == "/save":
        try:
            Path(arg + ".messages.json").write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
            n = llm.save_session(arg)
        except OSError as e:
            print(f"could not save {arg}: {e}")
            return messages, False
        print(f"saved {n} tokens to {arg}")
        return messages, False
    if cmd == "/load":
        # everything is read and checked before anything changes: the messages, then the state (checked whole
        # by load_session before it replaces the KV), so a failed /load leaves the conversation as it was
        try:
            loaded = validate_messages(json.loads(Path(arg + ".messages.json").read_text(encoding="utf-8")))
            tokens = llm.load_session(arg)
        except (OSError, ValueError) as e:
            print(f"could not load {arg}: {e}")
            return messages, False
        print(f"loaded {len(tokens)} tokens, {len(loaded)} messages")
        return loaded, False
    print(HELP)
    return messages, False

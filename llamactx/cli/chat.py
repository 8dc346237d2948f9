"""`llamactx chat`: an interactive terminal chat with the model's template (llama-cli's conversation mode).

Commands: /clear forgets the conversation, /save FILE and /load FILE keep it across runs (the sequence's KV
state through the state API, plus the messages beside it in FILE.messages.json), /exit ends. Ctrl-C stops the
answer being generated; what was said so far stays in the conversation. An answer also ends, handing the turn
back, at a -r reverse prompt or a --stop string (neither is kept); --n-probs N lists its tokens' probabilities.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llamactx.chat_template import validate_messages
from llamactx.cli.completion import print_probs, write_stream

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
    chunks, interrupted = write_stream(llm.chat(messages, max_tokens=n_predict, stream=True, **options))
    sys.stdout.write(" [interrupted]\n" if interrupted else "\n")
    if options.get("n_probs", -1) > 0:
        print_probs(llm.model.vocab, chunks, options["n_probs"])
    return "".join(c.text for c in chunks)


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

"""`llamactx run`: one completion streamed to stdout (llama.cpp's tools/completion, llama-completion, without
its interactive mode).

The prompt is continued as text. With -sys it becomes one chat turn instead: the system prompt and -p as the
user's message, rendered with the model's chat template (llama-completion's conversation mode, --single-turn).
Generation stops at an end-of-generation token, after -n tokens, when the context is full (unless
--context-shift), at a --stop string (not printed, as llama-server's `stop`) or at a -r reverse prompt (printed,
as llama-completion prints it). Ctrl-C stops the generation, prints the timings and exits 130
(llama-completion's `sigint_handler`). --n-probs N lists each generated token's probability and the N most
likely tokens after the text.
"""

from __future__ import annotations

import json
import math
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as llama-completion's _exit(130)


def run_completion(llm, prompt: str, options: dict, n_predict: int, system_prompt: str | None = None,
                   reverse_prompts: tuple[str, ...] = (), verbose_prompt: bool = False) -> int:
    """Stream the completion of `prompt` (LLM.complete's `options`); returns the exit status."""
    if system_prompt:
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
        if verbose_prompt:
            sys.stdout.write(llm.template.render(messages, add_generation_prompt=True))
        stream = llm.chat(messages, max_tokens=n_predict, stream=True, **options)
    else:
        if verbose_prompt:
            sys.stdout.write(prompt)
        stream = llm.complete(prompt, max_tokens=n_predict, stream=True, **options)
    chunks, interrupted = write_stream(stream)
    result = llm.result
    if result is not None and result.stop_word in reverse_prompts:
        sys.stdout.write(result.stop_word)
    sys.stdout.write("\n")
    if options.get("n_probs", -1) > 0:
        print_probs(llm.model.vocab, chunks, options["n_probs"])
    sys.stdout.flush()
    if result is not None:
        print_timings(result.timings)
    if interrupted:
        print("llamactx: interrupted by user", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def write_stream(stream) -> tuple[list, bool]:
    """Write each chunk's text as it comes; Ctrl-C closes the stream (which aborts the request, keeping what was
    generated and its timings in `llm.result`). Returns (the chunks, whether Ctrl-C stopped it)."""
    chunks = []
    try:
        for chunk in stream:
            chunks.append(chunk)
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        stream.close()
        return chunks, True
    return chunks, False


def print_probs(vocab, chunks, n_probs: int, out=None) -> None:
    """One line per generated token: its text and probability, then the `n_probs` most likely tokens and theirs
    (the softmax of the model's logits before sampling, as llama-server's `completion_probabilities`)."""
    out = out or sys.stdout
    print(f"\nprobabilities: each token, then the {n_probs} most likely at its position", file=out)
    for c in chunks:
        if c.token is None or c.logprob is None:
            continue
        top = "  ".join(f"{_piece(vocab, t)} {math.exp(lp):.4f}" for t, lp in c.top_logprobs)
        print(f"{_piece(vocab, c.token):>16} {math.exp(c.logprob):.4f} | {top}", file=out)


def _piece(vocab, token: int) -> str:
    return json.dumps(vocab.token_to_piece(token, special=True).decode("utf-8", "replace"), ensure_ascii=False)


def print_timings(t) -> None:
    print(f"\nprompt: {t.prompt_n} tokens, {t.prompt_per_second:.1f} t/s; generation: {t.predicted_n} tokens, "
          f"{t.predicted_per_second:.1f} t/s", file=sys.stderr)

"""A request's input as tokens: prompts, chat renders, embedding and rerank inputs, each refused with a 400 (naming
the field) when too long for its context, from its length alone where possible (llama-server's
tokenize_input_prompts, server-common.cpp; `Vocab.min_tokens`).

Each function takes what it reads: a generation prompt a `PromptFit` (the vocabulary, a slot's context and
--context-shift), a chat render the `ChatTemplate`, embedding and rerank inputs the vocabulary (or model) and their
context's n_ctx. The server's routes build these from its state; the cluster's ingress renders chats with its own
vocab-only template.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamactx import tool_calls
from llamactx.api import protocol as P
from llamactx.api import rerank as rerank_api
from llamactx.chat_template import ChatTemplate
from llamactx.vocab import Vocab


@dataclass(frozen=True, slots=True)
class PromptFit:
    """What a generation prompt is tokenized with and must fit: the vocabulary, a slot's context (n_ctx) and
    whether --context-shift truncates a prompt that fills it (else it is refused)."""

    vocab: Vocab
    n_ctx: int
    context_shift: bool


def completion_prompts(fit: PromptFit, prompt, n_keep: int) -> tuple[list[list[int]], str]:
    """A completion prompt as token lists (one per prompt) and the text of the first (for echo)."""
    vocab = fit.vocab
    if isinstance(prompt, (str, dict)):
        items: list = [prompt]
    elif any(isinstance(p, int) for p in prompt):  # token ids, maybe mixed with texts: one prompt
        if not all(isinstance(p, (int, str)) for p in prompt):
            raise P.ProtocolError("prompt: a list of token ids may hold texts, not nested lists or objects")
        if all(isinstance(p, int) for p in prompt):
            items = [prompt]
        else:
            items = [[t for j, p in enumerate(prompt) for t in (
                [p] if isinstance(p, int) else prompt_tokens(fit, p, True, add_special=j == 0))]]
    else:
        items = list(prompt)
    out = []
    for i, p in enumerate(items):
        if isinstance(p, dict):  # llama-server's multimodal prompt object: its text, and no media
            if p.get("multimodal_data"):
                raise P.ProtocolError(f"prompt[{i}].multimodal_data: this server has no multimodal projector")
            p = p.get("prompt_string")
            if not isinstance(p, str):
                raise P.ProtocolError(f"prompt[{i}].prompt_string must be a string")
            items[i] = p
        if isinstance(p, str):
            tokens = prompt_tokens(fit, p, True)
        else:
            tokens = P.check_tokens(p, vocab.n_tokens, f"prompt[{i}]" if len(items) > 1 else "prompt")
        if not tokens:
            raise P.ProtocolError(f"prompt[{i}] is empty")
        out.append(fit_prompt(fit, tokens, n_keep))
    if len(out) > P.MAX_N:
        raise P.ProtocolError(f"prompt: at most {P.MAX_N} prompts per request")
    first = items[0]
    return out, first if isinstance(first, str) else vocab.detokenize(out[0])


def content_text(obj: dict, field: str) -> str:
    """The text of llama-server's {"content": [{"type": "text", "text": ...}, ...]} input (no media here)."""
    blocks = obj.get("content")
    if not isinstance(blocks, list) or not blocks:
        raise P.ProtocolError(f"{field}.content must be a non-empty list of content parts")
    parts = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind != "text" or not isinstance(b.get("text"), str):
            what = "media input is not supported (no multimodal projector)" if kind in (
                "image_url", "input_audio", "input_video") else f"type {kind!r} is not 'text'"
            raise P.ProtocolError(f"{field}.content[{j}]: {what}")
        parts.append(b["text"])
    return "".join(parts)


def rerank_prompts(model, n_ctx: int, req) -> list[list[int]]:
    """The tokens of every (query, document) pair for `model`; a pair longer than the reranker's context (`n_ctx`)
    is a 400 naming the document."""
    vocab = model.vocab
    n_min_query = vocab.min_tokens(req.query)
    out = []
    for i, doc in enumerate(req.documents):
        n_min = n_min_query + vocab.min_tokens(doc)
        if n_min > n_ctx:  # refused from its length, before tokenizing (see Vocab.min_tokens)
            raise P.ProtocolError(f"documents[{i}]: the query and document have at least {n_min} tokens, more than "
                                  f"the reranking context's n_ctx = {n_ctx}")
        tokens = rerank_api.format_prompt(model, req.query, doc)
        if not tokens:
            raise P.ProtocolError(f"documents[{i}]: the query and document give no tokens to score")
        if len(tokens) > n_ctx:
            raise P.ProtocolError(f"documents[{i}]: the query and document are {len(tokens)} tokens, more than the "
                                  f"reranking context's n_ctx = {n_ctx}")
        out.append(tokens)
    return out


def embedding_tokens(vocab: Vocab, n_ctx: int, inputs: list) -> list[list[int]]:
    """The tokens of each embedding input (a text, or token ids); `n_ctx` is the embedding context's."""
    return [P.check_tokens(x, vocab.n_tokens, f"input[{i}]") if isinstance(x, list)
            else embedding_input(vocab, n_ctx, x, i) for i, x in enumerate(inputs)]


def embedding_input(vocab: Vocab, n_ctx: int, text: str, i: int) -> list[int]:
    n_min = vocab.min_tokens(text)
    if n_min > n_ctx:  # refused from its length, before tokenizing (see Vocab.min_tokens)
        raise P.ProtocolError(f"input[{i}] has at least {n_min} tokens, more than the embedding context's "
                              f"n_ctx = {n_ctx}")
    return vocab.tokenize(text, add_special=True, parse_special=False)


def render_chat(template: ChatTemplate, req: P.ChatCompletionRequest) -> tuple[str, list[dict]]:
    """The chat prompt, with the tools in it, and the functions a reply may call (none for tool_choice "none",
    whose prompt still has the tools where the template takes them, as llama-server's has).

    A final assistant message is continued, not closed (llama-server's prefill_assistant, or vLLM's explicit
    continue_final_message): the prompt is the conversation before it with the generation prompt, then its
    text. Two assistant messages at the end, or continue_final_message with add_generation_prompt, are a 400."""
    if req.continue_final_message and req.add_generation_prompt:
        raise P.ProtocolError("continue_final_message and add_generation_prompt cannot both be true")
    fns = tool_calls.functions(req.tools)
    messages, pass_tools = tool_calls.prepare(template.source, req.messages, fns, req.tool_choice)
    fns = fns if req.tool_choice != "none" else []  # rendered (llama-server's prompt) but never parsed
    tools = req.tools if pass_tools else None
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant" and isinstance(last.get("content"), str) and not last.get("tool_calls"):
        if len(messages) > 1 and messages[-2].get("role") == "assistant":
            raise P.ProtocolError("messages: two assistant messages at the end; the last one is continued, so the "
                                  "one before it must be another role's")
        if len(messages) > 1:
            head = template.render(messages[:-1], True, tools, req.chat_template_kwargs)
            return head + last["content"], fns
    add = True if req.add_generation_prompt is None else req.add_generation_prompt
    return template.render(messages, add, tools, req.chat_template_kwargs), fns


def prompt_tokens(fit: PromptFit, text: str, parse_special: bool, add_special: bool = True) -> list[int]:
    """A prompt's tokens. Without --context-shift a text too long for a slot is refused from its length alone,
    before it is tokenized (a client's huge input costs no tokenizer time or cache memory: Vocab.min_tokens)."""
    n_min, n_ctx = fit.vocab.min_tokens(text), fit.n_ctx
    if n_min >= n_ctx and not fit.context_shift:
        raise exceeds_context(n_min, n_ctx, at_least=True)
    return fit.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)


def exceeds_context(n_tokens: int, n_ctx: int, at_least: bool = False) -> P.ProtocolError:
    return P.ProtocolError(f"the request exceeds the available context size ({'at least ' * at_least}{n_tokens} "
                           f"prompt tokens, n_ctx = {n_ctx}); try increasing it", 400, "exceed_context_size_error",
                           n_prompt_tokens=n_tokens, n_ctx=n_ctx)


def fit_prompt(fit: PromptFit, tokens: list[int], n_keep: int) -> list[int]:
    """A prompt that fills a slot's context is refused (exceed_context_size_error), or with --context-shift
    truncated as llama-server does: the first n_keep tokens, then the last half of the context."""
    n_ctx = fit.n_ctx
    if len(tokens) < n_ctx:
        return tokens
    if not fit.context_shift:
        raise exceeds_context(len(tokens), n_ctx)
    n_keep = max(0, min(n_keep, n_ctx // 2 - 1))
    return tokens[:n_keep] + tokens[len(tokens) - (n_ctx // 2 - n_keep):]

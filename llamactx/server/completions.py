"""The generation endpoints: POST /v1/completions, /v1/chat/completions and llama-server's /completion, streamed
(SSE) or not (tools/server: `handle_completions_impl`, server-task.cpp's to_json_* functions).

A request becomes `n` engine sequences (one per choice; they share the prompt's KV cells through the prefix
cache). Their chunks come back from the engine thread on one asyncio queue; a `Renderer` turns them into the
endpoint's JSON. A client that disconnects (mid-stream, or while its request waits) cancels its sequences, which
are never decoded again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from llamactx import chat_grammar, chat_parse, chat_sampling, tool_calls
from llamactx.api import protocol as P
from llamactx.api.responses import Choice, Renderer
from llamactx.engine import Chunk
from llamactx.engine import Sequence as EngineSequence
from llamactx.server.streams import resumable
from llamactx.server.worker import QueueFull, Request

DISCONNECT_POLL_S = 0.25


@dataclass
class LiveChoice(Choice):
    """A choice whose sequence runs on the engine thread, reached through its worker `Request`."""

    request: Request | None = None


def with_reasoning(state, req: P.ChatCompletionRequest) -> P.ChatCompletionRequest:
    """The request with the server's thinking default in its chat_template_kwargs (-rea on|off, or
    --reasoning-budget 0: enable_thinking false), unless it sets enable_thinking itself (a boolean, as
    llama-server requires); an unknown reasoning_format is a 400 naming the known ones."""
    rt = state.config.runtime
    if req.reasoning_format is not None:
        try:
            chat_parse.check_reasoning_format(req.reasoning_format)
        except chat_parse.ChatParseError as e:
            raise P.ProtocolError(str(e)) from None
    kwargs = dict(req.chat_template_kwargs or {})
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise P.ProtocolError(f"chat_template_kwargs.enable_thinking: expected a boolean, got "
                              f"{kwargs['enable_thinking']!r}")
    default = False if rt.reasoning_budget == 0 else rt.enable_thinking
    if "enable_thinking" not in kwargs and default is not None:
        kwargs["enable_thinking"] = default
    return req.model_copy(update={"chat_template_kwargs": kwargs or None})


def chat_parse_params(state, req: P.ChatCompletionRequest, fns: list[dict]) -> chat_parse.ChatParams:
    """How to parse this chat's replies (common_chat_templates_apply's parser params): the template's format,
    the generation prompt it renders for these messages, the request's (or the server's) reasoning format."""
    kwargs = req.chat_template_kwargs or {}
    messages, pass_tools = tool_calls.prepare(state.template.source, req.messages, fns)
    tools = req.tools if pass_tools else None
    continued = messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls")
    gp = "" if continued else chat_parse.generation_prompt(state.template, messages, tools, kwargs)
    params = chat_parse.chat_params(
        state.template.source, gp, tools=[{"type": "function", "function": f} for f in fns],
        reasoning_format=req.reasoning_format or state.config.runtime.reasoning_format,
        enable_thinking=kwargs.get("enable_thinking", True), parallel_tool_calls=req.parallel_tool_calls,
        tool_choice=req.tool_choice if fns else "none")
    if not chat_grammar.uses_own_format(params, req.tool_choice, fns):  # the grammar writes a bare JSON call
        params = replace(params, format="generic")
    return params


async def serve(state, http: HttpRequest, prompts: list[list[int]], gen: P.GenerationRequest,
                renderer: Renderer, reasoning_budget: tuple[int, str] | None = None) -> Response:
    """Run a request's choices on the engine; a JSON response, or an SSE stream when gen.stream.
    `reasoning_budget`: (tokens, message) of a chat's thinking budget (default: the server's)."""
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    grammar = await _grammar(state, gen)
    n_budget, message = reasoning_budget or (state.config.runtime.reasoning_budget, "")
    budget = chat_sampling.reasoning_budget(state.model.vocab, getattr(renderer, "parse", None), n_budget, message)
    choices = []
    for p_index, prompt in enumerate(prompts):
        for k in range(gen.n):
            index = p_index * gen.n + k
            grammar_k = grammar.clone() if grammar is not None else None
            sampler = state.runtime.sampler(gen.sampling_for(k), grammar_k)
            if budget is not None:  # first in the chain, as common_sampler_sample applies rbudget
                sampler.samplers.insert(0, budget.clone())
            req = Request(prompt, sampler, gen.limits, gen.options, loop, events, index=index)
            choices.append(LiveChoice(index, request=req))
    if len(choices) > state.worker.max_in_flight:  # would wait forever for room: the request's own mistake
        raise P.ProtocolError(f"n: {len(prompts)} prompt(s) x n = {gen.n} is {len(choices)} choices, more than this "
                              f"server ever holds at once (slots + --max-queue = {state.worker.max_in_flight})")
    try:
        for c in choices:
            state.worker.submit(c.request)
    except QueueFull as e:
        for c in choices:
            state.worker.cancel(c.request)
        raise P.ProtocolError(str(e), 503, "unavailable_error", headers={"Retry-After": "1"}) from None
    if gen.stream:  # with X-Conversation-Id the stream outlives its client and can be read again (streams.py)
        body = resumable(state.streams, http, _stream(state, choices, events, renderer, gen))
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await _collect(state, http, choices, events, renderer)


async def _grammar(state, gen: P.GenerationRequest):
    if gen.grammar is None:
        return None
    if gen.grammar[0] == "tool_calls":  # (chat_grammar.call_grammar's grammar, the chat's ChatParams)
        return await asyncio.to_thread(chat_grammar.grammar_sampler, state.model.vocab, *gen.grammar[1])
    return await asyncio.to_thread(state.runtime.grammar, **gen.grammar_args())  # llguidance compiles off the loop


async def _next(events: asyncio.Queue, choices: list[LiveChoice]) -> tuple[LiveChoice, list[Chunk]]:
    """The next engine event of any choice; raises the engine's refusal of a request as is."""
    index, payload, finished = await events.get()
    c = next(c for c in choices if c.index == index)
    if isinstance(payload, Exception):
        c.done = True
        raise P.ProtocolError(str(payload)) from None
    c.seq = c.request.seq
    c.add(payload, finished)
    return c, payload


async def _collect(state, http: HttpRequest, choices: list[LiveChoice], events: asyncio.Queue,
                   renderer: Renderer) -> Response:
    try:
        while not all(c.done for c in choices):
            try:
                await asyncio.wait_for(_next(events, choices), timeout=DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await http.is_disconnected():
                    return Response(status_code=499)
        _raise_errors(choices)
        return JSONResponse(renderer.response(choices))
    finally:
        _cancel_unfinished(state, choices)


def _raise_errors(choices: list[LiveChoice]) -> None:
    for c in choices:
        if c.seq is not None and c.seq.finish_reason == "error":
            raise _generation_error(c.seq)


def _generation_error(seq: EngineSequence) -> P.ProtocolError:
    """A request that could not go on: its own doing (a grammar that allows no token) is a 400, a bug a 500."""
    if seq.error_internal:
        return P.ProtocolError(seq.error or "generation failed", 500, "server_error")
    return P.ProtocolError(seq.error or "generation failed", 400)


async def _stream(state, choices: list[LiveChoice], events: asyncio.Queue, renderer: Renderer,
                  gen: P.GenerationRequest) -> AsyncIterator[bytes]:
    named = getattr(renderer, "sse_events", False)  # Anthropic's stream: "event: <type>" lines, no [DONE]

    def _sse(obj: dict[str, Any]) -> bytes:
        return _sse_bytes(obj, obj.get("type") if named else None)

    try:
        for c in choices:
            for obj in renderer.first(c):
                yield _sse(obj)
        while not all(c.done for c in choices):
            try:
                c, chunks = await _next(events, choices)
            except P.ProtocolError as e:
                yield _sse(e.body())
                return
            for ch in chunks:
                if ch.progress is not None:
                    yield _sse(renderer.progress(c, ch))
            for obj in renderer.delta(c, [ch for ch in chunks if ch.progress is None]):
                yield _sse(obj)
            if c.done:
                if c.seq.finish_reason == "error":
                    yield _sse(_generation_error(c.seq).body())
                    continue
                for obj in renderer.last(c):
                    yield _sse(obj)
        if gen.include_usage:
            usage = renderer.usage_chunk(choices)
            if usage:
                yield _sse(usage)
        if not named:
            yield b"data: [DONE]\n\n"
    finally:
        _cancel_unfinished(state, choices)


def _cancel_unfinished(state, choices: list[LiveChoice]) -> None:
    for c in choices:
        if not c.done:
            state.worker.cancel(c.request)


def _sse_bytes(obj: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"

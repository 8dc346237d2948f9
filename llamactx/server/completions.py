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
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from llamactx.engine import Chunk
from llamactx.engine import Sequence as EngineSequence
from llamactx.server import protocol as P
from llamactx.server.worker import QueueFull, Request

DISCONNECT_POLL_S = 0.25


@dataclass
class Choice:
    """One choice's state while it is generated."""

    index: int
    request: Request
    chunks: list[Chunk] = field(default_factory=list)
    text: str = ""
    done: bool = False

    @property
    def seq(self) -> EngineSequence:
        return self.request.seq  # type: ignore[return-value]


class Renderer:
    """The JSON of one endpoint, for a whole response or for stream chunks."""

    object_name = "text_completion"

    def __init__(self, state, prompt_text: str, gen: P.GenerationRequest, echo: bool = False):
        self.state, self.gen, self.echo = state, gen, echo
        self.prompt_text = prompt_text
        self.id = P.new_id("cmpl")
        self.created = P.now()
        self.model = state.alias
        self.vocab = state.model.vocab

    def head(self) -> dict[str, Any]:
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
                "system_fingerprint": "llamactx"}

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        out = self.head()
        out["choices"] = [self.choice(c) for c in choices]
        out["usage"] = P.usage([c.seq for c in choices])
        out["timings"] = P.timings(choices[0].seq)
        return out

    def choice(self, c: Choice) -> dict[str, Any]:
        text = (self.prompt_text if self.echo else "") + c.text
        lp = P.completion_logprobs(self.vocab, c.chunks, len(self.prompt_text) if self.echo else 0)
        return {"text": text, "index": c.index, "logprobs": lp if self.gen.n_probs >= 0 else None,
                "finish_reason": P.finish_reason(c.seq)}

    def first(self, c: Choice) -> list[dict[str, Any]]:
        """Chunks to send before any token of choice `c`."""
        if not self.echo:
            return []
        return [self._delta(c, self.prompt_text, [], None)]

    def delta(self, c: Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        text = "".join(ch.text for ch in chunks)
        return [self._delta(c, text, chunks, None)] if text else []

    def _delta(self, c: Choice, text: str, chunks: list[Chunk], finish: str | None) -> dict[str, Any]:
        lp = P.completion_logprobs(self.vocab, chunks, 0) if self.gen.n_probs >= 0 and chunks else None
        return {**self.head(), "choices": [{"text": text, "index": c.index, "logprobs": lp, "finish_reason": finish}]}

    def last(self, c: Choice) -> list[dict[str, Any]]:
        out = self._delta(c, "", [], P.finish_reason(c.seq))
        out["timings"] = P.timings(c.seq)
        return [out]

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        return {**self.head(), "choices": [], "usage": P.usage([c.seq for c in choices])}


class ChatRenderer(Renderer):
    object_name = "chat.completion.chunk"

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        out = super().response(choices)
        out["object"] = "chat.completion"
        return out

    def choice(self, c: Choice) -> dict[str, Any]:
        out = {"index": c.index, "message": {"role": "assistant", "content": c.text},
               "finish_reason": P.finish_reason(c.seq)}
        out["logprobs"] = P.chat_logprobs(self.vocab, c.chunks) if self.gen.n_probs >= 0 else None
        return out

    def first(self, c: Choice) -> list[dict[str, Any]]:
        return [self._chat(c, {"role": "assistant", "content": ""}, None, [])]

    def delta(self, c: Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        text = "".join(ch.text for ch in chunks)
        return [self._chat(c, {"content": text}, None, chunks)] if text else []

    def _chat(self, c: Choice, delta: dict, finish: str | None, chunks: list[Chunk]) -> dict[str, Any]:
        lp = P.chat_logprobs(self.vocab, chunks) if self.gen.n_probs >= 0 and chunks else None
        return {**self.head(), "choices": [{"index": c.index, "delta": delta, "logprobs": lp,
                                            "finish_reason": finish}]}

    def last(self, c: Choice) -> list[dict[str, Any]]:
        out = self._chat(c, {}, P.finish_reason(c.seq), [])
        out["timings"] = P.timings(c.seq)
        return [out]


class NativeRenderer(Renderer):
    """llama-server's own /completion: `content`, `stop`, `stop_type`, `timings`..."""

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        c = choices[0]
        return self._final(c)

    def _final(self, c: Choice) -> dict[str, Any]:
        seq = c.seq
        stop_type = {"stop": "word" if seq.stream.stop_word else "eos", "length": "limit"}.get(
            seq.finish_reason or "", "none")
        return {"index": c.index, "content": c.text, "tokens": list(seq.output), "id_slot": seq.seq_id,
                "stop": True, "model": self.model, "tokens_predicted": seq.n_output,
                "tokens_evaluated": seq.n_prompt, "prompt": self.prompt_text, "has_new_line": "\n" in c.text,
                "truncated": False, "stop_type": stop_type, "stopping_word": seq.stream.stop_word or "",
                "tokens_cached": seq.n_past, "timings": P.timings(seq)}

    def first(self, c: Choice) -> list[dict[str, Any]]:
        return []

    def delta(self, c: Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        text = "".join(ch.text for ch in chunks)
        toks = [ch.token for ch in chunks if ch.token is not None]
        return [{"index": c.index, "content": text, "tokens": toks, "stop": False}] if text or toks else []

    def last(self, c: Choice) -> list[dict[str, Any]]:
        out = self._final(c)
        out["content"] = ""
        return [out]

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        return {}


async def serve(state, http: HttpRequest, prompts: list[list[int]], gen: P.GenerationRequest,
                renderer: Renderer) -> Response:
    """Run a request's choices on the engine; a JSON response, or an SSE stream when gen.stream."""
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    grammar = await _grammar(state, gen)
    choices = []
    for p_index, prompt in enumerate(prompts):
        for k in range(gen.n):
            index = p_index * gen.n + k
            sampler = gen.chain(state.model, grammar.clone() if grammar is not None else None, choice=k)
            req = Request(prompt, sampler, gen.limits, {"id_slot": gen.id_slot, "cache_prompt": gen.cache_prompt,
                                                        "n_probs": gen.n_probs}, loop, events, index=index)
            choices.append(Choice(index, req))
    try:
        for c in choices:
            state.worker.submit(c.request)
    except QueueFull as e:
        for c in choices:
            state.worker.cancel(c.request)
        raise P.ProtocolError(str(e), 503, "unavailable_error", headers={"Retry-After": "1"}) from None
    if gen.stream:
        return StreamingResponse(_stream(state, choices, events, renderer, gen), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await _collect(state, http, choices, events, renderer)


async def _grammar(state, gen: P.GenerationRequest):
    if gen.grammar is None:
        return None
    from llamactx.sampling.grammar import GrammarSampler

    kind, source = gen.grammar
    build = GrammarSampler.from_gbnf if kind == "gbnf" else GrammarSampler.from_json_schema
    return await asyncio.to_thread(build, state.model.vocab, source)  # llguidance compiles off the event loop


async def _next(events: asyncio.Queue, choices: list[Choice]) -> tuple[Choice, list[Chunk]]:
    """The next engine event of any choice; raises the engine's refusal of a request as is."""
    index, payload, finished = await events.get()
    c = next(c for c in choices if c.index == index)
    if isinstance(payload, Exception):
        c.done = True
        raise P.ProtocolError(str(payload)) from None
    c.done = finished
    c.chunks.extend(payload)
    c.text += "".join(ch.text for ch in payload)
    return c, payload


async def _collect(state, http: HttpRequest, choices: list[Choice], events: asyncio.Queue,
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


def _raise_errors(choices: list[Choice]) -> None:
    for c in choices:
        if c.seq is not None and c.seq.finish_reason == "error":
            raise _generation_error(c.seq)


def _generation_error(seq: EngineSequence) -> P.ProtocolError:
    """A request that could not go on: its own doing (a grammar that allows no token) is a 400, a bug a 500."""
    if seq.error_internal:
        return P.ProtocolError(seq.error or "generation failed", 500, "server_error")
    return P.ProtocolError(seq.error or "generation failed", 400)


async def _stream(state, choices: list[Choice], events: asyncio.Queue, renderer: Renderer,
                  gen: P.GenerationRequest) -> AsyncIterator[bytes]:
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
            for obj in renderer.delta(c, chunks):
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
        yield b"data: [DONE]\n\n"
    finally:
        _cancel_unfinished(state, choices)


def _cancel_unfinished(state, choices: list[Choice]) -> None:
    for c in choices:
        if not c.done:
            state.worker.cancel(c.request)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"

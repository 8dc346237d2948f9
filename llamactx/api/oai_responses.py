"""OpenAI's Responses API over the chat pipeline (llama-server's /v1/responses: server-common.cpp
`convert_responses_to_chatcmpl` and server-task.cpp's to_json_oaicompat_resp*).

A Responses request (`input` text or items, `instructions`, `max_output_tokens`, function tools) becomes a chat
request; its answer is a `response` object with a message output item, or the Responses stream's events
(response.created ... response.completed, each with its sequence_number).
"""

from __future__ import annotations

from typing import Any

from llamactx.api import protocol as P
from llamactx.api.responses import ChatRenderer, Choice
from llamactx.engine import Chunk


def _content(value, field: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise P.ProtocolError(f"{field} must be a string or a list of content parts")
    parts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append(str(part.get("text", "")))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise P.ProtocolError(f"{field}[{i}]: {kind} is not supported by this server (no multimodal projector)")
        else:
            raise P.ProtocolError(f"{field}[{i}]: content part type {kind!r} is not supported")
    return "".join(parts)


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat request body for a Responses request body. ProtocolError names the first bad field."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": _content(body["instructions"], "instructions")})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise P.ProtocolError("input: a string or a non-empty array of input items is required")
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in ("system", "developer", "user", "assistant"):
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _content(item.get("content", ""), f"input[{i}].content")})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": str(item.get("call_id", "")), "type": "function",
                "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments", "{}"))}}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                             "content": _content(item.get("output", ""), f"input[{i}].output")})
        else:
            raise P.ProtocolError(f"input[{i}]: an item of type {kind!r} (role {item.get('role')!r}) is not "
                                  "supported" if isinstance(item, dict) else f"input[{i}] must be an object")
    chat: dict[str, Any] = {"messages": messages, "stream": bool(body.get("stream", False))}
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("model", "model"), ("timings_per_token", "timings_per_token"),
                     ("return_progress", "return_progress")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    for key in P.LLAMA_SERVER_FIELDS:  # llama-server's own request fields pass through
        if key in body:
            chat[key] = body[key]
    if body.get("tools"):
        tools = []
        for i, t in enumerate(body["tools"]):
            if not isinstance(t, dict) or t.get("type") != "function":
                raise P.ProtocolError(f"tools[{i}]: only function tools are supported")
            tools.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                          if k in t}})
        chat["tools"] = tools
        if isinstance(body.get("tool_choice"), str):
            chat["tool_choice"] = body["tool_choice"]
    return chat


class ResponsesRenderer(ChatRenderer):
    """A chat's choice as a `response`, or as the Responses stream."""

    sse_events = True  # "event: <type>" lines, and no [DONE]

    def __init__(self, *args, n_prompt: int = 0, **kw):
        super().__init__(*args, **kw)
        self.id = P.new_id("resp")
        self.msg_id = P.new_id("msg")
        self.n_prompt = n_prompt
        self.seq_no = 0
        self.rs_id = P.new_id("rs")  # the reasoning item's id (when the model thinks)

    def _event(self, kind: str, **fields) -> dict[str, Any]:
        self.seq_no += 1
        return {"type": kind, "sequence_number": self.seq_no - 1, **fields}

    def _response(self, c: Choice | None, status: str) -> dict[str, Any]:
        output, usage = [], None
        if c is not None and status == "completed":
            message, _ = self._message(c)
            if message.get("reasoning_content"):  # a reasoning item first, as llama-server's
                output.append({"type": "reasoning", "id": self.rs_id, "summary": [], "encrypted_content": "",
                               "status": "completed", "content": [{"type": "reasoning_text",
                                                                   "text": message["reasoning_content"]}]})
            if message.get("content") or not message.get("tool_calls"):
                output.append(self._item(message.get("content") or "", "completed"))
            for call in message.get("tool_calls", []):
                output.append({"type": "function_call", "id": P.new_id("fc"), "call_id": call["id"],
                               "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                               "status": "completed"})
            n_in, n_out = c.seq.n_prompt, c.seq.n_output
            usage = {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
                     "input_tokens_details": {"cached_tokens": c.seq.timings.cached_n},
                     "output_tokens_details": {"reasoning_tokens": 0}}
        sp = self.gen.sampling
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "usage": usage, "error": None, "incomplete_details": None,
                "instructions": None, "metadata": {}, "parallel_tool_calls": False, "tool_choice": "auto",
                "tools": [], "temperature": sp.temperature, "top_p": sp.top_p,
                "max_output_tokens": self.gen.limits.max_tokens if self.gen.limits.max_tokens >= 0 else None}

    def _item(self, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant", "content": content}

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        out = self._response(choices[0], "completed")
        out["timings"] = P.timings(choices[0].seq)
        return out

    def first(self, c: Choice) -> list[dict[str, Any]]:
        pending = self._response(None, "in_progress")
        return [self._event("response.created", response=pending),
                self._event("response.in_progress", response=pending),
                self._event("response.output_item.added", output_index=0, item=self._item("", "in_progress")),
                self._event("response.content_part.added", item_id=self.msg_id, output_index=0, content_index=0,
                            part={"type": "output_text", "text": "", "annotations": []})]

    def progress(self, c: Choice, chunk: Chunk) -> dict[str, Any]:
        return self._event("response.in_progress", response=self._response(None, "in_progress"),
                           **P.progress(chunk))

    def delta(self, c: Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        """The parsed reply's deltas as they come: reasoning_text and output_text deltas (tool calls are
        items of the completed response)."""
        out = self._text_events(super().delta(c, chunks))
        if out and self.gen.timings_per_token and c.seq is not None:
            out[-1]["timings"] = P.timings(c.seq)
        return out

    def _text_events(self, chat_chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for chunk in chat_chunks:
            delta = chunk["choices"][0]["delta"]
            if delta.get("reasoning_content"):
                out.append(self._event("response.reasoning_text.delta", item_id=self.rs_id, output_index=0,
                                       content_index=0, delta=delta["reasoning_content"]))
            if delta.get("content") and not self.tools:
                out.append(self._event("response.output_text.delta", item_id=self.msg_id, output_index=0,
                                       content_index=0, delta=delta["content"], logprobs=[]))
        return out

    def last(self, c: Choice) -> list[dict[str, Any]]:
        pending = self._text_events([ch for ch in super().last(c) if ch["choices"][0]["delta"]])
        message, _ = self._message(c)
        text = message.get("content") or ""
        part = {"type": "output_text", "text": text, "annotations": []}
        done = self._response(c, "completed")
        out = [self._event("response.output_text.done", item_id=self.msg_id, output_index=0, content_index=0,
                           text=text, logprobs=[]),
               self._event("response.content_part.done", item_id=self.msg_id, output_index=0, content_index=0,
                           part=part),
               self._event("response.output_item.done", output_index=0,
                           item=next((i for i in done["output"] if i["type"] != "reasoning"),
                                     self._item(text, "completed")))]
        end = self._event("response.completed", response=done)
        end["timings"] = P.timings(c.seq)
        return [*pending, *out, end]

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        return {}


__all__ = ["ResponsesRenderer", "to_chat"]

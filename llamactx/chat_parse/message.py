"""The parsed assistant message and its streaming diffs (common/chat.h: common_chat_msg, common_chat_tool_call,
common_chat_msg_diff::compute_diffs, common_chat_msg::to_json_oaicompat).

A parser returns a `ChatMsg`; `to_oai` gives the OpenAI assistant message. While a reply streams, the text so
far is parsed again after every token and `diffs(previous, current)` says what is new: reasoning and content
appended, a tool call that appeared (its name and id first) and argument text appended to the last call, as
llama-server sends them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text as the model wrote it (or as built from its XML parameters)
    id: str = ""  # the model's own id ("" when the format has none; the front end assigns one)


@dataclass(slots=True)
class ChatMsg:
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def to_oai(self, ids: list[str] | None = None) -> dict[str, Any]:
        """The OpenAI assistant message: `content` None when empty and there are calls (OpenAI's shape), a call
        without an id gets `ids[i]` or a fresh "call_..." id."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [{"id": call_id(c, i, ids), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for i, c in enumerate(self.tool_calls)]
        return out


def call_id(call: ToolCall, index: int, ids: list[str] | None) -> str:
    if call.id:
        return call.id
    if ids is not None and index < len(ids):
        return ids[index]
    return new_call_id()


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class MsgDiff:
    """What one re-parse added (common_chat_msg_diff): text deltas, or one tool call's delta at `tool_index`."""

    reasoning_content_delta: str = ""
    content_delta: str = ""
    tool_index: int = -1
    name: str = ""
    id: str = ""
    arguments_delta: str = ""


def _suffix(previous: str, current: str) -> str:
    """What `current` adds to `previous` (string_diff); a changed prefix sends nothing (it cannot be unsent)."""
    return current[len(previous):] if current.startswith(previous) else ""


def diffs(prev: ChatMsg, cur: ChatMsg) -> list[MsgDiff]:
    """The deltas from `prev` to `cur` (common_chat_msg_diff::compute_diffs): reasoning, content, then the last
    known call's argument growth and each new call (its name and id with its arguments so far, in one delta, as
    llama-server streams a call)."""
    out = []
    if cur.reasoning_content != prev.reasoning_content:
        d = _suffix(prev.reasoning_content, cur.reasoning_content)
        if d:
            out.append(MsgDiff(reasoning_content_delta=d))
    if cur.content != prev.content:
        d = _suffix(prev.content, cur.content)
        if d:
            out.append(MsgDiff(content_delta=d))
    if prev.tool_calls and len(cur.tool_calls) >= len(prev.tool_calls):
        i = len(prev.tool_calls) - 1
        p, c = prev.tool_calls[i], cur.tool_calls[i]
        d = _suffix(p.arguments, c.arguments)
        if d or (c.name and c.name != p.name):
            out.append(MsgDiff(tool_index=i, name=c.name if c.name != p.name else "",
                               id=c.id if c.id != p.id else "", arguments_delta=d))
    for i in range(len(prev.tool_calls), len(cur.tool_calls)):
        c = cur.tool_calls[i]
        out.append(MsgDiff(tool_index=i, name=c.name, id=c.id, arguments_delta=c.arguments))
    return out

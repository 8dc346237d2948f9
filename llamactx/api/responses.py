"""The JSON of a generation, whole or streamed, for the OpenAI API and llama-server's /completion
(tools/server/server-task.cpp: to_json_oaicompat, to_json_oaicompat_chat(_stream), to_json_non_oaicompat).

A `Renderer` turns the `Choice`s of one request (engine sequences and their chunks) into a response, or into
stream chunks: `first` before any token, `delta` per batch of chunks, `last` when a choice finishes, and a
`usage_chunk`. Both the HTTP server and the `Llama` API use these, so the shapes exist once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from llamactx import chat_parse
from llamactx.api import protocol as P
from llamactx.chat_parse.message import new_call_id
from llamactx.engine import Chunk
from llamactx.engine import Sequence as EngineSequence
from llamactx.version import __version__

FINGERPRINT = f"b{__version__}-llamactx"  # llama-server's "b<build>-<commit>"


@dataclass
class Choice:
    """One choice's state while it is generated: its sequence, its chunks so far, and whether it is done."""

    index: int
    seq: EngineSequence | None = None
    chunks: list[Chunk] = field(default_factory=list)
    text: str = ""
    done: bool = False

    def add(self, chunks: list[Chunk], finished: bool) -> None:
        self.chunks.extend(chunks)
        self.text += "".join(ch.text for ch in chunks)
        self.done = finished


class Renderer:
    """The JSON of one endpoint, for a whole response or for stream chunks."""

    object_name = "text_completion"

    def __init__(self, model_name: str, vocab, prompt_text: str, gen: P.GenerationRequest, echo: bool = False):
        self.gen, self.echo = gen, echo
        self.prompt_text = prompt_text
        self.id = P.new_id("cmpl")
        self.created = P.now()
        self.model = model_name
        self.vocab = vocab

    def head(self) -> dict[str, Any]:
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        out = self.head()
        out["choices"] = [self.choice(c) for c in choices]
        out["usage"] = P.usage([c.seq for c in choices])
        out["timings"] = P.timings(choices[0].seq)
        if self.gen.verbose:  # llama-server's debug echo of what the model saw
            out["__verbose"] = {"prompt": self.prompt_text}
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
        return {**self.head(), "choices": [], "usage": P.usage([c.seq for c in choices]),
                "timings": P.timings(choices[0].seq)}

    def progress(self, c: Choice, chunk: Chunk) -> dict[str, Any]:
        """A stream chunk with a prompt-progress report (return_progress)."""
        return {**self.head(), "choices": [], **P.progress(chunk)}


class ChatRenderer(Renderer):
    """OpenAI chat. With `parse` (llamactx.chat_parse's ChatParams) the reply is parsed as llama-server parses
    it: thinking into `reasoning_content`, tool calls into `tool_calls`; a stream sends what each token adds to
    the parsed message (reasoning, content, then each call's name and id, then its arguments), as llama-server's
    common_chat_msg_diff deltas; a call is sent once complete). Without it the text is the content, as is."""

    object_name = "chat.completion.chunk"

    def __init__(self, *args, tools: bool = False, parse: chat_parse.ChatParams | None = None, **kw):
        super().__init__(*args, **kw)
        self.tools = tools
        self.parse = parse
        self._sent: dict[int, chat_parse.ChatMsg] = {}  # per choice: the message streamed so far
        self._ids: dict[int, list[str]] = {}  # per choice: its calls' ids, kept from the first delta

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        out = super().response(choices)
        out["object"] = "chat.completion"
        return out

    def _parsed(self, c: Choice) -> chat_parse.ChatMsg:
        if self.parse is None:
            return chat_parse.ChatMsg(c.text)
        return chat_parse.parse(self.parse, c.text)

    def _message(self, c: Choice) -> tuple[dict[str, Any], str]:
        """The assistant message and the finish reason ("tool_calls" when the model called tools)."""
        msg = self._parsed(c)
        ids = self._ids.setdefault(c.index, [])
        ids += [call.id or new_call_id() for call in msg.tool_calls[len(ids):]]
        message = msg.to_oai(ids)
        if not msg.tool_calls and message["content"] is None:
            message["content"] = ""
        return message, "tool_calls" if msg.tool_calls else P.finish_reason(c.seq)

    def choice(self, c: Choice) -> dict[str, Any]:
        message, finish = self._message(c)
        out = {"index": c.index, "message": message, "finish_reason": finish}
        out["logprobs"] = P.chat_logprobs(self.vocab, c.chunks) if self.gen.n_probs >= 0 else None
        return out

    def first(self, c: Choice) -> list[dict[str, Any]]:
        return [self._chat(c, {"role": "assistant", "content": None}, None, [])]  # llama-server: null

    def delta(self, c: Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        if self.parse is None:
            text = "".join(ch.text for ch in chunks)
            deltas = [{"content": text}] if text else []
        else:
            deltas = self._deltas(c, chat_parse.parse_partial(self.parse, c.text))
        out = [self._chat(c, d, None, chunks if i == 0 else []) for i, d in enumerate(deltas)]
        if out and self.gen.timings_per_token and c.seq is not None:
            out[-1]["timings"] = P.timings(c.seq)
        return out

    def _deltas(self, c: Choice, cur: chat_parse.ChatMsg) -> list[dict[str, Any]]:
        """The stream deltas from what choice `c` sent so far to `cur` (server_chat_msg_diff_to_json_oaicompat);
        a new call sends its id and name with its arguments so far, later deltas the arguments added."""
        prev = self._sent.get(c.index, chat_parse.ChatMsg())
        self._sent[c.index] = cur
        ids = self._ids.setdefault(c.index, [])
        out: list[dict[str, Any]] = []
        for d in chat_parse.diffs(prev, cur):
            if d.reasoning_content_delta:
                out.append({"reasoning_content": d.reasoning_content_delta})
            if d.content_delta:
                out.append({"content": d.content_delta})
            if d.tool_index < 0:
                continue
            call: dict[str, Any] = {"index": d.tool_index}
            if d.tool_index >= len(ids):  # a new call: its id, name and arguments so far (llama-server's diff)
                ids.append(d.id or new_call_id())
                out.append({"tool_calls": [{**call, "id": ids[-1], "type": "function",
                                            "function": {"name": d.name, "arguments": d.arguments_delta}}]})
            elif d.arguments_delta:
                out.append({"tool_calls": [{**call, "function": {"arguments": d.arguments_delta}}]})
        return out

    def _chat(self, c: Choice, delta: dict, finish: str | None, chunks: list[Chunk]) -> dict[str, Any]:
        lp = P.chat_logprobs(self.vocab, chunks) if self.gen.n_probs >= 0 and chunks else None
        return {**self.head(), "choices": [{"index": c.index, "delta": delta, "logprobs": lp,
                                            "finish_reason": finish}]}

    def last(self, c: Choice) -> list[dict[str, Any]]:
        out = []
        if self.parse is not None:
            out = [self._chat(c, d, None, []) for d in self._deltas(c, self._parsed(c))]
        _, finish = self._message(c)
        end = self._chat(c, {}, finish, [])
        end["timings"] = P.timings(c.seq)
        return [*out, end]


class NativeRenderer(Renderer):
    """llama-server's own /completion: `content`, `stop`, `stop_type`, `timings`, `completion_probabilities` (with
    n_probs > 0; after the sampler chain, as probabilities, with post_sampling_probs), `generation_settings`; one
    object per prompt (a list for several); `response_fields` keeps only those fields, named by "a/b" paths."""

    def __init__(self, *args, response_fields: list[str] | None = None, **kw):
        super().__init__(*args, **kw)
        self.fields = response_fields or []

    def response(self, choices: list[Choice]) -> dict[str, Any] | list[dict[str, Any]]:
        out = [self._pick(self._final(c)) for c in choices]
        return out[0] if len(out) == 1 else out

    def _pick(self, obj: dict[str, Any]) -> dict[str, Any]:
        if not self.fields:
            return obj
        out = {}
        for path in self.fields:
            value: Any = obj
            for key in path.split("/"):
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                out[path] = value
        return out

    def _final(self, c: Choice) -> dict[str, Any]:
        seq = c.seq
        stop_type = {"stop": "word" if seq.stream.stop_word else "eos", "length": "limit"}.get(
            seq.finish_reason or "", "none")
        out = {"index": c.index, "content": c.text, "tokens": list(seq.output) if self.gen.return_tokens else [],
               "id_slot": seq.seq_id,
               "stop": True, "model": self.model, "tokens_predicted": seq.n_output,
               "tokens_evaluated": seq.n_prompt, "generation_settings": self._settings(), "prompt": self.prompt_text,
               "has_new_line": "\n" in c.text, "truncated": False, "stop_type": stop_type,
               "stopping_word": seq.stream.stop_word or "", "tokens_cached": seq.n_past, "timings": P.timings(seq)}
        if self.gen.n_probs > 0:
            out["completion_probabilities"] = self._probs(c.chunks)
        return out

    def _settings(self) -> dict[str, Any]:
        sp, lim = self.gen.sampling, self.gen.limits
        return {"n_predict": lim.max_tokens, "seed": sp.seed, "temperature": sp.temperature, "top_k": sp.top_k,
                "top_p": sp.top_p, "min_p": sp.min_p, "n_probs": max(self.gen.n_probs, 0),
                "stream": self.gen.stream, "stop": list(lim.stop), "ignore_eos": lim.ignore_eos,
                # llama-server's list form; -inf (a ban, and ignore_eos's end-of-generation tokens) is null
                "logit_bias": [{"token": t, "bias": None if math.isinf(b) else b} for t, b in sp.logit_bias]}

    def _probs(self, chunks: list[Chunk]) -> list[dict[str, Any]]:
        """llama-server's completion_probabilities: per sampled token its id, text, bytes and logprob, and the
        n_probs most likely tokens the same way."""
        value, top = ("prob", "top_probs") if self.gen.post_sampling_probs else ("logprob", "top_logprobs")

        def entry(token: int, v: float) -> dict[str, Any]:
            piece = self.vocab.token_to_piece(token)
            return {"id": token, "token": piece.decode("utf-8", "replace"), "bytes": list(piece), value: v}

        return [{**entry(ch.token, ch.logprob), top: [entry(t, v) for t, v in ch.top_logprobs]}
                for ch in chunks if ch.token is not None and ch.logprob is not None]

    def first(self, c: Choice) -> list[dict[str, Any]]:
        return []

    def progress(self, c: Choice, chunk: Chunk) -> dict[str, Any]:
        return {"index": c.index, "content": "", "tokens": [], "stop": False, **P.progress(chunk)}

    def delta(self, c: Choice, chunks: list[Chunk]) -> list[dict[str, Any]]:
        text = "".join(ch.text for ch in chunks)
        toks = [ch.token for ch in chunks if ch.token is not None]
        if not (text or toks):
            return []
        out = {"index": c.index, "content": text, "tokens": toks if self.gen.return_tokens else [], "stop": False}
        if self.gen.n_probs > 0:
            out["completion_probabilities"] = self._probs(chunks)
        return [out]

    def last(self, c: Choice) -> list[dict[str, Any]]:
        out = self._final(c)
        out["content"] = ""
        return [out]

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        return {}

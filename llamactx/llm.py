"""LLM: the high-level API (one model, one conversation), in the spirit of llama-cpp-python's `Llama`.

    llm = LLM()                                   # the embedded default model (SmolLM2-135M-Instruct)
    llm.complete("1, 2, 3,", max_tokens=8, temperature=0).text
    llm.chat([{"role": "user", "content": "Hi"}]).text
    for chunk in llm.complete("Once upon a time", stream=True): print(chunk.text, end="")
    llm.embed(["a sentence", "another"])          # (2, n_embd), mean-pooled

An LLM is a one-slot user of the `Engine`: the same decode loop as the server. `chat` keeps the conversation's KV
between turns: the next turn's prompt starts with the previous one, so only the new messages are decoded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from llamactx import chat_parse, chat_sampling
from llamactx.chat_request import grammar_sampler, prepare_chat
from llamactx.chat_template import ChatTemplate
from llamactx.cparams import ContextParams
from llamactx.engine import Chunk, Completion, GenerationError, Limits, RequestOptions
from llamactx.model import Model
from llamactx.runtime import Runtime, RuntimeParams
from llamactx.sampling import SamplerChain, SamplingParams
from llamactx.tool_calls import ToolCallError

_SAMPLING_FIELDS = set(SamplingParams.__dataclass_fields__)
_RUNTIME_FIELDS = set(RuntimeParams.__dataclass_fields__) - {"model", "lora", "vocab_only", "context"}


class LLM:
    """A model with one conversation. `model`: None (the embedded default), an embedded name ("smollm2",
    "gemma3"), a GGUF path, or a loaded `Model` (shared, never copied). `lora`: LoRA adapters, each a path or a
    (path, scale) pair (`--lora` / `--lora-scaled`; llamactx.lora.load_adapters). Other keyword arguments are
    `RuntimeParams` fields (n_ctx 4096, chat_template, pooling, sampling defaults...) or other `ContextParams`
    fields."""

    def __init__(self, model: Model | str | Path | None = None, lora=(), **context_params: Any):
        params = RuntimeParams(model=None if isinstance(model, Model) else model, lora=tuple(lora),
                               **_runtime_fields(context_params))
        self._start(Runtime(params, model if isinstance(model, Model) else None))

    @classmethod
    def from_params(cls, params: RuntimeParams, model: Model | None = None) -> LLM:
        """An LLM of a front end's RuntimeParams (`run` and `chat` make theirs from their flags); one slot."""
        llm = cls.__new__(cls)
        llm._start(Runtime(replace(params, n_slots=1), model))
        return llm

    def _start(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.model, self.lora, self.engine = runtime.model, runtime.lora, runtime.engine
        self.ctx = self.engine.ctx
        self.result: Completion | None = None  # the last completion (also after a stream ends)
        self.chat_params: chat_parse.ChatParams | None = None  # how the last chat turn's reply is parsed

    @property
    def template(self) -> ChatTemplate:
        return self.runtime.template

    @property
    def tokens(self) -> list[int]:
        """The tokens the conversation's sequence holds in memory (what the next prompt can reuse)."""
        return self.engine.slot_tokens(0)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.model.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def sampler(self, grammar: str | None = None, json_schema: Mapping | str | None = None,
                **sampling: Any) -> SamplerChain:
        """The sampler chain for these options (SamplingParams names; `temperature` 0 = greedy)."""
        rt = self.runtime
        return rt.sampler(self._sampling(sampling), rt.grammar(grammar, json_schema))

    def _sampling(self, sampling: dict[str, Any]) -> SamplingParams:
        unknown = set(sampling) - _SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        if "seed" in sampling and sampling["seed"] is None:
            del sampling["seed"]
        return self.runtime.sampling(**sampling)

    def complete(self, prompt: str | Sequence[int], max_tokens: int = 128, stop: Sequence[str] | str | None = None,
                 stream: bool = False, grammar: str | None = None, json_schema: Mapping | str | None = None,
                 context_shift: bool = False, n_keep: int = 0, n_probs: int = -1, **sampling: Any
                 ) -> Completion | Iterator[Chunk]:
        """Continue `prompt` (text: tokenized with add_special and parse_special). Returns a `Completion`
        (text, tokens, finish_reason, timings), or with `stream=True` an iterator of `Chunk`s (the `Completion`
        is then in `llm.result` once the iterator ends). `n_probs` >= 0 gives each Chunk its token's logprob and
        the `n_probs` most likely tokens (-1: none). Raises GenerationError if sampling fails (a grammar
        dead end)."""
        chain = self.sampler(grammar, json_schema, **sampling)
        return self._complete(prompt, chain, max_tokens, stop, stream, context_shift, n_keep, n_probs)

    def _complete(self, prompt: str | Sequence[int], chain: SamplerChain, max_tokens: int,
                  stop: Sequence[str] | str | None, stream: bool, context_shift: bool, n_keep: int, n_probs: int
                  ) -> Completion | Iterator[Chunk]:
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        limits = Limits(max_tokens, stops, context_shift=context_shift, n_keep=n_keep)
        seq = self.engine.add_request(tokens, chain, limits, RequestOptions(n_probs=n_probs))
        chunks = self._run(seq)
        if stream:
            return chunks
        for _ in chunks:
            pass
        return self.result  # type: ignore[return-value]

    def _run(self, seq) -> Iterator[Chunk]:
        try:
            yield from self.engine.generate(seq)
        finally:
            self.result = seq.result()
        if seq.finish_reason == "error":
            raise GenerationError(seq.error or "generation failed")

    def chat(self, messages: Sequence[Mapping[str, Any]], max_tokens: int = 256,
             tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = "auto",
             parallel_tool_calls: bool = False, stop: Sequence[str] | str | None = None, stream: bool = False,
             grammar: str | None = None, json_schema: Mapping | str | None = None, context_shift: bool = False,
             n_keep: int = 0, n_probs: int = -1, **sampling: Any) -> Completion | Iterator[Chunk]:
        """Answer the conversation `messages` with the model's chat template; same options as `complete`, plus
        OpenAI `tools` / `tool_choice` / `parallel_tool_calls`. The turn is prepared as llama-server prepares it
        (llamactx.chat_request: the runtime's reasoning_format, enable_thinking, reasoning_budget; the tool-call
        grammar, lazy for "auto"); `llm.message(text)` then parses the reply into the OpenAI message (thinking in
        `reasoning_content`, `tool_calls`), `llm.chat_params` is how. The KV cache of the previous turn is reused
        for the common prefix. Raises ToolCallError for malformed tools / tool_choice."""
        rt = self.runtime.params
        thinking = False if rt.reasoning_budget == 0 else rt.enable_thinking
        setup = prepare_chat(self.template, messages, tools, tool_choice, parallel_tool_calls, rt.reasoning_format,
                             None if thinking is None else {"enable_thinking": thinking})
        params, constraint = self._sampling(sampling), self.runtime.grammar(grammar, json_schema)
        if setup.call_required and constraint is not None:
            raise ToolCallError("tool_choice: a required tool call cannot be combined with grammar / json_schema")
        if setup.grammar is not None and constraint is None:  # as llama-server: lazy for "auto"
            constraint = grammar_sampler(self.model.vocab, setup.grammar, setup.parse)
        chain = self.runtime.sampler(params, constraint)
        budget = chat_sampling.reasoning_budget(self.model.vocab, setup.parse, rt.reasoning_budget)
        if budget is not None:  # first in the chain, as common_sampler_sample applies rbudget
            chain.samplers.insert(0, budget)
        self.chat_params = setup.parse
        return self._complete(setup.prompt, chain, max_tokens, stop, stream, context_shift, n_keep, n_probs)

    def message(self, text: str | None = None, partial: bool = False) -> dict[str, Any]:
        """The OpenAI assistant message of the last `chat` reply (`text`: the reply, default the last result's),
        parsed as llama-server parses it; `partial` for a reply still being generated."""
        if self.chat_params is None:
            raise RuntimeError("message(): no chat turn yet; call chat() first")
        text = self.result.text if text is None and self.result is not None else text or ""
        parse = chat_parse.parse_partial if partial else chat_parse.parse
        return parse(self.chat_params, text).to_oai()

    def embed(self, texts: Sequence[str] | str) -> np.ndarray:
        """Mean-pooled, L2-normalised embeddings of `texts` (their final hidden states). -> (n, n_embd) float32"""
        if isinstance(texts, str):
            texts = [texts]
        return self.runtime.embedder.embed([self.tokenize(t, parse_special=False) for t in texts])

    def save_session(self, path: str | Path) -> int:
        """Save the conversation's KV state and tokens to a session file; returns the number of tokens."""
        tokens = self.tokens
        self.ctx.state_seq_save_file(path, 0, tokens)
        return len(tokens)

    def load_session(self, path: str | Path) -> list[int]:
        """Replace the conversation's KV state with a session file's (StateError, with nothing changed, if it
        does not fit); returns its tokens."""
        tokens = self.ctx.state_seq_load_file(path, 0)
        self.engine.set_slot_tokens(0, tokens)
        return tokens

    def reset(self) -> None:
        """Forget the conversation (the KV cache of the sequence)."""
        self.engine.clear_slot(0)



def _runtime_fields(context_params: dict[str, Any]) -> dict[str, Any]:
    """LLM's keyword arguments (ContextParams names) as RuntimeParams fields; TypeError for an unknown one."""
    fields = {k: v for k, v in context_params.items() if k in _RUNTIME_FIELDS}
    other = {k: v for k, v in context_params.items() if k not in _RUNTIME_FIELDS}
    unknown = set(other) - set(ContextParams.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown LLM option(s): {', '.join(sorted(unknown))}")
    return {**fields, "context": other} if other else fields

"""`Llama`: llama-cpp-python's high-level class on llamactx, same names, arguments and return shapes
(llama_cpp/llama.py), so that `from llamactx import Llama` replaces `from llama_cpp import Llama`. (The `llama`
architecture is llamactx.models.llama.)

    llm = Llama(model_path="model.gguf", n_ctx=2048, seed=1337)
    out = llm("Q: Name the planets. A:", max_tokens=32, stop=["Q:"])        # OpenAI text_completion dict
    llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])  # chat.completion dict
    for chunk in llm.create_completion("Once", stream=True): ...              # stream chunks
    llm.create_embedding("text")["data"][0]["embedding"]

It is a one-slot user of the engine (the decode loop the server runs), and its dicts come from the renderers
the server uses too (api/responses.py): one implementation of the OpenAI shapes. Options are validated as the
server validates a request (api/protocol.py): a bad value raises a ProtocolError (a ValueError) naming it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamactx import tool_calls
from llamactx.api import protocol as P
from llamactx.api.responses import ChatRenderer, Choice, Renderer
from llamactx.engine import GenerationError
from llamactx.engine.speculative import NgramParams, SpecParams
from llamactx.runtime import Runtime, RuntimeParams
from llamactx.sampling.rng import LLAMA_DEFAULT_SEED
from llamactx.sampling.samplers import SamplerBase

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]
StoppingCriteria = Callable[[np.ndarray, np.ndarray], bool]


class LogitsProcessorList(list):
    """Callables (input_ids, scores) -> scores applied to the logits before sampling, in order."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Callables (input_ids, logits) -> bool; generation stops ("stop") when any says True."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any(criterion(input_ids, logits) for criterion in self)


class LlamaGrammar:
    """A grammar for `grammar=`: GBNF text (`from_string`, `from_file`) or a JSON schema (`from_json_schema`)."""

    def __init__(self, kind: str, source: str):
        self.kind, self.source = kind, source

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls("gbnf", grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike, verbose: bool = True) -> LlamaGrammar:
        with open(file, encoding="utf-8") as f:
            return cls("gbnf", f.read())

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> LlamaGrammar:
        return cls("json_schema", json_schema)


class LlamaPromptLookupDecoding:
    """llama-cpp-python's prompt lookup decoding (llama_cpp/llama_speculative.py), for `Llama(draft_model=...)`:
    drafts of `num_pred_tokens` tokens found after an earlier occurrence of the last `max_ngram_size` tokens. Runs
    as the engine's ngram-simple drafter (llamactx.engine.speculative): outputs are those without it."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens

    def spec_params(self) -> SpecParams:
        return SpecParams(types=("ngram-simple",), ngram_simple=NgramParams(size_n=self.max_ngram_size,
                                                                            size_m=self.num_pred_tokens))


@dataclass
class LlamaState:
    """What `save_state` keeps: the context's state blob, the tokens it holds and the seed."""

    input_ids: np.ndarray
    llama_state: bytes
    llama_state_size: int
    seed: int


class _ProcessorSampler(SamplerBase):
    """The first sampler of a chain with logits processors: the whole row of logits goes through them, with the
    tokens so far (prompt + accepted) as input_ids."""

    def __init__(self, processors: LogitsProcessorList, prompt: Sequence[int]):
        self.processors, self.prompt, self.history = processors, list(prompt), list(prompt)

    @property
    def name(self) -> str:
        return "logits-processor"

    def apply(self, cur) -> None:
        order = np.argsort(cur.ids)  # (n,) the candidates by token id: processors index scores by token
        scores = np.array(cur.logits[order], np.float32)
        out = np.asarray(self.processors(np.asarray(self.history, np.intc), scores), np.float32)
        cur.logits[order] = out

    def accept(self, token: int) -> None:
        self.history.append(int(token))

    def reset(self) -> None:
        self.history = list(self.prompt)


class Llama:
    """A model and a one-slot engine, with llama-cpp-python's API. `model_path` may also be an embedded model
    name ("smollm2", "gemma3"). `lora_path` / `lora_scale`: a LoRA adapter in llama.cpp's GGUF format
    (llamactx.lora); `lora_base` is accepted and ignored (the adapter applies to this model's own weights, as
    llama-cpp-python does since its GGUF adapters). `draft_model`: a LlamaPromptLookupDecoding (speculative decoding
    from the prompt; outputs unchanged). GPU and memory-mapping options have no effect here."""

    def __init__(self, model_path: str, *, seed: int = LLAMA_DEFAULT_SEED, n_ctx: int = 512, n_batch: int = 512,
                 n_ubatch: int = 512, n_threads: int | None = None, n_threads_batch: int | None = None,
                 embedding: bool = False, flash_attn: bool = False, chat_format: str | None = None,
                 type_k: str | None = None, type_v: str | None = None, vocab_only: bool = False,
                 lora_path: str | None = None, lora_scale: float = 1.0, swa_full: bool = True, verbose: bool = True,
                 draft_model: LlamaPromptLookupDecoding | None = None, **ignored: Any):
        self.model_path = str(model_path)
        self.verbose = verbose
        self.lora_path, self.lora_scale = lora_path, lora_scale
        # swa_full: llama-cpp-python leaves llama_context_default_params' full-size SWA cache on
        params = RuntimeParams(model=model_path, vocab_only=vocab_only, n_ctx=n_ctx, n_batch=n_batch,
                               n_ubatch=n_ubatch, flash_attn=flash_attn, swa_full=swa_full, n_threads=n_threads or 2,
                               n_threads_batch=n_threads_batch or n_threads or 2, type_k=type_k or "f16",
                               type_v=type_v or "f16", lora=((lora_path, lora_scale),) if lora_path else (),
                               chat_template=chat_format, embd_n_ctx=max(n_ctx, 512),
                               spec=draft_model.spec_params() if draft_model is not None else None)
        self._runtime = Runtime(params)
        self._model, self._engine = self._runtime.model, self._runtime.engine
        self.metadata = {k: str(v) for k, v in self._model.meta.items() if isinstance(v, (str, int, float, bool))}
        self._template = self._runtime.template
        if embedding:
            self._runtime.embedder  # noqa: B018 -- built now, as llama-cpp-python's embedding=True context is
        self.set_seed(seed)

    # -- vocabulary -------------------------------------------------------------------------------------------

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._model.vocab.tokenize(text.decode("utf-8", "replace"), add_special=add_bos,
                                          parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        return b"".join(self._model.vocab.token_to_piece(int(t), special=special) for t in tokens)

    def token_bos(self) -> int:
        return self._model.vocab.bos

    def token_eos(self) -> int:
        return self._model.vocab.eos

    def n_vocab(self) -> int:
        return self._model.hparams.n_vocab

    def n_embd(self) -> int:
        return self._model.hparams.n_embd

    def n_ctx(self) -> int:
        return self._engine.ctx.params.n_ctx if self._engine else 0

    # -- state ------------------------------------------------------------------------------------------------

    def set_seed(self, seed: int) -> None:
        """The seed of the next completion that gives none (each such completion then draws the next seed)."""
        self._seed = random.randrange(2**32 - 1) if seed in (-1, LLAMA_DEFAULT_SEED) else int(seed)

    def reset(self) -> None:
        """Forget the cached prompt."""
        self._engine.clear_slot(0)

    def save_state(self) -> LlamaState:
        tokens = np.array(self._engine.slot_tokens(0), np.intc)
        blob = self._engine.ctx.state_get_data()
        return LlamaState(tokens, blob, len(blob), self._seed)

    def load_state(self, state: LlamaState) -> None:
        """Restore a `save_state`; StateError (nothing changed) if it does not fit this context."""
        self._engine.ctx.state_set_data(state.llama_state)
        self._engine.set_slot_tokens(0, [int(t) for t in state.input_ids])
        self._seed = state.seed

    # -- completion -------------------------------------------------------------------------------------------

    def __call__(self, prompt: str | Sequence[int], **kwargs: Any):
        return self.create_completion(prompt, **kwargs)

    def create_completion(self, prompt: str | Sequence[int], suffix: str | None = None,
                          max_tokens: int | None = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, logprobs: int | None = None,
                          echo: bool = False, stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                          stopping_criteria: StoppingCriteriaList | None = None,
                          logits_processor: LogitsProcessorList | None = None,
                          grammar: LlamaGrammar | str | None = None,
                          logit_bias: Mapping[int, float] | None = None) -> dict | Iterator[dict]:
        """A `text_completion` dict, or with `stream` an iterator of chunks. Raises ProtocolError (a
        ValueError) for an invalid option, naming it."""
        if suffix:
            raise P.ProtocolError("suffix: infill is not supported")
        body = self._body(max_tokens, temperature, top_p, min_p, typical_p, frequency_penalty, presence_penalty,
                          repeat_penalty, top_k, stop, seed, mirostat_mode, mirostat_tau, mirostat_eta, grammar,
                          logit_bias)
        req = P.validate(P.CompletionRequest, {**body, "prompt": prompt if isinstance(prompt, str) else list(prompt),
                                               "echo": echo, "logprobs": logprobs})
        tokens = self.tokenize(prompt.encode("utf-8"), add_bos=True, special=True) if isinstance(prompt, str) \
            else P.check_tokens(list(prompt), self.n_vocab(), "prompt")
        gen = P.GenerationRequest.from_fields(req, self._model.vocab, logprobs if logprobs is not None else -1)
        text = prompt if isinstance(prompt, str) else self._model.vocab.detokenize(tokens)
        renderer = Renderer(model or self.model_path, self._model.vocab, text, gen, echo=echo)
        run = self._run(tokens, gen, renderer, logits_processor, stopping_criteria)
        return _chunks(run) if stream else _last(run)

    def create_chat_completion(self, messages: list[dict[str, Any]], functions: list | None = None,
                               function_call: Any = None, tools: list | None = None, tool_choice: Any = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               typical_p: float = 1.0, stream: bool = False, stop: str | list[str] | None = None,
                               seed: int | None = None, response_format: dict | None = None,
                               max_tokens: int | None = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, tfs_z: float = 1.0,
                               mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                               model: str | None = None, logits_processor: LogitsProcessorList | None = None,
                               grammar: LlamaGrammar | str | None = None,
                               logit_bias: Mapping[int, float] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None) -> dict | Iterator[dict]:
        """A `chat.completion` dict (message with `tool_calls` when the model calls a tool), or with `stream` an
        iterator of `chat.completion.chunk`s."""
        if functions and not tools:  # the legacy form of tools
            tools = [{"type": "function", "function": f} for f in functions]
            tool_choice = {"type": "function", "function": function_call} if isinstance(function_call, dict) \
                else function_call
        body = self._body(max_tokens, temperature, top_p, min_p, typical_p, frequency_penalty, presence_penalty,
                          repeat_penalty, top_k, stop, seed, mirostat_mode, mirostat_tau, mirostat_eta, grammar,
                          logit_bias)
        fmt = dict(response_format) if response_format else None
        req = P.validate(P.ChatCompletionRequest, {**body, "messages": messages, "tools": tools,
                                                   "tool_choice": tool_choice, "response_format": fmt,
                                                   "logprobs": bool(logprobs), "top_logprobs": top_logprobs})
        fns = tool_calls.functions(req.tools) if req.tool_choice != "none" else []
        msgs, pass_tools = tool_calls.prepare(self._template.source, req.messages, fns)
        prompt = self._template.render(msgs, True, req.tools if pass_tools else None)
        tokens = self.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        gen = P.GenerationRequest.from_fields(req, self._model.vocab, (top_logprobs or 0) if logprobs else -1)
        required = tool_calls.required_function(req.tool_choice, fns)
        if required:
            gen.grammar = ("json_schema", tool_calls.call_schema(required))
        renderer = ChatRenderer(model or self.model_path, self._model.vocab, prompt, gen, tools=bool(fns))
        run = self._run(tokens, gen, renderer, logits_processor, None)
        return _chunks(run) if stream else _last(run)

    def _body(self, max_tokens, temperature, top_p, min_p, typical_p, frequency_penalty, presence_penalty,
              repeat_penalty, top_k, stop, seed, mirostat_mode, mirostat_tau, mirostat_eta, grammar,
              logit_bias) -> dict[str, Any]:
        """llama-cpp-python's arguments as a request body for the server's validation."""
        if seed is None:  # each completion without a seed takes the next one (reproducible after load_state)
            seed, self._seed = self._seed, random.Random(self._seed).randrange(2**32 - 1)
        body: dict[str, Any] = {
            "max_tokens": -1 if max_tokens is None or max_tokens <= 0 else max_tokens, "temperature": temperature,
            "top_p": top_p, "min_p": min_p, "typical_p": typical_p, "frequency_penalty": frequency_penalty,
            "presence_penalty": presence_penalty, "repeat_penalty": repeat_penalty, "top_k": top_k, "stop": stop,
            "seed": seed, "mirostat": mirostat_mode, "mirostat_tau": mirostat_tau, "mirostat_eta": mirostat_eta,
            "logit_bias": {str(k): v for k, v in logit_bias.items()} if logit_bias else None,
        }
        if isinstance(grammar, LlamaGrammar):
            body["grammar" if grammar.kind == "gbnf" else "json_schema"] = grammar.source if grammar.kind == "gbnf" \
                else _json_object(grammar.source)
        elif isinstance(grammar, str):
            body["grammar"] = grammar
        return body

    def _run(self, tokens: list[int], gen: P.GenerationRequest, renderer: Renderer,
             processors: LogitsProcessorList | None, criteria: StoppingCriteriaList | None) -> Iterator[dict]:
        """Generate on the engine; yields stream chunks, and the whole response last (marked by `_last`)."""
        chain = self._runtime.sampler(gen.sampling_for(), self._runtime.grammar(**gen.grammar_args()))
        if processors:
            chain.samplers.insert(0, _ProcessorSampler(LogitsProcessorList(processors), tokens))
        seq = self._engine.add_request(tokens, chain, gen.limits, n_probs=gen.n_probs)
        choice = Choice(0, seq)
        yield from renderer.first(choice)
        try:
            for chunks in self._steps(seq, criteria):
                choice.add(chunks, seq.is_finished)
                yield from renderer.delta(choice, chunks)
        finally:
            self._engine.abort(seq)
        if seq.finish_reason == "error":
            raise GenerationError(seq.error or "generation failed")
        choice.done = True
        yield from renderer.last(choice)
        yield _Final(renderer.response([choice]))

    def _steps(self, seq, criteria: StoppingCriteriaList | None) -> Iterator[list]:
        """The sequence's chunks after each engine step; a stopping criterion that says True ends it ("stop")."""
        for chunk in self._engine.generate(seq):
            if criteria and chunk.token is not None and not seq.is_finished and criteria(
                    np.asarray(seq.tokens, np.intc), np.array(self._engine.ctx.get_logits_ith(-1))):
                yield [chunk, *seq.finish("stop")]
                return
            yield [chunk]

    # -- embeddings ----------------------------------------------------------------------------------------------

    def embed(self, input: str | list[str], normalize: bool = True, truncate: bool = True,
              return_count: bool = False):
        """Mean-pooled, normalised embeddings: one list of floats for a string, a list of them for a list."""
        texts = [input] if isinstance(input, str) else list(input)
        tokens = [self._model.vocab.tokenize(t, add_special=True, parse_special=False) for t in texts]
        embedder = self._runtime.embedder
        if truncate:
            tokens = [t[: embedder.n_ctx] for t in tokens]
        vecs = embedder.embed(tokens)
        out = [v.tolist() for v in vecs]
        out = out[0] if isinstance(input, str) else out
        return (out, sum(len(t) for t in tokens)) if return_count else out

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        vecs, n = self.embed(input, return_count=True)
        vecs = [vecs] if isinstance(input, str) else vecs
        return {"object": "list", "model": model or self.model_path,
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vecs)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}


class _Final(dict):
    """The whole response, yielded after the stream chunks."""


def _chunks(run: Iterator[dict]) -> Iterator[dict]:
    for item in run:
        if not isinstance(item, _Final):
            yield item


def _last(run: Iterator[dict]) -> dict:
    final = None
    for item in run:
        if isinstance(item, _Final):
            final = dict(item)
    return final  # type: ignore[return-value]


def _json_object(source: str | Mapping) -> Any:
    import json

    return json.loads(source) if isinstance(source, str) else source

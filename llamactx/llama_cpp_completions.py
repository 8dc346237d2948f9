"""The completion side of llama-cpp-python's `Llama` (llama_cpp/llama.py's create_completion and
create_chat_completion), as one-slot requests of the engine (the decode loop the server runs) rendered by the
server's renderers (api/responses.py). llamactx.llama_cpp_python's `Llama` inherits it; the token-level API, the
state and the caches live there, and slot 0 of the engine always holds what `input_ids[:n_tokens]` names, so a
completion reuses what `eval` left in memory and the other way round.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from llamactx.api import protocol as P
from llamactx.api.responses import ChatRenderer, Choice, Renderer
from llamactx.chat_request import grammar_sampler, prepare_chat
from llamactx.engine import GenerationError, RequestOptions
from llamactx.llama_cpp_options import LlamaGrammar, LogitsProcessorList, StoppingCriteriaList
from llamactx.sampling.samplers import SamplerBase


class LogitsProcessorSampler(SamplerBase):
    """The first sampler of a chain with logits processors: the whole row of logits, in token-id order, goes
    through them with `input_ids()` (the tokens so far) as their first argument."""

    def __init__(self, processors: LogitsProcessorList, input_ids: Callable[[], np.ndarray]):
        self.processors, self.input_ids = processors, input_ids

    @property
    def name(self) -> str:
        return "logits-processor"

    def apply(self, cur) -> None:
        order = np.argsort(cur.ids)  # (n,) the candidates by token id: processors index scores by token
        scores = np.array(cur.logits[order], np.float32)  # (n,)
        cur.logits[order] = np.asarray(self.processors(self.input_ids(), scores), np.float32)


class _History:
    """prompt + accepted tokens, for the processors of an engine request."""

    def __init__(self, prompt: Sequence[int]):
        self.tokens = list(prompt)

    def __call__(self) -> np.ndarray:
        return np.asarray(self.tokens, np.intc)


class Completions:
    """create_completion / create_chat_completion for `Llama` (which holds the engine, the runtime, the model,
    input_ids / n_tokens, the cache and save_state / load_state these methods use)."""

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
        body = self._body(max_tokens, temperature, top_p, min_p, typical_p, frequency_penalty, presence_penalty,
                          repeat_penalty, top_k, stop, seed, mirostat_mode, mirostat_tau, mirostat_eta, grammar,
                          logit_bias)
        req = P.validate(P.CompletionRequest, {**body, "prompt": prompt if isinstance(prompt, str) else list(prompt),
                                               "echo": echo, "logprobs": logprobs})
        tokens = self.tokenize(prompt.encode("utf-8"), add_bos=True, special=True) if isinstance(prompt, str) \
            else P.check_tokens([int(t) for t in prompt], self.n_vocab(), "prompt")
        gen = P.GenerationRequest.from_fields(req, self._model.vocab, logprobs if logprobs is not None else -1)
        text = prompt if isinstance(prompt, str) else self._model.vocab.detokenize(tokens)
        after = ""
        if suffix is not None:
            tokens, after = self._infill_tokens(prompt, tokens, suffix)
        renderer = Renderer(model or self.model_path, self._model.vocab, text, gen, echo=echo)
        run = self._run(tokens, gen, renderer, logits_processor, stopping_criteria)
        return _chunks(run) if stream else _with_suffix(_last(run), after)

    def _infill_tokens(self, prompt: str | Sequence[int], tokens: list[int], suffix: str) -> tuple[list[int], str]:
        """llama-cpp-python's fill-in-the-middle prompt, [BOS] PRE prompt SUF suffix MID (SUF suffix PRE prompt
        MID with spm_infill), with the model's FIM tokens (llama_vocab_fim_pre / fim_suf / fim_mid, which
        llama-cpp-python 0.3.36 means to call: it passes token 0 for each, a TODO in its code). A model without
        them completes the prompt alone and the suffix is appended to the text, as llama-cpp-python does for
        negative ids. Returns (the prompt's tokens, the text to append)."""
        vocab = self._model.vocab
        pre, suf, mid = vocab.fim_pre, vocab.fim_suf, vocab.fim_mid
        if min(pre, suf, mid) < 0:
            return tokens, suffix
        body = self.tokenize(prompt.encode("utf-8"), add_bos=False, special=False) if isinstance(prompt, str) \
            else tokens
        tail = self.tokenize(suffix.encode("utf-8"), add_bos=False, special=False)
        if vocab.add_space_prefix and suffix:  # no space before the suffix (llama-cpp-python's "☺" prefix)
            mark = self.tokenize("☺".encode(), add_bos=False, special=False)
            tail = self.tokenize(("☺" + suffix).encode("utf-8"), add_bos=False, special=False)[len(mark):]
        bos = [vocab.bos] if vocab.add_bos and vocab.bos >= 0 else []
        eos = [vocab.eos] if vocab.add_eos and vocab.eos >= 0 else []
        first, second = ([suf, *tail], [pre, *body]) if self.spm_infill else ([pre, *body], [suf, *tail])
        return [*bos, *first, *second, mid, *eos], ""

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
                               top_logprobs: int | None = None, reasoning_format: str | None = None
                               ) -> dict | Iterator[dict]:
        """A `chat.completion` dict, or with `stream` an iterator of `chat.completion.chunk`s. The reply is parsed
        as llama-server parses it for the model's template family (llamactx.chat_request): thinking into
        `reasoning_content`, calls into `tool_calls` (streamed as deltas too), and `tool_choice` ("auto",
        "required", "none", a named function) constrains the calls with the server's grammar (lazy for Hermes
        formats). `reasoning_format` (llamactx's addition; llama-server's values) defaults to "auto", or to
        "none" when the Llama was made with an explicit `chat_format` (llama-cpp-python's behaviour: the text as
        the model wrote it). With a `chat_handler`, that handler answers (llama-cpp-python's
        LlamaChatCompletionHandler protocol: called with llama=self and these keywords)."""
        if self.chat_handler is not None:
            args = dict(locals())
            del args["self"], args["reasoning_format"]
            return self.chat_handler(llama=self, **args)
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
        if reasoning_format is None:
            reasoning_format = "none" if self.chat_format is not None else "auto"
        setup = prepare_chat(self._runtime.template, req.messages, req.tools, req.tool_choice,
                             bool(req.parallel_tool_calls), reasoning_format)
        tokens = self.tokenize(setup.prompt.encode("utf-8"), add_bos=True, special=True)
        gen = P.GenerationRequest.from_fields(req, self._model.vocab, (top_logprobs or 0) if logprobs else -1)
        if setup.grammar is not None and gen.grammar is None:  # as llama-server: lazy for "auto"
            gen.grammar = ("tool_calls", (setup.grammar, setup.parse))
        elif setup.call_required:
            raise P.ProtocolError("tool_choice: a required tool call cannot be combined with grammar / "
                                  "response_format")
        renderer = ChatRenderer(model or self.model_path, self._model.vocab, setup.prompt, gen,
                                tools=bool(setup.fns), parse=setup.parse)
        run = self._run(tokens, gen, renderer, logits_processor, None)
        return _chunks(run) if stream else _last(run)

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any):
        """create_chat_completion's answer as the `openai` package's ChatCompletion (or a generator of
        ChatCompletionChunk with stream=True). Needs `openai` installed."""
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        out = self.create_chat_completion(*args, **kwargs)
        if kwargs.get("stream"):
            return (ChatCompletionChunk(**chunk) for chunk in out)
        return ChatCompletion(**out)

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
            "repeat_last_n": self.last_n_tokens_size,
            "logit_bias": {str(k): v for k, v in logit_bias.items()} if logit_bias else None,
        }
        if isinstance(grammar, LlamaGrammar):
            body.update(grammar.request_fields())
        elif isinstance(grammar, str):
            body["grammar"] = grammar
        return body

    def _run(self, tokens: list[int], gen: P.GenerationRequest, renderer: Renderer,
             processors: LogitsProcessorList | None, criteria: StoppingCriteriaList | None) -> Iterator[dict]:
        """Generate on the engine's slot 0, after the longest cached state (set_cache); yields stream chunks, and
        the whole response last (marked by `_Final`)."""
        self._load_cached(tokens)
        self._hand_to_engine()
        if gen.grammar is not None and gen.grammar[0] == "tool_calls":  # (ToolGrammar, the chat's ChatParams)
            grammar = grammar_sampler(self._model.vocab, *gen.grammar[1])
        else:
            grammar = self._runtime.grammar(**gen.grammar_args())
        chain = self._runtime.sampler(gen.sampling_for(), grammar)
        history = _History(tokens)
        if processors:
            chain.samplers.insert(0, LogitsProcessorSampler(LogitsProcessorList(processors), history))
        seq = self._engine.add_request(tokens, chain, gen.limits, RequestOptions(id_slot=0, n_probs=gen.n_probs))
        choice = Choice(0, seq)
        yield from renderer.first(choice)
        try:
            for chunks in self._steps(seq, criteria, history):
                choice.add(chunks, seq.is_finished)
                yield from renderer.delta(choice, chunks)
        finally:
            self._engine.abort(seq)
            self._take_from_engine()
        if seq.finish_reason == "error":
            raise GenerationError(seq.error or "generation failed")
        if self.cache is not None:
            self._log("Llama._create_completion: cache save")
            self.cache[list(seq.tokens)] = self.save_state()
        choice.done = True
        yield from renderer.last(choice)
        yield _Final(renderer.response([choice]))

    def _load_cached(self, tokens: list[int]) -> None:
        """Load the cache's state for the longest prefix of `tokens` when it is longer than what is evaluated."""
        if self.cache is None:
            return
        try:
            item = self.cache[tokens]
        except KeyError:
            self._log("Llama._create_completion: cache miss")
            return
        have = self.longest_token_prefix(self._input_ids.tolist(), tokens)
        if self.longest_token_prefix(item.input_ids[: item.n_tokens].tolist(), tokens) > have:
            self.load_state(item)
            self._log("Llama._create_completion: cache hit")

    def _hand_to_engine(self) -> None:
        """Slot 0 holds exactly input_ids[:n_tokens]: trim what memory holds past them (a memory that cannot be
        trimmed starts empty)."""
        ctx = self._context()
        if not self._ctx.kv_cache_seq_rm(0, self.n_tokens, -1):
            ctx.memory.clear(data=True)
            self.n_tokens = 0
        self._engine.set_slot_tokens(0, self._input_ids.tolist())

    def _take_from_engine(self) -> None:
        held = self._engine.slot_tokens(0)  # (what the request decoded: its last sampled token is not)
        self.input_ids[: len(held)] = held
        self.n_tokens, self._requires_eval = len(held), True

    def _steps(self, seq, criteria: StoppingCriteriaList | None, history: _History) -> Iterator[list]:
        """The sequence's chunks after each engine step; a stopping criterion that says True ends it ("stop")."""
        for chunk in self._engine.generate(seq):
            if chunk.token is not None:
                history.tokens.append(int(chunk.token))
            if criteria and chunk.token is not None and not seq.is_finished and criteria(
                    np.asarray(seq.tokens, np.intc), np.array(self._engine.ctx.get_logits_ith(-1))):
                yield [chunk, *seq.finish("stop")]
                return
            yield [chunk]


class _Final(dict):
    """The whole response, yielded after the stream chunks."""


def _chunks(run: Iterator[dict]) -> Iterator[dict]:
    for item in run:
        if not isinstance(item, _Final):
            yield item


def _with_suffix(response: dict, after: str) -> dict:
    if after:
        response["choices"][0]["text"] += after
    return response


def _last(run: Iterator[dict]) -> dict:
    final = None
    for item in run:
        if isinstance(item, _Final):
            final = dict(item)
    return final  # type: ignore[return-value]

"""LLM: the high-level API (one model, one context, one conversation), in the spirit of llama-cpp-python's `Llama`.

    llm = LLM()                                   # the embedded default model (SmolLM2-135M-Instruct)
    llm.complete("1, 2, 3,", max_tokens=8, temperature=0).text
    llm.chat([{"role": "user", "content": "Hi"}]).text
    for chunk in llm.complete("Once upon a time", stream=True): print(chunk.text, end="")
    llm.embed(["a sentence", "another"])          # (2, n_embd), mean-pooled

`chat` keeps the conversation's KV between turns: the next turn's prompt starts with the previous one, so only the
new messages are decoded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llamactx.batch import Batch
from llamactx.chat_template import ChatTemplate
from llamactx.context import Context
from llamactx.cparams import ContextParams
from llamactx.embedded import resolve_model_path
from llamactx.generation import Chunk, Completion, Generation
from llamactx.model import Model
from llamactx.sampling import SamplerChain
from llamactx.sampling.params import SamplingParams

_SAMPLING_FIELDS = set(SamplingParams.__dataclass_fields__)


class LLM:
    """A model with one context. `model`: None (the embedded default), an embedded name ("smollm2", "gemma3"), a
    GGUF path, or a loaded `Model` (shared, never copied). Other keyword arguments are `ContextParams` fields
    (default n_ctx 4096)."""

    def __init__(self, model: Model | str | Path | None = None, **context_params: Any):
        self.model = model if isinstance(model, Model) else Model.load(resolve_model_path(model))
        context_params.setdefault("n_ctx", 4096)
        self.ctx = Context(self.model, ContextParams(**context_params))
        self.generation = Generation(self.ctx)
        self._template: ChatTemplate | None = None
        self._embed_ctx: Context | None = None

    @property
    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = ChatTemplate.from_model(self.model)
        return self._template

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.model.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def sampler(self, grammar: str | None = None, json_schema: Mapping | str | None = None,
                **sampling: Any) -> SamplerChain:
        """The sampler chain for these options (SamplingParams names; `temperature` 0 = greedy)."""
        unknown = set(sampling) - _SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        if "seed" in sampling and sampling["seed"] is None:
            del sampling["seed"]
        params = SamplingParams(**sampling)
        constraint = _grammar(self.model.vocab, grammar, json_schema)
        return SamplerChain.default(params, self.model.hparams.n_vocab, self.model.vocab,
                                    n_ctx=self.ctx.params.n_ctx_seq, n_ctx_train=self.model.hparams.n_ctx_train,
                                    grammar=constraint)

    def complete(self, prompt: str | Sequence[int], max_tokens: int = 128, stop: Sequence[str] | str | None = None,
                 stream: bool = False, grammar: str | None = None, json_schema: Mapping | str | None = None,
                 context_shift: bool = False, n_keep: int = 0, **sampling: Any) -> Completion | Iterator[Chunk]:
        """Continue `prompt` (text: tokenized with add_special and parse_special). Returns a `Completion`
        (text, tokens, finish_reason, timings), or with `stream=True` an iterator of `Chunk`s (the `Completion`
        is then in `llm.generation.result` once the iterator ends)."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        chain = self.sampler(grammar, json_schema, **sampling)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        chunks = self.generation.generate(tokens, chain, max_tokens, stops, context_shift, n_keep)
        if stream:
            return chunks
        for _ in chunks:
            pass
        return self.generation.result  # type: ignore[return-value]

    def chat(self, messages: Sequence[Mapping[str, Any]], max_tokens: int = 256, **options: Any
             ) -> Completion | Iterator[Chunk]:
        """Answer the conversation `messages` with the model's chat template; same options as `complete`. The
        KV cache of the previous turn is reused for the common prefix."""
        prompt = self.template.render(messages, add_generation_prompt=True)
        return self.complete(prompt, max_tokens=max_tokens, **options)

    def embed(self, texts: Sequence[str] | str) -> np.ndarray:
        """Mean-pooled, L2-normalised embeddings of `texts` (their final hidden states). -> (n, n_embd) float32"""
        if isinstance(texts, str):
            texts = [texts]
        if self._embed_ctx is None:
            self._embed_ctx = Context(self.model, ContextParams(n_ctx=self.ctx.params.n_ctx, embeddings=True,
                                                                pooling_type="mean"))
        ctx = self._embed_ctx
        out = np.zeros((len(texts), self.model.hparams.n_embd), np.float32)
        for i, text in enumerate(texts):
            tokens = self.tokenize(text, parse_special=False)
            ctx.memory.clear(data=False)
            batch = Batch(len(tokens))
            for p, t in enumerate(tokens):
                batch.add(t, p, (0,), True)
            if ctx.decode(batch) != 0:
                raise RuntimeError(f"embed: text {i} does not fit the context ({len(tokens)} tokens)")
            vec = ctx.get_embeddings_seq(0)
            out[i] = vec / max(float(np.linalg.norm(vec)), 1e-12)
        return out

    def reset(self) -> None:
        """Forget the conversation (the KV cache of the sequence)."""
        self.generation.reset()


def _grammar(vocab, grammar: str | None, json_schema: Mapping | str | None):
    if grammar is None and json_schema is None:
        return None
    from llamactx.sampling.grammar import GrammarSampler

    if grammar is not None and json_schema is not None:
        raise ValueError("give either grammar or json_schema, not both")
    if grammar is not None:
        return GrammarSampler.from_gbnf(vocab, grammar)
    schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
    return GrammarSampler.from_json_schema(vocab, schema)

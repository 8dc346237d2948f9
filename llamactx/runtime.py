"""The runtime every front end stands on: one parameters object and the one place that builds from it (llama.cpp's
`common_params` and `common_init_from_params`, common/common.h).

    rt = Runtime(RuntimeParams(model="smollm2", n_ctx=4096, n_slots=4))
    seq = rt.engine.add_request(rt.model.vocab.tokenize("Hi"), rt.sampler(SamplingParams(temperature=0)))

`llamactx serve` (server/), `LLM` (llm.py), `Llama` (llama_cpp_python.py) and `run` / `chat` (cli/) each fill a
`RuntimeParams` from their own spelling of the options (flags, keyword arguments) and ask a `Runtime` for the
model, its LoRA adapters, the engine, the chat template, the embedder, grammars and sampler chains. A sampler chain
is built for the slot's real context size, which `repeat_last_n = -1` and `dry_penalty_last_n = -1` mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llamactx.chat_spans import MessageDelimiters
from llamactx.chat_template import ChatTemplate
from llamactx.embedded import resolve_model_path
from llamactx.embedding import Embedder
from llamactx.engine import Engine
from llamactx.engine.session_tier import SessionParams
from llamactx.engine.speculative import SpecParams
from llamactx.lora import load_adapters
from llamactx.model import Model
from llamactx.sampling import SamplerChain, SamplingParams


@dataclass(frozen=True)
class RuntimeParams:
    """What a front end was asked for: the model, its adapters, the context and its slots (llama.cpp's flag
    names in comments). `sampling` holds the SamplingParams fields a request falls back to."""

    model: str | None = None  # -m: a GGUF path or an embedded model name (None: the embedded default)
    vocab_only: bool = False  # only the vocabulary: no weights, no engine (llama_model_params.vocab_only)
    lora: tuple[tuple[Any, float], ...] = ()  # --lora / --lora-scaled: (path or LoraAdapter, scale)
    n_ctx: int = 4096  # -c: the KV pool the slots share
    n_slots: int = 1  # -np
    kv_unified: bool = True  # -kvu: a slot may use all of -c; off: each slot gets -c / -np
    n_batch: int = 2048  # -b
    n_ubatch: int = 512  # -ub
    n_threads: int = 2  # -t
    n_threads_batch: int = 0  # -tb (0: = -t)
    type_k: str = "f16"  # -ctk
    type_v: str = "f16"  # -ctv
    flash_attn: str | bool = "auto"  # -fa on|off|auto
    swa_full: bool = False  # --swa-full
    chat_template: str | None = None  # --chat-template NAME|JINJA: instead of the model's
    # --reasoning-format, -rea on|off|auto (None: auto, the template's default), --reasoning-budget (0: no thinking)
    reasoning_format: str = "auto"
    enable_thinking: bool | None = None
    reasoning_budget: int = -1
    pooling: str | None = None  # --pooling: the embedder's (None: the model's pooling_type, else mean)
    embd_n_ctx: int | None = None  # the embedder's context (None: n_ctx)
    sampling: Mapping[str, Any] = field(default_factory=dict)  # --temp, --seed ...: SamplingParams defaults
    context: Mapping[str, Any] = field(default_factory=dict)  # other ContextParams fields (--rope-freq-base ...)
    spec: SpecParams | None = None  # --spec-type ...: speculative decoding (engine/speculative.py); None: off
    n_ctx_checkpoints: int = 8  # -ctxcp: context checkpoints per slot (engine/checkpoints.py); 0: off
    checkpoint_min_step: int = 0  # -cms: least spacing of mid-prompt checkpoints, in tokens
    # --session-ram, --session-dir, --session-disk: evicted slots' states in RAM, then on disk
    # (engine/session_tier.py); None: off
    session: SessionParams | None = None

    def context_params(self) -> dict[str, Any]:
        """The ContextParams fields of the engine's context (n_ctx and the slots aside)."""
        return dict(n_batch=self.n_batch, n_ubatch=self.n_ubatch, n_threads=self.n_threads,
                    n_threads_batch=self.n_threads_batch or self.n_threads, type_k=self.type_k, type_v=self.type_v,
                    flash_attn=self.flash_attn, swa_full=self.swa_full, kv_unified=self.kv_unified, **self.context)


class Runtime:
    """A loaded model with its adapters and engine, per `params`. `model`: an already loaded `Model` to share
    (never copied) instead of loading `params.model`. The chat template and the embedder are built on first
    use."""

    def __init__(self, params: RuntimeParams, model: Model | None = None):
        self.params = params
        self.model = model or Model.load(resolve_model_path(params.model), vocab_only=params.vocab_only)
        self.lora = () if params.vocab_only else load_adapters(self.model, params.lora)  # (LoraAdapter, scale)
        self._template: ChatTemplate | None = None
        # checkpoints at user-message starts follow the template the prompts are rendered with: --chat-template's
        # when given (else the engine reads the model's own on first use)
        delimiters = (MessageDelimiters.from_template(self.template, self.model.vocab)
                      if params.chat_template is not None and not params.vocab_only else None)
        self.engine = None if params.vocab_only else Engine(self.model, n_slots=params.n_slots, n_ctx=params.n_ctx,
                                                            lora=self.lora, spec=params.spec,
                                                            n_ctx_checkpoints=params.n_ctx_checkpoints,
                                                            checkpoint_min_step=params.checkpoint_min_step,
                                                            session=params.session,
                                                            message_delimiters=delimiters,
                                                            **params.context_params())
        self._embedder: Embedder | None = None
        self._reranker: Embedder | None = None

    @property
    def template(self) -> ChatTemplate:
        """The chat template: --chat-template's, else the model's, else a built-in one for its vocabulary."""
        if self._template is None:
            self._template = ChatTemplate.from_model(self.model, source=self.params.chat_template)
        return self._template

    @property
    def embedder(self) -> Embedder:
        """Sentence embeddings with the model's weights and adapters, in a context of its own."""
        if self._embedder is None:
            pooling = self.params.pooling
            self._embedder = self._pooled("mean" if pooling == "none" else pooling)  # "none": the server refuses it
            # (None: the model's own pooling type, embedding.default_pooling)
        return self._embedder

    @property
    def reranker(self) -> Embedder:
        """Rerank scores (pooling "rank": llama-server's --reranking) with the model's weights and adapters, in a
        context of its own, beside the embedder and the engine."""
        if self._reranker is None:
            self._reranker = self._pooled("rank")
        return self._reranker

    def _pooled(self, pooling: str | None) -> Embedder:
        p = self.params
        return Embedder(self.model, n_ctx=p.embd_n_ctx or p.n_ctx, lora=self.lora, pooling=pooling,
                        n_threads=p.n_threads, n_threads_batch=p.n_threads_batch or p.n_threads,
                        flash_attn=p.flash_attn)

    @property
    def n_ctx_slot(self) -> int:
        """The context one slot may use: what -1 means for repeat_last_n and dry_penalty_last_n."""
        return self.engine.n_ctx_slot if self.engine else self.params.n_ctx

    def sampling(self, **fields: Any) -> SamplingParams:
        """SamplingParams: the front end's defaults (`params.sampling`) overridden by `fields`."""
        return SamplingParams(**{**self.params.sampling, **fields})

    def grammar(self, grammar: str | None = None, json_schema: Mapping | str | None = None):
        """A GBNF grammar or a JSON schema as a GrammarSampler (compiled by llguidance: slow on a first call, so
        the server calls it off its event loop), or None for neither. Raises GrammarError."""
        if grammar is None and json_schema is None:
            return None
        from llamactx.sampling.grammar import GrammarSampler  # llguidance loads on the first constrained call

        return GrammarSampler.build(self.model.vocab, grammar, json_schema)

    def sampler(self, params: SamplingParams, grammar=None) -> SamplerChain:
        """llama-server's sampler chain for `params` (and a GrammarSampler), sized for one slot's context."""
        hp = self.model.hparams
        return SamplerChain.default(params, hp.n_vocab, self.model.vocab, n_ctx=self.n_ctx_slot,
                                    n_ctx_train=hp.n_ctx_train, grammar=grammar)

"""`Llama`: llama-cpp-python 0.3.36's high-level class (llama_cpp/llama.py) on llamactx, same names, arguments,
semantics and return shapes, so that code written for llama-cpp-python runs unchanged (the `llama_cpp` package
re-exports it; `from llamactx import Llama` works too). (The `llama` architecture is llamactx.models.llama.)

    llm = Llama(model_path="model.gguf", n_ctx=2048, seed=1337)
    out = llm("Q: Name the planets. A:", max_tokens=32, stop=["Q:"])        # OpenAI text_completion dict
    llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])  # chat.completion dict
    for token in llm.generate(llm.tokenize(b"Once"), temp=0.0): ...         # the token-level API
    llm.embed("text")                                                         # with embedding=True

Two levels share one context, as in llama-cpp-python: the token-level API (`eval`, `sample`, `generate`,
`input_ids`, `n_tokens`, `scores`) decodes sequence 0 of the engine's context itself (here); the completions run
as a one-slot request of the engine (the decode loop the server runs: llamactx.llama_cpp_completions) and their
dicts come from the renderers the server uses too (api/responses.py). Slot 0 of the engine and
`input_ids[:n_tokens]` always name the same tokens, so either level reuses what the other left in memory
(llama-cpp-python's prefix match). Options are validated as the server validates a request (api/protocol.py): a
bad value raises a ValueError naming it.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from llamactx.api import protocol as P
from llamactx.batch import Batch
from llamactx.context import Context, DecodeStatus
from llamactx.cparams import ContextParams
from llamactx.embedded import resolve_model_path
from llamactx.embedding import default_pooling, embd_normalize
from llamactx.llama_cpp_completions import Completions, LogitsProcessorSampler
from llamactx.llama_cpp_options import (
    LlamaGrammar,
    LlamaPromptLookupDecoding,
    LlamaState,
    LlamaTokenizer,
    LogitsProcessorList,
    StoppingCriteriaList,
    init_signature,
    runtime_params,
)
from llamactx.model import Model
from llamactx.models import memory_type
from llamactx.runtime import Runtime
from llamactx.sampling import (
    DistSampler,
    GreedySampler,
    MinPSampler,
    MirostatSampler,
    MirostatV2Sampler,
    PenaltiesSampler,
    SamplerChain,
    TempSampler,
    TopKSampler,
    TopPSampler,
    TypicalSampler,
)
from llamactx.sampling.rng import LLAMA_DEFAULT_SEED

__all__ = ["Llama", "LlamaGrammar", "LlamaPromptLookupDecoding", "LlamaState", "LlamaTokenizer",
           "LogitsProcessorList", "StoppingCriteriaList"]


class _ContextHandle:
    """`Llama._ctx`: llama-cpp-python's LlamaContext as far as its users reach (`.ctx`, `n_ctx()`,
    `kv_cache_seq_rm`); `ctx` is the llamactx Context, None once closed."""

    def __init__(self, ctx: Context | None):
        self.ctx = ctx

    def n_ctx(self) -> int:
        ctx = self.ctx
        return 0 if ctx is None else ctx.n_ctx if isinstance(ctx, _VocabOnlyContext) else ctx.params.n_ctx

    def kv_cache_seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        mem = self.ctx.memory if self.ctx is not None else None
        return True if mem is None else mem.seq_rm(seq_id, p0, p1)


class _VocabOnlyContext:
    """The context of a vocab_only model (llama.cpp makes one too): no memory, and anything that needs weights
    raises a RuntimeError saying so."""

    memory = None

    def __init__(self, n_ctx: int):
        self.n_ctx = n_ctx

    def _refuse(self, *args: Any, **kwargs: Any):
        raise RuntimeError("the model was loaded with vocab_only=True: it has no weights to decode with")

    decode = encode = get_logits = get_logits_ith = get_embeddings = state_get_data = state_set_data = _refuse

    def close(self) -> None:
        pass


class Llama(Completions):
    """A model, its context and a one-slot engine, with llama-cpp-python's constructor and methods. `model_path`
    may also be an embedded model name ("smollm2", "gemma3"). Every keyword of llama-cpp-python 0.3.36 is
    accepted with its default; one that asks for what llamactx cannot do (mlock, kv_overrides, a GPU split,
    another draft model) raises a ValueError naming it (llama_cpp_options.runtime_params); an unknown one a
    TypeError. GPU placement options keep their CPU meaning: every layer runs here, as on a CPU-only build."""

    def __init__(self, model_path: str, **kwargs: Any):
        self._init_args = {"model_path": model_path, **kwargs}
        opts, params = runtime_params(model_path, kwargs)
        self.model_path = str(model_path)
        self.verbose = opts["verbose"]
        self.n_batch = opts["n_batch"]
        self.last_n_tokens_size = opts["last_n_tokens_size"]
        self.lora_path, self.lora_scale, self.lora_base = opts["lora_path"], opts["lora_scale"], None
        self.chat_format, self.chat_handler = opts["chat_format"], opts["chat_handler"]
        self.draft_model = opts["draft_model"]
        self.spm_infill = bool(opts["spm_infill"])
        self.cache = None
        self._logits_all = bool(opts["logits_all"]) or self.draft_model is not None  # drafts need every row
        self._embedding = opts["embedding"]
        self._pooling = opts["pooling"]
        self._context_overrides = dict(params.context)  # rope / yarn / attention_type: the embedding context's too
        model = Model.load(resolve_model_path(params.model), use_mmap=opts["use_mmap"], vocab_only=params.vocab_only)
        self._runtime = Runtime(params, model=model)
        self._model, self._engine = self._runtime.model, self._runtime.engine
        self._ctx = _ContextHandle(self._engine.ctx if self._engine else _VocabOnlyContext(params.n_ctx))
        self._n_ctx = self._engine.ctx.params.n_ctx if self._engine else params.n_ctx
        self._n_vocab = self._model.hparams.n_vocab
        self.metadata = {k: str(v) for k, v in self._model.meta.items() if isinstance(v, (str, int, float, bool))}
        kind = memory_type(self._model.arch) if not opts["vocab_only"] else "kv"
        self._is_recurrent, self._is_hybrid = kind == "recurrent", kind == "hybrid"
        self.tokenizer_ = opts["tokenizer"] or LlamaTokenizer(self)
        self.n_tokens = 0
        self.input_ids = np.ndarray((self._n_ctx,), dtype=np.intc)  # (n_ctx,) the tokens in memory
        self.scores = np.zeros((self._n_ctx if self._logits_all else self.n_batch, self._n_vocab),
                               dtype=np.single)  # (rows, n_vocab): filled by eval with logits_all
        self._requires_eval = True  # the context's last logits are not those of input_ids[n_tokens - 1]
        self._sampler: SamplerChain | None = None
        self._embd_ctx: Context | None = None
        if self.chat_format is not None:
            self._runtime.template  # noqa: B018 -- an unknown chat_format is refused here, naming the known ones
        self._seed = opts["seed"]
        self.set_seed(opts["seed"])

    # -- model and vocabulary ---------------------------------------------------------------------------------

    @property
    def ctx(self) -> Context | None:
        return self._ctx.ctx

    @property
    def model(self):
        return self._model

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of utf-8 `text` (llama_tokenize); `add_bos` adds the model's BOS (if it has one), `special`
        parses special-token text."""
        return self.tokenizer_.tokenize(text, add_bos, special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of `tokens`; a leading space after a BOS is dropped, as llama-cpp-python does."""
        return self.tokenizer_.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def tokenizer(self) -> LlamaTokenizer:
        return LlamaTokenizer(self)

    def token_bos(self) -> int:
        return self._model.vocab.bos

    def token_eos(self) -> int:
        return self._model.vocab.eos

    def token_nl(self) -> int:
        return self._model.vocab.nl

    def n_vocab(self) -> int:
        return self._n_vocab

    def n_embd(self) -> int:
        return self._model.hparams.n_embd

    def n_ctx(self) -> int:
        return self._n_ctx

    def pooling_type(self) -> str:
        return self._pooling or default_pooling(self._model)

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return n

    @staticmethod
    def logits_to_logprobs(logits, axis: int = -1) -> np.ndarray:
        """log_softmax over `axis`, in float32 as llama-cpp-python computes it."""
        x = np.asarray(logits, np.single)
        m = np.max(x, axis=axis, keepdims=True)
        out = x - m
        return out - np.log(np.sum(np.exp(out), axis=axis, keepdims=True))

    # -- token level: eval / sample / generate ----------------------------------------------------------------

    @property
    def _input_ids(self) -> np.ndarray:
        return self.input_ids[: self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        return self.scores[: self.n_tokens, :]

    @property
    def eval_tokens(self):
        from collections import deque

        return deque(self._input_ids.tolist(), maxlen=self._n_ctx)

    def _context(self) -> Context:
        ctx = self._ctx.ctx
        if ctx is None:
            raise RuntimeError("Llama: closed (close() was called): it cannot decode")
        if isinstance(ctx, _VocabOnlyContext):
            ctx.decode()
        return ctx

    def reset(self) -> None:
        """Forget the evaluated tokens (llama-cpp-python's reset: n_tokens = 0; a recurrent or hybrid memory is
        cleared, a KV cache is trimmed by the next eval)."""
        self.n_tokens = 0
        self._requires_eval = True
        if (self._is_recurrent or self._is_hybrid) and self._engine is not None:
            self._context().memory.clear(data=True)
            self._engine.set_slot_tokens(0, [])

    def eval(self, tokens: Sequence[int]) -> None:
        """Decode `tokens` after the first `n_tokens` (what memory holds past them is removed first), n_batch at a
        time, as sequence 0. With logits_all every row's logits go to `scores`. Raises ValueError for a token
        outside the vocab or past n_ctx, RuntimeError when the context cannot decode."""
        ctx = self._context()
        tokens = P.check_tokens([int(t) for t in tokens], self._n_vocab, "tokens")
        if self.n_tokens + len(tokens) > self._n_ctx:
            raise ValueError(f"eval: {self.n_tokens} + {len(tokens)} tokens exceed n_ctx = {self._n_ctx}")
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        try:
            for i in range(0, len(tokens), self.n_batch):
                chunk = tokens[i: i + self.n_batch]
                n_past, n = self.n_tokens, len(chunk)
                batch = Batch(n)
                for j, t in enumerate(chunk):
                    batch.add(t, n_past + j, (0,), self._logits_all or j == n - 1)
                status = ctx.decode(batch)
                if status != DecodeStatus.OK:
                    raise RuntimeError(f"llama_decode returned {int(status)}")
                self.input_ids[n_past: n_past + n] = chunk
                if self._logits_all:
                    self.scores[n_past: n_past + n, :] = ctx.get_logits()  # (n, n_vocab)
                self.n_tokens += n
                self._requires_eval = False
        finally:
            self._engine.set_slot_tokens(0, self._input_ids.tolist())

    def _init_sampler(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
                      temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                      presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                      mirostat_eta: float = 0.1, mirostat_tau: float = 5.0, penalize_nl: bool = True,
                      logits_processor: LogitsProcessorList | None = None,
                      grammar: LlamaGrammar | None = None) -> SamplerChain:
        """llama-cpp-python's chain (Llama._init_sampler): [processors], penalties, [grammar], then greedy
        (temp 0), dist alone (temp < 0), mirostat, or top-k, typical, top-p, min-p, temp, dist."""
        n_vocab, seed = self._n_vocab, self._seed
        chain: list = []
        if logits_processor:
            chain.append(LogitsProcessorSampler(LogitsProcessorList(logits_processor), lambda: self._input_ids))
        chain.append(PenaltiesSampler(n_vocab, self.last_n_tokens_size, repeat_penalty, frequency_penalty,
                                      presence_penalty))
        if temp < 0.0:
            chain.append(DistSampler(seed))
        elif temp == 0.0:
            chain.append(GreedySampler())
        elif mirostat_mode == 1:
            chain.append(MirostatSampler(n_vocab, seed, mirostat_tau, mirostat_eta, 100))
        elif mirostat_mode == 2:
            chain.append(MirostatV2Sampler(seed, mirostat_tau, mirostat_eta))
        else:
            chain += [TopKSampler(top_k), TypicalSampler(typical_p, 1), TopPSampler(top_p, 1),
                      MinPSampler(min_p, 1), TempSampler(temp), DistSampler(seed)]
        g = self._runtime.grammar(**grammar.grammar_args()) if grammar is not None else None
        return SamplerChain(chain, grammar=g)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True,
               logits_processor: LogitsProcessorList | None = None, grammar: LlamaGrammar | None = None,
               idx: int | None = None) -> int:
        """A token from the logits of position `idx` (default: the last evaluated), with the chain `generate`
        set up or a one-off chain of these arguments."""
        if self.n_tokens <= 0:
            raise RuntimeError("sample: nothing has been evaluated (n_tokens = 0)")
        sampler = self._sampler or self._init_sampler(top_k, top_p, min_p, typical_p, temp, repeat_penalty,
                                                      frequency_penalty, presence_penalty, tfs_z, mirostat_mode,
                                                      mirostat_eta, mirostat_tau, penalize_nl, logits_processor,
                                                      grammar)
        ridx = idx - self.n_tokens if idx is not None else -1
        return sampler.sample(self._context(), ridx)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: LogitsProcessorList | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None,
                 grammar: LlamaGrammar | None = None) -> Iterator[int]:
        """Tokens sampled after `tokens`, one per iteration; `send(more)` appends tokens to evaluate. With
        `reset`, the longest prefix of `tokens` already evaluated is kept (llama-cpp-python's prefix match): an
        exact, live match samples at once; otherwise memory is cut after the prefix (a recurrent memory, which
        cannot be cut, starts again) and the rest, at least one token, is evaluated."""
        self._sampler = self._init_sampler(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
                                           presence_penalty, tfs_z, mirostat_mode, mirostat_eta, mirostat_tau,
                                           penalize_nl, logits_processor, grammar)
        tokens = [int(t) for t in tokens]
        if reset and self.n_tokens > 0:
            reset, tokens = self._reuse_prefix(tokens)
        if reset:
            self.reset()
        sample_idx = self.n_tokens + len(tokens) - 1
        while True:
            self.eval(tokens)
            while sample_idx < self.n_tokens:
                token = self.sample(idx=sample_idx)
                sample_idx += 1
                if stopping_criteria is not None and stopping_criteria(
                        self._input_ids[:sample_idx], self._scores[sample_idx - self.n_tokens, :]):
                    return
                more = yield token
                tokens = [token, *(more or [])]
                if sample_idx < self.n_tokens and token != self.input_ids[sample_idx]:
                    self.n_tokens = sample_idx  # a drafted token was wrong: drop it and what follows
                    self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
                    self._requires_eval = True
                    break
            if self.draft_model is not None:
                self.input_ids[self.n_tokens: self.n_tokens + len(tokens)] = tokens
                drafts = self.draft_model(self.input_ids[: self.n_tokens + len(tokens)])
                tokens.extend(drafts.astype(int)[: self._n_ctx - self.n_tokens - len(tokens)].tolist())

    def _reuse_prefix(self, tokens: list[int]) -> tuple[bool, list[int]]:
        """(whether to reset, the tokens left to evaluate) for a prompt against what is evaluated."""
        prefix = self.longest_token_prefix(self._input_ids.tolist(), tokens)
        consumed = prefix == len(tokens)
        if consumed and self.n_tokens == len(tokens) and not self._requires_eval:
            self._log("Llama.generate: full prompt already cached, skipping reset")
            return False, []
        keep = prefix - 1 if consumed else prefix  # leave one token to evaluate: its logits are sampled
        if keep > 0 and self._ctx.kv_cache_seq_rm(-1, keep, -1):
            self.n_tokens = keep
            self._requires_eval = True
            self._log(f"Llama.generate: {keep} prefix-match hit, remaining {len(tokens) - keep} prompt tokens to eval")
            return False, tokens[keep:]
        return True, tokens

    def _log(self, message: str) -> None:
        if self.verbose:
            print(message, file=sys.stderr)

    # -- state ------------------------------------------------------------------------------------------------

    def set_cache(self, cache) -> None:
        """A LlamaRAMCache / LlamaDiskCache (or None): completions load the state of the longest cached prefix
        of their prompt and store their own after."""
        self.cache = cache

    def set_seed(self, seed: int) -> None:
        """The seed of the next completion that gives none (each such completion then draws the next seed)."""
        self._seed = random.randrange(2**32 - 1) if seed in (-1, LLAMA_DEFAULT_SEED) else int(seed)

    def save_state(self) -> LlamaState:
        blob = self._context().state_get_data()
        return LlamaState(input_ids=self.input_ids.copy(), scores=self._scores.copy(), n_tokens=self.n_tokens,
                          llama_state=blob, llama_state_size=len(blob), seed=self._seed)

    def load_state(self, state: LlamaState) -> None:
        """Restore a `save_state`; StateError (nothing changed) if it does not fit this context."""
        self._context().state_set_data(state.llama_state)
        n = state.n_tokens
        self.input_ids = np.array(state.input_ids, np.intc)
        self.scores[:n, :] = state.scores[:n]
        self.n_tokens, self._requires_eval, self._seed = n, True, state.seed
        self._engine.set_slot_tokens(0, self._input_ids.tolist())

    def __getstate__(self) -> dict[str, Any]:
        return {**self._init_args, "seed": self._seed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.__init__(state.pop("model_path"), **state)

    def close(self) -> None:
        """Free the context and the model; the object can no longer decode."""
        for ctx in (self._ctx.ctx, self._embd_ctx):  # (the engine's context is _ctx.ctx)
            if ctx is not None:
                ctx.close()
        self._ctx.ctx = self._embd_ctx = None
        self._sampler = None

    # -- embeddings ----------------------------------------------------------------------------------------------

    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """Pooled embeddings (the model's pooling type, mean for a decoder; with pooling "none" one vector per
        token): one list of floats for a string, a list of them for a list. `normalize`: L2-normalised
        (common_embd_normalize). Needs embedding=True, as llama-cpp-python does."""
        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        texts = [input] if isinstance(input, str) else list(input)
        tokens = [self.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in texts]
        n_max = self._embedding_context().params.n_batch
        if truncate:
            tokens = [t[:n_max] for t in tokens]
        out = []
        for i, toks in enumerate(tokens):
            if len(toks) > n_max:
                raise ValueError(f"input[{i}]: {len(toks)} tokens exceed n_batch = {n_max} (truncate=False)")
            vecs = self._embed_tokens(toks)  # (n_embd,) or (len(toks), n_embd) with pooling "none"
            if normalize:
                vecs = embd_normalize(vecs) if vecs.ndim == 1 else np.stack([embd_normalize(v) for v in vecs])
            out.append(vecs.tolist())
        out = out[0] if isinstance(input, str) else out
        return (out, sum(len(t) for t in tokens)) if return_count else out

    def _embedding_context(self) -> Context:
        if self._embd_ctx is None:
            self._context()  # raises when closed or vocab-only
            p = self._engine.ctx.params
            n = min(self._n_ctx, self._model.hparams.n_ctx_train) if self._model.is_embedding_only else self._n_ctx
            self._embd_ctx = Context(self._model, ContextParams(
                n_ctx=n, n_batch=n, n_ubatch=n, embeddings=True, pooling_type=self._pooling or "unspecified",
                n_threads=p.n_threads, n_threads_batch=p.n_threads_batch, flash_attn=p.flash_attn,
                **self._context_overrides))
        return self._embd_ctx

    def _embed_tokens(self, tokens: list[int]) -> np.ndarray:
        ctx = self._embedding_context()
        if ctx.memory is not None:
            ctx.memory.clear(data=False)
        batch = Batch(max(1, len(tokens)))
        for p, t in enumerate(tokens):
            batch.add(int(t), p, (0,), True)
        if ctx.decode(batch) != DecodeStatus.OK:
            raise RuntimeError("llama_decode failed for an embedding input")
        if ctx.params.pooling_type == "none":
            return np.array(ctx.get_embeddings()[: len(tokens)], np.float32)  # (n_tokens, n_embd)
        return np.array(ctx.get_embeddings_seq(0), np.float32)  # (n_embd,)

    def create_embedding(self, input: str | list[str], model: str | None = None) -> dict[str, Any]:
        """An OpenAI embedding list of `embed`'s vectors, not normalised (llama-cpp-python's create_embedding calls
        embed with its default normalize=False)."""
        vecs, n = self.embed(input, return_count=True)
        vecs = [vecs] if isinstance(input, str) else vecs
        return {"object": "list", "model": model or self.model_path,
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vecs)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    # -- the Hub ----------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files: list | None = None,
                        local_dir: str | None = None, local_dir_use_symlinks: bool | str = "auto",
                        cache_dir: str | None = None, **kwargs: Any) -> Llama:
        """A Llama on a GGUF file of a Hugging Face repository (`filename` may be a glob), downloaded by
        huggingface_hub.hf_hub_download (installed separately). ValueError when no or several files match."""
        import fnmatch

        import huggingface_hub

        if filename is None or any(c in filename for c in "*?["):
            files = [f for f in huggingface_hub.list_repo_files(repo_id) if f.endswith(".gguf")]
            matches = [f for f in files if fnmatch.fnmatch(f, filename or "*.gguf")]
            if len(matches) != 1:
                raise ValueError(f"filename {filename!r}: {len(matches)} files of {repo_id} match ({matches[:8]})")
            filename = matches[0]
        path = huggingface_hub.hf_hub_download(repo_id=repo_id, filename=filename, local_dir=local_dir,
                                               cache_dir=cache_dir)
        for extra in additional_files or []:
            huggingface_hub.hf_hub_download(repo_id=repo_id, filename=extra, local_dir=local_dir,
                                            cache_dir=cache_dir)
        return cls(model_path=path, **kwargs)


Llama.__init__.__signature__ = init_signature()  # type: ignore[attr-defined] -- help() shows its keywords

"""The engine: many sequences of one context, one batched decode per step (llama-server's `update_slots`,
nano-vllm's `LLMEngine`).

    engine = Engine(model, n_slots=4, n_ctx=4096)
    seq = engine.add_request(prompt_tokens, sampler, Limits(max_tokens=64))
    while engine.has_work:
        for out in engine.step():   # every sequence that produced text or finished this step
            print(out.seq.id, [c.text for c in out.chunks], out.seq.finish_reason)

`step()` is schedule -> one Batch -> `ctx.decode` -> sample each output row -> post-process. One thread owns an
engine (it is not thread-safe): the server runs it in its own thread and talks to it through a queue.

With `spec=SpecParams(types=("ngram-simple",))` generating sequences bring drafts (engine/speculative.py) into the
same batch; post-processing samples each draft position in turn, keeps the tokens up to the first one the sampler
did not pick (common_sampler_sample_and_accept_n) and removes the rest from memory (`seq_rm`): the output is the one
without drafts, token for token, wherever the weights' kernels are row invariant (speculative.py says where they
are not). Memories that cannot drop a suffix (recurrent, hybrid: `partial_prefix` False) roll back instead: the
engine snapshots a drafting sequence's state before the decode (`Memory.checkpoint_write`, llama-server's
speculative checkpoint) and, when a draft token is rejected, restores it and decodes the accepted tokens again in
the next step (llama-server's replay). `kv_layout_exact` contexts, whose bits depend on where cells sit, decode
without drafts (`Engine.spec_disabled` says why). With a draft model (`draft-simple`, engine/draft_model.py) every
step first drafts for all generating sequences at once (`Speculator.prepare`), so the draft context decodes them
together, as llama-server does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from llamactx.batch import Batch
from llamactx.chat_spans import MessageDelimiters
from llamactx.chat_template import ChatTemplate
from llamactx.context import Context, DecodeStatus
from llamactx.cparams import ContextParams
from llamactx.engine.checkpoints import CheckpointParams
from llamactx.engine.scheduler import Scheduled, Scheduler
from llamactx.engine.sequence import Chunk, EngineError, Limits, RequestOptions, Sequence
from llamactx.engine.session_tier import SessionParams, SessionTier
from llamactx.engine.speculative import SpecParams, Speculator
from llamactx.memory import MemoryOpError
from llamactx.model import Model
from llamactx.sampling import SamplerChain, SamplingParams


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one sequence produced in a step: its new chunks, and whether it finished (seq.finish_reason)."""

    seq: Sequence
    chunks: list[Chunk]

    @property
    def finished(self) -> bool:
        return self.seq.is_finished


@dataclass(slots=True)
class EngineStats:
    """Counters for llama-server's /metrics."""

    n_prompt_tokens: int = 0  # prompt tokens decoded (cached ones excluded), of finished requests
    n_prompt_cached: int = 0  # prompt tokens found in memory, of finished requests
    n_tokens_predicted: int = 0  # generated tokens of finished requests
    n_decode: int = 0  # decode calls
    n_busy_slots: int = 0  # summed over decode calls (busy slots per decode = n_busy_slots / n_decode)
    n_tokens_max: int = 0  # the largest batch decoded
    t_prompt_ms: float = 0.0  # decode time of batches that carried prompt tokens
    t_predicted_ms: float = 0.0  # decode time of batches of generated tokens only
    n_draft_tokens: int = 0  # draft tokens verified (speculative decoding)
    n_draft_accepted: int = 0  # draft tokens accepted
    n_draft_verif_steps: int = 0  # drafts verified


class Engine:
    """`n_slots` sequences of one context over a shared, read-only `model`. Extra keyword arguments are
    `ContextParams` fields (n_batch, n_ubatch, n_threads, type_k...). The context's KV cells are one pool; with
    kv_unified (the default) each slot may use up to `n_ctx` tokens while memory lasts, without it each slot's
    context is n_ctx / n_slots (llama-server with an explicit -np). `spec`: speculative decoding (None: off).
    `n_ctx_checkpoints` (llama-server's --ctx-checkpoints, 0 = off), `checkpoint_max_bytes` and
    `checkpoint_min_step` (--checkpoint-min-step): per slot, the context checkpoints that let a recurrent, hybrid or
    sliding-window memory reuse part of a cached prompt (engine/checkpoints.py).
    `session`: the session tier below the slots, in RAM and on disk, that evicted slots' states go to and come
    back from (engine/session_tier.py; None or nothing enabled: off). `message_delimiters`: what opens a chat
    message in a prompt's tokens (chat_spans.py; None: those of the model's chat template), whose user messages
    end prompt chunks and get checkpoints where checkpoints are taken. Raises EngineError for a bad argument."""

    def __init__(self, model: Model, n_slots: int = 1, n_ctx: int = 4096, lora=(), spec: SpecParams | None = None,
                 n_ctx_checkpoints: int = 8, checkpoint_max_bytes: int = 256 << 20, checkpoint_min_step: int = 0,
                 session: SessionParams | None = None, message_delimiters: MessageDelimiters | None = None,
                 **context_params):
        if not 1 <= n_slots <= 256:
            raise EngineError(f"n_slots = {n_slots} is outside [1, 256]")
        if spec is not None and not isinstance(spec, SpecParams):
            raise EngineError(f"spec: expected SpecParams or None, got {type(spec).__name__}")
        if session is not None and not isinstance(session, SessionParams):
            raise EngineError(f"session: expected SessionParams or None, got {type(session).__name__}")
        self.model = model
        context_params.setdefault("kv_unified", True)
        self.ctx = Context(model, ContextParams(n_ctx=n_ctx, n_seq_max=n_slots, **context_params))
        self.spec = spec
        self.spec_disabled = self._why_no_speculation(spec)  # None when speculating (or not asked to)
        self.speculator = None
        if spec is not None and spec.enabled and not self.spec_disabled:
            self.speculator = Speculator(spec, model, n_slots, self._draft_context_params())
        # Q4_K / Q6_K weights: a ubatch of at most GEMV_ROWS rows runs every row as one alone (speculative.py)
        self._max_draft = None if _row_invariant(model) else GEMV_ROWS - 1
        p = self.ctx.params
        enabled = session is not None and session.enabled and self.ctx.memory is not None
        self.session = SessionTier(self.ctx, session) if enabled else None
        self.scheduler = Scheduler(self.ctx.memory, n_slots, p.n_batch, p.n_ubatch,
                                   self._draft if self.speculator is not None else None,
                                   CheckpointParams(n_ctx_checkpoints, checkpoint_max_bytes, checkpoint_min_step),
                                   self.session)
        self.set_adapters_lora(lora)
        self.stats = EngineStats()
        self._delimiters = message_delimiters

    def _why_no_speculation(self, spec: SpecParams | None) -> str | None:
        """Why this engine decodes without drafts although asked to speculate; None otherwise."""
        if spec is None or not spec.enabled:
            return None
        if self.ctx.params.kv_layout_exact:
            return "kv_layout_exact: a token's bits depend on where its cells sit, a draft could change them"
        return None

    def _draft_context_params(self) -> dict:
        """A draft model's context: the target's n_ctx, batch sizes, threads and KV layout, one sequence per slot
        (common_speculative_init_from_params: the draft context holds as many tokens per sequence as the target's),
        its KV cache in f16 (--spec-draft-type-k / -v's default)."""
        p = self.ctx.params
        return dict(n_ctx=p.n_ctx, n_batch=p.n_batch, n_ubatch=p.n_ubatch, n_threads=p.n_threads,
                    n_threads_batch=p.n_threads_batch, flash_attn=p.flash_attn, swa_full=p.swa_full,
                    kv_unified=p.kv_unified)

    def warmup(self) -> None:
        """Decode a 2-token and a 1-token batch and forget them, and sample once with the default chain, so that
        the kernels are compiled or loaded from numba's cache before the first request (llama-server's warmup
        run)."""
        ctx = self.ctx
        ctx.decode(Batch.get_one([self.model.vocab.bos if self.model.vocab.bos >= 0 else 0] * 2))
        ctx.decode(Batch.get_one([0]))
        if ctx.memory is not None:  # an encoder (bert) keeps nothing between batches
            ctx.memory.clear(data=False)
        n_vocab = self.model.hparams.n_vocab
        SamplerChain.default(SamplingParams(), n_vocab).sample_logits(np.zeros(n_vocab, np.float32))

    def set_adapters_lora(self, adapters) -> None:
        """The LoRA adapters ((LoraAdapter, scale) pairs) that every following step applies, to every slot
        (llama-server's global adapter scales). A change forgets the idle slots' cached prompts, computed with
        the old adapters (llama-server clears a slot's cache when its adapters change). Raises LoraError."""
        before = self.ctx.adapters_lora
        self.ctx.set_adapters_lora([a for a, _ in adapters], [s for _, s in adapters])
        if self.ctx.adapters_lora != before:
            cache = self.scheduler.cache
            for slot in cache.slots:
                if slot.holder is None and slot.tokens:
                    cache.clear_slot(slot.seq_id)

    @property
    def message_delimiters(self) -> MessageDelimiters:
        """What opens a chat message: the engine's, else found in the model's chat template on first use (none when
        the template cannot be rendered)."""
        if self._delimiters is None:
            try:
                template = ChatTemplate.from_model(self.model)
            except ValueError:  # a template that does not compile: no message spans
                self._delimiters = MessageDelimiters()
            else:
                self._delimiters = MessageDelimiters.from_template(template, self.model.vocab)
        return self._delimiters

    @property
    def n_slots(self) -> int:
        return self.scheduler.n_slots

    @property
    def n_ctx_slot(self) -> int:
        return self.ctx.params.n_ctx_seq

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add_request(self, prompt: Seq[int], sampler: SamplerChain, limits: Limits | None = None,
                    options: RequestOptions | None = None) -> Sequence:
        """Queue a request; it joins the running batch at the next step with a free slot. `options` (id_slot,
        cache_prompt, n_probs, ...) travel with its Sequence; while checkpoints are taken, its prompt chunks also
        end where `message_delimiters` find user messages. Raises EngineError for a prompt that cannot fit a
        slot."""
        if self.model.is_embedding_only:
            raise EngineError(f"model '{self.model.arch}' is an encoder (embeddings only: no output layer, no "
                              f"logits to sample; llama_decode runs llama_encode on it): it cannot generate text. "
                              f"Use /v1/embeddings or `llamactx embedding`")
        prompt = list(prompt)
        n_vocab = self.model.hparams.n_vocab
        bad = [t for t in prompt if not (isinstance(t, (int, np.integer)) and 0 <= t < n_vocab)]
        if bad:
            raise EngineError(f"prompt token {bad[0]!r} is outside the vocab [0, {n_vocab})")
        if len(prompt) > self.n_ctx_slot:
            raise EngineError(f"the prompt has {len(prompt)} tokens, more than a slot's context n_ctx = "
                              f"{self.n_ctx_slot}")
        options = options or RequestOptions()
        if not -1 <= options.id_slot < self.n_slots:
            raise EngineError(f"id_slot {options.id_slot} is outside [-1, {self.n_slots})")
        prompt = [int(t) for t in prompt]
        user_starts = self.message_delimiters.user_starts(prompt) if self.scheduler.cache.checkpointing else ()
        seq = Sequence(prompt, sampler, limits or Limits(), options, user_starts)
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence, reason: str = "abort") -> list[Chunk]:
        """Stop `seq` now with finish_reason `reason` ("abort"; "length" at a deadline, "error" when the engine
        failed): it is never decoded again; its slot is free for the next step."""
        if seq.is_finished:
            return []
        chunks = seq.finish(reason)
        self._finished(seq)
        return chunks

    @property
    def load(self) -> tuple[int, int, int]:
        """(requests running, requests waiting for a slot or memory, preemptions so far): /metrics' gauges."""
        return len(self.scheduler.running), len(self.scheduler.waiting), self.scheduler.n_preempted

    # -- slots: what llama-server's /slots, slot files and a one-conversation API read and set ---------------

    def slot_request(self, id_slot: int) -> Sequence | None:
        """The request running on slot `id_slot`, None when it is idle."""
        return self.scheduler.cache.slots[id_slot].holder

    def slot_tokens(self, id_slot: int) -> list[int]:
        """The tokens slot `id_slot` holds in memory now (a running request's decoded ones), in position order."""
        return list(self.scheduler.cache.slots[id_slot].held)

    def clear_slot(self, id_slot: int) -> None:
        """Forget an idle slot's cache (its cells and tokens)."""
        self.scheduler.cache.clear_slot(id_slot)

    def set_slot_tokens(self, id_slot: int, tokens: list[int]) -> None:
        """An idle slot's memory now holds `tokens` (after a state or slot file was loaded into its sequence)."""
        self.scheduler.cache.set_tokens(id_slot, tokens)

    def step(self) -> list[StepOutput]:
        """One decode of every scheduled sequence's tokens; returns what each sampled sequence produced."""
        if self.speculator is not None and self.speculator.draft_model is not None:
            self.speculator.prepare([(seq.seq_id, seq.id, seq.tokens, self._n_draft_max(seq, self.n_ctx_slot))
                                     for seq in self.scheduler.running if seq.is_generating])
        plan = self.scheduler.schedule()
        if not plan:
            return []
        batch = self._batch(plan)
        # return_progress: a first report before any of the prompt is decoded (processed == cached)
        before = {s.seq: [s.seq.progress()] for s in plan
                  if s.seq.options.return_progress and s.seq.n_past == s.seq.n_cached < s.seq.n_prompt}
        for s in plan:
            self.scheduler.cache.checkpoint(s.seq)  # before the decode: the state before this chunk
        rollback = {} if self.ctx.memory.partial_prefix else \
            {s.seq: self.ctx.memory.checkpoint_write(s.seq.seq_id) for s in plan if s.draft}
        t0, cpu0 = time.perf_counter(), time.process_time()
        status = self.ctx.decode(batch)
        if status != DecodeStatus.OK:  # the scheduler checked the room, so only an abort or a surprise lands here
            self.scheduler.preempt(self.scheduler.running[-1])
            return []
        seconds = time.perf_counter() - t0
        if self.speculator is not None and all(s.seq.is_generating for s in plan):
            # what a row costs on this machine; the process's CPU time where it is less (other processes' load)
            self.speculator.budget.cost.observe(batch.n_tokens, min(seconds, time.process_time() - cpu0))
        self._count(plan, seconds * 1000)
        return self._postprocess(plan, before, rollback)

    def _batch(self, plan: list[Scheduled]) -> Batch:
        batch = Batch(sum(s.n_tokens for s in plan))
        for s in plan:
            seq = s.seq
            tokens = [seq.pending[0], *s.draft] if s.draft else seq.pending[: s.n_tokens]
            for j, t in enumerate(tokens):
                batch.add(t, seq.n_past + j, (seq.seq_id,), bool(s.draft) or (s.sample and j == len(tokens) - 1))
        return batch

    def _draft(self, seq: Sequence, n_max: int, n_gen: int, used: int) -> list[int]:
        """The scheduler's drafter: at most `n_max` draft tokens for generating `seq`, no more than its context
        and max_tokens leave room for (llama-server's get_n_draft_max), and no more than are worth verifying in a
        step of `n_gen` generating sequences and `used` rows so far (speculative.DraftBudget)."""
        budget, n_max = self.speculator.budget, self._n_draft_max(seq, n_max)
        n_cap = budget.cap(seq.seq_id, n_gen, used, n_max)
        if n_cap == 0:  # not worth verifying: a draft is only followed, to learn when it is again
            if n_max > 0 and not budget.has_shadow(seq.seq_id):
                budget.shadow(seq.seq_id, len(seq.tokens),
                              self.speculator.draft(seq.seq_id, seq.id, seq.tokens, n_max))
            return []
        return self.speculator.draft(seq.seq_id, seq.id, seq.tokens, n_cap)

    def _n_draft_max(self, seq: Sequence, n_max: int) -> int:
        n_max = min(n_max, self.n_ctx_slot - seq.n_past - 2)
        if self._max_draft is not None:
            n_max = min(n_max, self._max_draft)
        if seq.limits.max_tokens >= 0:
            n_max = min(n_max, seq.limits.max_tokens - seq.n_output - 1)
        return n_max

    def _postprocess(self, plan: list[Scheduled], before: dict[Sequence, list[Chunk]],
                     rollback: dict[Sequence, bytes]) -> list[StepOutput]:
        outputs = []
        row = 0
        for s in plan:
            seq = s.seq
            first, row = row, row + s.n_tokens
            prefill = seq.n_past < seq.n_prompt
            seq.n_past += 1 if s.draft else s.n_tokens  # draft tokens count once accepted (_verify)
            progress = before.get(seq, []) + ([seq.progress()] if seq.options.return_progress and prefill else [])
            if not s.sample:
                if progress:
                    outputs.append(StepOutput(seq, progress))
                continue
            chunks = self._verify(s, first, rollback.get(seq)) if s.draft else self._sample(seq, row - 1)[1]
            if self.speculator is not None:
                self.speculator.budget.follow(seq.seq_id, seq.tokens)
            if not seq.is_finished and seq.n_past >= self.n_ctx_slot:
                chunks += self._context_full(seq)
            if seq.is_finished:
                self._finished(seq)
            outputs.append(StepOutput(seq, progress + chunks))
        return outputs

    def _sample(self, seq: Sequence, i: int) -> tuple[int | None, list[Chunk]]:
        """Sample output row `i` for `seq` and append the token: (the token, None on failure; its chunks)."""
        try:
            token = seq.sampler.sample(self.ctx, i)
        except Exception as e:  # a grammar dead end or an empty candidate set ends this request only
            seq.error = f"sampling failed: {e}"
            return None, seq.finish("error")
        return token, seq.append(token, self.model.vocab, *self._logprobs(seq, i, token))

    def _verify(self, s: Scheduled, first: int, snapshot: bytes | None) -> list[Chunk]:
        """Rows first .. first + len(draft) hold the logits after the sampled token and after each draft token:
        sample them in order while the sampler picks the draft's next token (common_sampler_sample_and_accept_n),
        so the sampler sees exactly the tokens it would without the draft. seq.n_past already counts the sampled
        token; each accepted draft token adds one, and memory forgets the positions past it (`seq_rm`). A memory
        without partial prefixes goes back to `snapshot`, its state before the sampled token, instead: the
        sampled and accepted tokens are pending again and the next step decodes them (llama-server's replay)."""
        seq, draft = s.seq, s.draft
        n_past = seq.n_past
        chunks: list[Chunk] = []
        n_accepted = 0
        for j in range(len(draft) + 1):
            token, out = self._sample(seq, first + j)
            chunks += out
            if seq.is_finished or j == len(draft) or token != draft[j]:
                break
            n_accepted += 1
            seq.n_past += 1
        if seq.n_past < n_past + len(draft):
            if snapshot is None:
                self.ctx.memory.seq_rm(seq.seq_id, seq.n_past, -1)
            else:
                self.ctx.memory.checkpoint_load(seq.seq_id, snapshot, n_past - 1)
                seq.n_past = n_past - 1
        self._count_draft(seq, len(draft), n_accepted)
        if not seq.is_finished and not self.ctx.memory.can_continue(seq.seq_id, seq.n_past):
            self.scheduler.preempt(seq)  # cannot happen with drafts in one ubatch; recomputing is always right
        return chunks

    def _count_draft(self, seq: Sequence, n_draft: int, n_accepted: int) -> None:
        st, t = self.stats, seq.timings
        st.n_draft_tokens += n_draft
        st.n_draft_accepted += n_accepted
        st.n_draft_verif_steps += 1
        t.draft_n += n_draft
        t.draft_n_accepted += n_accepted
        self.speculator.accept(seq.seq_id, n_accepted, n_draft)

    def _logprobs(self, seq: Sequence, i: int, token: int) -> tuple[float | None, tuple]:
        if seq.options.n_probs < 0:
            return None, ()
        if seq.options.post_sampling_probs:
            return _post_sampling(seq.sampler.cur, token, seq.options.n_probs)
        logits = self.ctx.get_logits_ith(i).astype(np.float64)
        m = logits.max()
        logp = logits - (m + np.log(np.exp(logits - m).sum()))  # (n_vocab,) log-softmax of the raw logits
        top = np.argsort(-logp, kind="stable")[: seq.options.n_probs] if seq.options.n_probs else []
        return float(logp[token]), tuple((int(t), float(logp[t])) for t in top)

    def _context_full(self, seq: Sequence) -> list[Chunk]:
        """A slot's context is full: finish with "length", or with context shift drop half of what follows the
        first n_keep tokens (llama-server's context shift)."""
        if not seq.limits.context_shift:
            return seq.finish("length")
        n_past = seq.n_past
        n_keep, n_discard = seq.shift(seq.limits.n_keep, seq.limits.n_discard)
        if self.speculator is not None:
            self.speculator.budget.shadow_drop(seq.seq_id)  # its position moved
        self.scheduler.cache.forget_checkpoints(seq.seq_id)
        mem = self.ctx.memory
        mem.seq_rm(seq.seq_id, n_keep, n_keep + n_discard)
        try:
            mem.seq_add(seq.seq_id, n_keep + n_discard, n_past, -n_discard)
        except MemoryOpError:  # shared cells to copy and no room for the copies: stop here
            mem.seq_rm(seq.seq_id, n_keep, -1)
            seq.n_past = n_keep
            return seq.finish("length")
        return []

    def _count(self, plan: list[Scheduled], ms: float) -> None:
        st = self.stats
        st.n_decode += 1
        st.n_busy_slots += len(plan)
        st.n_tokens_max = max(st.n_tokens_max, sum(s.n_tokens for s in plan))
        if any(not s.seq.is_generating for s in plan):  # checked before post-processing moves n_past
            st.t_prompt_ms += ms
        else:
            st.t_predicted_ms += ms

    def _finished(self, seq: Sequence) -> None:
        """Count a finished request the way its `timings` do (llama-server's metrics add up the tasks')."""
        self.scheduler.finish(seq)
        t, st = seq.timings, self.stats
        st.n_prompt_tokens += t.prompt_n
        st.n_prompt_cached += t.cached_n
        st.n_tokens_predicted += t.predicted_n

    def generate(self, seq: Sequence):
        """Run steps until `seq` finishes, yielding its chunks (a one-request user: the LLM API, the CLI).
        Other queued requests advance too. Closing the iterator early aborts `seq`."""
        try:
            while not seq.is_finished:
                n_decode = self.stats.n_decode
                for out in self.step():
                    if out.seq is seq:
                        yield from out.chunks
                if self.stats.n_decode == n_decode and not seq.is_finished and not self.scheduler.running:
                    raise EngineError("the request cannot be scheduled (its slot stays busy)")
        finally:
            self.abort(seq)


# llama.cpp's kernel for these weights depends on how many rows the ubatch has (docs/numerics.md)
ROW_VARIANT_TYPES = frozenset({int(GGMLQuantizationType.Q4_K), int(GGMLQuantizationType.Q6_K)})
GEMV_ROWS = 3  # Q4_K runs rows in fours through its gemm and the rest (here all) through its gemv, as one row alone


def _row_invariant(model: Model) -> bool:
    """Whether every matmul weight of `model` is computed the same way whatever else shares its ubatch."""
    return not any(len(info.shape) == 2 and info.ggml_type in ROW_VARIANT_TYPES
                   for info in model.tensor_infos.values())


def _post_sampling(cur, token: int, n_probs: int) -> tuple[float, tuple]:
    """(p(token), the n_probs most probable candidates) over what the sampler chain left in `cur`, the
    candidates the last draw chose from (common_sampler_get_candidates, sorted); candidates at p = 0 are left out."""
    if cur is None:
        return 1.0, ((token, 1.0),)
    probs = cur.probs
    if probs is None:  # no sampler computed them: the softmax of what is left
        logits = cur.logits.astype(np.float64)
        e = np.exp(logits - logits.max())
        probs = e / e.sum()
    order = np.argsort(-np.asarray(probs, np.float64), kind="stable")
    top = tuple((int(cur.ids[j]), float(probs[j])) for j in order[:n_probs] if probs[j] > 0)
    hit = np.flatnonzero(cur.ids == token)
    return (float(probs[hit[0]]) if hit.size else 0.0), top


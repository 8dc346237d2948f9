"""Draft-model speculation: a small model with the target's vocabulary drafts greedily in a context of its own
(llama.cpp's common/speculative.cpp `common_speculative_impl_draft_simple`, the `draft-simple` type, and
`common_speculative_are_compatible`).

The draft context has a sequence per engine slot (n_seq_max = n_slots) and the engine's n_ctx. Per slot it keeps
the tokens its memory holds; a draft first brings the context to the slot's tokens (the common prefix stays, the
rest is removed with `seq_rm`, the new tokens are decoded), then decodes the token sampled last and drafts one
token per decode while the draft is confident: llama.cpp's draft sampler is top-k 10 over the draft's logits, the
draft token is the top candidate, and drafting stops once its probability among those 10 falls below p_min; a draft
shorter than n_min is dropped. Sequences that draft in the same step share each decode, as llama.cpp's `draft()`
batches every drafting sequence. The draft only proposes: the engine verifies it with the target's own sampler, so
what the draft model computes never changes the output, only how many tokens one target decode yields.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from llamactx.batch import Batch
from llamactx.context import Context, DecodeStatus
from llamactx.cparams import ContextParams
from llamactx.engine.prefix_cache import common_prefix
from llamactx.model import Model

SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128  # speculative.cpp: largest n_vocab difference between target and draft
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5  # token texts are compared from this id on
DRAFT_TOP_K = 10  # the draft sampler's top-k (common_speculative_impl_draft_simple's common_sampler)


def vocab_mismatch(target: Model, draft: Model) -> str | None:
    """What makes `draft`'s vocabulary unusable for `target`'s drafts, None when they are compatible
    (common_speculative_are_compatible): the tokenizer type, BOS and EOS (add flag, and id when added), an n_vocab
    difference above 128, or a token text that differs from id 5 on."""
    vt, vd = target.vocab, draft.vocab
    if vt.model_type != vd.model_type:
        return f"vocab type: target {vt.model_type!r}, draft {vd.model_type!r}"
    for name in ("bos", "eos"):
        add_t, add_d = getattr(vt, f"add_{name}"), getattr(vd, f"add_{name}")
        id_t, id_d = getattr(vt, name), getattr(vd, name)
        if add_t != add_d or (add_t and id_t != id_d):
            return (f"{name.upper()} token: target add_{name} = {add_t}, id {id_t}; "
                    f"draft add_{name} = {add_d}, id {id_d}")
    diff = abs(vt.n_tokens - vd.n_tokens)
    if diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return (f"n_vocab: target {vt.n_tokens}, draft {vd.n_tokens}, a difference of {diff} (at most "
                f"{SPEC_VOCAB_MAX_SIZE_DIFFERENCE})")
    for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(vt.n_tokens, vd.n_tokens)):
        if vt.token_get_text(i) != vd.token_get_text(i):
            return f"token {i} text: target {vt.token_get_text(i)!r}, draft {vd.token_get_text(i)!r}"
    return None


def draft_token(logits: np.ndarray) -> tuple[int, float]:
    """The draft sampler on one row of logits (n_vocab,): the top candidate and its probability among the
    DRAFT_TOP_K best (top-k, then the softmax the chain's dist sampler computes; llama.cpp drafts
    `cur_p->data[0]`, not the sampled token)."""
    k = min(DRAFT_TOP_K, logits.shape[0])
    top = np.argpartition(-logits, k - 1)[:k]  # (k,) ids of the k largest logits
    best = int(np.argmax(logits))  # the first of equal maxima
    z = np.exp((logits[top] - logits[best]).astype(np.float64))  # (k,)
    return best, float(1.0 / z.sum())


class DraftSimple:
    """The draft-simple drafter of one engine: a Context on the draft `model` with `n_seq` sequences, one per
    slot. `context_params`: ContextParams fields other than n_seq_max (the engine's n_ctx, n_batch, n_ubatch,
    threads, kv_unified...). `n_vocab_target`: a draft token at or above it (a draft vocabulary may be up to 128
    tokens larger) ends the draft. Not thread-safe: the engine's thread owns it."""

    def __init__(self, model: Model, n_seq: int, n_max: int, n_min: int, p_min: float, n_vocab_target: int,
                 context_params: Mapping[str, object]):
        self.model = model
        self.ctx = Context(model, ContextParams(n_seq_max=n_seq, **context_params))
        self.n_max, self.n_min, self.p_min = n_max, n_min, p_min
        self.n_vocab_target = n_vocab_target
        self.held: list[list[int]] = [[] for _ in range(n_seq)]  # per seq_id: the tokens its cells hold
        self._used = [0] * n_seq  # per seq_id: when it last drafted (eviction order)
        self._clock = 0
        self.n_decode = 0  # draft-context decodes (prefix catch-up and drafting)

    def begin(self, seq_id: int, prompt: list[int]) -> None:
        pass  # the next draft reuses whatever prefix of the new prompt the sequence still holds

    def accept(self, seq_id: int, n_accepted: int, is_other: bool) -> None:
        pass  # rejected draft tokens are removed at the next draft, with the rest of what differs

    def draft(self, seq_id: int, prompt: list[int], sampled: int, n_max: int | None = None) -> list[int]:
        """Up to `n_max` (at most the drafter's n_max) tokens expected after `prompt` + `sampled` for slot
        `seq_id`; [] when the draft model is not confident enough, or its context has no room."""
        return self.draft_many({seq_id: (prompt, sampled, n_max)})[seq_id]

    def draft_many(self, requests: Mapping[int, tuple[list[int], int, int | None]]) -> dict[int, list[int]]:
        """Drafts for several slots at once, `requests[seq_id] = (prompt, sampled, n_max)`: one decode brings
        every sequence up to date, then each drafting step decodes one token of every sequence still drafting
        (llama.cpp's draft() over its dparams)."""
        out: dict[int, list[int]] = {s: [] for s in requests}
        n_max = {s: self.n_max if n is None else min(n, self.n_max) for s, (_, _, n) in requests.items()}
        live = [s for s in requests if n_max[s] > 0]
        for s in live:
            self._clock += 1
            self._used[s] = self._clock
        logits = self._catch_up({s: [*requests[s][0], requests[s][1]] for s in live})
        while logits:
            step: dict[int, int] = {}
            for s, row in logits.items():
                token, p = draft_token(row)
                if p < self.p_min or token >= self.n_vocab_target:
                    continue
                out[s].append(token)
                if len(out[s]) < n_max[s]:
                    step[s] = token
            logits = self._decode({s: [t] for s, t in step.items()})
        for s in live:
            if len(out[s]) < self.n_min:
                out[s] = []
        return out

    def _catch_up(self, targets: dict[int, list[int]]) -> dict[int, np.ndarray]:
        """Bring each sequence's cells to `targets[seq_id]`, its last token decoded: the logits after each
        sequence's last token (sequences that found no room are left out)."""
        pending: dict[int, list[int]] = {}
        for s, tokens in targets.items():
            k = min(common_prefix(self.held[s], tokens), len(tokens) - 1)  # the last token's logits are needed
            if k < len(self.held[s]):
                mem = self.ctx.memory
                if not mem.can_continue(s, k) or not mem.seq_rm(s, k, -1):
                    mem.seq_rm(s, -1, -1)  # a window or a state that cannot be cut there: start over
                    k = 0
                del self.held[s][k:]
            pending[s] = tokens[k:]
        logits: dict[int, np.ndarray] = {}
        n_batch = self.ctx.params.n_batch
        while pending:
            chunk: dict[int, list[int]] = {}
            room = n_batch
            for s, tokens in pending.items():
                if room == 0:
                    break
                chunk[s], room = tokens[:room], room - len(tokens[:room])
            done = [s for s in chunk if len(chunk[s]) == len(pending[s])]
            out = self._decode(chunk, done)
            if out is None:
                break  # no room even after evicting the others: these sequences draft nothing this step
            logits |= out
            pending = {s: t[len(chunk.get(s, ())):] for s, t in pending.items() if s not in done}
        return logits

    def _decode(self, tokens: dict[int, list[int]], want: list[int] | None = None) -> dict[int, np.ndarray] | None:
        """Decode `tokens[seq_id]` after what each sequence holds, in one batch: the logits (copied) after the
        last token of each sequence in `want` (default: all). Memory short: the cells of the least recently
        drafting other sequences are freed and the decode retried; None when nothing more can be freed."""
        if not tokens:
            return {}
        want = list(tokens) if want is None else want
        batch = Batch(sum(len(t) for t in tokens.values()))
        rows = {}
        for s, ts in tokens.items():
            for j, t in enumerate(ts):
                batch.add(t, len(self.held[s]) + j, (s,), s in want and j == len(ts) - 1)
            rows[s] = batch.n_tokens - 1
        while True:
            self.n_decode += 1
            if self.ctx.decode(batch) == DecodeStatus.OK:
                break
            idle = [s for s in range(len(self.held)) if self.held[s] and s not in tokens]
            if not idle:
                return None
            victim = min(idle, key=lambda s: self._used[s])
            self.ctx.memory.seq_rm(victim, -1, -1)
            self.held[victim] = []
        for s, ts in tokens.items():
            self.held[s] += ts
        return {s: np.array(self.ctx.get_logits_ith(rows[s])) for s in want}

"""The engine: many sequences of one context, one batched decode per step (llama-server's update_slots,
nano-vllm's engine/).

    text_stream.py   TextStream: token bytes -> printable text, stop strings held back
    sequence.py      Sequence: one request's state (tokens, n_past, sampler, limits, finish reason); RequestOptions
    prefix_cache.py  PrefixCache: the slots (context sequences), what each holds, prefix sharing, LRU eviction
    session_tier.py  SessionTier: evicted slots' states in RAM, then on disk, restored by token prefix
    state_store.py   StateRam, StateDisk: sequence states in RAM and as files, bounded in bytes, LRU
    scheduler.py     Scheduler: waiting / running queues, admission, chunked prefill, preemption (decides only)
    engine.py        Engine.step(): schedule -> one Batch -> decode -> sample -> post-process (and verify drafts)
    speculative.py   SpecParams, Speculator: speculative decoding's drafters and parameters (common/speculative.cpp)
    draft_budget.py  DecodeCost, DraftBudget: what a decode row costs here, how much of a draft is worth verifying
    ngram.py         the n-gram drafters: ngram-simple, ngram-map-k, ngram-mod (common/ngram-map.cpp, ngram-mod.cpp)
                     and llamactx's ngram-backoff (shorter keys, loops drafted through)
    draft_model.py   the draft-model drafter (draft-simple): a small model drafting in a context of its own
    checkpoints.py   context checkpoints: snapshots of a slot's non-rollbackable memory (--ctx-checkpoints)
"""

from llamactx.engine.engine import Engine, EngineStats, StepOutput
from llamactx.engine.sequence import (
    Chunk,
    Completion,
    EngineError,
    GenerationError,
    Limits,
    RequestOptions,
    Sequence,
    SequenceStatus,
    Timings,
)
from llamactx.engine.session_tier import SessionParams
from llamactx.engine.speculative import NgramParams, SpecParams, SpecParamsError
from llamactx.engine.text_stream import TextStream

__all__ = ["Chunk", "Completion", "Engine", "EngineError", "EngineStats", "GenerationError", "Limits", "NgramParams",
           "RequestOptions", "Sequence", "SequenceStatus", "SessionParams", "SpecParams", "SpecParamsError",
           "StepOutput", "TextStream", "Timings"]

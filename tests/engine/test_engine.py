"""The engine on the real SmolLM2: continuous batching is invisible in the results (batch invariance), slots and
the queue, prefix sharing, aborts, preemption when memory runs out, context shift."""

from __future__ import annotations

import pytest

from llamactx.engine import Engine, EngineError, Limits, RequestOptions
from llamactx.llm import LLM
from llamactx.sampling import SamplerChain, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "Python is a programming language that",
    "The largest planet in the solar system is",
]


def chain(model, temperature: float = 0.0, seed: int = 1) -> SamplerChain:
    params = SamplingParams(temperature=temperature, seed=seed)
    return SamplerChain.default(params, model.hparams.n_vocab, model.vocab, n_ctx=4096)


def run_all(engine: Engine, seqs, max_steps: int = 2000) -> None:
    for _ in range(max_steps):
        if not engine.has_work:
            return
        engine.step()
    raise AssertionError("the engine did not finish in time")


@pytest.fixture(scope="module")
def prompts(smollm):
    return [smollm.vocab.tokenize(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def alone(smollm, prompts):
    """Each prompt's greedy and seeded completions, one request at a time."""
    engine = Engine(smollm, n_slots=1, n_ctx=1024)
    out = {}
    for temp in (0.0, 0.8):
        for i, p in enumerate(prompts):
            seq = engine.add_request(p, chain(smollm, temp, seed=i), Limits(max_tokens=24))
            run_all(engine, [seq])
            out[temp, i] = seq.output
    return out


@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_eight_concurrent_requests_equal_each_alone(smollm, prompts, alone, temp):
    engine = Engine(smollm, n_slots=8, n_ctx=2048, n_batch=64)  # prompts prefill in chunks beside decodes
    seqs = [engine.add_request(p, chain(smollm, temp, seed=i), Limits(max_tokens=24)) for i, p in enumerate(prompts)]
    busy = []
    while engine.has_work:
        engine.step()
        busy.append(len(engine.scheduler.running))
    assert [s.output for s in seqs] == [alone[temp, i] for i in range(8)]
    assert max(busy) == 8 and engine.ctx.memory.used > 0


def test_slots_bound_the_running_requests_and_the_queue_is_fifo(smollm, prompts):
    engine = Engine(smollm, n_slots=2, n_ctx=1024)
    seqs = [engine.add_request(p, chain(smollm), Limits(max_tokens=8)) for p in prompts[:5]]
    started = []
    while engine.has_work:
        engine.step()
        assert len(engine.scheduler.running) <= 2
        started += [s.id for s in seqs if s.t_admitted is not None and s.id not in started]
    assert started == sorted(started) and len(started) == 5
    assert all(s.finish_reason == "length" and len(s.output) == 8 for s in seqs)


def test_a_shared_system_prompt_is_decoded_once(smollm):
    system = smollm.vocab.tokenize("You are a helpful assistant. " * 50)[:300]
    engine = Engine(smollm, n_slots=8, n_ctx=4096, n_batch=512)
    tails = [smollm.vocab.tokenize(f" Question {i}: what is {i} + {i}?", add_special=False) for i in range(8)]
    seqs = [engine.add_request(system + t, chain(smollm), Limits(max_tokens=4)) for t in tails]
    run_all(engine, seqs)
    tail_tokens = sum(len(t) for t in tails)
    assert engine.stats.n_prompt_tokens <= len(system) + tail_tokens + 8
    assert sum(s.n_cached for s in seqs) >= 7 * (len(system) - 1)
    assert engine.ctx.memory.used <= len(system) + tail_tokens + 8 * 4


def test_an_aborted_request_frees_its_slot_at_once(smollm, prompts):
    engine = Engine(smollm, n_slots=2, n_ctx=1024)
    a, b, c = (engine.add_request(p, chain(smollm), Limits(max_tokens=40)) for p in prompts[:3])
    for _ in range(3):
        engine.step()
    assert c.t_admitted is None
    engine.abort(a)
    assert a.finish_reason == "abort" and a not in engine.scheduler.running
    n_out = len(a.output)
    engine.step()
    assert c.t_admitted is not None and len(a.output) == n_out  # never decoded again
    run_all(engine, [b, c])
    assert b.finish_reason == c.finish_reason == "length"


def test_a_full_memory_preempts_and_recomputes_without_changing_results(smollm, prompts, alone):
    engine = Engine(smollm, n_slots=4, n_ctx=256, n_batch=64)  # 4 x (prompt + 40) tokens need more than 256
    long_prompts = [p * 8 for p in prompts[:4]]
    seqs = [engine.add_request(p, chain(smollm), Limits(max_tokens=40)) for p in long_prompts]
    run_all(engine, seqs)
    single = Engine(smollm, n_slots=1, n_ctx=256)
    for p, s in zip(long_prompts, seqs, strict=True):
        ref = single.add_request(p, chain(smollm), Limits(max_tokens=40))
        run_all(single, [ref])
        assert s.output == ref.output and s.finish_reason == "length"
    assert engine.scheduler.n_preempted > 0


def test_requests_that_cannot_fit_are_refused(smollm):
    engine = Engine(smollm, n_slots=2, n_ctx=256)
    with pytest.raises(EngineError, match="more than a slot's context n_ctx = 256"):
        engine.add_request(list(range(1, 300)), chain(smollm))
    with pytest.raises(EngineError, match="outside the vocab"):
        engine.add_request([1, 10**6], chain(smollm))
    with pytest.raises(EngineError, match="id_slot 5"):
        engine.add_request([1, 2], chain(smollm), options=RequestOptions(id_slot=5))
    with pytest.raises(EngineError, match="prompt is empty"):
        engine.add_request([], chain(smollm))


def test_logprobs_are_the_log_softmax_of_the_logits(smollm, prompts):
    engine = Engine(smollm, n_slots=1, n_ctx=512)
    seq = engine.add_request(prompts[0], chain(smollm), Limits(max_tokens=3), RequestOptions(n_probs=3))
    chunks = list(engine.generate(seq))
    assert all(c.logprob is not None and c.logprob <= 0 for c in chunks if c.token is not None)
    first = chunks[0]
    assert first.top_logprobs[0][0] == first.token  # greedy: the most likely token
    assert [lp for _, lp in first.top_logprobs] == sorted((lp for _, lp in first.top_logprobs), reverse=True)


def test_llm_is_a_one_slot_engine_user(smollm):
    llm = LLM(smollm, n_ctx=512)
    assert llm.engine.n_slots == 1
    out = llm.complete("1, 2, 3, 4, 5,", max_tokens=8, temperature=0)
    assert out.text.startswith(" 6, 7")
    assert llm.tokens[-1] == out.tokens[-1] or len(llm.tokens) > 0

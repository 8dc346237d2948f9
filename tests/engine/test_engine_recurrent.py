"""The engine serving models whose memory cannot keep a partial prefix (recurrent states; tests/data/tiny):
concurrent requests equal each alone, and the prompt cache reuses a slot only when the whole cached history
starts the new prompt, else reprocesses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamactx import Model
from llamactx.engine import Engine, Limits
from llamactx.models import ARCHITECTURES
from llamactx.sampling import SamplerChain, SamplingParams

TINY = Path(__file__).parent.parent / "data" / "tiny"
NAMES = [name for name in ("mamba2", "lfm2") if name in ARCHITECTURES]


@pytest.fixture(scope="module", params=NAMES)
def tiny(request):
    ref = json.loads((TINY / f"{request.param}.json").read_text())
    return Model.load(TINY / f"tiny-{request.param}.gguf"), ref


def greedy(model) -> SamplerChain:
    return SamplerChain.default(SamplingParams(temperature=0.0), model.hparams.n_vocab, model.vocab, n_ctx=256)


def run(engine: Engine, seqs) -> None:
    for _ in range(500):
        if not engine.has_work:
            return
        engine.step()
    raise AssertionError("the engine did not finish")


def alone(model, prompt, n: int) -> list[int]:
    engine = Engine(model, n_slots=1, n_ctx=256, n_threads=2)
    seq = engine.add_request(prompt, greedy(model), Limits(max_tokens=n))
    run(engine, [seq])
    return seq.output


def test_two_concurrent_requests_equal_each_alone(tiny):
    model, ref = tiny
    p0, p1 = ref["prompts"][0]["tokens"], ref["prompts"][2]["tokens"]
    engine = Engine(model, n_slots=2, n_ctx=256, n_batch=8, n_threads=2)  # prompts prefill in chunks
    seqs = [engine.add_request(p, greedy(model), Limits(max_tokens=16)) for p in (p0, p1)]
    run(engine, seqs)
    assert seqs[0].output == ref["greedy"][:16]  # llama.cpp's greedy tokens
    assert seqs[1].output == alone(model, p1, 16)
    assert engine.stats.n_busy_slots > engine.stats.n_decode  # the two did share decodes


def test_prompt_cache_reuses_whole_histories_only(tiny):
    """A follow-up whose prompt starts with everything a slot holds continues that state (its cached tokens are
    not decoded again); a prompt sharing only part of a slot's history is reprocessed from the start. Both give
    the tokens a fresh engine gives."""
    model, ref = tiny
    p0 = ref["prompts"][0]["tokens"]
    engine = Engine(model, n_slots=2, n_ctx=256, n_threads=2)
    first = engine.add_request(p0, greedy(model), Limits(max_tokens=8))
    run(engine, [first])
    held = p0 + first.output[:-1]  # the last sampled token was never decoded
    follow = held + first.output[-1:] + [5, 6]
    partial = p0[:10] + [7, 8, 9]
    seqs = [engine.add_request(p, greedy(model), Limits(max_tokens=6)) for p in (follow, partial)]
    run(engine, seqs)
    assert seqs[0].n_cached == len(held)
    assert seqs[1].n_cached == 0
    assert seqs[0].output == alone(model, follow, 6)
    assert seqs[1].output == alone(model, partial, 6)

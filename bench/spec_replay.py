"""Speculative decoding replayed on a fixed greedy output: what each n-gram drafter would draft, what the draft
budget would verify and how many decodes that takes, without running the model again (a drafter only changes the
number of decodes, never a greedy output: tests/engine/test_speculative.py). The decode time is modelled by a
row-cost line, `fixed + per_row * rows` ms (DecodeCost's line: `bench/spec_bench.py` prints the one it measured),
so the ratio is plain's 1-row decodes over the drafted decodes' modelled time: an upper bound on the measured
ratio (no per-step Python time, no load). Where the copies a drafter misses lie shows in "single" (tokens decoded
one row at a time). "oracle" replays the same drafts verified exactly as far as they turn out right (and not at all
where the first token is wrong): the most any draft budget could make of them at that row cost.

Usage: python bench/spec_replay.py [-m smollm2] [--task a,c,d] [--types ngram-simple,ngram-backoff,ngram-mod]
           [--row-cost 6.27,2.04] [--save DIR | --load DIR]
(--save writes each task's prompt and greedy output as DIR/<task>.json, --load replays those instead of
generating: the outputs of a haswell-compiled model with NUMBA_CPU_NAME=haswell, for example.)
The row-cost lines measured on 2026-12-05 (spec_bench.py's "decode cost measured", quiet, -t 2): native (Zen 4)
6.27 + 2.04 ms/row, haswell target 5.19 + 2.83 ms/row; 2026-12-06 native 3.72-4.09 + 1.94-2.37 ms/row. With
3.72 + 1.94 the budget's replay gives a / c / d 1.92x / 1.79x / 2.29x and the oracle 2.34x / 2.17x / 2.70x
(haswell outputs at 5.19 + 2.83: 1.57x / 1.84x / 2.22x, oracle 1.93x / 2.11x / 2.53x): SmolLM2 writes text of its
own for the first ~20-60 tokens of (a) and (c) (no draft can be right there) before it loops, and a row costs a
third to a half of a one-row decode, so even perfect drafting of these outputs stays near 2x.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spec_bench import task_prompt

from llamactx import Model
from llamactx.embedded import resolve_model_path
from llamactx.engine import Engine, Limits, RequestOptions
from llamactx.engine.draft_budget import DecodeCost, DraftBudget
from llamactx.engine.speculative import SpecParams, Speculator
from llamactx.sampling import SamplerChain, SamplingParams


def greedy(model: Model, prompt: list[int], n: int) -> list[int]:
    engine = Engine(model, n_ctx=2048, n_threads=1, n_threads_batch=1)
    sampler = SamplerChain.default(SamplingParams(temperature=0.0), model.hparams.n_vocab, model.vocab,
                                   n_ctx=engine.n_ctx_slot)
    seq = engine.add_request(prompt, sampler, Limits(max_tokens=n, ignore_eos=True), RequestOptions(cache_prompt=False))
    for _ in engine.generate(seq):
        pass
    return seq.output


def _matched(draft: list[int], out: list[int], i: int) -> int:
    """How many tokens of `draft` the output holds from index i on: what verifying it accepts."""
    k = 0
    while k < len(draft) and i + k < len(out) and draft[k] == out[i + k]:
        k += 1
    return k


def replay(spec_type: str, prompt: list[int], out: list[int], fixed: float, per_row: float,
           steps: list | None = None) -> dict:
    """Decode `out` after `prompt` as the engine would with `spec_type` and the draft budget (one stream), the
    budget's cost model holding the line; out[0] comes from the prompt's decode. `steps`, given, gets each
    decode's (output index, draft length, tokens of it accepted)."""
    cost = DecodeCost(SpecParams().free_rows)
    for rows in range(1, 65):
        for _ in range(DecodeCost.MIN_SAMPLES):
            cost.observe(rows, fixed + per_row * rows)
    spec = Speculator(SpecParams(types=(spec_type,)), cost=cost)
    budget: DraftBudget = spec.budget
    i, ms, decodes, drafted, accepted, single = 1, 0.0, 0, 0, 0, 0
    while i < len(out):
        tokens = prompt + out[:i]
        n_cap = budget.cap(0, 1, 1, 1024)
        if n_cap == 0 and not budget.has_shadow(0):
            budget.shadow(0, len(tokens), spec.draft(0, 1, tokens, 1024))
        draft = spec.draft(0, 1, tokens, n_cap) if n_cap else []
        k = _matched(draft, out, i)
        if draft:
            spec.accept(0, k, len(draft))
        if steps is not None:
            steps.append((i, len(draft), k))
        decodes, drafted, accepted, single = decodes + 1, drafted + len(draft), accepted + k, single + (not draft)
        ms += fixed + per_row * (1 + len(draft))
        i += k + 1
        budget.follow(0, prompt + out[:i])
    plain = (len(out) - 1) * (fixed + per_row)
    return {"decodes": decodes, "drafted": drafted, "accepted": accepted, "single": single, "ratio": plain / ms}


def oracle(spec_type: str, prompt: list[int], out: list[int], fixed: float, per_row: float) -> dict:
    """`replay` with a budget that knows the future: each decode verifies the drafter's whole draft up to the first
    token the output does not hold (nothing where the first is wrong); the drafter sees the same histories."""
    spec = Speculator(SpecParams(types=(spec_type,)))
    i, ms, decodes, accepted, single = 1, 0.0, 0, 0, 0
    while i < len(out):
        k = _matched(spec.draft(0, 1, prompt + out[:i], len(out)), out, i)
        decodes, accepted, single = decodes + 1, accepted + k, single + (k == 0)
        ms += fixed + per_row * (1 + k)
        i += k + 1
    plain = (len(out) - 1) * (fixed + per_row)
    return {"decodes": decodes, "drafted": accepted, "accepted": accepted, "single": single, "ratio": plain / ms}


def main() -> None:
    p = argparse.ArgumentParser(prog="spec_replay", description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("-n", "--n-predict", type=int, default=256)
    p.add_argument("--task", default="a,c,d")
    p.add_argument("--types", default="ngram-simple,ngram-backoff,ngram-mod,ngram-map-k")
    p.add_argument("--row-cost", default="6.27,2.04", help="FIXED,PER_ROW ms of a decode")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--save", type=Path, default=None)
    g.add_argument("--load", type=Path, default=None)
    args = p.parse_args()
    fixed, per_row = (float(x) for x in args.row_cost.split(","))
    model = None if args.load else Model.load(resolve_model_path(args.model))
    for task in args.task.split(","):
        if args.load:
            data = json.loads((args.load / f"{task}.json").read_text())
        else:
            prompt = model.vocab.tokenize(task_prompt(model, task), parse_special=True)
            data = {"prompt": prompt, "out": greedy(model, prompt, args.n_predict)}
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / f"{task}.json").write_text(json.dumps(data))
        for t in args.types.split(","):
            r = replay(t, data["prompt"], data["out"], fixed, per_row)
            o = oracle(t, data["prompt"], data["out"], fixed, per_row)
            print(f"task {task} {t:13s}: {r['decodes']:3d} decodes for {len(data['out'])} tokens, "
                  f"{r['accepted']} of {r['drafted']} draft tokens accepted, {r['single']} one-row decodes, "
                  f"modelled {r['ratio']:.2f}x (oracle: {o['decodes']} decodes, {o['ratio']:.2f}x)")


if __name__ == "__main__":
    main()

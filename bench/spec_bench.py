"""Speculative decoding (n-gram drafts or a draft model) against plain decoding: one stream, generation tokens/s.

Four tasks, each run alternately without and with speculation (so a machine whose load drifts hurts both alike):
(a) input-grounded: the model repeats ~500 tokens of code with a variable renamed, greedy (drafts from the prompt
    should be accepted for long stretches); (b) free generation at temperature 1 (few drafts: the cost of looking);
(c) the same code repeated verbatim, greedy: a copy the model follows even where arithmetic makes it leave (a)'s
    text early (SmolLM2 compiled for AVX2 wanders from (a) after ~140 characters); (d) proofreading, greedy: "Fix
    the typos in this text." on ~330 tokens of well-written prose with three misspelt words (a user's text is
    mostly right), the answer the text again with the model's corrections: the copy SmolLM2 follows best, natively
    and for AVX2 (it leaves the text for a token or two at a time: a comma, a word replaced; ngram-backoff's
    cursor drafts the copy again right after each). SmolLM2 (135M) follows neither code copy for long: after a
    few dozen tokens of the code it writes text of its own, then loops on it, and the drafts that pay come from
    that loop (--trace shows, per step, whether ngram-simple found a draft and how much of it the draft budget
    verified). ngram-simple drafts no loop shorter than its 12-token key and one
    period less a token of a longer one; `--spec-type ngram-backoff` (llamactx's own) drafts through loops and
    backs off to 6- and 3-token keys (bench/spec_replay.py replays the types on one greedy output, no model).
tg t/s is the request's generation rate (llama-server's timings: generated tokens after the first over the time
since the first), the prompt is not counted; "per CPU second" is the same tokens over the process's CPU time (with
-t 1 on a machine that other processes load, the ratio that does not depend on how much of a core they leave).
The issue's targets: >= 2x where the model follows the text ((a), (d); (c) natively), <= 5% loss on (b).

Usage: python bench/spec_bench.py [-m smollm2] [-t 2] [-n 256] [--runs 3] [--task a,b,c,d]
           [--spec-type ngram-simple] [--spec-ngram-simple-size-n N] [--spec-ngram-simple-size-m N] ... (every
           llama-server --spec-* flag of cli/args.py; default --spec-type ngram-simple)
           [--trace] [--draft-model FNAME] (= --spec-type draft-simple -md FNAME: speculation with a draft model; a test
           draft made of the model's own first layers: tests/models/draft.py `write_draft`)
The draft budget measures what a decode row costs on this machine from the decodes it runs (speculative.py
DecodeCost); run 0 of each task, not counted, is where it first learns it. With a draft model, each run starts
with an empty draft context, so the draft's own prompt processing, which
happens at the first draft (after the first token), is counted in tg.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from llamactx import Model
from llamactx.cli.args import ArgumentParser, add_speculative, spec_params
from llamactx.embedded import resolve_model_path
from llamactx.engine import Engine, Limits, RequestOptions
from llamactx.engine.ngram import NgramBackoff, NgramSimple
from llamactx.engine.speculative import Speculator
from llamactx.sampling import SamplerChain, SamplingParams

CODE = (Path(__file__).parent / "data" / "spec_code.txt").read_text()  # ~480 tokens: llamactx/engine/sequence.py
TEXT = (Path(__file__).parent / "data" / "spec_text.txt").read_text().strip()  # ~330 tokens of prose, 3 typos


def task_prompt(model: Model, task: str) -> str:
    if task == "a":  # the chat's answer starts with the code fence, so the copy begins at once
        return ("<|im_start|>user\nRewrite this code with the variable `seq` renamed to `s`. Output only the "
                f"code.\n```python\n{CODE}```<|im_end|>\n<|im_start|>assistant\n```python\n")
    if task == "c":  # a verbatim copy: followed longer where the arithmetic makes (a)'s model wander (AVX2)
        return ("<|im_start|>user\nRepeat this code exactly, without any change.\n```python\n"
                f"{CODE}```<|im_end|>\n<|im_start|>assistant\n```python\n")
    if task == "d":  # proofreading: the answer is the text again, with whatever the model corrects
        return f"<|im_start|>user\nFix the typos in this text.\n\n{TEXT}<|im_end|>\n<|im_start|>assistant\n"
    return "<|im_start|>user\nWrite a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


class DraftTrace:
    """Per step of a lone stream (--trace): the tokens it produced, whether the first drafter's lookup (ngram-simple
    or ngram-backoff) found a draft and
    how many draft tokens were verified; `summary` says where the tokens decoded one row at a time came from."""

    def __init__(self, engine: Engine):
        self.engine, self.steps = engine, []
        self._drafter = engine.scheduler.drafter
        engine.scheduler.drafter = self._draft

    def _draft(self, seq, n_max, n_gen, used):
        spec = self.engine.speculator
        pure = isinstance(spec.drafters[0], (NgramSimple, NgramBackoff))  # a pure lookup: asking twice changes nothing
        found = spec.drafters[0].draft(seq.seq_id, seq.tokens[:-1], seq.tokens[-1]) if pure else None
        out = self._drafter(seq, n_max, n_gen, used)
        self.steps.append((seq.n_output, None if found is None else len(found), len(out),
                           spec.budget.rate(seq.seq_id)))
        return out

    def summary(self, n_tokens: int) -> str:
        ends = [s[0] for s in self.steps[1:]] + [n_tokens]
        alone = [(s, end - s[0]) for s, end in zip(self.steps, ends, strict=True) if s[2] == 0]
        miss = sum(n for s, n in alone if s[1] == 0)
        refused = sum(n for s, n in alone if s[1])
        spans = " ".join(f"{s[0]}:{s[1]}/{s[2]}@{s[3]:.2f}" for s in self.steps
                         if s[2] or s[1])  # output index: found/verified@rate
        return (f"    {len(alone)} one-row steps: {miss} tokens with no n-gram match, {refused} with a draft the "
                f"budget did not verify\n    steps with a draft (token:found/verified@rate): {spans}")


def run_once(engine: Engine, prompt: list[int], temp: float, seed: int, n: int) -> dict:
    params = SamplingParams(temperature=temp, seed=seed)
    sampler = SamplerChain.default(params, engine.model.hparams.n_vocab, engine.model.vocab, n_ctx=engine.n_ctx_slot)
    if engine.speculator is not None and engine.speculator.draft_model is not None:  # an empty draft context
        d = engine.speculator.draft_model
        d.ctx.memory.clear(data=False)
        d.held = [[] for _ in d.held]
    elif engine.speculator is not None:  # drafters start empty: ngram-mod's table would remember the last answer;
        # the decode costs measured so far (the machine's, not the answer's) are kept
        engine.speculator = Speculator(engine.spec, cost=engine.speculator.budget.cost)
    n_decode, st = engine.stats.n_decode, engine.stats
    drafted, accepted = st.n_draft_tokens, st.n_draft_accepted
    seq = engine.add_request(prompt, sampler, Limits(max_tokens=n, ignore_eos=True),
                             RequestOptions(cache_prompt=False))
    cpu0 = n0 = None
    for _ in engine.generate(seq):
        if cpu0 is None:  # the first token: the rest is generation (tg), as predicted_ms counts it
            cpu0, n0 = time.process_time(), seq.n_output
    t = seq.timings
    return {"tps": 1e3 * (t.predicted_n - 1) / t.predicted_ms, "n": t.predicted_n, "tokens": seq.output,
            "cpu_tps": (seq.n_output - n0) / max(time.process_time() - cpu0, 1e-9),
            "decodes": st.n_decode - n_decode, "drafted": st.n_draft_tokens - drafted,
            "accepted": st.n_draft_accepted - accepted}


def main() -> None:
    p = ArgumentParser(prog="spec_bench", description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", "--n-predict", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--task", default="a,b")
    p.add_argument("--draft-model", default=None, help="= --spec-type draft-simple -md FNAME")
    p.add_argument("--trace", action="store_true", help="per step of the last run: n-gram match, draft verified")
    add_speculative(p)
    args = p.parse_args()
    if args.draft_model is not None:
        args.spec_draft_model = args.draft_model
        args.spec_type = args.spec_type or ["draft-simple"]
    if not args.spec_type:
        args.spec_type = ["ngram-simple"]
    spec = spec_params(args)
    model = Model.load(resolve_model_path(args.model))
    engines = {False: Engine(model, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads),
               True: Engine(model, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, spec=spec)}
    for e in engines.values():
        e.warmup()
    print(f"{args.model}, -t {args.threads}, {args.n_predict} tokens, {spec}")
    if engines[True].speculator is not None and engines[True].speculator.draft_model is not None:
        d = engines[True].speculator.draft_model.model
        print(f"draft model: {d.path} ({d.hparams.n_layer} layers, {d.size / 2**20:.0f} MiB)")
    for task in args.task.split(","):
        prompt = model.vocab.tokenize(task_prompt(model, task), parse_special=True)
        temp = 1.0 if task == "b" else 0.0
        res: dict[bool, list[dict]] = {False: [], True: []}
        for r in range(args.runs + 1):  # run 0 plans the graphs of this task's shapes: not counted
            trace = DraftTrace(engines[True]) if args.trace and r == args.runs else None
            for on in (False, True):
                out = run_once(engines[on], prompt, temp, seed=1234 + r, n=args.n_predict)
                if r:
                    res[on].append(out)
                    print(f"  task {task} run {r} spec {'on ' if on else 'off'}: {out['tps']:7.2f} t/s "
                          f"({out['cpu_tps']:7.2f} per CPU second), "
                          f"{out['decodes']} decodes, drafted {out['drafted']}, accepted {out['accepted']}")
        if trace is not None:
            engines[True].scheduler.drafter = trace._drafter
            print(trace.summary(res[True][-1]["n"]))
        same = all(a["tokens"] == b["tokens"] for a, b in zip(res[False], res[True], strict=True))
        off, on = (statistics.median(x["tps"] for x in res[k]) for k in (False, True))
        cpu_off, cpu_on = (statistics.median(x["cpu_tps"] for x in res[k]) for k in (False, True))
        last = res[True][-1]
        print(f"task {task} ({len(prompt)}-token prompt, temp {temp}): off {off:.2f} t/s, on {on:.2f} t/s, "
              f"ratio {on / off:.2f}x (per CPU second {cpu_on / cpu_off:.2f}x), same tokens: {same} "
              f"(on: {last['decodes']} decodes for {last['n']} tokens, "
              f"{last['accepted']} of {last['drafted']} draft tokens accepted; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})")
        if engines[True].speculator is not None:
            print(f"  decode cost measured: {engines[True].speculator.budget.cost.summary()}")


if __name__ == "__main__":
    main()

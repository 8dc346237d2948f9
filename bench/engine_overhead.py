"""Engine overhead: a server step (Engine.step: schedule, build the batch, decode, sample every sequence, text
out) against the bare `ctx.decode` of the same batch (issue 9's target: <= 15%).

B requests with the server's default sampling chain generate together; for every step in which all of them are
generating (one token each, no prompt chunk) the step's time and its ctx.decode's time are recorded. Reported:
the medians, and overhead = step / decode - 1. The clock is wall time on the calling thread (use a quiet machine).

Usage: python bench/engine_overhead.py [-m smollm2] [-B 8] [-n 64] [-t 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from llamactx import Model
from llamactx.embedded import resolve_model_path
from llamactx.engine import Engine, Limits
from llamactx.sampling import SamplerChain, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-B", "--batch", type=int, default=8, help="concurrent requests (slots)")
    ap.add_argument("-n", "--n-gen", type=int, default=64, help="tokens per request")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    model = Model.load(resolve_model_path(args.model))
    engine = Engine(model, n_slots=args.batch, n_ctx=4096, n_threads=args.threads, n_threads_batch=args.threads)
    engine.warmup()
    ctx = engine.ctx
    decode_ms: list[float] = []
    real_decode = ctx.decode

    def timed_decode(batch):
        t0 = time.perf_counter()
        try:
            return real_decode(batch)
        finally:
            decode_ms.append((time.perf_counter() - t0) * 1000)

    ctx.decode = timed_decode  # an instance attribute: only this context's calls are timed
    vocab = model.vocab
    for i in range(args.batch):
        prompt = vocab.tokenize(f"Request {i}: tell me a story about a lighthouse.", add_special=True)
        engine.add_request(prompt, SamplerChain.default(SamplingParams(seed=i), model.hparams.n_vocab),
                           Limits(max_tokens=args.n_gen, ignore_eos=True))
    steps, decodes = [], []
    while engine.has_work:
        generating = all(s.is_generating for s in engine.scheduler.running)
        n_running = len(engine.scheduler.running)
        t0 = time.perf_counter()
        engine.step()
        ms = (time.perf_counter() - t0) * 1000
        if generating and n_running == args.batch and decode_ms:
            steps.append(ms)
            decodes.append(decode_ms[-1])
    step, dec = statistics.median(steps), statistics.median(decodes)
    print(f"{args.model}, B = {args.batch}, {args.threads} threads, "
          f"{len(steps)} generation steps")
    print("| step ms | ctx.decode ms | overhead |")
    print("| ---: | ---: | ---: |")
    print(f"| {step:.2f} | {dec:.2f} | {100 * (step / dec - 1):.1f}% |")


if __name__ == "__main__":
    main()

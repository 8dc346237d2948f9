"""CPU time per decoded token of a tiny recurrent / hybrid model, the forward as one compiled program against the
same forward op by op (FastOps without graphs: what these models ran before issue 41's compiled path), alternating
the two so that the machine's load moves both alike. One thread; tiny models, so the time is the per-node Python
and dispatch the program removes, not arithmetic:

    python bench/recurrent_decode_cpu.py tests/data/tiny/tiny-granitehybrid.gguf -n 64 -r 3
"""

from __future__ import annotations

import argparse
import time

from llamactx import Batch, Context, ContextParams, Model


def decode_cpu(model: Model, n: int, compiled: bool) -> float:
    """Seconds of process CPU time per token over n single-token decodes after an 8-token prompt."""
    ctx = Context(model, ContextParams(n_ctx=n + 16, n_batch=16, n_threads=1, n_threads_batch=1))
    if not compiled:
        ctx.ops._plan = lambda build, params: None  # every ubatch op by op
    batch = Batch(8)
    for i in range(8):
        batch.add(1 + i, i, [0], logits=i == 7)
    ctx.decode(batch)
    one = Batch(1)
    one.add(2, 8, [0], logits=True)
    ctx.decode(one)  # warm: plans and compiles outside the timing
    t0 = time.process_time()
    for i in range(n):
        one = Batch(1)
        one.add(3 + i % 7, 9 + i, [0], logits=True)
        ctx.decode(one)
    return (time.process_time() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=64, help="tokens per run")
    ap.add_argument("-r", type=int, default=3, help="alternating runs of each")
    args = ap.parse_args()
    model = Model.load(args.model)
    for _ in range(args.r):
        eager, graph = decode_cpu(model, args.n, False), decode_cpu(model, args.n, True)
        print(f"op by op {eager * 1e3:7.3f} ms/token   compiled {graph * 1e3:7.3f} ms/token   "
              f"ratio {eager / graph:5.2f}x")


if __name__ == "__main__":
    main()

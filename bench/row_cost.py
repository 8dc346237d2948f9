"""What decoding n rows at once costs relative to one row (batched decode, speculative verification), per matmul
kernel and for the whole decode step, on the target numba compiles for (run it once natively and once with
NUMBA_CPU_NAME=haswell NUMBA_CACHE_DIR=.numba-haswell to compare the AVX2 path).

Per matrix of the model (each distinct type and shape, Q/K/V and gate/up packed as FastOps packs them, the output
matrix) it prints the time of one matmul of n = 1, 2, 4, 8 activation rows and its ratio to n = 1; then the same
for a decode step of n sequences, one token each (Context.decode). The clock is the calling thread's CPU time with
one thread (numba runs a one-thread parallel region on the calling thread), the best of `--reps`, so the figures
hold on a machine other processes share.

Usage: python bench/row_cost.py [-m smollm2|gemma3|PATH] [-n 1,2,4,8] [--reps 20] [--no-forward]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path.cwd()))  # the checkout run from, before an installed llamactx

from llamactx import Batch, Context, ContextParams, Model  # noqa: E402
from llamactx.backend.fast import FastOps  # noqa: E402
from llamactx.embedded import resolve_model_path  # noqa: E402
from llamactx.ggml import kernels  # noqa: E402
from llamactx.ggml.cpu import active_path, arithmetic  # noqa: E402

GROUPS = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"), ("attn_output",), ("ffn_down",))


def cpu_best(fn, reps: int) -> float:
    """The least CPU time of the calling thread over `reps` calls of fn (after one untimed call)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def matrices(model: Model) -> list[tuple[str, list]]:
    """(label, weights) of block 0's matmuls as FastOps packs them, and the output matrix."""
    out = []
    for group in GROUPS:
        ws = [model.weight(f"blk.0.{n}.weight") for n in group if f"blk.0.{n}.weight" in model.tensor_infos]
        by_type: dict = {}
        for w in ws:
            by_type.setdefault((w.ggml_type, w.shape[0]), []).append(w)
        for same in by_type.values():
            out.append(("+".join(w.name.split(".")[2] for w in same), same))
    head = "output.weight" if "output.weight" in model.tensor_infos else "token_embd.weight"
    out.append((head, [model.weight(head)]))
    return out


def kernel_rows(model: Model, ns: list[int], reps: int) -> None:
    rng = np.random.default_rng(0)
    print(f"{'matrix':24} {'type':6} {'k x rows':>13} " + " ".join(f"{'n=' + str(n) + ' ms':>9}" for n in ns)
          + "  " + " ".join(f"{'x' + str(n):>6}" for n in ns[1:]))
    for label, ws in matrices(model):
        pw = kernels.pack_weights(ws) if len(ws) > 1 else kernels.pack_weight(ws[0])
        order = FastOps._kernel_order(ws[0])
        times = []
        for n in ns:
            x = rng.standard_normal((n, pw.k)).astype(np.float32)  # (n, k)
            out = np.empty((n, pw.n_rows), np.float32)  # (n, n_rows)
            r = reps if pw.n_rows * pw.k < 20_000_000 else max(3, reps // 4)
            def run(x=x, out=out, pw=pw, order=bool(order)):
                kernels.matmul(x, pw, 1, out=out, llama_order=order)

            times.append(cpu_best(run, r))
        print(f"{label:24} {ws[0].type_name:6} {pw.k:>5} x {pw.n_rows:<6} "
              + " ".join(f"{t * 1e3:9.3f}" for t in times) + "  "
              + " ".join(f"{t / times[0]:6.2f}" for t in times[1:]))


def forward_rows(model: Model, ns: list[int], reps: int) -> None:
    n_max = max(ns)
    ctx = Context(model, ContextParams(n_ctx=n_max * 64 + 256, n_batch=512, n_seq_max=n_max, n_threads=1,
                                       n_threads_batch=1, kv_unified=True))
    rng = np.random.default_rng(0)
    prompt = Batch(n_max * 16, n_seq_max=1)
    for s in range(n_max):
        for i, t in enumerate(rng.integers(0, model.hparams.n_vocab, 16)):
            prompt.add(int(t), i, (s,), i == 15)
    if ctx.decode(prompt) != 0:
        raise RuntimeError("prompt decode failed")
    times = []
    for n in ns:
        batch = Batch(n)
        pos = [16]

        def step(n=n, batch=batch, pos=pos):
            batch.clear()
            for s in range(n):
                batch.add(int(rng.integers(0, model.hparams.n_vocab)), pos[0], (s,), True)
            ctx.decode(batch)
            pos[0] += 1
            for s in range(n):  # keep the sequences short: every n sees the same context length
                ctx.memory.seq_rm(s, pos[0] - 1, -1)
            pos[0] -= 1

        times.append(cpu_best(step, reps))
    cells = " ".join(f"n={n} {t * 1e3:.2f} ms" for n, t in zip(ns, times, strict=True))
    print("decode step, n sequences x 1 token: " + cells
          + " | vs n=1: " + " ".join(f"x{t / times[0]:.2f}" for t in times[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-n", "--rows", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-forward", action="store_true")
    args = ap.parse_args()
    ns = [int(v) for v in args.rows.split(",")]
    model = Model.load(resolve_model_path(args.model))
    print(f"{model.desc}: path {active_path()}, arithmetic {arithmetic()['variant']}, 1 thread, CPU time")
    kernel_rows(model, ns, args.reps)
    if not args.no_forward:
        forward_rows(model, ns, max(5, args.reps // 2))


if __name__ == "__main__":
    main()

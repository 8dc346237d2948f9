"""Where a token's time goes: matmuls, attention, other ops, Python (issue 10's profile table).

Decodes a prompt, then single tokens (or B sequences' tokens per step with -B), and splits the time of each step:
- op by op (FastOps with the graph executor off, as every decode ran before it): each ops call is timed, nested
  calls counted once; "attention" includes storing the ubatch's K/V; "recurrent" is ssm_conv, ssm_scan and
  gated_delta_net (a Gated DeltaNet model also gets a line with the bytes of recurrent state a step reads and
  writes, and the rate the recurrent ops move them at); "Python" is the rest of `decode`;
- as a compiled graph (the default where the checkout has one): the plan's run is timed as a whole, then rerun
  with only its matmul rows and with only its attention rows (the program is data: rows of a table), each less
  a run of no rows (binding the inputs); "other ops" = run - matmuls - attention - binding, "Python" = decode -
  run + binding. The reruns compute on the arena's leftovers: their results are thrown away.

The clock is the calling thread's CPU time with one thread (`-t 1`, the default): numba runs a one-thread parallel
region on the calling thread, so the figures hold on a machine other processes share; `--wall` uses wall time
(then use -t 2 on a quiet machine). Run from a checkout (`cd CHECKOUT && python bench/profile_forward.py`) to
profile that checkout; the graph rows are skipped where it has no graph executor.

Usage: python bench/profile_forward.py [-m smollm2] [-n 32] [-p 32] [-d 0] [-B 1] [-t 1] [--wall]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path.cwd()))  # the checkout run from, before an installed llamactx

from llamactx import Batch, Context, ContextParams, Model  # noqa: E402
from llamactx.embedded import resolve_model_path  # noqa: E402

MATMUL = ("matmul", "matmuls")
ATTENTION = ("attention_kv", "attention")
RECURRENT = ("ssm_conv", "ssm_scan", "gated_delta_net")
OTHER = ("get_rows", "rms_norm", "rope", "swiglu", "geglu", "softcap", "l2_norm", "softplus", "sigmoid", "silu",
         "rope_imrope")


class Timer:
    """Sums of the clock per category over the calls it wraps; nested wrapped calls count once, in the outer."""

    def __init__(self, clock) -> None:
        self.clock, self.sums, self.depth = clock, {}, 0

    def wrap(self, fn, cat):
        def timed(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sums[cat] = self.sums.get(cat, 0.0) + self.clock() - t0
                self.depth -= 1

        return timed


def _steps(ctx: Context, n_seq: int, n_prompt: int, n_gen: int, n_depth: int, timer: Timer, rng) -> float:
    """Prompts (untimed), then n_gen steps of one token per sequence. -> the steps' clock seconds (the timer's
    sums cover the steps only)"""
    nv = ctx.model.hparams.n_vocab
    for s in range(n_seq):
        toks = rng.integers(0, nv, n_depth + n_prompt)
        for c in range(0, len(toks), 512):
            b = Batch(len(toks[c : c + 512]))
            for i, t in enumerate(toks[c : c + 512]):
                b.add(int(t), c + i, (s,), c + i == len(toks) - 1)
            assert ctx.decode(b) == 0
    timer.sums.clear()
    clock = timer.clock
    total = 0.0
    step = Batch(n_seq)
    for j in range(n_gen):
        step.clear()
        for s in range(n_seq):
            step.add(int(rng.integers(0, nv)), n_depth + n_prompt + j, (s,), True)
        t0 = clock()
        assert ctx.decode(step) == 0
        total += clock() - t0
    return total


def profile(model, args, graph: bool, clock) -> dict:
    ctx = Context(model, ContextParams(n_ctx=args.B * (args.n_depth + args.n_prompt + args.n_gen + 1) + 256,
                                       n_seq_max=args.B, n_threads=args.threads, n_threads_batch=args.threads,
                                       kv_unified=True, flash_attn=args.flash_attn))
    ops = ctx.ops
    timer = Timer(clock)
    orig_run = None
    if graph:
        from llamactx.ggml.kernels import compute

        orig_run = compute.GraphPlan.run

        def run(plan, *a):
            t0 = clock()
            result = orig_run(plan, *a)
            timer.sums["program"] = timer.sums.get("program", 0.0) + clock() - t0
            full = plan.prog
            try:
                for name, rows in (("matmul", full[:, compute.OP] == compute.MUL_MAT),
                                   ("attention", full[:, compute.OP] == compute.ATTN),
                                   ("binding", np.zeros(len(full), bool))):
                    plan.prog = full[rows]
                    t0 = clock()
                    orig_run(plan, *a)
                    timer.sums[name] = timer.sums.get(name, 0.0) + clock() - t0
            finally:
                plan.prog = full
            return result

        compute.GraphPlan.run = run
    else:
        if hasattr(ops, "compute_graph"):  # op by op: the ReferenceOps behaviour, build computing eagerly
            ops.compute_graph = lambda build, params: build(ops, params)
        for cats, name in ((MATMUL, "matmul"), (ATTENTION, "attention"), (RECURRENT, "recurrent"), (OTHER, "other")):
            for meth in cats:
                if hasattr(ops, meth):
                    setattr(ops, meth, timer.wrap(getattr(ops, meth), name))
    rng = np.random.default_rng(0)
    try:
        _steps(ctx, args.B, args.n_prompt, 2, args.n_depth, timer, rng)  # warm-up: compiles, plans
        ctx.memory.clear(data=False)
        total = _steps(ctx, args.B, args.n_prompt, args.n_gen, args.n_depth, timer, rng)
    finally:
        if orig_run is not None:
            from llamactx.ggml.kernels import compute

            compute.GraphPlan.run = orig_run
    return {"total": total, **timer.sums}


def recurrent_traffic(model) -> dict | None:
    """The recurrent state one decode step reads and writes per sequence (kernels.delta_rule), for a model with
    Gated DeltaNet layers; None for others."""
    if model.arch not in ("qwen35", "qwen35moe", "qwen3next"):
        return None
    try:
        from llamactx.ggml.kernels.delta_rule import recurrent_traffic as traffic
    except ImportError:  # a checkout without the kernel
        return None
    return traffic(model.hparams)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-p", "--n-prompt", type=int, default=32)
    ap.add_argument("-d", "--n-depth", type=int, default=0)
    ap.add_argument("-B", type=int, default=1, help="sequences decoding together")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-fa", "--flash-attn", default="disabled", choices=("enabled", "disabled", "auto"),
                    help="flash attention (default disabled)")
    ap.add_argument("--wall", action="store_true", help="wall time instead of the thread's CPU time")
    args = ap.parse_args()
    clock = time.perf_counter if args.wall else time.thread_time
    model = Model.load(resolve_model_path(args.model))
    try:
        import llamactx.ggml.kernels.compute  # noqa: F401

        has_graph = True
    except ImportError:
        has_graph = False
    eager = profile(model, args, False, clock)
    rows = [("op by op", eager)]
    if has_graph:
        g = profile(model, args, True, clock)
        if "program" in g:  # else the model never ran as a compiled graph: op by op again
            rows.append(("graph", g))
    n_tok = args.n_gen * args.B
    print(f"{Path(model.path).name}, B = {args.B}, depth {args.n_depth + args.n_prompt}, {args.threads} thread(s), "
          f"{'wall' if args.wall else 'CPU'} ms per step ({n_tok // args.n_gen} token(s))")
    print("| run | total | matmuls | attention | recurrent | other ops | Python | tok/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows:
        if name == "graph":  # the decodes' time includes the reruns
            r = {**r, "total": r["total"] - r.get("matmul", 0.0) - r.get("attention", 0.0) - r.get("binding", 0.0)}
            bind = r.get("binding", 0.0)
            mm, at = r.get("matmul", 0.0) - bind, r.get("attention", 0.0) - bind
            other = r.get("program", 0.0) - mm - at - bind
            py = r["total"] - r.get("program", 0.0) + bind
        else:
            mm, at, other = r.get("matmul", 0.0), r.get("attention", 0.0), r.get("other", 0.0)
            py = r["total"] - mm - at - other - r.get("recurrent", 0.0)
        ms = lambda s: f"{1e3 * s / args.n_gen:.2f}"  # noqa: E731
        print(f"| {name} | {ms(r['total'])} | {ms(mm)} | {ms(at)} | {ms(r.get('recurrent', 0.0))} | {ms(other)} | "
              f"{ms(py)} | {n_tok / r['total']:.1f} |")
    traffic = recurrent_traffic(model)
    if traffic:
        rec = eager.get("recurrent", 0.0) / args.n_gen  # seconds per step of the recurrent ops, op by op
        moved = 2 * args.B * (traffic["ssm"] + traffic["conv"])  # read once and written once per sequence
        print(f"recurrent state per decode step: {traffic['layers']} delta-net layers x {args.B} sequence(s): "
              f"delta-rule states {args.B * traffic['ssm'] / 2**20:.2f} MiB read + the same written, conv states "
              f"{args.B * traffic['conv'] / 2**10:.1f} KiB read + written: {moved / 2**20:.2f} MiB moved by the "
              f"recurrent ops, {moved / rec / 1e9 if rec else 0:.1f} GB/s over their time "
              f"({1e3 * rec:.2f} ms); the memory's copies of a step (llamactx.memory.recurrent: the rollback "
              f"snapshot, the view's copy, the store) move it again")


if __name__ == "__main__":
    main()

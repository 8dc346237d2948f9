"""Where a token's time goes: matmuls, attention, other ops, Python (issue 10's profile table).

Decodes a prompt, then single tokens (or B sequences' tokens per step with -B), and splits the time of each step:
- op by op (FastOps with the graph executor off, as every decode ran before it): each ops call is timed, nested
  calls counted once; "attention" includes storing the ubatch's K/V; "recurrent" is ssm_conv, ssm_scan and
  gated_delta_net (a Gated DeltaNet model also gets a line with the bytes of recurrent state a step reads and
  writes, and the rate the recurrent ops move them at); "Python" is the rest of `decode`;
- as a compiled graph (the default where the checkout has one): the decode runs its program one row (node) at a
  time, in order, on the same buffers, so every node computes what it computes in a whole run, recurrent states and
  KV cache included; each call is timed and less the time of a call of no rows (binding the inputs, the dispatch),
  measured at every run. The nodes' times are summed per kind ("mul_mat Q4_K", "mul_mat_id Q6_K", "gdn_rs", ...:
  the second table), "other ops" = the nodes that are neither matmuls, attention nor recurrent, "Python" = decode
  - the nodes - what the extra calls added (their bindings, the timing).
`--prompt` profiles the prompt instead: one ubatch of -p tokens per step (e.g. -p 512, as llama-bench's pp512).

The clock is the calling thread's CPU time with one thread (`-t 1`, the default): numba runs a one-thread parallel
region on the calling thread, so the figures hold on a machine other processes share; `--wall` uses wall time
(then use -t 2 on a quiet machine). Run from a checkout (`cd CHECKOUT && python bench/profile_forward.py`) to
profile that checkout; the graph rows are skipped where it has no graph executor.

Usage: python bench/profile_forward.py [-m smollm2] [-n 32] [-p 32] [-d 0] [-B 1] [-t 1] [--wall]
           [--prompt] [--no-eager]
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


def _prompt(ctx: Context, s: int, toks) -> None:
    for c in range(0, len(toks), 512):
        b = Batch(len(toks[c : c + 512]))
        for i, t in enumerate(toks[c : c + 512]):
            b.add(int(t), c + i, (s,), c + i == len(toks) - 1)
        if ctx.decode(b) != 0:
            raise RuntimeError(f"decode of a prompt chunk at {c} failed")


def _steps(ctx: Context, args, n_gen: int, timer: Timer, rng) -> float:
    """Prompts, then n_gen steps of one token per sequence; with args.prompt, n_gen prompts of args.n_prompt tokens
    (the memory cleared before each) instead. -> the steps' clock seconds (the timer's sums cover them only)"""
    nv = ctx.model.hparams.n_vocab
    clock = timer.clock
    if args.prompt:  # each step: a prompt from an empty cache
        total = 0.0
        timer.sums.clear()
        for _ in range(n_gen):
            ctx.memory.clear(data=False)
            toks = rng.integers(0, nv, args.n_prompt)
            t0 = clock()
            _prompt(ctx, 0, toks)
            total += clock() - t0
        return total
    for s in range(args.B):
        _prompt(ctx, s, rng.integers(0, nv, args.n_depth + args.n_prompt))
    timer.sums.clear()
    total = 0.0
    step = Batch(args.B)
    for j in range(n_gen):
        step.clear()
        for s in range(args.B):
            step.add(int(rng.integers(0, nv)), args.n_depth + args.n_prompt + j, (s,), True)
        t0 = clock()
        if ctx.decode(step) != 0:
            raise RuntimeError(f"decode of step {j} failed")
        total += clock() - t0
    return total


def _kind_name(compute, code: int, prog_row, w_kind) -> str:
    """A node's kind: its op name, and for a matmul the weight's ggml type."""
    name = {v: k for k, v in compute._OPS.items()}.get(code, f"op {code}")
    if code in (compute.MUL_MAT, compute.MUL_MAT_ID, compute.MUL_MAT_HEADS):
        from gguf import GGMLQuantizationType

        kind = int(w_kind[prog_row[compute.P0]])
        known = kind in GGMLQuantizationType._value2member_map_
        name += " " + (GGMLQuantizationType(kind).name if known else str(kind))
    return name


def _node_by_node(compute, timer: Timer, clock):
    """Wrap compute.PROGRAMS so that each program runs one row at a time, each row's time (less a call of no rows)
    summed per node kind into timer.sums["node:" + kind]; "calls" what the extra calls added. -> a function
    that restores the originals"""
    originals = dict(compute.PROGRAMS)

    def wrap(program):
        def by_node(prog, fprm, *rest):  # fprm (n_nodes, 1): each row's float parameter, sliced with it
            start = clock()
            program(prog[:0], fprm[:0], *rest)  # compiles or loads
            empties = []
            for _ in range(7):
                t0 = clock()
                program(prog[:0], fprm[:0], *rest)
                empties.append(clock() - t0)
            empty = sorted(empties)[3]  # the median call of no rows
            nodes = 0.0
            for r in range(prog.shape[0]):
                t0 = clock()
                program(prog[r : r + 1], fprm[r : r + 1], *rest)
                dt = clock() - t0 - empty
                key = "node:" + _kind_name(compute, int(prog[r, compute.OP]), prog[r], rest[12])
                timer.sums[key] = timer.sums.get(key, 0.0) + dt
                nodes += dt
            # this wrapper's time but the nodes' and one binding: what a whole call would not have spent
            timer.sums["calls"] = timer.sums.get("calls", 0.0) + clock() - start - nodes - empty
            return None

        return by_node

    for path, program in originals.items():
        compute.PROGRAMS[path] = wrap(program)

    def restore():
        compute.PROGRAMS.update(originals)

    return restore


def profile(model, args, graph: bool, clock) -> dict:
    n_pos = args.n_prompt if args.prompt else args.B * (args.n_depth + args.n_prompt + args.n_gen + 1)
    ctx = Context(model, ContextParams(n_ctx=n_pos + 256, n_batch=max(512, args.n_prompt),
                                       n_ubatch=max(512, args.n_prompt) if args.prompt else 512,
                                       n_seq_max=args.B, n_threads=args.threads, n_threads_batch=args.threads,
                                       kv_unified=True, flash_attn=args.flash_attn))
    ops = ctx.ops
    timer = Timer(clock)
    restore = None
    if graph:
        from llamactx.ggml.kernels import compute

        restore = _node_by_node(compute, timer, clock)
    else:
        if hasattr(ops, "compute_graph"):  # op by op: the ReferenceOps behaviour, build computing eagerly
            ops.compute_graph = lambda build, params: build(ops, params)
        for cats, name in ((MATMUL, "matmul"), (ATTENTION, "attention"), (RECURRENT, "recurrent"), (OTHER, "other")):
            for meth in cats:
                if hasattr(ops, meth):
                    setattr(ops, meth, timer.wrap(getattr(ops, meth), name))
    rng = np.random.default_rng(0)
    try:
        _steps(ctx, args, 1 if args.prompt else 2, timer, rng)  # warm-up: compiles, plans
        ctx.memory.clear(data=False)
        total = _steps(ctx, args, args.n_gen, timer, rng)
    finally:
        if restore is not None:
            restore()
    return {"total": total, **timer.sums}


def _graph_split(compute, r: dict) -> dict:
    """The graph pass's node kinds grouped as the table's columns (seconds over the steps)."""
    nodes = {k[5:]: v for k, v in r.items() if k.startswith("node:")}
    out = {"matmul": 0.0, "attention": 0.0, "recurrent": 0.0, "other": 0.0}
    for kind, sec in nodes.items():
        op = kind.split(" ")[0]
        col = ("matmul" if op in ("mul_mat", "mul_mat_id", "mul_mat_heads") else "attention" if op == "attn"
               else "recurrent" if op in ("ssm_conv_rs", "gdn_rs") else "other")
        out[col] += sec
    out["total"] = r["total"] - r.get("calls", 0.0)  # as one call per program would take
    out["python"] = out["total"] - sum(nodes.values())
    return out


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
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="steps (prompts with --prompt)")
    ap.add_argument("-p", "--n-prompt", type=int, default=32)
    ap.add_argument("-d", "--n-depth", type=int, default=0)
    ap.add_argument("-B", type=int, default=1, help="sequences decoding together")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-fa", "--flash-attn", default="disabled", choices=("enabled", "disabled", "auto"),
                    help="flash attention (default disabled)")
    ap.add_argument("--wall", action="store_true", help="wall time instead of the thread's CPU time")
    ap.add_argument("--prompt", action="store_true", help="profile prompts of -p tokens (one ubatch) instead")
    ap.add_argument("--no-eager", action="store_true", help="skip the op-by-op run")
    args = ap.parse_args()
    if args.prompt and (args.B != 1 or args.n_depth):
        ap.error("--prompt profiles one sequence's prompt from an empty cache: no -B or -d")
    clock = time.perf_counter if args.wall else time.thread_time
    model = Model.load(resolve_model_path(args.model))
    try:
        from llamactx.ggml.kernels import compute
    except ModuleNotFoundError:  # a checkout without a graph executor
        compute = None
    rows = [] if args.no_eager else [("op by op", profile(model, args, False, clock))]
    graph = None
    if compute is not None:
        g = profile(model, args, True, clock)
        if any(k.startswith("node:") for k in g):  # else the model never ran as a compiled graph
            graph = g
            rows.append(("graph", {**g, **_graph_split(compute, g)}))
    n_tok = args.n_gen * (args.n_prompt if args.prompt else args.B)
    what = f"prompt {args.n_prompt}" if args.prompt else f"depth {args.n_depth + args.n_prompt}"
    print(f"{Path(model.path).name}, B = {args.B}, {what}, {args.threads} thread(s), "
          f"{'wall' if args.wall else 'CPU'} ms per {'prompt' if args.prompt else 'step'} "
          f"({n_tok // args.n_gen} token(s))")
    print("| run | total | matmuls | attention | recurrent | other ops | Python | tok/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ms = lambda s: f"{1e3 * s / args.n_gen:.2f}"  # noqa: E731
    for name, r in rows:
        mm, at, rec, other = (r.get(c, 0.0) for c in ("matmul", "attention", "recurrent", "other"))
        py = r["python"] if "python" in r else r["total"] - mm - at - other - rec
        print(f"| {name} | {ms(r['total'])} | {ms(mm)} | {ms(at)} | {ms(rec)} | {ms(other)} | {ms(py)} | "
              f"{n_tok / r['total']:.1f} |")
    if graph is not None:
        nodes = sorted(((k[5:], v) for k, v in graph.items() if k.startswith("node:")), key=lambda kv: -kv[1])
        total = sum(v for _, v in nodes)
        print("\n| graph node kind | ms | share |\n| --- | ---: | ---: |")
        for kind, sec in nodes:
            print(f"| {kind} | {ms(sec)} | {100 * sec / total:.1f}% |")
    _print_traffic(model, args, graph, rows)


def _print_traffic(model, args, graph, rows) -> None:
    """The recurrent state a decode step moves, and the rate the recurrent ops (the graph's nodes, else op by op)
    move it at."""
    traffic = recurrent_traffic(model)
    if not traffic or args.prompt:
        return
    if graph is not None:
        rec = sum(v for k, v in graph.items() if k in ("node:gdn_rs", "node:ssm_conv_rs")) / args.n_gen
        conv = graph.get("node:ssm_conv_rs", 0.0) / args.n_gen
        where = f"the graph's gdn_rs + ssm_conv_rs nodes, of which the conv {1e3 * conv:.3f} ms"
    else:
        rec = dict(rows).get("op by op", {}).get("recurrent", 0.0) / args.n_gen
        where = "the recurrent ops, op by op"
    moved = 2 * args.B * (traffic["ssm"] + traffic["conv"])  # read once and written once per sequence
    print(f"\nrecurrent state per decode step: {traffic['layers']} delta-net layers x {args.B} sequence(s): "
          f"delta-rule states {args.B * traffic['ssm'] / 2**20:.2f} MiB read + the same written, conv states "
          f"{args.B * traffic['conv'] / 2**10:.1f} KiB read + written: {moved / 2**20:.2f} MiB moved, "
          f"{moved / rec / 1e9 if rec else 0:.1f} GB/s over {1e3 * rec:.2f} ms ({where})")


if __name__ == "__main__":
    main()

"""`llamactx bench`: llama-bench's tests (tools/llama-bench/llama-bench.cpp): pp = prompt processing, tg = text
generation, pg = a prompt then generation, timed together.

pp<N>: N random tokens decoded in n_batch chunks into an empty cache; tg<N>: N single-token decodes; pp<P>+tg<G>:
both, the generation after the prompt. With `-d D` (llama-bench's --n-depth) every repetition starts from a cache
already holding D tokens of sequence 0 (decoded once, then restored from a state blob, untimed), so tg<N> @ d<D> is
decode at long context. Each test runs once to warm up, then `-r` times; t/s is reported as mean +/- standard
deviation, in llama-bench's markdown table or its JSON / JSONL records (the same keys).

As in llama-bench, -p, -n, -d, -t, -b, -ub take comma lists and ranges (`first-last`, `first-last+step`,
`first-last*factor`), -ctk / -ctv comma lists, and -pg PP,TG may be repeated; every combination is a test, in
llama-bench's order (batch, ubatch, cache types, threads, depth; then the pp, tg and pg tests).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from llamactx.cli.args import CommandError

_RANGE = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")


def parse_int_list(text: str, flag: str) -> list[int]:
    """llama-bench's parse_int_range: comma-separated `first[-last[(+|*)step]]` items, non-negative. -> the values in
    order"""
    out: list[int] = []
    for item in str(text).split(","):
        m = _RANGE.fullmatch(item.strip())
        if m is None:
            raise CommandError(f"bench: {flag} {text!r}: {item!r} is not a number or a range first-last[+|*step]")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        op, step = m.group(3) or "+", int(m.group(4) or 1)
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                raise CommandError(f"bench: {flag} {text!r}: the range {item!r} does not advance")
            i = nxt
            if len(out) > 10_000:
                raise CommandError(f"bench: {flag} {text!r}: more than 10000 values")
    return out


def parse_pg(text: str) -> tuple[int, int]:
    """-pg PP,TG -> (PP, TG)"""
    parts = str(text).split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise CommandError(f"bench: -pg {text!r} must be two numbers PP,TG")
    return int(parts[0]), int(parts[1])


_FLASH = {"0": "disabled", "off": "disabled", "1": "enabled", "on": "enabled", "auto": "auto"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `llamactx bench` (llama-bench's names; lists where llama-bench takes lists)."""
    p.add_argument("-m", "--model", default=None, help="GGUF path or embedded model name (smollm2, gemma3)")
    p.add_argument("-p", "--n-prompt", default="512", help="prompt sizes, e.g. 64,512 (default 512)")
    p.add_argument("-n", "--n-gen", default="128", help="generation lengths, e.g. 16,128 (default 128)")
    p.add_argument("-pg", dest="pg", action="append", default=[], metavar="PP,TG",
                   help="a prompt of PP tokens then TG generated, timed together (repeatable)")
    p.add_argument("-d", "--n-depth", default="0", help="tokens in the cache before each test, e.g. 0,4096")
    p.add_argument("-t", "--threads", default="2", help="thread counts, e.g. 1,2 (default 2)")
    p.add_argument("-b", "--batch-size", default="2048", help="logical batch sizes (default 2048)")
    p.add_argument("-ub", "--ubatch-size", default="512", help="physical batch sizes (default 512)")
    p.add_argument("-ctk", "--cache-type-k", default="f16", help="K cache types, e.g. f16,q8_0")
    p.add_argument("-ctv", "--cache-type-v", default="f16", help="V cache types")
    p.add_argument("-fa", "--flash-attn", default="auto", choices=("0", "1", "on", "off", "auto"),
                   help="flash attention (llama-bench's -fa; default auto: on, as on a CPU)")
    p.add_argument("--swa-full", action="store_true", help="a full-size cache for sliding-window layers")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("-o", "--output", choices=("md", "json", "jsonl"), default="md")


@dataclass(frozen=True, slots=True)
class BenchTest:
    """One test: llama-bench's cmd_params_instance, restricted to what llamactx varies."""

    n_prompt: int
    n_gen: int
    n_depth: int
    n_threads: int
    n_batch: int
    n_ubatch: int
    type_k: str
    type_v: str

    @property
    def name(self) -> str:
        """llama-bench's test column: pp512, tg128, pp512+tg128, with ` @ d4096` at a depth."""
        if self.n_prompt and self.n_gen:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return name + (f" @ d{self.n_depth}" if self.n_depth else "")


def expand_tests(args: argparse.Namespace) -> list[BenchTest]:
    """Every test the flags ask for, in llama-bench's order (get_cmd_params_instances). Raises CommandError for a
    bad value or when nothing is left to measure."""
    prompts = parse_int_list(args.n_prompt, "-p")
    gens = parse_int_list(args.n_gen, "-n")
    pgs = [parse_pg(v) for v in args.pg]
    depths = parse_int_list(args.n_depth, "-d")
    threads = parse_int_list(args.threads, "-t")
    batches = parse_int_list(args.batch_size, "-b")
    ubatches = parse_int_list(args.ubatch_size, "-ub")
    types_k = [s.strip() for s in str(args.cache_type_k).split(",")]
    types_v = [s.strip() for s in str(args.cache_type_v).split(",")]
    if args.repetitions < 1:
        raise CommandError(f"bench: -r {args.repetitions} must be >= 1")
    for flag, values in (("-t", threads), ("-b", batches), ("-ub", ubatches)):
        if 0 in values:
            raise CommandError(f"bench: {flag} 0 must be >= 1")
    tests = []
    for nb, nub, tk, tv, nt, nd in itertools.product(batches, ubatches, types_k, types_v, threads, depths):
        shapes = [(p, 0) for p in prompts if p] + [(0, g) for g in gens if g] + [pg for pg in pgs if any(pg)]
        tests += [BenchTest(p, g, nd, nt, nb, nub, tk, tv) for p, g in shapes]
    if not tests:
        raise CommandError(f"bench: nothing to measure with -p {args.n_prompt} -n {args.n_gen}"
                           f"{''.join(f' -pg {v}' for v in args.pg)} (give -p, -n and/or -pg > 0)")
    return tests


# --- running ---------------------------------------------------------------------------------------------------


def _pp(ctx, tokens: np.ndarray, n_batch: int, pos0: int = 0) -> None:
    from llamactx.batch import Batch

    for start in range(0, len(tokens), n_batch):
        part = tokens[start : start + n_batch]
        batch = Batch(len(part))
        for i, t in enumerate(part):
            batch.add(int(t), pos0 + start + i, (0,), i == len(part) - 1)
        if ctx.decode(batch) != 0:
            raise RuntimeError("bench: decode failed (context too small?)")


def _tg(ctx, tokens: np.ndarray) -> None:
    from llamactx.batch import Batch

    for t in tokens:
        if ctx.decode(Batch.get_one([int(t)])) != 0:
            raise RuntimeError("bench: decode failed (context too small?)")


def run_test(ctx, n_prompt: int, n_gen: int, reps: int, seed: int = 0, n_depth: int = 0) -> list[float]:
    """Seconds of each repetition of one test (the prompt, then the generation after it), after one warm-up run;
    each starts from `n_depth` tokens of sequence 0 in the cache."""
    rng = np.random.default_rng(seed)
    n_vocab = ctx.model.hparams.n_vocab
    samples = []
    depth_state = None
    for rep in range(reps + 1):
        ctx.memory.clear(data=False)
        if n_depth and depth_state is None:
            _pp(ctx, rng.integers(0, n_vocab, n_depth), ctx.params.n_batch)
            depth_state = ctx.state_seq_get_data(0)
        elif n_depth:
            ctx.state_seq_set_data(depth_state, 0)
        prompt, gen = rng.integers(0, n_vocab, n_prompt), rng.integers(0, n_vocab, n_gen)
        t0 = time.perf_counter()
        if n_prompt:
            _pp(ctx, prompt, ctx.params.n_batch, pos0=n_depth)
        if n_gen:
            _tg(ctx, gen)
        if rep:
            samples.append(time.perf_counter() - t0)
    return samples


def run_bench(model, args) -> int:
    from llamactx.context import Context
    from llamactx.cparams import ContextParams

    tests = expand_tests(args)
    ctx, ctx_key = None, None
    if args.output == "json":
        print("[", end="")
    for i, t in enumerate(tests):
        n_ctx = max(t.n_prompt + t.n_gen, 256) + t.n_depth
        key = (n_ctx, t.n_batch, t.n_ubatch, t.type_k, t.type_v, t.n_threads)
        if key != ctx_key:  # a context per setting (the packed weights are the model's, shared)
            ctx = None  # its cache freed before the next one is made
            ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=t.n_batch, n_ubatch=t.n_ubatch,
                                               n_threads=t.n_threads, n_threads_batch=t.n_threads,
                                               type_k=t.type_k, type_v=t.type_v, swa_full=args.swa_full,
                                               flash_attn=_FLASH[args.flash_attn]))
            ctx_key = key
        secs = run_test(ctx, t.n_prompt, t.n_gen, args.repetitions, n_depth=t.n_depth)
        row = _row(model, t, secs)
        row["flash_attn"] = int(ctx.params.flash_attn)
        if args.output == "json":
            print(("," if i else "") + "\n  " + json.dumps(row, indent=2).replace("\n", "\n  "), end="")
        elif args.output == "jsonl":
            print(json.dumps(row))
        else:
            _print_row(row, t, header=i == 0)
        sys.stdout.flush()
    if args.output == "json":
        print("\n]")
    return 0


def _cpu_info() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _row(model, t: BenchTest, secs: list[float]) -> dict:
    """llama-bench's JSON record (test::get_fields, then samples), with the values of llamactx's single CPU
    backend where llama-bench has a setting llamactx lacks."""
    from llamactx.version import __version__

    ts = [(t.n_prompt + t.n_gen) / s for s in secs]
    return {
        "build_commit": f"llamactx-{__version__}", "build_number": 0, "cpu_info": _cpu_info(), "gpu_info": "",
        "backends": "CPU", "model_filename": str(model.path), "model_type": model.desc, "model_size": model.size,
        "model_n_params": model.n_params, "n_batch": t.n_batch, "n_ubatch": t.n_ubatch, "n_threads": t.n_threads,
        "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": t.type_k, "type_v": t.type_v,
        "n_gpu_layers": 0, "n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False,
        "flash_attn": 0, "devices": "auto", "tensor_split": "0.00", "tensor_buft_overrides": "none",
        "load_mode": "auto", "lazy_mode": "auto", "embeddings": False, "no_op_offload": 0, "no_host": False,
        "repack": True, "fit_target": 0, "fit_min_ctx": 0,
        "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.n_depth,
        "test_time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "avg_ns": int(statistics.mean(secs) * 1e9), "stddev_ns": int(_std(secs) * 1e9),
        "avg_ts": statistics.mean(ts), "stddev_ts": _std(ts),
        "samples_ns": [int(s * 1e9) for s in secs], "samples_ts": ts,
    }


def _std(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


_HEAD = ["model", "size", "params", "backend", "threads", "test", "t/s"]
_WIDTHS = [30, 10, 10, 7, 7, 18, 20]


def _print_row(r: dict, t: BenchTest, header: bool) -> None:
    """One line of llama-bench's markdown table (printed as each test ends)."""
    fmt = "| " + " | ".join(f"{{:{'>' if i >= 4 else '<'}{w}}}" for i, w in enumerate(_WIDTHS)) + " |"
    if header:
        print(fmt.format(*_HEAD))
        print("| " + " | ".join("-" * (w - 1) + (":" if i >= 4 else "-") for i, w in enumerate(_WIDTHS)) + " |")
    size = r["model_size"]
    size = f"{size / 2**20:.2f} MiB" if size < 2**30 else f"{size / 2**30:.2f} GiB"
    print(fmt.format(r["model_type"], size, f"{r['model_n_params'] / 1e6:.2f} M",
                     r["backends"], str(r["n_threads"]), t.name, f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"))

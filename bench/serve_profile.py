"""Where a second of serving goes: `llamactx serve` under serve_bench.py's load (N streaming clients, a short prompt
each, `-n` tokens with ignore_eos), with the engine thread's time split into decode / sampling / the rest of the
step / the worker's hand-off to the handlers / idle, the rows each decode carried, and every thread's CPU time
(the engine thread, numba's pool, the event loop). No llama.cpp counterpart: a diagnostic of issue 47.

The server runs in a child process of this script with the timers patched in (wall clock on the engine thread);
the clients are serve_bench's own, in this process (their CPU time is reported too: they share the cores). Set
NUMBA_CPU_NAME / NUMBA_CACHE_DIR as for the server you mean to measure: the child inherits the environment.
Diagnostics: SERVE_PROFILE_NOGIL=1 runs the graph program without the GIL (a clone compiled at start, uncached),
SERVE_PROFILE_CPROFILE=FILE writes a cProfile of the event loop thread.

Measured 2026-12-05 (haswell target, quiet machine, -c 8, 3 requests): the engine thread spends ~87% of the wall
time in ctx.decode, 8 rows in ~95% of decodes; sampling ~4%, the rest of the step ~2%, hand-off ~1%, idle ~4-6%.
The decode of 8 rows took ~20.8 ms there against ~16.2 ms bare (engine_overhead.py): the clients (then ~4.4 ms
CPU per step, one httpx.Client per request) and the event loop (~1 ms) share the two cores with numba's pool.
2026-12-06, serve_bench's keep-alive clients (~0.5 ms CPU per step), 6 requests: decode 19.8-22.8 ms of a
21.8-24.5 ms step against 16.8-18.5 ms bare, the event loop 1.0-1.7 ms CPU per step.

Usage: python bench/serve_profile.py [-m smollm2] [-c 8] [-np 8] [-n 64] [--requests 3] [-t 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each of this process's threads, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def child(out_path: str, serve_args: list[str]) -> None:
    """Run `llamactx serve` with timers on the engine thread; write them to `out_path` at SIGTERM. With
    SERVE_PROFILE_NOGIL=1 the graph program runs without the GIL (a clone compiled here, not cached)."""
    from llamactx.cli.commands import main
    if os.environ.get("SERVE_PROFILE_NOGIL") == "1":
        from numba import njit

        from llamactx.ggml.kernels import compute
        for path, fn in list(compute.PROGRAMS.items()):
            compute.PROGRAMS[path] = njit(nogil=True)(fn.py_func)
    from llamactx.engine import engine as engine_mod
    from llamactx.server import worker as worker_mod

    acc = {"decode": 0.0, "sample": 0.0, "step": 0.0, "deliver": 0.0, "idle": 0.0, "loop": 0.0}
    rows: dict[int, int] = {}  # tokens per decode -> decodes
    seqs: dict[int, int] = {}  # rows sampled (logits) per decode -> decodes
    n = {"steps": 0, "prefill_steps": 0}
    on = threading.Event()  # set at SIGUSR1: the clocks start then (after the warm-up)

    Engine, Worker = engine_mod.Engine, worker_mod.EngineWorker
    step0, sample0, drain0, step_w0 = Engine.step, Engine._sample, Worker._drain, Worker._step

    cpu = dict.fromkeys(acc, 0.0)  # the engine thread's own CPU time in each

    def timed(key, fn):
        def wrapper(*a, **kw):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                if on.is_set():
                    acc[key] += time.perf_counter() - t0
                    cpu[key] += time.thread_time() - c0
        return wrapper

    def step(self):
        ctx = self.ctx
        if "decode" not in ctx.__dict__:
            real = ctx.decode

            def decode(batch):
                if on.is_set():
                    rows[batch.n_tokens] = rows.get(batch.n_tokens, 0) + 1
                    k = int(batch.logits[: batch.n_tokens].astype(bool).sum())
                    seqs[k] = seqs.get(k, 0) + 1
                return timed("decode", real)(batch)
            ctx.decode = decode
        n["engine_tid"] = threading.get_native_id()
        if on.is_set():
            n["steps"] += 1
            n["prefill_steps"] += any(not s.is_generating for s in self.scheduler.running)
        return timed("step", step0)(self)

    Engine.step = step
    Engine._sample = timed("sample", sample0)

    Worker._drain = timed("idle", drain0)
    Worker._step = timed("loop", step_w0)
    t_start = [0.0, {}]

    def start(*_):
        t_start[0] = time.perf_counter()
        t_start[1] = _thread_cpu()
        on.set()

    signal.signal(signal.SIGUSR1, start)
    prof = None
    if os.environ.get("SERVE_PROFILE_CPROFILE"):  # the event loop thread's Python, from SIGUSR1 on
        import cProfile

        prof = cProfile.Profile()
        signal.signal(signal.SIGUSR1, lambda *_: (start(), prof.enable()))

    def dump(*_):
        on.clear()
        wall = time.perf_counter() - t_start[0]
        cpu0, cpu1 = t_start[1], _thread_cpu()
        if prof is not None:
            prof.disable()
            prof.dump_stats(os.environ["SERVE_PROFILE_CPROFILE"])
        tmp = out_path + ".tmp"
        Path(tmp).write_text(json.dumps({
            "wall": wall, "acc": acc, "cpu": cpu, "pid": os.getpid(), "rows": rows, "seqs": seqs, **n,
            "threads": {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}}))
        os.replace(tmp, out_path)

    signal.signal(signal.SIGUSR2, dump)  # the clocks stop (uvicorn takes SIGTERM for its shutdown)
    sys.exit(main(["serve", *serve_args]))


def _histogram(counts: dict[str, int]) -> str:
    """"value: count, ..." in value order."""
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: int(kv[0])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-c", "--clients", type=int, default=8)
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1:])
        return
    from serve_bench import free_port, run_clients, wait_ready

    from llamactx.embedded import resolve_model_path

    port = free_port()
    out = str(Path(tempfile.mkdtemp()) / "profile.json")
    cmd = [sys.executable, __file__, "--child", out, "-m", str(resolve_model_path(args.model)), "--port", str(port),
           "-np", str(args.parallel), "-c", "8192", "-t", str(args.threads), "--no-webui"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, cmd)
    run_clients(url, 2, 1, 8)  # warm up
    proc.send_signal(signal.SIGUSR1)  # the clocks start
    cpu = time.process_time()
    r = run_clients(url, args.clients, args.requests, args.n_gen)
    cpu = time.process_time() - cpu
    proc.send_signal(signal.SIGUSR2)  # the clocks stop and the child writes them
    deadline = time.monotonic() + 30
    while not Path(out).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    d = json.loads(Path(out).read_text())
    Path(out).unlink()
    Path(out).parent.rmdir()
    wall, acc = d["wall"], d["acc"]
    print(f"{args.clients} clients x {args.requests} requests x {args.n_gen} tokens, -np {args.parallel}, "
          f"{args.threads} threads: {r['tps']:.1f} t/s, TTFT p50 {r['ttft_p50']:.2f} s; server clocks over "
          f"{wall:.2f} s, {d['steps']} steps ({d['prefill_steps']} with a prompt)")
    other = acc["step"] - acc["decode"] - acc["sample"]
    print("engine thread, % of the server's wall time: " + ", ".join(
        f"{k} {100 * v / wall:.1f}" for k, v in [("decode", acc["decode"]), ("sampling", acc["sample"]),
                                                  ("rest of step", other), ("hand-off", acc["loop"] - acc["step"]),
                                                  ("drain (idle + commands)", acc["idle"])]))
    print(f"ms per step: {1000 * acc['step'] / max(1, d['steps']):.2f} (decode "
          f"{1000 * acc['decode'] / max(1, d['steps']):.2f}, sampling {1000 * acc['sample'] / max(1, d['steps']):.2f})")
    c, ns = d["cpu"], max(1, d["steps"])
    print(f"engine thread CPU ms per step: step {1000 * c['step'] / ns:.2f} (decode {1000 * c['decode'] / ns:.2f}, "
          f"sampling {1000 * c['sample'] / ns:.2f}), hand-off {1000 * (c['loop'] - c['step']) / ns:.2f}, "
          f"drain {1000 * c['idle'] / ns:.2f}; event loop thread "
          f"{1000 * d['threads'].get(str(d['pid']), 0.0) / ns:.2f}")
    print(f"rows sampled per decode: {_histogram(d['seqs'])}; tokens per decode: {_histogram(d['rows'])}")
    names = {str(d["engine_tid"]): "engine", str(d["pid"]): "event loop (main)"}
    print("server thread CPU s: " + ", ".join(f"{names.get(k, k)} {v:.2f}" for k, v in
                                              sorted(d["threads"].items(), key=lambda x: -x[1]) if v > 0.005) +
          f"; total {sum(d['threads'].values()):.2f} of {wall:.2f} s wall; the clients' process {cpu:.2f}")


if __name__ == "__main__":
    main()

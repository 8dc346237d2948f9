"""Matmul kernel throughput on the real SmolLM2-135M and Gemma-3-270M weights.

    .venv/bin/python bench/bench_matmul.py [--threads 2] [--reps 20] [--quick]

Prints, per matrix (ffn_up, ffn_down, attn_q, output) and path (vnni / portable), Gweights/s for n = 1 (decode:
weights streamed per second) and n = 64 (prompt: weight x row products per second), plus f32 BLAS on a
pre-dequantized copy for n = 64 (the floor of a dequantize-and-BLAS design), and the time of all SmolLM2 matmuls
of one decoded token (30 layers x 7 + output; also with Q/K/V and gate/up packed as one matrix each). Times are
the best of `--reps` runs; on a busy machine (another process on the second core) expect noise.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from llamactx.embedded import gemma3_path, smollm2_path
from llamactx.ggml import kernels
from llamactx.gguf.quants import dequantize
from llamactx.model import Model, Weight

MATRICES = ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.weight", "token_embd.weight")


def load_weights(path, names=None) -> dict[str, Weight]:
    """2-D tensors of a GGUF file as `Weight`s (raw read-only blocks), optionally only `names`."""
    model = Model.load(path)
    return {
        name: model.weight(name)
        for name, info in model.tensor_infos.items()
        if len(info.shape) == 2 and (names is None or name in names)
    }


def best_time(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_matrix(w: Weight, paths, threads: int, reps: int, rng) -> list[str]:
    """Gweights/s cells: per path n = 1 and n = 64, then f32 BLAS (n = 64) on a dequantized copy."""
    pw = kernels.pack_weight(w)
    k, n_rows = pw.k, pw.n_rows
    cells = []
    for path in paths:
        for n in (1, 64):
            x = rng.standard_normal((n, k)).astype(np.float32)  # (n, k)
            out = np.empty((n, n_rows), np.float32)  # (n, n_rows)

            def run(x=x, out=out, path=path):
                kernels.matmul(x, pw, threads, path=path, out=out)

            dt = best_time(run, reps if n == 1 else max(3, reps // 4))
            cells.append(f"{k * n_rows * n / dt / 1e9:6.1f}")
    if n_rows * k > 40_000_000:  # no f32 copy of the big output matrices
        return [*cells, "     -"]
    wf = dequantize(w.data.reshape(-1), w.ggml_type, w.shape)  # (n_rows, k)
    x = rng.standard_normal((64, k)).astype(np.float32)  # (64, k)
    with threadpool_limits(threads, user_api="blas"):
        dt = best_time(lambda: x @ wf.T, max(3, reps // 4))
    return [*cells, f"{k * n_rows * 64 / dt / 1e9:6.1f}"]


def token_time(weights: dict[str, Weight], path: str, threads: int, reps: int, rng, fused: bool) -> tuple[float, int]:
    """Seconds for every matmul of one SmolLM2 decode step (n = 1), distinct weights as in a real token; `fused`
    packs Q/K/V and gate/up as one matrix each (kernels.pack_weights)."""
    n_layer = 1 + max(int(name.split(".")[1]) for name in weights if name.startswith("blk."))
    packed = []
    for il in range(n_layer):
        w = {name.split(".")[2]: wt for name, wt in weights.items() if name.startswith(f"blk.{il}.")}
        groups = [["attn_q", "attn_k", "attn_v"], ["attn_output"], ["ffn_gate", "ffn_up"], ["ffn_down"]]
        if not fused:
            groups = [[name] for group in groups for name in group]
        packed += [kernels.pack_weights([w[name] for name in group]) for group in groups]
    packed.append(kernels.pack_weight(weights["token_embd.weight"]))  # the tied output matrix
    xs = {k: rng.standard_normal((1, k)).astype(np.float32) for k in {pw.k for pw in packed}}

    def step():
        for pw in packed:
            kernels.matmul(xs[pw.k], pw, threads, path=path)

    return best_time(step, reps), len(packed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="VNNI path only when available, fewer reps")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    feats = kernels.cpu_features()
    paths = ["vnni", "portable"] if feats["vnni"] else ["portable"]
    if args.quick:
        paths = paths[:1]
    print(f"cpu {feats['cpu']}  vnni={feats['vnni']}  threads={args.threads}  (first runs compile the kernels)")
    header = "".join(f" {p[:4]} n=1 {p[:4]} n=64" for p in paths)
    print(f"{'model':8} {'matrix':22} {'type':5} {'k x rows':>13} {header}  blas64  (Gweights/s)")
    for model, path in (("smollm2", smollm2_path()), ("gemma3", gemma3_path())):
        weights = load_weights(path, set(MATRICES))
        for name in MATRICES:
            w = weights[name]
            cells = bench_matrix(w, paths, args.threads, args.reps, rng)
            dims = f"{w.shape[0]}x{w.shape[1]}"
            print(f"{model:8} {name.replace('blk.0.', ''):22} {w.type_name:5} {dims:>13}   " + "     ".join(cells))
    weights = load_weights(smollm2_path())
    for p in paths:
        for fused in (False, True):
            dt, count = token_time(weights, p, args.threads, max(5, args.reps // 2), rng, fused)
            how = "QKV and gate/up fused" if fused else "one call per matrix"
            print(f"smollm2 decode step, all matmuls ({count} calls, {how}), {p}: {dt * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

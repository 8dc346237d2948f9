"""Matmul kernel throughput on the real SmolLM2-135M and Gemma-3-270M weights.

    .venv/bin/python bench/bench_matmul.py [--threads 2] [--reps 20] [--quick]
    .venv/bin/python bench/bench_matmul.py --types [--quant-dir DIR] [--shape 4096x4096] [--reference]

Prints, per matrix (ffn_up, ffn_down, attn_q, output) and path (vnni / portable), Gweights/s for n = 1 (decode:
weights streamed per second) and n = 64 (prompt: weight x row products per second), plus f32 BLAS on a
pre-dequantized copy for n = 64 (the floor of a dequantize-and-BLAS design), and the time of all SmolLM2 matmuls
of one decoded token (30 layers x 7 + output; also with Q/K/V and gate/up packed as one matrix each). Times are
the best of `--reps` runs; on a busy machine (another process on the second core) expect noise.

`--types` prints instead a row per quant type (Q4_K and Q4_1 as the anchors; the hub's Q2_K, Q3_K, Q5_K, Q6_K,
IQ4_XS, IQ4_NL, MXFP4, BF16): Gweights/s at n = 1 and n = 64 of what FastOps runs for that weight (the numba
kernels, or the reference kernels where FastOps keeps it there), and the ratio to Q4_K. The weights are the
largest 2-D tensor of that type in the GGUF files of `--quant-dir` (e.g. SmolLM2 requantized by llama-quantize,
docs/numerics.md) when one holds it, else random blocks of `--shape` (k x rows; finite scales, every quant
pattern). `--reference` adds the reference kernels' figures (slow).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quantize as gguf_quantize
from threadpoolctl import threadpool_limits

from llamactx.backend.fast import FastOps
from llamactx.backend.reference import ReferenceOps
from llamactx.embedded import gemma3_path, smollm2_path
from llamactx.ggml import kernels
from llamactx.gguf.quants import block_format, dequantize
from llamactx.model import Model, Weight

MATRICES = ("blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.weight", "token_embd.weight")
TYPES = ("Q4_K", "Q4_1", "Q2_K", "Q3_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "MXFP4", "BF16")
# f16 scale fields of each block (kept finite in random blocks); MXFP4 has an E8M0 exponent byte at 0
F16_FIELDS = {"Q4_K": (0, 2), "Q4_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2), "Q6_K": (208,),
              "IQ4_XS": (0,), "IQ4_NL": (0,), "MXFP4": ()}


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


def random_weight(type_name: str, k: int, n_rows: int, rng) -> Weight:
    """A (k, n_rows) weight of `type_name`: gguf-py's quantization of Gaussian values for BF16 and Q4_1, else
    random blocks with finite scales (speed does not depend on the values)."""
    t = T[type_name]
    if type_name in ("BF16", "Q4_1"):
        data = gguf_quantize(rng.standard_normal((n_rows, k)).astype(np.float32), t)  # (n_rows, row bytes)
    else:
        fmt = block_format(t)
        data = rng.integers(0, 256, (n_rows, k // fmt.block_size, fmt.type_size), dtype=np.uint8)
        for off in F16_FIELDS[type_name]:
            data[:, :, off : off + 2] = (rng.random(data.shape[:2]) * 0.02 + 1e-3).astype(np.float16)[..., None].view(
                np.uint8)
        if type_name == "MXFP4":
            data[:, :, 0] = rng.integers(118, 124, data.shape[:2])
        data = data.reshape(n_rows, -1)
    data.flags.writeable = False
    return Weight(f"random.{type_name}", int(t), (k, n_rows), data)


def file_weights(quant_dir: Path) -> dict[str, Weight]:
    """type name -> the largest 2-D tensor of that type among the GGUF files of `quant_dir`."""
    best: dict[str, Weight] = {}
    for path in sorted(quant_dir.glob("*.gguf")):
        for w in load_weights(path).values():
            size = w.shape[0] * w.shape[1]
            if w.type_name in TYPES and (w.type_name not in best or size > np.prod(best[w.type_name].shape)):
                best[w.type_name] = w
    return best


def type_row(w: Weight, threads: int, reps: int, rng, reference: bool) -> tuple[str, list[float]]:
    """(what runs, Gweights/s at n = 1 and 64 of FastOps' path for this weight [, then the reference's])."""
    order = FastOps._kernel_order(w)
    pw = kernels.pack_weight(w) if order is not None else None
    ops = ReferenceOps()
    k, n_rows = w.shape[0], w.shape[1]
    runs = [("kernels" if pw is not None else "reference", pw)] + ([("reference", None)] if reference else [])
    cells = []
    for _, packed in runs:
        for n in (1, 64):
            x = rng.standard_normal((n, k)).astype(np.float32)  # (n, k)
            if packed is not None:
                fn = lambda x=x, packed=packed: kernels.matmul(x, packed, threads, llama_order=order)  # noqa: E731
            else:
                fn = lambda x=x: ops.matmul(x, w)  # noqa: E731
            dt = best_time(fn, reps if n == 1 and packed is not None else 3)
            cells.append(k * n_rows * n / dt / 1e9)
    return runs[0][0], cells


def type_table(args, rng) -> None:
    """The --types table (module docstring)."""
    kernels.set_threads(args.threads)
    from_files = file_weights(Path(args.quant_dir).expanduser()) if args.quant_dir else {}
    k, n_rows = (int(v) for v in args.shape.lower().split("x"))
    extra = "  ref n=1  ref n=64" if args.reference else ""
    print(f"cpu {kernels.cpu_features()['cpu']}  threads={args.threads}  (Gweights/s; x = vs Q4_K)")
    print(f"{'type':7} {'weights':34} {'runs on':9}   n=1    n=64   x n=1  x n=64{extra}")
    anchor = None
    for name in TYPES:
        w = from_files.get(name) or random_weight(name, k, n_rows, rng)
        what, cells = type_row(w, args.threads, args.reps, rng, args.reference)
        anchor = anchor or cells
        src = f"{w.name.replace('.weight', '')} {w.shape[0]}x{w.shape[1]}"
        refs = "".join(f" {c:8.2f}" for c in cells[2:])
        print(f"{name:7} {src:34} {what:9} {cells[0]:6.2f} {cells[1]:7.2f} {cells[0] / anchor[0]:6.2f} "
              f"{cells[1] / anchor[1]:7.2f}{refs}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="VNNI path only when available, fewer reps")
    ap.add_argument("--types", action="store_true", help="a row per quant type instead (module docstring)")
    ap.add_argument("--quant-dir", default=None, help="--types: take each type's weights from these GGUF files")
    ap.add_argument("--shape", default="4096x4096", help="--types: k x rows of synthesized weights")
    ap.add_argument("--reference", action="store_true", help="--types: the reference kernels' figures too")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    if args.types:
        type_table(args, rng)
        return
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

"""Micro-benchmark of the compiled attention at depth (ggml/kernels/attention.py `attend`; `--fa on`: flash.py
`flash_attend`), and its check.

Decode at depth is one token over every cell: ggml's kq mul_mat, soft_max and kqv mul_mat (llama.cpp's
build_attn_mha without flash attention). This times `attend` for a model's attention shape over a random f16 cache
and checks its output bit for bit against the reference kernel (llamactx.ggml.attention, the same arithmetic).
Compare the native and an AVX2 compile of the same kernel:

    python bench/attention_bench.py -d 4096 -t 1                       # this CPU
    NUMBA_CPU_NAME=haswell NUMBA_CACHE_DIR=$PWD/.numba-haswell python bench/attention_bench.py -d 4096 -t 1

Defaults are SmolLM2-135M's (9 query heads, 3 KV heads, head size 64); `-n` tokens (a causal batch ending at the
depth) times a prompt-sized ubatch instead. `--passes` also times the three passes of decode at depth one by one
(scores, softmax, values (+ the lanes' reduction without flash attention; 512-bit targets only)), the best
of the repetitions each, e.g. where the time goes with the cache in DRAM:

    python bench/attention_bench.py -d 4096 -t 1 --fa on --layers 30 --passes
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def make_case(n: int, depth: int, n_head: int, n_head_kv: int, d: int, seed: int = 0):
    """Random q (n, n_head * d), an f16 cache k, v (depth, n_head_kv * d) as uint16 bits, and the visible cells of n
    causal tokens ending at `depth` (VisibleCells)."""
    from llamactx.ggml.inputs import VisibleCells

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, n_head * d)).astype(np.float32)  # (n, n_head * d)
    k = (rng.standard_normal((depth, n_head_kv * d)) * 0.5).astype(np.float16).view(np.uint16)  # (depth, kv)
    v = rng.standard_normal((depth, n_head_kv * d)).astype(np.float16).view(np.uint16)  # (depth, kv)
    mask = np.full((n, depth), -np.inf, np.float32)  # (n, depth)
    for t in range(n):
        mask[t, : depth - n + t + 1] = 0.0
    return q, k, v, VisibleCells.from_mask(mask)


def run(q, k, v, vis, n_head: int, n_head_kv: int, n_threads: int, fa: bool = False) -> np.ndarray:
    from llamactx.ggml.kernels.attention import attend
    from llamactx.ggml.kernels.flash import flash_attend

    n = q.shape[0]
    d_v = v.shape[1] // n_head_kv
    out = np.empty((n, n_head * d_v), np.float32)  # (n, n_head * d_v)
    if fa:
        flash_attend(q, k, v, n_head, n_head_kv, vis.cells, vis.n_cells, vis.mask_add, np.float32(0.125), out,
                     n_threads)
        return out
    attend(q, k, v, n_head, n_head_kv, vis.cells, vis.n_cells, vis.mask_add, np.float32(0.125), out, n_threads,
           np.full(n_head, -np.inf, np.float32))
    return out


def time_passes(q, kv, vis, n_head: int, n_head_kv: int, n_threads: int, fa: bool, reps: int) -> dict:
    """The best wall time (us) of each pass of the decode-at-depth split (kernels.flash `_flash_split`, or
    kernels.attention `_attend_split`) over `reps` calls, the caches kv[i % len(kv)] in turn."""
    import time

    from llamactx.ggml.kernels import attention as A
    from llamactx.ggml.kernels import flash as F

    n, d_v = q.shape[0], kv[0][1].shape[1] // n_head_kv
    n_pad = (int(vis.n_cells.max()) + 63) // 64 * 64
    cl = np.empty((n, n_pad), np.int64)  # (n, slots)
    for t in range(n):
        A._slot_cells(vis.cells, t, vis.n_cells[t], cl[t])
    w = np.empty((n, n_head, n_pad), np.float32)  # (n, n_head, slots) scores
    e = np.empty_like(w)
    out = np.empty((n, n_head * d_v), np.float32)
    sc = np.float32(0.125)
    if fa:
        f = np.empty((n, n_head, n_pad // 64), np.float32)
        s = np.empty((n, n_head), np.float32)
        acc = np.empty((n, n_head, d_v), np.float32)
        passes = {
            "scores": lambda k, v: F._split_scores(q, k, n_head, n_head_kv, cl, vis.n_cells, vis.mask_add, sc, w,
                                                   4 * n_threads),
            "softmax": lambda k, v: F._split_soft_max(w, vis.n_cells, e, f, s),
            "values": lambda k, v: F._split_values(v, n_head, n_head_kv, cl, vis.n_cells, e, f, s, acc, out,
                                                   n_threads),
        }
    else:
        sinks = np.full(n_head, -np.inf, np.float32)
        lanes = np.empty((n, n_head, 16, d_v), np.float32)
        passes = {
            "scores": lambda k, v: A._split_scores(q, k, n_head, n_head_kv, cl, vis.n_cells, vis.mask_add, sc, w,
                                                   4 * n_threads),
            "softmax": lambda k, v: A._split_soft_max(w, vis.n_cells, e, sinks),
            "values": lambda k, v: (A._split_values(v, n_head, n_head_kv, cl, vis.n_cells, e, lanes),
                                    A._split_reduce(lanes, out)),
        }
    best = {name: np.inf for name in passes}
    for i in range(reps):
        k, v = kv[i % len(kv)]
        for name, run_pass in passes.items():  # in order: each pass reads what the one before wrote
            t0 = time.perf_counter()
            run_pass(k, v)
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e6)
    return best


def reference(q, k, v, vis, n_head: int, n_head_kv: int, fa: bool) -> np.ndarray:
    """The reference kernel's output for the same case (flash: the tiled arithmetic, row invariant)."""
    from llamactx.ggml.attention import attention_f16_cells
    from llamactx.ggml.flash_attn import flash_attn_f16_cells

    q3 = q.reshape(q.shape[0], n_head, -1)  # (n, n_head, d)
    if fa:
        return flash_attn_f16_cells(q3, k.view(np.float16), v.view(np.float16), n_head_kv, vis, 0.125, k.shape[0], 1)
    return attention_f16_cells(q3, k.view(np.float16), v.view(np.float16), n_head_kv, vis, 0.125)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-d", "--depth", type=int, default=4096)
    ap.add_argument("-n", "--n-tokens", type=int, default=1)
    ap.add_argument("--n-head", type=int, default=9)
    ap.add_argument("--n-head-kv", type=int, default=3)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-r", "--repetitions", type=int, default=50)
    ap.add_argument("--fa", choices=("off", "on"), default="off", help="on: flash attention (kernels/flash.py)")
    ap.add_argument("--passes", action="store_true", help="also time decode at depth's passes one by one")
    ap.add_argument("--layers", type=int, default=1,
                    help="time calls over this many caches in turn (30: a model's cache, not in the CPU's caches)")
    args = ap.parse_args()

    import numba

    from llamactx.ggml.cpu import F32_EPR

    numba.set_num_threads(args.threads)
    q, k, v, vis = make_case(args.n_tokens, args.depth, args.n_head, args.n_head_kv, args.head_size)
    fa = args.fa == "on"
    out = run(q, k, v, vis, args.n_head, args.n_head_kv, args.threads, fa)  # compile / load, then check
    ref = reference(q, k, v, vis, args.n_head, args.n_head_kv, fa)
    same = np.array_equal(out.view(np.uint32), ref.view(np.uint32))
    kv = [(k, v)]
    if args.layers > 1:  # one array of every layer's rows as the KV cache allocates it (in huge pages)
        kc = np.zeros((args.layers,) + k.shape, np.uint16)  # (layers, depth, n_head_kv * d)
        vc = np.zeros((args.layers,) + v.shape, np.uint16)
        kc[:], vc[:] = k, v
        kv = [(kc[i], vc[i]) for i in range(args.layers)]
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(args.repetitions):
        run(q, *kv[i % args.layers], vis, args.n_head, args.n_head_kv, args.threads, fa)
    dt = (time.perf_counter() - t0) / args.repetitions
    cpu = (time.process_time() - c0) / args.repetitions
    print(f"{'flash_attend' if fa else 'attend'} n={args.n_tokens} depth={args.depth} heads {args.n_head}/"
          f"{args.n_head_kv} d={args.head_size} t={args.threads} layers={args.layers} F32_EPR={F32_EPR}: "
          f"{dt * 1e6:.0f} us/call ({cpu * 1e6:.0f} us CPU), bit-identical to the reference: {same}")
    if not same:
        raise SystemExit("the kernel differs from the reference kernel")
    if args.passes:
        if F32_EPR != 16 and not fa:
            raise SystemExit("--passes --fa off times the 512-bit build's kernels (this target has 8-lane vectors)")
        best = time_passes(q, kv, vis, args.n_head, args.n_head_kv, args.threads, fa, args.repetitions)
        print(f"passes (best of {args.repetitions}, us): " + ", ".join(f"{k} {v:.0f}" for k, v in best.items()))


if __name__ == "__main__":
    main()

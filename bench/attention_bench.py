"""Micro-benchmark of the compiled attention at depth (ggml/kernels/attention.py `attend`; `--fa on`: flash.py
`flash_attend`), and its check.

Decode at depth is one token over every cell: ggml's kq mul_mat, soft_max and kqv mul_mat (llama.cpp's
build_attn_mha without flash attention). This times `attend` for a model's attention shape over a random f16 cache
and checks its output bit for bit against the reference kernel (llamactx.ggml.attention, the same arithmetic).
Compare the native and an AVX2 compile of the same kernel:

    python bench/attention_bench.py -d 4096 -t 1                       # this CPU
    NUMBA_CPU_NAME=haswell NUMBA_CACHE_DIR=$PWD/.numba-haswell python bench/attention_bench.py -d 4096 -t 1

Defaults are SmolLM2-135M's (9 query heads, 3 KV heads, head size 64); `-n` tokens (a causal batch ending at the
depth) times a prompt-sized ubatch instead.
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


if __name__ == "__main__":
    main()

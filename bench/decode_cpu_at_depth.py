"""CPU time of one decoded token at depth, llama.cpp vs llamactx, each on the calling thread (-t 1): a load-robust
ratio on a shared machine (llama-bench's wall clock moves with the others' load; one-thread CPU time much less).

llama.cpp runs through llama-cpp-python's ctypes bindings over the libllama of LLAMA_CPP_LIB_PATH (e.g. the AVX2
build ~/.cache/llamactx-llamacpp/avx2/bin): with one thread ggml computes the graph on the calling thread. Ours runs
llamactx's Context (compiled for NUMBA_CPU_NAME when set). Both fill the cache with the same `depth` tokens (two
threads), then time `n` single-token decodes with one thread:

    PYTHONPATH=/work/sdist/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=~/.cache/llamactx-llamacpp/avx2/bin \\
        python bench/decode_cpu_at_depth.py --side llamacpp -d 4096 --fa off
    NUMBA_CPU_NAME=haswell NUMBA_CACHE_DIR=$PWD/.numba-haswell python bench/decode_cpu_at_depth.py --side ours \\
        -d 4096 --fa off
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def llamacpp(path: str, depth: int, n: int, fa: bool) -> list[float]:
    import ctypes
    import sys
    import types

    sys.modules.setdefault("diskcache", types.ModuleType("diskcache"))  # llama_cache's disk cache: unused here
    import llama_cpp as L

    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = depth + n + 16, 512, 512
    cp.n_threads, cp.n_threads_batch = 1, 2
    cp.flash_attn_type = 1 if fa else 0
    ctx = L.llama_init_from_model(model, cp)
    toks = np.random.default_rng(0).integers(100, 20000, depth + n).astype(np.int32)
    for i in range(0, depth, 512):
        chunk = (ctypes.c_int32 * min(512, depth - i))(*toks[i : min(i + 512, depth)].tolist())
        if L.llama_decode(ctx, L.llama_batch_get_one(chunk, len(chunk))) != 0:
            raise SystemExit("llama_decode failed")
    times = []
    for i in range(n):
        one = (ctypes.c_int32 * 1)(int(toks[depth + i]))
        t0 = time.thread_time()
        if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
            raise SystemExit("llama_decode failed")
        L.llama_get_logits_ith(ctx, -1)
        times.append(time.thread_time() - t0)
    return times


def ours(path: str, depth: int, n: int, fa: bool) -> list[float]:
    from llamactx import Batch, Context, ContextParams, Model

    model = Model.load(path)
    ctx = Context(model, ContextParams(n_ctx=depth + n + 16, n_batch=512, n_ubatch=512, n_threads=1,
                                       n_threads_batch=2, flash_attn="enabled" if fa else "disabled"))
    toks = np.random.default_rng(0).integers(100, 20000, depth + n).tolist()
    for i in range(0, depth, 512):
        if ctx.decode(Batch.get_one(toks[i : min(i + 512, depth)])) != 0:
            raise SystemExit("decode failed")
    times = []
    for i in range(n):
        t0 = time.thread_time()
        if ctx.decode(Batch.get_one([toks[depth + i]])) != 0:
            raise SystemExit("decode failed")
        ctx.get_logits_ith(-1)
        times.append(time.thread_time() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", choices=("llamacpp", "ours"), required=True)
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-d", "--depth", type=int, default=4096)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("--fa", choices=("off", "on"), default="off")
    args = ap.parse_args()
    from llamactx.embedded import resolve_model_path

    path = str(resolve_model_path(args.model))
    run = llamacpp if args.side == "llamacpp" else ours
    times = run(path, args.depth, args.n_gen, args.fa == "on")
    steady = np.array(times[1:] if len(times) > 1 else times)
    med = float(np.median(steady))
    p10, p90 = np.percentile(steady, (10, 90))
    print(f"{args.side} d{args.depth} fa {args.fa}: {med * 1e3:.2f} ms CPU per token (median of {len(steady)}; "
          f"p10 {p10 * 1e3:.2f}, p90 {p90 * 1e3:.2f}), {1 / med:.1f} t/s")


if __name__ == "__main__":
    main()

"""A decoded token's experts as one weight stream (llamactx.ggml.kernels.experts), alone: GB/s against the read roof.

Runs the single-row expert stream of a MoE GGUF's gate and up expert matrices (every layer, as decode does: each
call a fresh random choice of n_expert_used experts, so the weights come from DRAM), on one thread, timed by the
thread's CPU time (best of --reps), beside bench/membw.py's read of a buffer as large on the same thread, and the
same stream on one expert repeatedly (its weights in L2: the kernel's arithmetic ceiling). The bytes are the
routed experts' packed weights read per pass. Issue 47's profile: where the stream sits between the arithmetic and
the memory roof says whether the kernel or the memory holds decode back.

Usage: python bench/moe_stream.py [-m /tmp/moe-1b-q8_0.gguf (bench/make_moe_model.py)] [--rounds 3] [--reps 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).parents[1]))
from llamactx import Model  # noqa: E402
from llamactx.ggml import kernels  # noqa: E402
from llamactx.ggml.cpu import set_threads  # noqa: E402
from llamactx.ggml.kernels.experts import stream_experts  # noqa: E402
from llamactx.ggml.kernels.matmul import _activations  # noqa: E402
from llamactx.ggml.kernels.simd import VNNI  # noqa: E402
from llamactx.ggml.moe import stacked  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from membw import _read, roof_buffer  # noqa: E402


@njit(cache=True)
def _pass(kind, W, a, starts, unit, out):
    """Every unit of the single-row experts of `starts` on this thread (as one task of matmul_id)."""
    stream_experts(VNNI, kind, False, W, a, starts, unit, 0, unit, out)


def _cpu(fn, reps: int) -> float:
    fn()
    best = 1e9
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="/tmp/moe-1b-q8_0.gguf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    set_threads(1)
    model = Model.load(args.model)
    hp = model.hparams
    n_layer, n_expert, k = hp.n_layer, hp.n_expert, hp.n_expert_used
    mats = [kernels.pack_weight(stacked(model.weight(f"blk.{i}.ffn_{p}_exps.weight")))
            for i in range(n_layer) for p in ("gate", "up")]
    pw = mats[0]
    n_ff = pw.n_rows // n_expert
    unit = n_ff // 4
    x = np.random.default_rng(0).standard_normal((k, pw.k)).astype(np.float32)  # (k, n_embd): one row per expert
    a = _activations(pw.ggml_type, x)
    out = np.empty((k, n_ff), np.float32)  # (k, n_ff)
    rng = np.random.default_rng(1)
    choices = []
    for _ in range(64):
        starts = np.zeros(n_expert + 1, np.int64)  # (n_expert + 1,): k experts of one row each
        for e in rng.choice(n_expert, k, replace=False):
            starts[e + 1 :] += 1
        choices.append(starts)
    slots = [(p.qs, p.qh, p.sc) for p in mats]
    per_expert = (pw.qs.nbytes + pw.qh.nbytes + pw.sc.nbytes) // n_expert
    nbytes = len(mats) * k * per_expert
    turn = [0]

    def dram() -> None:
        for W in slots:
            turn[0] += 1
            _pass(pw.ggml_type, W, a, choices[turn[0] % 64], unit, out)

    one = np.zeros(n_expert + 1, np.int64)
    one[1:] = 1  # expert 0 alone, again and again

    def l2() -> None:
        for _ in range(len(mats)):
            _pass(pw.ggml_type, slots[0], a, one, unit, out[:1])

    buf = roof_buffer(nbytes)
    print(f"{Path(args.model).name}: {len(mats)} matrices x {k} experts x {per_expert / 1e6:.2f} MB = "
          f"{nbytes / 1e6:.1f} MB a pass, one thread, CPU time")
    for _ in range(args.rounds):
        t_dram = _cpu(dram, args.reps)
        t_roof = _cpu(lambda: _read(buf, 1), args.reps)
        t_l2 = _cpu(l2, args.reps)
        print(f"experts stream {nbytes / t_dram / 1e9:5.1f} GB/s ({t_dram * 1e3:.2f} ms)   read roof "
              f"{buf.nbytes / t_roof / 1e9:5.1f} GB/s   one expert in L2 "
              f"{len(mats) * per_expert / t_l2 / 1e9:5.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()

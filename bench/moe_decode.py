"""One decoded token's expert matmuls, the graph's two ways, on the same data (issue 47): the grouped MUL_MAT_ID
node (compute._mul_mat_id_node: rows gathered by expert, each slot's copy of the row quantized, the stream, the
outputs scattered back) three times a layer (gate, up, down), against experts.decode_experts (the row quantized
once, each slot's expert read in place, gate and up in one stream: what the executor runs for one token).

Every layer's gate / up / down of a MoE GGUF (default bench/make_moe_model.py's), a fresh random choice of
n_expert_used experts per call (weights from DRAM), alternating the two ways, median microseconds per layer by the
calling thread's CPU time with -t 1 (wall time with more threads). Checks the two give the same bits first.

Usage: python bench/moe_decode.py [-m /tmp/moe-1b-q8_0.gguf] [-t 1] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).parents[1]))
from llamactx import Model  # noqa: E402
from llamactx.ggml import kernels  # noqa: E402
from llamactx.ggml.cpu import active_path, set_threads  # noqa: E402
from llamactx.ggml.kernels import compute  # noqa: E402
from llamactx.ggml.kernels.experts import decode_experts, streams_one  # noqa: E402
from llamactx.ggml.kernels.simd import PORTABLE, VNNI  # noqa: E402
from llamactx.ggml.moe import stacked  # noqa: E402

PATH = VNNI if active_path() == "vnni" else PORTABLE


@njit(cache=True)
def _grouped(nt, kind, Wg, Wu, Wd, x, h, ids, j, k, unit_ff, unit_embd, yg, yu, yd):
    """The three MUL_MAT_ID nodes of a layer, as the executor ran them for any row count."""
    ne0, n_ff = x.shape[0], h.shape[0] // k
    compute._mul_mat_id_node(PATH, nt, kind, Wg, x, 0, ne0, True, False, ne0, ids, j * k, k, 1, k, n_ff, unit_ff,
                             yg, 0, k * n_ff)
    compute._mul_mat_id_node(PATH, nt, kind, Wu, x, 0, ne0, True, False, ne0, ids, j * k, k, 1, k, n_ff, unit_ff,
                             yu, 0, k * n_ff)
    compute._mul_mat_id_node(PATH, nt, kind, Wd, h, 0, k * n_ff, False, False, n_ff, ids, j * k, k, 1, k, ne0,
                             unit_embd, yd, 0, k * ne0)


@njit(cache=True)
def _streamed(nt, kind, Wg, Wu, Wd, x, h, ids, j, k, unit_ff, unit_embd, yg, yu, yd):
    """decode_experts: gate and up in one stream, then down."""
    ne0, n_ff = x.shape[0], h.shape[0] // k
    sel = ids[j * k : (j + 1) * k]
    decode_experts(PATH, nt, kind, Wg[:3], Wu[:3], True, x.reshape((1, ne0)), True, sel, k, unit_ff,
                   yg.reshape((k, n_ff)), yu.reshape((k, n_ff)))
    decode_experts(PATH, nt, kind, Wd[:3], Wd[:3], False, h.reshape((k, n_ff)), False, sel, k, unit_embd,
                   yd.reshape((k, ne0)), yd.reshape((k, ne0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="/tmp/moe-1b-q8_0.gguf")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    set_threads(args.threads)
    model = Model.load(args.model)
    hp = model.hparams
    k, n_expert = hp.n_expert_used, hp.n_expert

    def packed(name):
        pw = kernels.pack_weight(stacked(model.weight(name)))
        return tuple(np.array(getattr(pw, s)) for s in ("qs", "qh", "sc", "mn", "d", "m")), pw

    layers = [[packed(f"blk.{i}.ffn_{p}_exps.weight") for p in ("gate", "up", "down")] for i in range(hp.n_layer)]
    gate_pw, down_pw = layers[0][0][1], layers[0][2][1]
    kind, ne0, n_ff = gate_pw.ggml_type, gate_pw.k, gate_pw.n_rows // n_expert
    if not streams_one(kind, n_ff, False):
        sys.exit(f"{Path(args.model).name}: its experts ({gate_pw.type_name}, n_ff {n_ff}) are not streamed")
    unit_ff, unit_embd = n_ff // 4, ne0 // 4
    rng = np.random.default_rng(1)
    ids = np.stack([rng.choice(n_expert, k, replace=False) for _ in range(64)]).astype(np.float32).reshape(-1)
    x = rng.standard_normal(ne0).astype(np.float32)
    h = rng.standard_normal(k * n_ff).astype(np.float32)
    outs = [np.empty(k * n_ff, np.float32), np.empty(k * n_ff, np.float32), np.empty(k * ne0, np.float32)]
    nbytes = sum(p.qs.nbytes + p.qh.nbytes + p.sc.nbytes for p in (gate_pw, gate_pw, down_pw)) * k // n_expert
    clock = time.thread_time if args.threads == 1 else time.perf_counter

    def run(fn, calls: int = 64) -> float:
        t0 = clock()
        for j in range(calls):
            (wg, _), (wu, _), (wd, _) = layers[j % len(layers)]
            fn(args.threads, kind, wg, wu, wd, x, h, ids, j, k, unit_ff, unit_embd, *outs)
        return (clock() - t0) / calls

    run(_grouped, 1)
    want = [o.copy() for o in outs]
    run(_streamed, 1)
    if not all(np.array_equal(a, b) for a, b in zip(want, outs, strict=True)):
        sys.exit("the two ways differ in bits")
    times: dict[str, list[float]] = {"grouped": [], "streamed": []}
    for _ in range(args.rounds):
        times["grouped"].append(run(_grouped))
        times["streamed"].append(run(_streamed))
    g, s = (float(np.median(v)) for v in times.values())
    print(f"{Path(args.model).name}: a layer's {k} experts x 3 matrices ({nbytes / 1e6:.2f} MB), {args.threads} "
          f"thread(s): grouped nodes {g * 1e6:.1f} us ({nbytes / g / 1e9:.1f} GB/s), decode_experts {s * 1e6:.1f} us "
          f"({nbytes / s / 1e9:.1f} GB/s); load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

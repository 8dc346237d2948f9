"""Nanoseconds per super-block of the IQ kernels for one activation row (a decoded token) against ggml-cpu's own
`ggml_vec_dot_iq*_q8_K` from the native llama.cpp build, on the same weight bytes and the same Q8_K activations,
with a bit-for-bit check of the two results.

Each weight tensor named on the command line (a GGUF file and a tensor, default: the low-bit files of issue #46) is
taken as ONE long row (its blocks are contiguous; its first 512 super-blocks) against a random activation row as
long, so that one call of either side covers every super-block and the call costs nothing per block. Ours is also
timed on the same blocks as rows of the tensor's k, as a model calls it: per-call work such as IQ1_M's activation
pair sums is then shared by the rows. Ours is kernels.klowbit's `lowbit_rows` (kiqrow.py for one row) and, with
--old, klowbit.vec_rows (the buffered decode it replaced). The clock is the calling thread's CPU time, best of
--reps, so the figures hold on a shared machine.

Usage: python bench/iq_vecdot.py [--reps 50] [--old] [FILE.gguf:TENSOR ...]
    e.g. python bench/iq_vecdot.py /tmp/smollm2-iq3_s.gguf:blk.0.ffn_down.weight
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path.cwd()))  # the checkout run from, before an installed llamactx

from gguf import GGUFReader  # noqa: E402
from numba import njit  # noqa: E402

from llamactx.ggml.cpu import active_path  # noqa: E402
from llamactx.ggml.kernels import klowbit  # noqa: E402
from llamactx.ggml.kernels.simd import PORTABLE, VNNI  # noqa: E402

DEFAULT = ["/tmp/smollm2-iq3_s.gguf:blk.0.ffn_down.weight", "/tmp/smollm2-iq1_m.gguf:blk.5.ffn_down.weight",
           "/tmp/smollm2-iq2_xs.gguf:blk.5.ffn_down.weight", "/tmp/moe-1b-iq2_xxs.gguf:blk.0.ffn_down_exps.weight"]
Q8K_BYTES = 4 + 256 + 32  # block_q8_K: float d, 256 int8, 16 int16 bsums
MAX_SUPER_BLOCKS = 512  # the first ones: the activation row (and IQ1_M's pair sums) stay in L2, as a token's in L1


@njit
def _new_vnni(t, post, w, a, out):
    klowbit.lowbit_rows(VNNI, t, post, w, a, 0, w.shape[0], out)


@njit
def _new_portable(t, post, w, a, out):
    klowbit.lowbit_rows(PORTABLE, t, post, w, a, 0, w.shape[0], out)


@njit
def _old_vnni(t, post, w, a, out):
    klowbit.vec_rows(VNNI, t, post, w, a, 0, w.shape[0], out)


@njit
def _old_portable(t, post, w, a, out):
    klowbit.vec_rows(PORTABLE, t, post, w, a, 0, w.shape[0], out)


def _best(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time_ns()
        fn()
        best = min(best, time.thread_time_ns() - t0)
    return best


def _q8k_bytes(a) -> np.ndarray:
    """klowbit's Q8_K activations (xq, xd, bsums) of one row as ggml's block_q8_K array."""
    xq, xd, bsums = a[0][0], a[1][0], a[2][0]
    nb = xd.shape[0]
    y = np.zeros((nb, Q8K_BYTES), np.uint8)
    y[:, :4] = xd.view(np.uint8).reshape(nb, 4)
    y[:, 4:260] = xq.view(np.uint8).reshape(nb, 256)
    y[:, 260:] = bsums.astype(np.int16).view(np.uint8).reshape(nb, 32)
    return y


def run(spec: str, lib: ctypes.CDLL, reps: int, old: bool) -> None:
    path, name = spec.split(":")
    tensor = next(t for t in GGUFReader(path).tensors if t.name == name)
    t = int(tensor.tensor_type)
    data = np.asarray(tensor.data).reshape(-1)
    per_row = int(tensor.shape[0]) // 256
    n_sb = min(int(tensor.n_elements) // 256, MAX_SUPER_BLOCKS) // per_row * per_row  # whole rows
    blocks = np.ascontiguousarray(data[: n_sb * (data.size * 256 // int(tensor.n_elements))]).reshape(1, -1)
    x = np.random.default_rng(0).standard_normal((1, n_sb * 256)).astype(np.float32)
    a = klowbit.activations_k(x)
    post = klowbit.post_of(t)
    out = np.zeros((1, 1), np.float32)
    vnni = active_path() == "vnni"
    new, prev = (_new_vnni, _old_vnni) if vnni else (_new_portable, _old_portable)
    ours = _best(lambda: new(t, post, blocks, a, out), reps)
    y = _q8k_bytes(a)
    fn = getattr(lib, f"ggml_vec_dot_{tensor.tensor_type.name.lower()}_q8_K")
    s = ctypes.c_float()
    args = (ctypes.c_int(n_sb * 256), ctypes.byref(s), ctypes.c_size_t(0), blocks.ctypes.data_as(ctypes.c_void_p),
            ctypes.c_size_t(0), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(0), ctypes.c_int(1))
    theirs = _best(lambda: fn(*args), reps)
    k = int(tensor.shape[0])  # the same super-blocks as a matrix of rows of k, one activation row of k
    mat = blocks.reshape(n_sb * 256 // k, -1)
    am = klowbit.activations_k(x[:, :k])
    outm = np.zeros((1, mat.shape[0]), np.float32)
    ours_m = _best(lambda: new(t, post, mat, am, outm), reps)
    same = np.float32(s.value).view(np.uint32) == out[0, 0].view(np.uint32)
    line = (f"{tensor.tensor_type.name:8s} {n_sb:5d} super-blocks: ours {ours / n_sb:6.2f} ns "
            f"(as {mat.shape[0]} rows of {k}: {ours_m / n_sb:6.2f}), "
            f"ggml {theirs / n_sb:6.2f} ns per super-block ({theirs / ours:.2f}x), bit-identical: {bool(same)}")
    if old:
        line += f"; before kiqrow {_best(lambda: prev(t, post, blocks, a, out), reps) / n_sb:6.2f} ns"
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tensors", nargs="*", default=DEFAULT)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--old", action="store_true", help="also time klowbit.vec_rows (before kiqrow.py)")
    ap.add_argument("--llamacpp", default=os.environ.get("LLAMACPP", str(Path.home() / ".cache/llamactx-llamacpp")))
    args = ap.parse_args()
    lib = ctypes.CDLL(str(Path(args.llamacpp) / "bin" / "libggml-cpu.so"))
    lib.ggml_cpu_init()
    print(f"path {active_path()}, 1 thread, CPU time, best of {args.reps}; load average {os.getloadavg()[0]:.1f}")
    for spec in args.tensors:
        run(spec, lib, args.reps, args.old)


if __name__ == "__main__":
    main()

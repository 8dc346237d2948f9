"""The single-matmul cases of tests/data/quants/matmuls.npz: for each quant type, weights and activations from fixed
seeds in shapes that take each kernel llama.cpp can pick for it (repacked or not: rows % 8; tiled or vec_dot:
n >= 8; tinyBLAS or vec_dot: n >= 2, k and rows; odd block counts and tails). Shared by make_quant_reference.py
(which records libggml's results) and tests/models/test_tiny_quant_types.py (which recomputes them), and the
random valid blocks make_quant_models.py writes (`tensor_data`). numpy and gguf only: the reference venv runs it."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

# f16 scale fields of each block (byte offset, low, high) and MXFP4's E8M0 exponent: weights of rms ~ 0.05
_F16_SCALES = {
    T.Q2_K: [(80, 0.002, 0.006), (82, 0.001, 0.004)],
    T.Q3_K: [(108, 0.001, 0.003)],
    T.Q4_K: [(0, 2e-4, 4e-4), (2, 2e-4, 4e-4)],
    T.Q5_K: [(0, 1e-4, 2e-4), (2, 1e-4, 2e-4)],
    T.IQ4_XS: [(0, 5e-5, 1e-4)],
    T.IQ4_NL: [(0, 5e-4, 1.5e-3)],
}

def tensor_data(shape: tuple[int, ...], t: T, rng: np.random.Generator) -> np.ndarray:
    """Random valid data of ggml `shape` stored as `t`: float32 for F32, else raw bytes (rows, row_bytes)."""
    n = int(np.prod(shape))
    ne0, rows = shape[0], n // shape[0]
    if t == T.F32:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32).reshape(shape[::-1])
    if t == T.BF16:
        f32 = (rng.standard_normal(n) / np.sqrt(ne0)).astype(np.float32)
        return (f32.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    block, size = GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, (n // block, size), dtype=np.uint8)
    for off, lo, hi in _F16_SCALES.get(t, []):
        d = rng.uniform(lo, hi, n // block).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    if t == T.MXFP4:
        blocks[:, 0] = rng.integers(119, 123, n // block)  # 2^(e - 128): 2^-9 .. 2^-6
    return blocks.reshape(rows, -1)


N_ROWS = (1, 3, 6, 9, 17)  # activation rows: vec_dot / gemv, gemm + gemv, tiled narrow (<= 16) and wide
MATMUL_CASES = [
    {"name": f"{t.name}_{rows}x{k}", "type": int(t), "rows": rows, "k": k}
    for t, shapes in (
        (T.Q2_K, [(24, 512), (20, 512)]), (T.Q3_K, [(20, 512)]), (T.Q4_K, [(20, 512)]), (T.Q5_K, [(20, 512)]),
        (T.IQ4_XS, [(20, 512)]),
        (T.IQ4_NL, [(24, 96), (20, 96), (20, 128)]), (T.MXFP4, [(24, 96), (20, 96), (20, 128)]),
        (T.BF16, [(24, 96), (22, 96), (24, 100), (24, 64)]),
    )
    for rows, k in shapes
]


def case_data(case: dict) -> tuple[int, np.ndarray, np.ndarray]:
    """(ggml type, weight bytes (rows, row_bytes), activations (max N_ROWS, k) float32) of one case."""
    rng = np.random.default_rng(_seed(case["name"]))
    t = T(case["type"])
    w = tensor_data((case["k"], case["rows"]), t, rng)
    x = (rng.standard_normal((max(N_ROWS), case["k"])) * 2).astype(np.float32)
    return int(t), w, x


def _seed(name: str) -> int:
    return sum((i + 1) * ord(c) for i, c in enumerate(name))

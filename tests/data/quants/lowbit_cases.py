"""The low-bit quant types' test data (issue #46): random valid super-blocks of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S, IQ1_S, IQ1_M, TQ1_0 and TQ2_0 (random grid indices, signs and sub-scales, a small random f16 d: weights of
rms ~ 0.05), the single-matmul cases of lowbit_matmuls.npz and the tiny model tiny-quants-lowbit.gguf. Shared by
make_lowbit_reference.py (llama.cpp's outputs) and tests/models/test_tiny_lowbit_types.py. numpy and gguf only: the
reference venv runs it.

Usage (from the repository root, in the project's venv): python tests/data/quants/lowbit_cases.py  (writes the
model; then make_lowbit_reference.py with llama.cpp's venv, for each build, tests/data/REFERENCE.md)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as T

OUT = Path(__file__).parent
# (byte offset of the f16 d, low, high); IQ1_M's d is packed in the top nibbles of its 4 scale words (offset 48)
D_RANGE = {T.IQ2_XXS: (0, 1.5e-3, 3e-3), T.IQ2_XS: (0, 1.5e-3, 3e-3), T.IQ2_S: (0, 1.5e-3, 3e-3),
           T.IQ3_XXS: (0, 4e-4, 8e-4), T.IQ3_S: (0, 4e-4, 8e-4), T.IQ1_S: (0, 1e-2, 2e-2),
           T.IQ1_M: (48, 1e-2, 2e-2), T.TQ1_0: (52, 0.04, 0.08), T.TQ2_0: (64, 0.04, 0.08)}
LOWBIT = tuple(D_RANGE)


def set_d(blocks: np.ndarray, t: T, d: np.ndarray) -> None:
    """Store the f16 super-block scales `d` (n,) into `blocks` (n, type_size) of type t, in place."""
    off = D_RANGE[t][0]
    if t == T.IQ1_M:  # iq1m_scale_t: nibble k of d in the top 4 bits of scale word k
        u = d.astype(np.float16).view(np.uint16)
        sc = blocks[:, 48:56].copy().view("<u2")
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((u >> (4 * k)) & 15) << 12)
        blocks[:, 48:56] = sc.view(np.uint8)
    else:
        blocks[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)


def tensor_data(shape: tuple[int, ...], t: T, rng: np.random.Generator) -> np.ndarray:
    """Random valid data of ggml `shape` stored as `t`: float32 for F32, else raw bytes (rows, row_bytes)."""
    n = int(np.prod(shape))
    if t == T.F32:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32).reshape(shape[::-1])
    block, size = GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, (n // block, size), dtype=np.uint8)
    _, lo, hi = D_RANGE[t]
    set_d(blocks, t, rng.uniform(lo, hi, n // block))
    return blocks.reshape(n // shape[0], -1)


N_ROWS = (1, 3, 6, 9, 17)  # activation rows: vec_dot (< 8), tiled narrow (<= 16) and wide
MATMUL_CASES = [{"name": f"{t.name}_{rows}x{k}", "type": int(t), "rows": rows, "k": k}
                for t in LOWBIT for rows, k in ((20, 512), (7, 256))]


def case_data(case: dict) -> tuple[int, np.ndarray, np.ndarray]:
    """(ggml type, weight bytes (rows, row_bytes), activations (max N_ROWS, k) float32) of one case."""
    rng = np.random.default_rng(sum((i + 1) * ord(c) for i, c in enumerate(case["name"])))
    t = T(case["type"])
    w = tensor_data((case["k"], case["rows"]), t, rng)
    x = (rng.standard_normal((max(N_ROWS), case["k"])) * 2).astype(np.float32)
    return int(t), w, x


# ggml_mul_mat_id cases: 4 experts of 20 rows, k = 256, 24 tokens with 2 experts each, routed so that experts 0
# and 1 get 8+ rows (the tiled kernel, per expert) and experts 2 and 3 fewer (vec_dot)
MOE_TYPES = LOWBIT
MOE_SHAPE = {"k": 256, "rows": 20, "n_expert": 4, "n_tokens": 24, "n_used": 2}


def moe_case(t: T) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(expert weights (n_expert * rows, row_bytes), x (n_tokens, k) float32, selected (n_tokens, n_used) int32)."""
    m = MOE_SHAPE
    rng = np.random.default_rng(4600 + int(t))
    w = tensor_data((m["k"], m["rows"] * m["n_expert"]), t, rng)
    x = (rng.standard_normal((m["n_tokens"], m["k"])) * 2).astype(np.float32)
    first = np.where(np.arange(m["n_tokens"]) < 18, 0, 2)  # expert 0: 18 rows, expert 2: 6
    second = np.where(np.arange(m["n_tokens"]) % 3 == 0, 3, 1)  # expert 3: 8 rows, expert 1: 16
    second[np.arange(m["n_tokens"]) >= 21] = 2  # ... and expert 2 also the last ones' second slot
    return w, x, np.stack([first, second], axis=1).astype(np.int32)


# every type a weight matrix of the model (TQ1_0 the token embedding: get_rows; its matmul is in MATMUL_CASES)
MODEL_TYPES = {"token_embd.weight": T.TQ1_0, "attn_q.weight": T.IQ2_XXS, "attn_k.weight": T.IQ2_XS,
               "attn_v.weight": T.IQ2_S, "attn_output.weight": T.IQ3_XXS, "ffn_gate.weight": T.IQ3_S,
               "ffn_up.weight": T.IQ1_S, "ffn_down.weight": T.IQ1_M, "output.weight": T.TQ2_0}


def write_model(seed: int = 146) -> Path:
    """tiny-quants-lowbit.gguf: a one-layer llama, n_embd = n_ff = 256, the tests' byte-level BPE vocabulary."""
    sys.path.insert(0, str(Path(__file__).parents[3]))
    from tests.gguf.tiny_model import _add, finish, tensor_table, tiny_hparams, vocab_meta  # noqa: PLC0415

    meta = {**tiny_hparams(n_embd=256, n_ff=256, n_layer=1, n_head=2, n_head_kv=1), **vocab_meta("bpe")}
    table = tensor_table(meta, len(meta["tokenizer.ggml.tokens"]))
    table["output.weight"] = table["token_embd.weight"]
    writer = GGUFWriter(str(OUT / "tiny-quants-lowbit.gguf"), "llama")
    writer.add_name("tiny quants lowbit")
    for key, value in meta.items():
        _add(writer, key, value)
    rng = np.random.default_rng(seed)
    for tname, shape in table.items():
        t = MODEL_TYPES.get(tname.removeprefix("blk.0."), T.F32)
        writer.add_tensor(tname, tensor_data(shape, t, rng), raw_dtype=None if t == T.F32 else t)
    return finish(writer)


if __name__ == "__main__":
    print(write_model())

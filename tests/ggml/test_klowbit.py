"""kernels.klowbit (issue #46): the IQ types' matmuls from their packed blocks give vecdot_lowbit's unpacked
integers-then-sums bits exactly (which tests/models/test_tiny_quant_types.py checks against libggml), on both kernel
paths, through every entry: matmul_lowbit, kernels.matmul on a packed weight and the experts' matmul_id."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.ggml.cpu import cpu_features
from llamactx.ggml.kernels.klowbit import KERNEL_TYPES, matmul_lowbit_portable, matmul_lowbit_vnni
from llamactx.ggml.kernels.matmul import expert_order, matmul, matmul_id
from llamactx.ggml.kernels.repack import pack_weight
from llamactx.ggml.vecdot_lowbit import matmul_lowbit, matmul_lowbit_unpacked
from llamactx.gguf.quants_lowbit import POST
from llamactx.model import Weight
from tests.data.quants.lowbit_cases import tensor_data

N_ROWS = (1, 3, 7, 8, 9, 21)  # vec_dot below 8, the tile from 8 (four rows at a time and the rest)
_PATHS = [("portable", matmul_lowbit_portable)] + ([("vnni", matmul_lowbit_vnni)] if cpu_features()["vnni"] else [])


def _weight(t: T, rows: int, k: int, seed: int) -> tuple[Weight, np.random.Generator]:
    rng = np.random.default_rng(seed)
    data = tensor_data((k, rows), t, rng)
    data.flags.writeable = False
    return Weight(f"{t.name}_{rows}x{k}", int(t), (k, rows), data), rng


def _same(got: np.ndarray, want: np.ndarray, msg: str) -> None:
    assert got.shape == want.shape, msg
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=msg)


@pytest.mark.parametrize("t", KERNEL_TYPES, ids=lambda t: T(t).name)
@pytest.mark.parametrize("path", _PATHS, ids=lambda p: p[0])
def test_kernels_give_the_unpacked_bits(t, path):
    """35 rows (two tiles and a partial one, split over 3 tasks) of k = 512, and 7 rows of k = 256."""
    name, kernel = path
    for rows, k in ((35, 512), (7, 256)):
        w, rng = _weight(t, rows, k, int(t) * 100 + rows)
        for n in N_ROWS:
            x = (rng.standard_normal((n, k)) * 2).astype(np.float32)
            want = matmul_lowbit_unpacked(x, w)
            got = np.full_like(want, np.nan)
            kernel(3, int(t), np.float32(POST[t]), w.data.reshape(rows, -1), x, got)
            _same(got, want, f"{t.name} {name} rows={rows} k={k} n={n}")


@pytest.mark.parametrize("t", KERNEL_TYPES, ids=lambda t: T(t).name)
def test_every_entry_reaches_the_kernels(t):
    """matmul_lowbit (the reference's), kernels.matmul on the packed blocks (FastOps and its graphs) and
    matmul_id of stacked experts (each expert's rows choosing vec_dot or the tile by their own count)."""
    w, rng = _weight(t, 24, 256, int(t))
    x = (rng.standard_normal((9, 256)) * 2).astype(np.float32)
    pw = pack_weight(w)
    for n in (1, 9):
        want = matmul_lowbit_unpacked(x[:n], w)
        _same(matmul_lowbit(x[:n], w), want, f"{t.name} matmul_lowbit n={n}")
        _same(matmul(x[:n], pw, 2), want, f"{t.name} kernels.matmul n={n}")
    assert expert_order(t, 8) == 0
    starts = np.array([0, 9, 9, 12], np.int64)  # experts of 8 rows: 9 rows (tiled), none, 3 (vec_dot)
    got = matmul_id(x[[*range(9), 0, 4, 8]], pw, starts, 8, 2)  # (12, 8)
    for e, (a, b) in enumerate(((0, 9), (9, 12))):
        expert = 2 * e  # experts 0 and 2
        we = Weight("e", int(t), (256, 8), w.data[8 * expert : 8 * expert + 8])
        _same(got[a:b], matmul_lowbit_unpacked(x[[*range(9), 0, 4, 8]][a:b], we), f"{t.name} expert {expert}")


@pytest.mark.parametrize("t", [T.IQ2_XXS, T.IQ3_S], ids=lambda t: T(t).name)
def test_prompt_sized_experts_quantized_on_every_thread(t):
    """A prompt's mul_mat_id quantizes its rows in shares over the threads (matmul._activations_par, from 8 rows per
    thread): 45 rows over three experts, each expert's rows as that expert's own matmul gives them."""
    w, rng = _weight(t, 48, 512, int(t) + 7)
    x = (rng.standard_normal((45, 512)) * 2).astype(np.float32)
    pw = pack_weight(w)
    starts = np.array([0, 20, 20, 29, 45], np.int64)  # experts of 12 rows: 20 rows, none, 9, 16
    got = matmul_id(x, pw, starts, 12, 2)
    for e in (0, 2, 3):
        a, b = starts[e], starts[e + 1]
        we = Weight("e", int(t), (512, 12), w.data[12 * e : 12 * e + 12])
        _same(got[a:b], matmul_lowbit_unpacked(x[a:b], we), f"{t.name} expert {e}")

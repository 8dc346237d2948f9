"""The hub's other quant types on the numba kernels (llamactx.ggml.kernels.kxquants): Q2_K, Q3_K, Q5_K, IQ4_XS,
IQ4_NL and MXFP4, bit for bit against the reference kernels (vecdot_kx / vecdot_nl, themselves bit-identical to
llama.cpp), on random blocks, on every extreme quant byte, and in FastOps' choice of kernel or reference."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.backend.fast import FastOps
from llamactx.backend.reference import ReferenceOps
from llamactx.ggml import kernels, vecdot_kx
from llamactx.ggml.cpu import F32_EPR
from llamactx.gguf import quants as Q
from llamactx.model import Weight
from tests.ggml.test_kernels import PATHS, THREADS, check_path

OPS = ReferenceOps()
TILED = [T.Q3_K, T.Q5_K, T.IQ4_XS]  # never repacked: ggml_vec_dot below 8 activation rows, the tiled kernel from 8
REPACKED = [T.Q2_K, T.IQ4_NL, T.MXFP4]  # with ne1 % 8 == 0 (Q2_K: an AVX-512 target) llama.cpp repacks them
HUB = TILED + REPACKED
# the bytes of each type's block that are not quants: f16 scales (kept finite) and MXFP4's E8M0 exponent
F16_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q5_K: [0, 2], T.IQ4_XS: [0], T.IQ4_NL: [0], T.MXFP4: []}


def hub_weight(t: int, k: int, n_rows: int, rng, fill: int | None = None) -> Weight:
    """Random blocks (or every byte `fill`) with finite f16 scales and MXFP4 exponents within 2^-28..2^12."""
    fmt = Q.block_format(t)
    shape = (n_rows, k // fmt.block_size, fmt.type_size)
    data = rng.integers(0, 256, shape, dtype=np.uint8) if fill is None else np.full(shape, fill, np.uint8)
    for off in F16_FIELDS[t]:
        scale = (rng.random(shape[:2]) * 0.02 + 1e-3).astype(np.float16)
        data[:, :, off : off + 2] = scale[..., None].view(np.uint8)
    if t == T.MXFP4:
        data[:, :, 0] = rng.integers(100, 140, shape[:2])
    data = data.reshape(n_rows, -1)
    data.flags.writeable = False
    return Weight(f"hub.{T(t).name}", int(t), (k, n_rows), data)


def assert_bits(got: np.ndarray, ref: np.ndarray, what) -> None:
    assert got.view(np.uint32).tolist() == ref.view(np.uint32).tolist(), what


@pytest.fixture
def repacked_reference(monkeypatch):
    """ReferenceOps computing Q2_K with ne1 % 8 == 0 in its repacked order on every target: an AVX2 build of
    llama.cpp does not repack Q2_K (FastOps leaves such a weight to the reference), but the kernels' repacked order
    is checked against the reference's there too."""
    monkeypatch.setattr(vecdot_kx, "F32_EPR", 16)


def llama_order(t: int, n_rows: int) -> bool:
    """The kernels' order that is llama.cpp's for this weight (what FastOps passes)."""
    return t in TILED or n_rows % 8 == 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t", HUB, ids=lambda t: T(t).name)
def test_hub_types_match_reference_bit_for_bit(t, path, repacked_reference):
    """llama_order=True against ReferenceOps for n = 1, 3 (vec_dot / gemv), 8, 9 (tiled / gemm + tail), 16, 19
    and 33 (Q3_K / Q5_K / IQ4_XS in tiles of 16 weight rows, kxtile.py) activation rows, 24 and 40 weight rows
    (partial tiles, one thread's share or both), rows of two super-blocks."""
    check_path(path)
    rng = np.random.default_rng(100 + int(t))
    for n_rows in (24, 40):
        w = hub_weight(t, 512, n_rows, rng)
        pw = kernels.pack_weight(w)
        for n in (1, 3, 8, 9, 16, 19, 33):
            x = (rng.standard_normal((n, 512)) * 2).astype(np.float32)  # (n, 512)
            for threads in {1, THREADS}:
                got = kernels.matmul(x, pw, threads, path=path, llama_order=True)  # (n, n_rows)
                assert_bits(got, OPS.matmul(x, w), (n_rows, n, threads))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t", [T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_XS], ids=lambda t: T(t).name)
def test_vec_dot_order_matches_reference_below_8_rows(t, path):
    """llama_order=False is ggml_vec_dot's order for every n: the reference's below 8 rows, for a weight llama.cpp
    does not repack (19 rows: Q2_K takes its vec_dot there)."""
    check_path(path)
    rng = np.random.default_rng(200 + int(t))
    w = hub_weight(t, 768, 19, rng)
    for n in (1, 2, 5, 7):
        x = (rng.standard_normal((n, 768)) * 2).astype(np.float32)  # (n, 768)
        assert_bits(kernels.matmul(x, kernels.pack_weight(w), THREADS, path=path), OPS.matmul(x, w), n)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t", HUB, ids=lambda t: T(t).name)
def test_hub_types_extreme_codes(t, path, repacked_reference):
    """Every quant and scale byte at 0x00 / 0x7F / 0x80 / 0xFF (IQ4's codebook ends -127 and 113, Q3_K's -4 and
    3 with scales -32 / 31, Q5_K's 31 with 63-scales) against activations of +-1 (quants +-127) and a mixed row:
    the largest integer lanes. On the portable path `pmaddubsw` pairs would saturate past 32767."""
    check_path(path)
    rng = np.random.default_rng(300 + int(t))
    x = np.ones((16, 256), np.float32)  # (16, 256)
    x[1::2] = -1.0
    x[4, 1::2] = -1.0
    for fill in (0x00, 0x7F, 0x80, 0xFF):
        w = hub_weight(t, 256, 16, rng, fill)
        for n in (1, 9, 16):
            got = kernels.matmul(x[:n], kernels.pack_weight(w), THREADS, path=path, llama_order=True)
            assert_bits(got, OPS.matmul(x[:n], w), (fill, n))


def test_fast_ops_puts_hub_types_on_the_kernels_where_llama_order_is_known():
    """FastOps' choice: Q3_K / Q5_K / IQ4_XS always; Q2_K (on an AVX-512 target), IQ4_NL and MXFP4 only when
    llama.cpp repacks them (ne1 % 8 == 0), else the reference computes them."""
    rng = np.random.default_rng(4)
    for t in HUB:
        for n_rows in (16, 19):
            expect = t in TILED or (n_rows % 8 == 0 and (t != T.Q2_K or F32_EPR == 16))
            got = FastOps._kernel_order(hub_weight(t, 256, n_rows, rng))
            assert (got is not None) == expect, (T(t).name, n_rows)
            assert got in (None, llama_order(t, n_rows))


@pytest.mark.parametrize("t", [T.Q3_K, T.IQ4_XS, T.IQ4_NL, T.MXFP4], ids=lambda t: T(t).name)
def test_expert_rows_match_reference_rows_alone(t):
    """matmul_id (ggml_mul_mat_id: every routed row computed alone) on the kernels equals ReferenceOps.matmul_rows
    for every expert, with 0, 1, 3 and 17 rows routed to the four experts (the 17 take kxtile's tiles)."""
    from llamactx.ggml.kernels.matmul import expert_order, matmul_id

    rng = np.random.default_rng(400 + int(t))
    n_ff, n_expert, k = 24, 4, 512
    assert expert_order(t, n_ff) == 0
    stacked = hub_weight(t, k, n_expert * n_ff, rng)  # (k, n_expert * n_ff): the experts' rows stacked
    counts = [0, 1, 3, 17]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (n_expert + 1,)
    x = (rng.standard_normal((int(starts[-1]), k)) * 2).astype(np.float32)  # (M, k) grouped by expert
    got = matmul_id(x, kernels.pack_weight(stacked), starts, n_ff, THREADS)  # (M, n_ff)
    for e in range(n_expert):
        rows = stacked.data[e * n_ff : (e + 1) * n_ff]
        expert = Weight(f"expert{e}", int(t), (k, n_ff), rows)
        r0, r1 = starts[e], starts[e + 1]
        if r1 > r0:
            assert_bits(got[r0:r1], OPS.matmul_rows(x[r0:r1], expert), e)

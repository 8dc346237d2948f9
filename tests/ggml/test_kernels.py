"""The numba kernels against the reference ops: quantized matmul, activation quantizers, get_rows, packing.

Oracles: `ReferenceOps.matmul` (for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 an operation-for-operation copy of ggml's x86 dot
products, so the kernels must match it bit for bit; for K-quants and F16/F32 a float64 product rounded once,
which the kernels match to float32 summation noise), `llamactx.gguf.quants` for the quantizers and decoders.
Both kernel paths run on every type (the VNNI one where the CPU has it). The first run compiles the kernels
(about 10-15 s per path), later runs load numba's cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx.backend.reference import ReferenceOps
from llamactx.embedded import ModelNotInstalledError
from llamactx.ggml import kernels
from llamactx.ggml import quants_cpu as QC
from llamactx.ggml.intrinsics import round_f16
from llamactx.ggml.kernels import q8 as KQ
from llamactx.ggml.vecdot import matmul_exact
from llamactx.gguf import quants as Q
from llamactx.gguf.quants_k import scale_min_k4
from llamactx.model import Weight
from tests.conftest import SCALE_OFFSETS

EXACT = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]  # ReferenceOps follows ggml's x86 order: bit-exact
CLOSE = [T.Q4_K, T.Q5_K, T.Q6_K, T.F32, T.F16]  # ReferenceOps rounds a float64 product: summation noise
PATHS = ["vnni", "portable"]
THREADS = min(2, numba.config.NUMBA_NUM_THREADS)  # two where the machine has them: both shares of the rows

OPS = ReferenceOps()


def random_weight(t: int, k: int, n_rows: int, rng) -> Weight:
    """Random blocks (every bit pattern of the quants) with finite, positive-ish f16 scales."""
    if t in (T.F32, T.F16):
        dtype = np.float32 if t == T.F32 else np.float16
        data = rng.standard_normal((n_rows, k)).astype(dtype)
    else:
        fmt = Q.block_format(t)
        nb = k // fmt.block_size
        data = rng.integers(0, 256, (n_rows, nb, fmt.type_size), dtype=np.uint8)
        for off in SCALE_OFFSETS[t]:
            scale = (rng.random((n_rows, nb)) * 0.02 + 1e-3).astype(np.float16)
            data[:, :, off : off + 2] = scale[..., None].view(np.uint8)
        data = data.reshape(n_rows, -1)
    data.flags.writeable = False
    return Weight(f"random.{T(t).name}", int(t), (k, n_rows), data)


def row_length(t: int) -> int:
    """A row length that is whole blocks but no multiple of the larger tiles (256-blocks: 2 super-blocks)."""
    return {256: 512, 32: 96}.get(Q.block_format(t).block_size, 37)


def check_path(path: str) -> None:
    if path == "vnni" and not kernels.cpu_features()["vnni"]:
        pytest.skip("CPU without AVX512-VNNI / AVX-VNNI")


def assert_matches_reference(x: np.ndarray, w: Weight, path: str) -> None:
    """Kernel vs ReferenceOps: equal bits for the 32-block types, else within 2e-6 (17 ulp of 2^-23) of the sum
    of |terms| (|x_q| . |W|) of each output, a bound on float32 summation-order differences."""
    got = kernels.matmul(x, kernels.pack_weight(w), THREADS, path=path)  # (n, n_rows)
    ref = OPS.matmul(x, w) if w.ggml_type not in (T.F32, T.F16) else None
    if w.ggml_type in EXACT:  # the kernels' order is ggml_vec_dot's (a repacked Q4_0 weight stays on the reference)
        ref = matmul_exact(x, w, repacked=False)
        assert got.view(np.uint32).tolist() == ref.view(np.uint32).tolist()
        return
    xq = OPS.activations_for(x, w.ggml_type).astype(np.float64)  # (n, k)
    wf = Q.dequantize(w.data.reshape(-1).view(np.uint8), w.ggml_type, w.shape).astype(np.float64)  # (rows, k)
    if ref is None:
        ref = xq @ wf.T
    scale = np.abs(xq) @ np.abs(wf).T  # (n, n_rows)
    err = np.abs(got.astype(np.float64) - ref)
    assert (err <= 2e-6 * scale + 1e-30).all(), f"max err / scale = {(err / scale).max():.3g}"


# --- activation quantizers -------------------------------------------------------------------------------------


def test_activation_quantizers_match_quants_cpu():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 512)) * rng.choice([1e-6, 1.0, 3e4], (4, 1))).astype(np.float32)  # (4, 512)
    x[0, :32] = 0.0
    x[1, :256] = 0.0
    x[2, 40] = np.float32(63.5)  # a tie: x * 127 / amax lands on .5
    n, k = x.shape
    xq = np.zeros((n, k), np.int8)
    xd = np.zeros((n, k // 32), np.float32)
    lanes = np.zeros((n, k // 4), np.int32)
    KQ.quantize_q8_0(x, xq, xd, lanes, -1)  # offset -1: plain sums of 4 quants
    ref = QC.quantize_q8_0(x).reshape(n, -1, 34)
    assert (ref[..., 2:].view(np.int8).reshape(n, k) == xq).all()
    assert (ref[..., :2].copy().view(np.float16)[..., 0].astype(np.float32) == xd).all()
    assert (xq.reshape(n, -1, 4).sum(-1) == lanes).all()
    s = np.zeros((k // 32, n), np.float32)  # block-major
    KQ.quantize_q8_1(x, xq, xd, s)
    ref = QC.quantize_q8_1(x).reshape(n, -1, 36)
    assert (ref[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) == s.T).all()
    xdk = np.zeros((n, k // 256), np.float32)
    bsums = np.zeros((n, k // 16), np.int32)
    KQ.quantize_q8_K(x, xq, xdk, bsums)
    ref = QC.quantize_q8_K(x).reshape(n, -1, 292)
    assert (ref[..., 4:260].view(np.int8).reshape(n, k) == xq).all()
    assert (ref[..., :4].copy().view(np.float32)[..., 0] == xdk).all()
    assert (ref[..., 260:].copy().view(np.int16).reshape(n, -1) == bsums).all()


@numba.njit
def _round_f16(x):
    return round_f16(np.float32(x))


def test_round_f16_matches_numpy():
    rng = np.random.default_rng(2)
    edge = [65504, 65519.996, 65520, 1e6, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 0.0, -0.0, np.inf, -np.inf]
    scales = np.repeat(np.float32([1e-7, 1e-5, 1.0, 6e4]), 100)
    v = np.concatenate([rng.standard_normal(400).astype(np.float32) * scales, np.float32(edge)])  # (411,)
    got = np.array([_round_f16(a) for a in v], dtype=np.float32)
    with np.errstate(over="ignore"):
        want = v.astype(np.float16).astype(np.float32)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


# --- matmul ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t", EXACT + CLOSE, ids=lambda t: T(t).name)
def test_matmul_random_weights(t, path):
    """n = 1, 3, 17, 21 activation rows (the 8-row, 4-row and 1-row code), 19 weight rows (not a multiple of the
    16-row task), rows of 96 / 512 / 37 elements."""
    check_path(path)
    rng = np.random.default_rng(int(t))
    w = random_weight(t, row_length(t), 19, rng)
    for n in (1, 3, 17, 21):
        x = (rng.standard_normal((n, w.shape[0])) * 2).astype(np.float32)  # (n, k)
        assert_matches_reference(x, w, path)


@pytest.mark.parametrize("path", PATHS)
def test_matmul_full_range_quants_never_saturate(path):
    """Every quant byte at 0x7F / 0xFF / 0x80 against activations of +-127: the largest products each type can
    make. On the portable path with AVX2 the small quants take `pmaddubsw`, whose int16 pairs saturate past 32767;
    Q8_0's unsigned q + 128 (up to 255 x 127 x 2) must not go that way."""
    check_path(path)
    x = np.ones((3, 96), np.float32)  # (3, 96)
    x[1] = -1.0
    x[2, 1::2] = -1.0
    for t in EXACT:
        fmt = Q.block_format(t)
        for byte in (0x7F, 0xFF, 0x80):
            data = np.full((7, 96 // fmt.block_size, fmt.type_size), byte, np.uint8)
            for off in SCALE_OFFSETS[t]:
                data[:, :, off : off + 2] = np.float16(0.01).reshape(1).view(np.uint8)
            data = data.reshape(7, -1)
            data.flags.writeable = False
            assert_matches_reference(x, Weight(f"full.{T(t).name}", int(t), (96, 7), data), path)


def test_matmul_extreme_activations_stay_exact():
    """Zero blocks, huge and tiny magnitudes, and a spike: ties in the activation quants and full-range lanes."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 96)).astype(np.float32)  # (5, 96)
    x[0] = 0.0
    x[1, :32] *= 1e30
    x[2, 32:64] *= 1e-30
    x[3, 7] = 1e4
    with np.errstate(over="ignore"):  # the reference's f16 scale of the 1e30 block overflows to inf, as ggml's
        for t in EXACT:
            assert_matches_reference(x, random_weight(t, 96, 7, rng), kernels.active_path())


@pytest.mark.parametrize("t", EXACT, ids=lambda t: T(t).name)
def test_matmul_largest_lanes_stay_exact(t):
    """Every quant byte 0x00 / 0x7F / 0x80 / 0xFF (the extreme weight quants: Q8_0's -128) against activations
    of +-1 (quants of +-127): the largest integer lanes the kernels convert (|lane| up to 4 * 128 * 127)."""
    rng = np.random.default_rng(5)
    w = random_weight(t, 96, 8, rng)
    data = np.repeat(np.array([0x00, 0x7F, 0x80, 0xFF] * 2, np.uint8)[:, None], w.data.shape[1], axis=1)
    size = w.data.shape[1] // 3  # bytes per block: 3 blocks of 32
    for off in SCALE_OFFSETS[t]:  # keep the random finite scales
        for b in range(3):
            data[:, b * size + off : b * size + off + 2] = w.data[:, b * size + off : b * size + off + 2]
    data.flags.writeable = False
    w = Weight(w.name, w.ggml_type, w.shape, data)
    x = np.ones((9, 96), np.float32)  # (9, 96)
    x[1::2] = -1.0
    x[4, 1::2] = -1.0
    assert_matches_reference(x, w, kernels.active_path())


@pytest.fixture(scope="module")
def real_weights(request) -> dict[str, Weight]:
    """One or two real tensors of each type the two models use (row subsets of the big embedding matrices)."""
    wanted = {
        "smollm": ["blk.0.attn_k.weight", "blk.3.ffn_down.weight", "token_embd.weight"],
        "gemma": [
            "blk.0.attn_k.weight",
            "blk.0.attn_v.weight",
            "blk.0.attn_output.weight",
            "blk.0.ffn_down.weight",
            "token_embd.weight",
        ],
    }
    out = {}
    for fixture, names in wanted.items():
        try:
            model = request.getfixturevalue(fixture)  # conftest: Model.load, once per session
        except ModelNotInstalledError as e:
            pytest.skip(str(e))
        for name in names:
            w = model.weight(name)
            if name == "token_embd.weight":
                w = Weight(name, w.ggml_type, (w.shape[0], 300), w.data[:300])  # (300, row_bytes)
            out[f"{fixture}.{name}"] = w
    return out


@pytest.mark.parametrize("path", PATHS)
def test_matmul_real_tensors(real_weights, path):
    check_path(path)
    rng = np.random.default_rng(4)
    types = set()
    for w in real_weights.values():
        x = rng.standard_normal((3, w.shape[0])).astype(np.float32)  # (3, k)
        assert_matches_reference(x, w, path)
        types.add(w.ggml_type)
    assert types == {T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K}


def test_matmul_n_rows_invariant_and_out_argument():
    """A row's result does not depend on the batch around it (4-row and 1-row code agree bit for bit)."""
    rng = np.random.default_rng(5)
    for t in (T.Q4_0, T.Q4_K, T.Q6_K):
        pw = kernels.pack_weight(random_weight(t, 512, 21, rng))
        x = rng.standard_normal((9, 512)).astype(np.float32)  # (9, 512)
        out = np.full((9, 21), np.nan, np.float32)
        assert kernels.matmul(x, pw, THREADS, out=out) is out
        single = np.concatenate([kernels.matmul(x[i : i + 1], pw, 1) for i in range(9)])
        assert out.view(np.uint32).tolist() == single.view(np.uint32).tolist()


def test_matmul_rejects_bad_input():
    rng = np.random.default_rng(6)
    pw = kernels.pack_weight(random_weight(T.Q4_0, 64, 3, rng))
    with pytest.raises(ValueError, match="expected"):
        kernels.matmul(np.zeros((2, 32), np.float32), pw, 1)
    with pytest.raises(ValueError, match="out must be"):
        kernels.matmul(np.zeros((2, 64), np.float32), pw, 1, out=np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="path"):
        kernels.matmul(np.zeros((2, 64), np.float32), pw, 1, path="avx9000")


# --- K-quants: ggml's own order ----------------------------------------------------------------------------------
# ReferenceOps rounds a float64 product for the K-quants, so here is ggml's x86 AVX2 vec_dot in numpy, written from
# ggml-cpu/arch/x86/quants.c: int32 lanes of 4 products (maddubs + madd), one fma(d, lane, acc) per super-block,
# hsum_float_8; Q4_K's acc_m lanes, Q5_K's summs, Q6_K's q8sclsub.


def _fma(a, b, c):
    """float32 fma via float64 (a*b exact; one more rounding only when exponents are > 29 apart)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)


def _hsum8(acc):
    r = (acc[4:] + acc[:4]).astype(np.float32)  # (4,)
    return np.float32(np.float32(r[0] + r[2]) + np.float32(r[1] + r[3]))


def _lanes(w, x):
    """int32 lanes of 4 products of 32 unsigned weights and 32 int8 activations. (32,), (32,) -> (8,)"""
    return (w.astype(np.int32) * x.astype(np.int32)).reshape(8, 4).sum(-1)


def ggml_vec_dot_k(w: Weight, x: np.ndarray) -> np.ndarray:
    """x (n, k) @ W^T for Q4_K / Q5_K / Q6_K weights as ggml's AVX2 vec_dot computes it. -> (n, rows) float32"""
    n, k = x.shape
    rows = w.data.reshape(w.shape[1], k // 256, -1)  # (rows, nb, type_size)
    act = QC.quantize_q8_K(x).reshape(n, k // 256, 292)
    yd = act[..., :4].copy().view(np.float32)[..., 0]  # (n, nb)
    yq = act[..., 4:260].view(np.int8)  # (n, nb, 256)
    bs = act[..., 260:].copy().view(np.int16).astype(np.int32)  # (n, nb, 16)
    out = np.empty((n, w.shape[1]), np.float32)
    f16 = lambda blk, o: np.float32(blk[o : o + 2].view(np.float16)[0])  # noqa: E731
    for i in range(n):
        for r in range(w.shape[1]):
            acc, acc_m, summs = np.zeros(8, np.float32), np.zeros(4, np.float32), np.float32(0)
            for b in range(k // 256):
                blk, q8 = rows[r, b], yq[i, b]
                sumi = np.zeros(8, np.int64)
                if w.ggml_type == T.Q6_K:
                    ql, qh, sc = blk[:128], blk[128:192], blk[192:208].view(np.int8).astype(np.int64)
                    for h in range(2):
                        l0, l1, hb = ql[64 * h : 64 * h + 32], ql[64 * h + 32 : 64 * h + 64], qh[32 * h : 32 * h + 32]
                        quarters = [
                            (l0 & 15) | (hb & 3) << 4,
                            (l1 & 15) | (hb >> 2 & 3) << 4,
                            (l0 >> 4) | (hb >> 4 & 3) << 4,
                            (l1 >> 4) | (hb >> 6 & 3) << 4,
                        ]
                        for t, q in enumerate(quarters):
                            g = 8 * h + 2 * t
                            lanes = _lanes(q, q8[128 * h + 32 * t : 128 * h + 32 * t + 32])
                            sumi += lanes * np.repeat(sc[g : g + 2], 4)
                    sumi -= 32 * (bs[i, b] * sc).reshape(8, 2).sum(-1)  # q8sclsub
                    acc = _fma(np.float32(yd[i, b] * f16(blk, 208)), sumi.astype(np.float32), acc)
                    continue
                sc, mn = (v[0].astype(np.int64) for v in scale_min_k4(blk[None, 4:16]))
                q5 = w.ggml_type == T.Q5_K
                qs, qh = (blk[48:176], blk[16:48]) if q5 else (blk[16:144], None)
                for c in range(4):
                    v = qs[32 * c : 32 * c + 32]
                    lo, hi = v & 15, v >> 4
                    if q5:
                        lo, hi = lo | (qh >> (2 * c) & 1) << 4, hi | (qh >> (2 * c + 1) & 1) << 4
                    sumi += sc[2 * c] * _lanes(lo, q8[64 * c : 64 * c + 32])
                    sumi += sc[2 * c + 1] * _lanes(hi, q8[64 * c + 32 : 64 * c + 64])
                acc = _fma(np.float32(yd[i, b] * f16(blk, 0)), sumi.astype(np.float32), acc)
                dmin = np.float32(-yd[i, b] * f16(blk, 2))
                prod = (mn * (bs[i, b].reshape(8, 2).sum(-1))).reshape(4, 2).sum(-1)  # (4,) madd of mins, hadd
                if q5:
                    summs = _fma(dmin, np.float32(prod.sum()), summs)
                else:
                    acc_m = _fma(dmin, prod.astype(np.float32), acc_m)
            m = np.float32(np.float32(acc_m[0] + acc_m[2]) + np.float32(acc_m[1] + acc_m[3]))
            out[i, r] = np.float32(_hsum8(acc) + (summs if w.ggml_type == T.Q5_K else m))
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: T(t).name)
def test_kquants_match_ggml_order_bit_for_bit(t, path):
    check_path(path)
    rng = np.random.default_rng(10 + int(t))
    w = random_weight(t, 512, 6, rng)
    x = (rng.standard_normal((5, 512)) * 2).astype(np.float32)  # (5, 512): the 4-row and the 1-row code
    got = kernels.matmul(x, kernels.pack_weight(w), THREADS, path=path)
    want = ggml_vec_dot_k(w, x)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


# --- packing ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", EXACT + CLOSE, ids=lambda t: T(t).name)
def test_pack_weight_memory_and_read_only(t):
    w = random_weight(t, row_length(t), 19, np.random.default_rng(7))
    pw = kernels.pack_weight(w)
    assert pw.nbytes <= 1.25 * w.data.nbytes or (t == T.Q4_K and pw.nbytes == w.data.nbytes // 19 * 24)
    if t in EXACT:  # rows in groups of four: the stored bytes of 20 rows, the last one zeros
        assert pw.nbytes == w.data.nbytes // 19 * 20
    assert not w.data.flags.writeable
    for slot in ("qs", "qh", "sc", "mn", "d", "m"):
        part = getattr(pw, slot)  # Q4_K: eight rows to a group (kblocks.py), the last five zeros
        assert part.shape[0] == (5 if t in EXACT else 3 if t == T.Q4_K else 19) and not part.flags.writeable
    if t in (T.F32, T.F16):
        assert np.shares_memory(pw.qs, w.data)  # used in place, no copy


def test_pack_weights_stacks_rows_bit_identically():
    rng = np.random.default_rng(11)
    ws = [random_weight(T.Q4_1, 96, rows, rng) for rows in (5, 2, 9)]
    fused = kernels.pack_weights(ws, name="qkv")
    assert fused.n_rows == 16 and fused.name == "qkv"
    x = rng.standard_normal((3, 96)).astype(np.float32)  # (3, 96)
    want = np.concatenate([kernels.matmul(x, kernels.pack_weight(w), THREADS) for w in ws], axis=1)  # (3, 16)
    assert kernels.matmul(x, fused, THREADS).view(np.uint32).tolist() == want.view(np.uint32).tolist()
    with pytest.raises(ValueError, match="Q4_0 with rows of 96, but"):
        kernels.pack_weights([ws[0], random_weight(T.Q4_0, 96, 2, rng)])


def test_pack_weight_rejects_unsupported():
    rng = np.random.default_rng(8)
    data = rng.integers(0, 256, (4, 54), dtype=np.uint8)  # TQ1_0: 54 bytes per 256 (runs unpacked, vecdot_lowbit)
    with pytest.raises(ValueError, match="no matmul kernel for type TQ1_0"):
        kernels.pack_weight(Weight("w", int(T.TQ1_0), (256, 4), data))
    with pytest.raises(ValueError, match="must be 2-D"):
        kernels.pack_weight(Weight("v", int(T.F32), (64,), np.zeros(64, np.float32)))


# --- get_rows --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "t", [T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: T(t).name
)
def test_get_rows_bit_identical_to_dequantize(t):
    rng = np.random.default_rng(9)
    w = random_weight(t, row_length(t), 11, rng)
    ids = np.array([0, 10, 3, 3, 7])
    got = kernels.get_rows(w, ids)  # (5, k)
    raw = w.data.view(np.uint8).reshape(-1)
    want = Q.dequantize(raw, t, w.shape)[ids]
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1], ids=lambda t: T(t).name)
def test_packed_q4_rows_bit_identical_to_dequantize(t):
    """The compiled graph looks a Q4_0 / Q4_1 file's embeddings up in the packed copy (rows in groups of four,
    a last partial group zero-filled): the same bits as dequantizing the stored rows."""
    from llamactx.ggml.kernels.get_rows import rows_q4_x4

    rng = np.random.default_rng(10)
    w = random_weight(t, 64, 11, rng)  # 11 rows: the last group of four partial
    pw = kernels.pack_weight(w)
    ids = np.array([0, 10, 3, 3, 7, 8])
    got = np.empty((len(ids), 64), np.float32)
    rows_q4_x4(pw.qs, pw.sc, t == T.Q4_1, ids, got)
    want = Q.dequantize(w.data.view(np.uint8).reshape(-1), t, w.shape)[ids]
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_get_rows_real_embeddings_and_bad_ids(real_weights):
    for key in ("smollm.token_embd.weight", "gemma.token_embd.weight"):
        w = real_weights[key]
        ids = np.array([0, 1, 299, 42])
        want = OPS.get_rows(w, ids)
        assert kernels.get_rows(w, ids).view(np.uint32).tolist() == want.view(np.uint32).tolist()
    with pytest.raises(IndexError, match="id 300 at position 1"):
        kernels.get_rows(w, np.array([0, 300]))
    with pytest.raises(ValueError, match="1-D integer"):
        kernels.get_rows(w, np.array([0.5]))


# --- CPU features, path, threads ---------------------------------------------------------------------------------


def test_cpu_features_and_path_selection():
    feats = kernels.cpu_features()
    assert isinstance(feats["cpu"], str) and isinstance(feats["vnni"], bool)
    assert kernels.path_for({}) == ("vnni" if feats["vnni"] else "portable")
    assert kernels.path_for({"LLAMACTX_NO_VNNI": "1"}) == "portable"
    assert kernels.path_for({"LLAMACTX_NO_VNNI": "0"}) == kernels.path_for({})
    assert kernels.active_path() == kernels.path_for(os.environ)


def test_no_vnni_env_var_forces_portable_path():
    env = dict(os.environ, LLAMACTX_NO_VNNI="1")
    code = "from llamactx.ggml import kernels; print(kernels.active_path())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "portable"


def test_set_threads():
    before = numba.get_num_threads()
    try:
        kernels.set_threads(1)
        assert numba.get_num_threads() == 1
        kernels.set_threads(1)  # unchanged: a no-op
        with pytest.raises(ValueError, match="n_threads"):
            kernels.set_threads(0)
    finally:
        kernels.set_threads(before)
    assert numba.get_num_threads() == before


def test_fast_ops_decode_equals_reference_ops(smollm):
    """The context's default ops (kernels) give the reference path's logits bit for bit on SmolLM2, whose matmuls
    are all 32-block types."""
    from llamactx import Batch, Context, ContextParams
    from llamactx.backend.fast import FastOps
    from llamactx.backend.reference import ReferenceOps

    tokens = smollm.vocab.tokenize("The quick brown fox jumps over the lazy dog.", add_special=False)
    logits = []
    for ops in (FastOps(smollm), ReferenceOps()):
        ctx = Context(smollm, ContextParams(n_ctx=256), ops=ops)
        assert ctx.decode(Batch.get_one(tokens)) == 0
        ctx.decode(Batch.get_one([42]))
        logits.append(np.array(ctx.get_logits_ith(-1)))
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K], ids=lambda t: T(t).name)
def test_kquants_llama_order_match_vecdot_k_bit_for_bit(t, path):
    """llama_order=True: Q4_K as ggml's repacked gemm/gemv, Q6_K as its tiled kernel from 8 rows (vecdot_k). From
    16 activation rows the kernels run in tiles of 16 weight rows (ktile.py): 40 rows make partial tiles, in one
    thread's share or both."""
    from llamactx.ggml.kernels.ktile import TILE_MIN_ROWS
    from llamactx.ggml.vecdot_k import matmul_k

    check_path(path)
    rng = np.random.default_rng(20 + int(t))
    for n_rows in (16, 40):
        w = random_weight(t, 512, n_rows, rng)
        # gemv only, gemm + gemv tail, Q6_K tiled, tiled + tail; then the tile kernels, with 0-3 gemv rows
        for n in (1, 5, 8, 9, TILE_MIN_ROWS, TILE_MIN_ROWS + 3, 33, 66):
            x = (rng.standard_normal((n, 512)) * 2).astype(np.float32)
            for threads in {1, THREADS}:
                got = kernels.matmul(x, kernels.pack_weight(w), threads, path=path, llama_order=True)
                assert got.view(np.uint32).tolist() == matmul_k(x, w).view(np.uint32).tolist(), (n_rows, n, threads)


@pytest.mark.parametrize("path", PATHS)
def test_q4_0_llama_order_matches_repacked_blocks_bit_for_bit(path):
    """llama_order=True for Q4_0: llama.cpp's repacked gemm/gemv order (one FMA per block of its whole integer dot
    product, no hsum), bit for bit as vecdot.matmul_repacked_blocks whatever the number of activation rows (8, 4
    and single rows, and their mixes), in one thread's share of the row groups or two (an odd number of groups
    too: the single-row path's last group alone). The order differs from ggml_vec_dot's, which llama_order=False
    keeps."""
    check_path(path)
    rng = np.random.default_rng(40)
    differs = 0
    for k, n_rows in ((32, 8), (96, 24), (256, 40), (576, 64)):
        w = random_weight(T.Q4_0, k, n_rows, rng)
        pw = kernels.pack_weight(w)
        for n in (1, 2, 3, 4, 5, 8, 9, 17):
            x = (rng.standard_normal((n, k)) * 2).astype(np.float32)
            ref = matmul_exact(x, w, repacked=True)
            for threads in {1, THREADS}:
                got = kernels.matmul(x, pw, threads, path=path, llama_order=True)
                assert got.view(np.uint32).tolist() == ref.view(np.uint32).tolist(), (k, n_rows, n, threads)
            vec_dot = matmul_exact(x, w, repacked=False)
            got = kernels.matmul(x, pw, THREADS, path=path, llama_order=False)
            assert got.view(np.uint32).tolist() == vec_dot.view(np.uint32).tolist(), (k, n_rows, n)
            differs += int((vec_dot != ref).sum())
    assert differs > 0  # the two orders are told apart


def test_fast_ops_runs_repacked_q4_0_on_the_kernels():
    """FastOps computes the repacked Q4_0 weights of tests/data/tiny's llama-q4_0 on the kernels (llama_order)
    and keeps llama.cpp's prompt logits, op by op and as the compiled graph (the context's default)."""
    from llamactx import Batch, Context, ContextParams
    from llamactx.backend.fast import FastOps
    from llamactx.ggml.vecdot import is_repacked_q4_0
    from tests.models.tiny import load_tiny

    _, model, ref, arrays = load_tiny("llama-q4_0")
    repacked = [w for w in map(model.weight, model.tensor_infos) if is_repacked_q4_0(w)]
    assert repacked and all(FastOps._kernel_order(w) is True for w in repacked)
    for graph in (True, False):
        for i, prompt in enumerate(ref["prompts"]):
            ops = FastOps(model)
            if not graph:  # op by op, as ReferenceOps.compute_graph runs a build
                ops.compute_graph = lambda build, params, ops=ops: build(ops, params)
            ctx = Context(model, ContextParams(n_ctx=512, n_batch=512, n_threads=2, flash_attn="disabled"), ops=ops)
            batch = Batch(len(prompt["tokens"]))
            for pos, tok in enumerate(prompt["tokens"]):
                batch.add(tok, pos, [0], logits=True)
            assert ctx.decode(batch) == 0
            np.testing.assert_array_equal(ctx.get_logits(), arrays[f"prompt_{i}"], err_msg=f"prompt {i} graph {graph}")


def _mapped_file_rss(path) -> int:
    """Resident bytes of this process's mappings of `path` (/proc/self/smaps)."""
    rss, current = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", parts[0]):  # a mapping's header (anonymous ones have no path)
                current = len(parts) >= 6 and parts[-1] == str(path)
            elif current and line.startswith("Rss:"):
                rss += int(parts[1]) * 1024
    return rss


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_packed_weights_replace_their_file_pages(tmp_path):
    """The packed copies stay within 1.2x the GGUF, and the file pages they were made from are released: what stays
    mapped is the metadata, the small unpacked tensors and pages the kernel maps back around them (clean page cache,
    3-19 MB here)."""
    code = (
        "import os, sys\n"
        "from llamactx import Model, Context, ContextParams, Batch\n"
        "from llamactx.embedded import smollm2_path\n"
        "from tests.ggml.test_kernels import _mapped_file_rss\n"
        "m = Model.load(smollm2_path())\n"
        "c = Context(m, ContextParams(n_ctx=256))\n"
        "c.decode(Batch.get_one(list(range(100, 132)))); c.decode(Batch.get_one([5]))\n"
        "from llamactx.ggml.kernels import PackedWeight\n"
        "packed = sum(v.nbytes for v in m._derived.values() if isinstance(v, PackedWeight))\n"
        "size = os.path.getsize(m.path)\n"
        "print(packed / size, _mapped_file_rss(m.path) / size)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    packed, mapped = (float(v) for v in out.stdout.split())
    assert packed <= 1.2
    assert mapped <= 0.25

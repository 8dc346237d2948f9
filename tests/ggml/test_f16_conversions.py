"""Every f16 conversion the kernels compile is correctly rounded on every x86-64 target, and none is a library call
(numba's JIT cannot resolve compiler-rt's `__truncdfhf2` / `__truncsfhf2` / `__extendhfsf2`: the process would
abort). Checked against numpy's conversions (round to nearest, ties to even) over every half, edge cases and
random floats, in a subprocess per target so that an abort fails one test, not the suite: the host (F16C, and
`vcvtsd2sh` only with AVX512-FP16), `haswell` (F16C, no AVX512-FP16) and `x86-64` (no F16C: integer IR)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CHECK = textwrap.dedent("""
    import numba, numpy as np
    from llamactx.ggml.intrinsics import f16_bits, f16_to_f32, round_f16, round_f16_f64
    from llamactx.ggml.cpu import check_target, cpu_features
    from llamactx.ggml.kernels.simd import vload_f16, vstore
    check_target()

    @numba.njit
    def widen(h, out):
        for i in range(h.shape[0]):
            out[i] = f16_to_f32(h[i])

    @numba.njit
    def widen8(b, out):  # the vector path: 8 halves per load, stored as 8 floats
        for i in range(out.shape[1] // 8):
            vstore(out, 0, 8 * i, vload_f16(b, 0, 16 * i))

    @numba.njit
    def narrow(x, bits, rounded):
        for i in range(x.shape[0]):
            bits[i] = f16_bits(x[i])
            rounded[i] = round_f16(x[i])

    @numba.njit
    def narrow64(x, rounded):
        for i in range(x.shape[0]):
            rounded[i] = round_f16_f64(x[i])

    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = halves.view(np.float16).astype(np.float32)
    got = np.empty(65536, np.float32)
    widen(halves, got)
    nan = np.isnan(want)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), "f16 -> f32"
    assert np.isnan(got[nan]).all()
    widen8(halves.view(np.uint8).reshape(1, -1), got.reshape(1, -1))
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), "f16x8 -> f32x8"

    rng = np.random.default_rng(0)
    mids = (want[:-1].astype(np.float64) + want[1:]) / 2  # exact ties between neighbouring halves
    edge = np.concatenate([want, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                           [65504, 65519.99, 65520, 1e6, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 2.0 ** -26,
                            1e-30, 0.0, -0.0, np.inf, -np.inf]])
    x64 = np.concatenate([edge, rng.standard_normal(200000) * 10.0 ** rng.integers(-9, 6, 200000)])
    x64 = np.concatenate([x64, -x64])
    x32 = np.concatenate([x64.astype(np.float32), rng.integers(0, 2 ** 32, 300000, dtype=np.uint64)
                          .astype(np.uint32).view(np.float32)])
    bits = np.empty(x32.shape[0], np.uint16)
    r32 = np.empty(x32.shape[0], np.float32)
    narrow(x32, bits, r32)
    ref = x32.astype(np.float16)
    ok = ~np.isnan(x32)
    assert np.array_equal(bits[ok], ref.view(np.uint16)[ok]), "f32 -> f16 bits"
    assert np.array_equal(r32[ok].view(np.uint32), ref[ok].astype(np.float32).view(np.uint32)), "f32 -> f16 -> f32"
    assert np.isnan(r32[~ok]).all() and ((bits[~ok] & 0x7E00) == 0x7E00).all(), "NaN stays a quiet NaN"
    r64 = np.empty(x64.shape[0], np.float32)
    narrow64(x64, r64)
    assert np.array_equal(r64.view(np.uint32), x64.astype(np.float16).astype(np.float32).view(np.uint32)), "f64"
    print("ok", cpu_features()["cpu"], cpu_features()["f16c"], cpu_features()["avx512fp16"])
""")


@pytest.mark.parametrize("cpu", [None, "haswell", "x86-64"])
def test_f16_conversions_are_exact_and_compile_on_every_target(cpu, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    if cpu:
        env["NUMBA_CPU_NAME"] = cpu
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok " + (cpu or "")), r.stdout

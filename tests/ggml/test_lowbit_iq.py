"""The low-bit formats' tables, bad blocks and routing (issue #46): IQ1-IQ3 and TQ1_0 / TQ2_0.

Their decoders are checked against gguf-py bit for bit in tests/gguf/test_quants.py, their matmuls against libggml's
own mul_mat and a tiny model's logits in tests/models/test_tiny_quant_types.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from llamactx import Model
from llamactx.backend.fast import FastOps
from llamactx.ggml.lowbit_decode import COMPILED_TYPES, unpack_iq
from llamactx.ggml.vecdot_lowbit import matmul_lowbit, uses_tiled
from llamactx.gguf import iq_grids
from llamactx.gguf.quants import block_format
from llamactx.gguf.quants_lowbit import LOWBIT_TYPES, lowbit_parts
from llamactx.model import ModelLoadError, Weight
from tests.gguf.tiny_model import write_tiny_llama

ROOT = Path(__file__).parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_iq_grids", ROOT / "tests" / "data" / "make_iq_grids.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_grids_are_ggml_commons(llamacpp_src):
    """iq_grids.py is what make_iq_grids.py makes from llama.cpp's ggml-common.h, and spot values hold."""
    gen = _load_generator()
    header = llamacpp_src / "ggml" / "src" / "ggml-common.h"
    assert (ROOT / "llamactx" / "gguf" / "iq_grids.py").read_text() == gen.render(header)
    assert iq_grids.IQ2XXS_GRID[1].tolist() == [43, 8, 8, 8, 8, 8, 8, 8]  # 0x080808080808082b
    assert iq_grids.IQ1S_GRID[1].tolist() == [1, -1, -1, -1, -1, -1, -1, -1]  # 0xffffffffffffff01
    assert iq_grids.KSIGNS_IQ2XS[1] == 129  # the eighth sign bit makes the count of minus signs even
    for g, n in ((iq_grids.IQ2XXS_GRID, 256), (iq_grids.IQ2XS_GRID, 512), (iq_grids.IQ2S_GRID, 1024),
                 (iq_grids.IQ3XXS_GRID, 256), (iq_grids.IQ3S_GRID, 512), (iq_grids.IQ1S_GRID, 2048)):
        assert g.shape[0] == n and len({row.tobytes() for row in g}) == n  # distinct entries


def test_every_grid_index_is_in_range():
    """Each format's index bits address exactly its grid: no stored block can point outside the codebook."""
    rng = np.random.default_rng(5)
    for t in LOWBIT_TYPES:
        blocks = np.full((4, block_format(t).type_size), 255, np.uint8)  # every index bit set
        blocks[1:] = rng.integers(0, 256, blocks[1:].shape, dtype=np.uint8)
        parts = lowbit_parts(t, blocks)  # an out-of-range index would raise IndexError here
        assert parts.codes.shape == (4, 256) and parts.scales.shape == (4, 16)


@pytest.mark.parametrize("t", COMPILED_TYPES, ids=lambda t: T(t).name)
def test_compiled_unpack_is_the_numpy_one(t):
    """lowbit_decode.unpack_iq gives quants_lowbit.lowbit_parts' integers byte for byte (random blocks, NaN and inf
    scales among them)."""
    blocks = np.random.default_rng(int(t)).integers(0, 256, (300, block_format(t).type_size), dtype=np.uint8)
    got, want = unpack_iq(t, blocks), lowbit_parts(t, blocks)
    for field, a, b in zip(want._fields, got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, field
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=field)


def _corrupt(path: Path, name: str, block: int, t: T, bits: int) -> None:
    """Set the f16 d of one super-block of tensor `name` to `bits` in the file itself."""
    reader = GGUFReader(path, "r+")
    data = next(x for x in reader.tensors if x.name == name).data
    blocks = np.asarray(data).reshape(-1).view(np.uint8).reshape(-1, block_format(t).type_size)
    if t == T.IQ1_M:  # iq1m_scale_t: nibble k of d in the top bits of scale word k
        words = blocks[block, 48:56].copy().view("<u2")
        for k in range(4):
            words[k] = (words[k] & 0x0FFF) | (((bits >> (4 * k)) & 15) << 12)
        blocks[block, 48:56] = words.view(np.uint8)
    else:
        off = {T.TQ1_0: 52, T.TQ2_0: 64}.get(t, 0)
        blocks[block, off:off + 2] = np.array([bits], "<u2").view(np.uint8)
    reader.data.flush()  # the file's memmap (mode r+)


@pytest.mark.parametrize(("t", "bits", "shown"), [(T.IQ2_XXS, 0x7E00, "nan"), (T.IQ1_M, 0x7C00, "inf"),
                                                  (T.TQ2_0, 0xFC00, "-inf"), (T.IQ3_S, 0x7C01, "nan")])
def test_non_finite_scale_refused_at_load_naming_the_tensor(tmp_path, t, bits, shown):
    name = "blk.0.ffn_down.weight"
    path = write_tiny_llama(tmp_path / "bad.gguf", types={name: t, "blk.0.attn_q.weight": t}, n_embd=256, n_ff=256,
                            n_layer=1, n_head=2, n_head_kv=1)
    Model.load(path).close()  # the sane file loads
    _corrupt(path, name, 1, t, bits)
    shown = rf"tensor '{name}' has invalid data: {t.name} block scale d of block 1 is {shown} "
    with pytest.raises(ModelLoadError, match=shown):
        Model.load(path)


@pytest.mark.parametrize("t", LOWBIT_TYPES, ids=lambda t: T(t).name)
def test_fast_ops_run_the_iq_types_on_the_kernels_and_leave_tq_to_the_reference(t):
    """FastOps runs the IQ types' matmuls on kernels.klowbit (its graphs too); TQ1_0 / TQ2_0 take the reference."""
    w = Weight("w", int(t), (256, 8), np.zeros((8, block_format(t).type_size), np.uint8))
    assert FastOps._kernel_order(w) is (None if t in (T.TQ1_0, T.TQ2_0) else True)
    assert uses_tiled(w, 8) == (t not in (T.TQ1_0, T.TQ2_0)) and not uses_tiled(w, 7)


def test_matmul_lowbit_refuses_other_types():
    w = Weight("w", int(T.Q4_K), (256, 8), np.zeros((8, 144), np.uint8))
    with pytest.raises(ValueError, match="Q4_K is not one of IQ2_XXS"):
        matmul_lowbit(np.zeros((1, 256), np.float32), w)

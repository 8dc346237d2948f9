"""llamactx.gguf.row_data (ggml_validate_row_data): NaN / infinite values and block scales refused naming the tensor,
the element or block and the field; and `llamactx quantize` refusing such an input, as llama-quantize's loader
does, without leaving an output file."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf import quants as gguf_quants

from llamactx.cli import main
from llamactx.gguf.row_data import check_row_data
from llamactx.gguf.values import GGUFError

T = GGMLQuantizationType
F16_NAN = (0x00, 0x7E)
F16_INF = (0x00, 0x7C)


def _blocks(t: T, n: int = 4) -> np.ndarray:
    """n blocks of type t with finite scales: gguf-py's quantizer where it has one, else zeros (d = 0)."""
    rng = np.random.default_rng(3)
    block = GGML_QUANT_SIZES[t][0]
    try:
        q = gguf_quants.quantize((0.1 * rng.standard_normal((n, block))).astype(np.float32), t)
        return np.ascontiguousarray(q).view(np.uint8).reshape(n, -1).copy()
    except NotImplementedError:
        return np.zeros((n, GGML_QUANT_SIZES[t][1]), np.uint8)


@pytest.mark.parametrize(("t", "offset", "field"), [
    (T.Q4_0, 0, "d"), (T.Q4_1, 2, "m"), (T.Q5_1, 0, "d"), (T.Q8_0, 0, "d"), (T.Q2_K, 82, "dmin"), (T.Q3_K, 108, "d"),
    (T.Q4_K, 2, "dmin"), (T.Q5_K, 0, "d"), (T.Q6_K, 208, "d"), (T.IQ4_NL, 0, "d"), (T.IQ4_XS, 0, "d"),
    (T.TQ1_0, 52, "d"), (T.IQ2_XXS, 0, "d"), (T.IQ1_S, 0, "d")])
def test_a_nan_or_infinite_block_scale_is_refused(t, offset, field):
    blocks = _blocks(t)
    check_row_data(t, blocks, "w")
    blocks[2, offset:offset + 2] = F16_NAN
    blocks[3, offset:offset + 2] = F16_INF
    with pytest.raises(GGUFError, match=rf"tensor 'w' has invalid data: {t.name} block scale {field} of block 2 is "
                                        r"nan \(must be finite; 2 such\)"):
        check_row_data(t, blocks, "w")


def test_iq1_m_scale_and_mxfp4_exponent():
    """IQ1_M's d is spread over the top nibbles of its four scale words; MXFP4's E8M0 exponent 0xff is NaN."""
    blocks = _blocks(T.IQ1_M)
    blocks[1, 49] |= 0xF0  # f16 bits 0x7c00 + mantissa: nibble 3 (bits 12-15) ...
    blocks[1, 51] |= 0xF0
    blocks[1, 53] |= 0xF0
    blocks[1, 55] |= 0x70  # ... = 0x7fff: NaN
    with pytest.raises(GGUFError, match="IQ1_M block scale d of block 1 is nan"):
        check_row_data(T.IQ1_M, blocks, "w")
    e = _blocks(T.MXFP4)
    check_row_data(T.MXFP4, e, "w")
    e[0, 0] = 0xFF
    with pytest.raises(GGUFError, match="MXFP4 block exponent e .0xff is NaN. of block 0 is 255"):
        check_row_data(T.MXFP4, e, "w")


@pytest.mark.parametrize(("t", "dtype"), [(T.F32, np.float32), (T.F16, np.float16), (T.BF16, None)])
def test_a_nan_or_infinite_value_is_refused(t, dtype):
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    x[7], x[9] = np.inf, np.nan
    raw = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8) if dtype is None else x.astype(dtype).view(
        np.uint8)
    with pytest.raises(GGUFError, match=rf"{t.name} value 7 is inf \(must be finite; 2 such\)"):
        check_row_data(t, raw, "blk.0.attn_q.weight")
    check_row_data(t, raw[:7 * (4 if t == T.F32 else 2)], "w")  # the first 7 values, finite


def test_a_partial_block_is_refused():
    with pytest.raises(GGUFError, match=r"tensor 'w': 35 bytes is not a whole number of Q8_0 blocks \(34 bytes\)"):
        check_row_data(T.Q8_0, np.zeros(35, np.uint8), "w")


def _write(path, tensors: dict[str, tuple[np.ndarray, T]]):
    w = GGUFWriter(path, "llama")
    for name, (data, t) in tensors.items():
        w.add_tensor(name, data, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_quantize_refuses_invalid_data_naming_the_tensor(tmp_path, capsys):
    """A NaN in an F16 tensor being converted, or a NaN scale in a Q8_0 tensor only copied: llama-quantize's loader
    refuses both ("tensor '...' has invalid data"), and so does llamactx quantize, leaving no output."""
    rng = np.random.default_rng(5)
    x = (0.1 * rng.standard_normal((4, 64))).astype(np.float32)
    bad = x.astype(np.float16)
    bad[2, 3] = np.nan
    q8 = np.ascontiguousarray(gguf_quants.quantize(x, T.Q8_0)).view(np.uint8).copy()
    q8[1, 34:36] = F16_NAN  # row 1's second block: block 3
    norm = np.ones(64, np.float32)
    for name, src, file_type, message in (
            ("f16", {"blk.0.attn_q.weight": (bad, T.F16), "blk.0.attn_norm.weight": (norm, T.F32)}, "Q4_0",
             "tensor 'blk.0.attn_q.weight' has invalid data: F16 value 131 is nan (must be finite; 1 such)"),
            ("q8", {"blk.0.attn_norm.weight": (norm, T.F32), "blk.0.attn_q.weight": (q8, T.Q8_0)}, "Q8_0",
             "tensor 'blk.0.attn_q.weight' has invalid data: Q8_0 block scale d of block 3 is nan")):
        path = _write(tmp_path / f"{name}.gguf", src)
        out = tmp_path / f"{name}.out.gguf"
        assert main(["quantize", str(path), str(out), file_type]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("error") == 1, err
        assert not out.exists() and not list(tmp_path.glob("*.tmp"))

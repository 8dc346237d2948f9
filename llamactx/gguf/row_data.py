"""ggml-quants.c `ggml_validate_row_data`: a stored tensor's bytes hold no NaN or infinite value (F32, F16, BF16),
no NaN or infinite f16 block scale (d, and m / dmin where the block has one: every weight of such a block would be
NaN or infinite), no NaN E8M0 exponent (MXFP4). llama-quantize's loader checks every tensor it reads this way
(llama_model_loader::load_data_range with check_tensors) and refuses the file naming the tensor.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llamactx.gguf.quants_lowbit import LOWBIT_TYPES, scale_of
from llamactx.gguf.values import GGUFError

T = GGMLQuantizationType

# the f16 scale fields of each block: (byte offset, ggml-common.h field name)
F16_FIELDS = {
    T.Q4_0: ((0, "d"),), T.Q4_1: ((0, "d"), (2, "m")), T.Q5_0: ((0, "d"),), T.Q5_1: ((0, "d"), (2, "m")),
    T.Q8_0: ((0, "d"),), T.Q2_K: ((80, "d"), (82, "dmin")), T.Q3_K: ((108, "d"),), T.Q4_K: ((0, "d"), (2, "dmin")),
    T.Q5_K: ((0, "d"), (2, "dmin")), T.Q6_K: ((208, "d"),), T.IQ4_NL: ((0, "d"),), T.IQ4_XS: ((0, "d"),),
}
FLOAT_DTYPES = {T.F32: np.float32, T.F16: np.float16, T.F64: np.float64}


def check_row_data(ggml_type: int, raw: np.ndarray, name: str) -> None:
    """Raise GGUFError naming the tensor, the first bad element or block, its value and how many there are, when
    `raw` (the tensor's bytes, uint8) fails ggml_validate_row_data. Types it does not check (I8 .. I64, and any
    this table lacks) pass."""
    t = T(ggml_type)
    raw = np.asarray(raw, np.uint8).reshape(-1)
    type_size = GGML_QUANT_SIZES[t][1]
    if raw.size % type_size:
        raise GGUFError(f"tensor {name!r}: {raw.size} bytes is not a whole number of {t.name} blocks "
                        f"({type_size} bytes)")
    if t in FLOAT_DTYPES or t == T.BF16:
        values = _float_values(t, raw)
        _refuse(name, ~np.isfinite(values), values, f"{t.name} value")
        return
    blocks = raw.reshape(-1, type_size)
    if t in LOWBIT_TYPES:
        d = scale_of(t, blocks)
        _refuse(name, ~np.isfinite(d), d, f"{t.name} block scale d of block")
    elif t == T.MXFP4:
        e = blocks[:, 0]
        _refuse(name, e == 0xFF, e, "MXFP4 block exponent e (0xff is NaN) of block")
    for offset, field in F16_FIELDS.get(t, ()):
        v = blocks[:, offset:offset + 2].copy().view(np.float16).reshape(-1).astype(np.float32)
        _refuse(name, ~np.isfinite(v), v, f"{t.name} block scale {field} of block")


def _float_values(t: T, raw: np.ndarray) -> np.ndarray:
    if t == T.BF16:  # the top half of a float32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return raw.view(FLOAT_DTYPES[t])


def _refuse(name: str, bad: np.ndarray, values: np.ndarray, what: str) -> None:
    hits = np.flatnonzero(bad)
    if hits.size:
        i = int(hits[0])
        raise GGUFError(f"tensor {name!r} has invalid data: {what} {i} is {values[i]} (must be finite; {hits.size} "
                        "such)")

"""Write the tiny GGUF models of tests/data/quants/ with gguf-py's GGUFWriter: one-layer llama models whose weight
matrices are stored in the quant types llamactx multiplies as llama.cpp does (docs/numerics.md), from random but
valid raw blocks (random quant bytes, small random scales; fixed seeds).

- tiny-quants-k.gguf: the Q8_K-activation types, n_embd 256 (K-quant and IQ4_XS rows need ne0 % 256 == 0):
  Q2_K, Q3_K, Q5_K, IQ4_XS. Q2_K's output matrix has 261 rows (ne1 % 8 != 0: not repacked, tiled / vec_dot) and
  its attn_v / ffn_gate are repacked in an AVX-512 build.
- tiny-quants-nl.gguf: the Q8_0 / BF16 ones, n_embd 128, n_ff 100: IQ4_NL, MXFP4 (repacked where ne1 % 8 == 0,
  else tinyBLAS / vec_dot) and BF16 (tinyBLAS for attn_v, vec_dot with a tail for ffn_down, k = 100).

The vocabulary is the tests' byte-level BPE one (tests/gguf/tiny_model.py, 261 tokens).
Usage (from the repository root, in the project's venv): python tests/data/quants/make_quant_models.py
Then make llama.cpp's outputs with make_quant_reference.py (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.quants.quant_matmul_cases import tensor_data  # noqa: E402
from tests.gguf.tiny_model import _add, finish, tensor_table, tiny_hparams, vocab_meta  # noqa: E402

T = GGMLQuantizationType
OUT = Path(__file__).parent

MODELS = {
    "k": {"n_embd": 256, "n_ff": 256, "types": {
        "token_embd.weight": T.IQ4_XS, "attn_q.weight": T.Q5_K, "attn_k.weight": T.Q3_K, "attn_v.weight": T.Q2_K,
        "attn_output.weight": T.IQ4_XS, "ffn_gate.weight": T.Q2_K, "ffn_up.weight": T.Q3_K,
        "ffn_down.weight": T.Q5_K, "output.weight": T.Q2_K}},
    "nl": {"n_embd": 128, "n_ff": 100, "types": {
        "token_embd.weight": T.MXFP4, "attn_q.weight": T.IQ4_NL, "attn_k.weight": T.MXFP4, "attn_v.weight": T.BF16,
        "attn_output.weight": T.MXFP4, "ffn_gate.weight": T.MXFP4, "ffn_up.weight": T.IQ4_NL,
        "ffn_down.weight": T.BF16, "output.weight": T.IQ4_NL}},
}


def write_model(name: str, spec: dict, seed: int) -> Path:
    meta = {**tiny_hparams(n_embd=spec["n_embd"], n_ff=spec["n_ff"], n_layer=1, n_head=2, n_head_kv=1),
            **vocab_meta("bpe")}
    table = tensor_table(meta, len(meta["tokenizer.ggml.tokens"]))
    table["output.weight"] = table["token_embd.weight"]
    writer = GGUFWriter(str(OUT / f"tiny-quants-{name}.gguf"), "llama")
    writer.add_name(f"tiny quants {name}")
    for key, value in meta.items():
        _add(writer, key, value)
    rng = np.random.default_rng(seed)
    for tname, shape in table.items():
        t = spec["types"].get(tname.removeprefix("blk.0."), T.F32)
        data = tensor_data(shape, t, rng)
        writer.add_tensor(tname, data, raw_dtype=None if t == T.F32 else t)
    return finish(writer)


if __name__ == "__main__":
    for i, (name, spec) in enumerate(MODELS.items()):
        print(write_model(name, spec, seed=100 + i))

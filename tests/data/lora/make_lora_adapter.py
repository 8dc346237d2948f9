"""Write the small LoRA adapters of tests/data/lora/ for SmolLM2-135M (the embedded default model) with gguf-py's
GGUFWriter, in llama.cpp's GGUF LoRA format (what convert_lora_to_gguf.py writes; read by src/llama-adapter.cpp):
general.type = "adapter", general.architecture = "llama", adapter.type = "lora", adapter.lora.alpha, and for each
adapted weight `<name>.lora_a` with ggml shape (n_in, rank) and `<name>.lora_b` with (rank, n_out).

- smollm2-lora.gguf: alpha 16; attn_q / attn_v / ffn_up / ffn_down / attn_output of a few layers, ranks 4, 8 and 16
  (16 = a tinyBLAS-sized k for B), F32 and F16 tensors, and one `_norm.weight` tensor that llama.cpp skips.
- smollm2-lora-b.gguf: no alpha (scale = the user's scale), rank 4, F16, on weights the first one leaves alone
  (attn_k, ffn_gate), for two adapters on one context.
- gemma3-lora.gguf: for Gemma-3-270M (architecture "gemma3"), alpha 8, on Q5_0 / Q8_0 / Q6_K / Q4_K base weights
  of a sliding-window and a global layer.

Random values from fixed seeds; each file is well under 1 MB. Usage (repository root, the project's venv):
    .venv/bin/python tests/data/lora/make_lora_adapter.py
then the reference logits: make_lora_reference.py (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.gguf.tiny_model import finish  # noqa: E402  (the repository root is on the path now)

OUT = Path(__file__).parent
N_EMBD, N_FF, N_EMBD_KV = 576, 1536, 192  # SmolLM2-135M: n_embd, n_ff, n_embd_k_gqa
G_EMBD, G_FF, G_KV, G_Q = 640, 2048, 256, 1024  # Gemma-3-270M: n_embd, n_ff, n_embd_k_gqa, n_head * head_dim

# (weight, n_in, n_out, rank, type)
ADAPTER_A = [
    ("blk.0.attn_q.weight", N_EMBD, N_EMBD, 8, np.float32),
    ("blk.0.attn_v.weight", N_EMBD, N_EMBD_KV, 8, np.float16),
    ("blk.0.ffn_up.weight", N_EMBD, N_FF, 8, np.float32),
    ("blk.1.attn_q.weight", N_EMBD, N_EMBD, 4, np.float16),
    ("blk.1.ffn_up.weight", N_EMBD, N_FF, 16, np.float16),
    ("blk.2.attn_v.weight", N_EMBD, N_EMBD_KV, 4, np.float32),
    ("blk.2.ffn_down.weight", N_FF, N_EMBD, 8, np.float32),
    ("blk.29.attn_output.weight", N_EMBD, N_EMBD, 8, np.float16),
]
ADAPTER_B = [
    ("blk.3.attn_k.weight", N_EMBD, N_EMBD_KV, 4, np.float16),
    ("blk.3.ffn_gate.weight", N_EMBD, N_FF, 4, np.float16),
]
ADAPTER_GEMMA = [
    ("blk.0.attn_q.weight", G_EMBD, G_Q, 8, np.float32),
    ("blk.0.attn_v.weight", G_EMBD, G_KV, 4, np.float16),
    ("blk.0.ffn_down.weight", G_FF, G_EMBD, 8, np.float16),
    ("blk.1.ffn_up.weight", G_EMBD, G_FF, 16, np.float32),
    ("blk.5.attn_output.weight", G_Q, G_EMBD, 8, np.float32),
]


def write(path: Path, pairs, alpha: float | None, seed: int, norm: bool, arch: str = "llama") -> None:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    if alpha is not None:
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for name, n_in, n_out, rank, dtype in pairs:
        a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)  # numpy (rank, n_in) = ggml (n_in, rank)
        b = rng.standard_normal((n_out, rank)) * 0.25  # numpy (n_out, rank) = ggml (rank, n_out)
        w.add_tensor(f"{name}.lora_a", a.astype(dtype))
        w.add_tensor(f"{name}.lora_b", b.astype(dtype))
    if norm:  # llama.cpp skips `_norm.weight` tensors of an adapter (llama_adapter_lora_init_impl)
        w.add_tensor("blk.0.attn_norm.weight", np.ones(N_EMBD, np.float32))
    finish(w)
    print(path.name, path.stat().st_size, "bytes")


if __name__ == "__main__":
    write(OUT / "smollm2-lora.gguf", ADAPTER_A, alpha=16.0, seed=13, norm=True)
    write(OUT / "smollm2-lora-b.gguf", ADAPTER_B, alpha=None, seed=14, norm=False)
    write(OUT / "gemma3-lora.gguf", ADAPTER_GEMMA, alpha=8.0, seed=15, norm=False, arch="gemma3")

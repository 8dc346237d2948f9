"""Write tests/data/tiny/tiny-nomic-bert.gguf: a tiny synthetic nomic-bert encoder (llama.cpp's LLM_ARCH_NOMIC_BERT,
nomic-embed-text's architecture) with tiny-bert.gguf's WordPiece vocabulary (make_tiny_bert.py).

The model: 2 layers, n_embd 64, 4 heads, n_ff 128, 128 positions, no position embeddings (NEOX RoPE over the
whole 16-wide head, `nomic-bert.rope.freq_base` 1000 as nomic-embed-text-v1.5), token-type embeddings, LayerNorm
eps 1e-12, `nomic-bert.pooling_type` mean, not causal. Layer 0 as convert_hf_to_gguf.py writes nomic-embed-text:
one fused `attn_qkv` (F32) without biases and a SwiGLU FFN (ffn_gate, ffn_up, ffn_down) without biases. Layer 1
(F16) has separate q / k / v with biases, an attn_output bias, and ffn_up / ffn_down biases, which llama.cpp loads
but its graph does not add (build_ffn gets none for nomic-bert).

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_nomic_bert.py
Then make llama.cpp's outputs for it with make_tiny_nomic_bert_reference.py (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.tiny.make_tiny_bert import N_CTX, N_FF, N_HEAD, N_LAYER, add_wordpiece_vocab  # noqa: E402
from tests.data.tiny.make_tiny_models import N_EMBD, OUT, Weights  # noqa: E402
from tests.gguf.tiny_model import finish  # noqa: E402

ROPE_FREQ_BASE = 1000.0


def main() -> Path:
    w = gguf.GGUFWriter(str(OUT / "tiny-nomic-bert.gguf"), "nomic-bert")
    w.add_name("tiny nomic bert")
    n_vocab = add_wordpiece_vocab(w)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_rope_freq_base(ROPE_FREQ_BASE)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    wt = Weights(w, 23, T.F32)
    wt.mat("token_embd.weight", N_EMBD, n_vocab, scale=1.0)
    wt.mat("token_types.weight", N_EMBD, 2, scale=0.5)
    wt.vec("token_embd_norm.weight", (N_EMBD,), 1.0)
    wt.vec("token_embd_norm.bias", (N_EMBD,))
    for il in range(N_LAYER):
        b = f"blk.{il}."
        kind = T.F32 if il == 0 else T.F16
        if il == 0:
            wt.mat(b + "attn_qkv.weight", N_EMBD, 3 * N_EMBD, kind=kind)
        else:
            for name in ("attn_q", "attn_k", "attn_v"):
                wt.mat(b + name + ".weight", N_EMBD, N_EMBD, kind=kind)
                wt.vec(b + name + ".bias", (N_EMBD,))
        wt.mat(b + "attn_output.weight", N_EMBD, N_EMBD, kind=kind)
        if il == 1:
            wt.vec(b + "attn_output.bias", (N_EMBD,))
        wt.vec(b + "attn_output_norm.weight", (N_EMBD,), 1.0)
        wt.vec(b + "attn_output_norm.bias", (N_EMBD,))
        wt.mat(b + "ffn_gate.weight", N_EMBD, N_FF, kind=kind)
        wt.mat(b + "ffn_up.weight", N_EMBD, N_FF, kind=kind)
        wt.mat(b + "ffn_down.weight", N_FF, N_EMBD, kind=kind)
        if il == 1:  # loaded, never added
            wt.vec(b + "ffn_up.bias", (N_FF,), scale=1.0)
            wt.vec(b + "ffn_down.bias", (N_EMBD,), scale=1.0)
        wt.vec(b + "layer_output_norm.weight", (N_EMBD,), 1.0)
        wt.vec(b + "layer_output_norm.bias", (N_EMBD,))
    return finish(w)


if __name__ == "__main__":
    print(main())

"""Write tests/data/tiny/tiny-glm4moe.gguf: a tiny synthetic GLM-4.5-style model (llama.cpp's LLM_ARCH_GLM4_MOE,
src/models/glm4-moe.cpp), laid out as convert_hf_to_gguf.py writes one, with random weights from a fixed seed.

`block_count` 4: 3 trunk layers (layer 0 a dense SwiGLU of 128, `leading_dense_block_count` 1; layers 1-2 MoE)
and one NextN (MTP) layer, `nextn_predict_layers` 1, with its eh_proj / enorm / hnorm / shared_head_norm, which a
context without drafting never runs. n_embd 64, 4 heads of 32 (2 KV heads) with q/k/v biases, RoPE over the first
16 of each head's 32 (NEOX); `post_attention_norm` before each FFN. 8 experts of 32 (2 routed per token), the
selection bias exp_probs_b, no `expert_gating_func` key (sigmoid, GLM's default), weights normalized and scaled by
2.5, one shared expert of 32. Matrices Q8_0, routers and norms F32; make_tiny_models.py's vocabulary.

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_glm4moe.py
Then llama.cpp's outputs: make_tiny_reference.py glm4moe (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.tiny.make_tiny_deepseek2 import experts  # noqa: E402
from tests.data.tiny.make_tiny_models import N_EMBD, N_VOCAB, OUT, Weights, common, smollm2_vocab  # noqa: E402
from tests.gguf.tiny_model import finish  # noqa: E402

N_TRUNK, N_NEXTN, N_DENSE, N_FF = 3, 1, 1, 128
N_HEAD, N_HEAD_KV, HEAD_DIM, N_ROT = 4, 2, 32, 16
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 8, 2, 32


def glm4moe(name: str = "glm4moe", seed: int = 41, path: Path | None = None, drop: tuple[str, ...] = ()) -> Path:
    """The tiny model; `drop`: tensors left out (the malformed files a load refuses)."""
    v = smollm2_vocab()
    path = path or OUT / f"tiny-{name}.gguf"
    arch = "glm4moe"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, T.Q8_0)
    common(w, wt, v, N_TRUNK + N_NEXTN, N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(N_ROT)
    w.add_uint32(f"{arch}.leading_dense_block_count", N_DENSE)
    w.add_uint32(f"{arch}.nextn_predict_layers", N_NEXTN)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_uint32(f"{arch}.expert_shared_count", 1)
    w.add_float32(f"{arch}.expert_weights_scale", 2.5)
    w.add_bool(f"{arch}.expert_weights_norm", True)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il in range(N_TRUNK + N_NEXTN):
        b = f"blk.{il}."
        wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
        wt.mat(b + "attn_q.weight", N_EMBD, N_HEAD * HEAD_DIM)
        wt.mat(b + "attn_k.weight", N_EMBD, N_HEAD_KV * HEAD_DIM)
        wt.mat(b + "attn_v.weight", N_EMBD, N_HEAD_KV * HEAD_DIM)
        wt.vec(b + "attn_q.bias", (N_HEAD * HEAD_DIM,))
        wt.vec(b + "attn_k.bias", (N_HEAD_KV * HEAD_DIM,))
        wt.vec(b + "attn_v.bias", (N_HEAD_KV * HEAD_DIM,))
        wt.mat(b + "attn_output.weight", N_HEAD * HEAD_DIM, N_EMBD)
        wt.vec(b + "post_attention_norm.weight", (N_EMBD,), 1.0)
        if il < N_DENSE:
            wt.mat(b + "ffn_gate.weight", N_EMBD, N_FF)
            wt.mat(b + "ffn_up.weight", N_EMBD, N_FF)
            wt.mat(b + "ffn_down.weight", N_FF, N_EMBD)
        else:
            experts(wt, b, probs_b=True)
        if il >= N_TRUNK:  # the NextN block's own tensors
            wt.mat(b + "nextn.eh_proj.weight", 2 * N_EMBD, N_EMBD)
            wt.vec(b + "nextn.enorm.weight", (N_EMBD,), 1.0)
            wt.vec(b + "nextn.hnorm.weight", (N_EMBD,), 1.0)
            wt.vec(b + "nextn.shared_head_norm.weight", (N_EMBD,), 1.0)
    if drop:
        w.tensors[-1] = {k: t for k, t in w.tensors[-1].items() if k not in drop}
    return finish(w)


if __name__ == "__main__":
    print(glm4moe())

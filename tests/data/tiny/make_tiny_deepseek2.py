"""Write tiny synthetic DeepSeek-V2/V3-style models (random weights from fixed seeds), laid out as
convert_hf_to_gguf.py writes them, for llama.cpp's LLM_ARCH_DEEPSEEK2 (src/models/deepseek2.cpp).

deepseek2 (MLA in the split attn_k_b / attn_v_b layout): 3 layers (1 dense SwiGLU of 128, then 2 MoE layers), n_embd
64, 4 heads; each head's query 48 wide (32 "nope" + 16 RoPE, key_length_mla), its value 32 (value_length_mla); the
KV latent 64 wide (kv_lora_rank), so the cache row is 80 (key_length) and V 64 (value_length), one KV head.
8 experts of 32 (2 routed per token) and one shared expert of 32.
- `tiny-deepseek2.gguf`: low-rank Q (q_lora_rank 32), DeepSeek-V3's router: sigmoid gating with the selection bias
  exp_probs_b, 4 expert groups of which 2 are used, weights normalized and scaled by 2.5.
- `tiny-deepseek2-lite.gguf`: a plain attn_q (q_lora_rank 0), softmax gating without bias or groups, weights
  neither normalized nor scaled (V2-Lite's router), and YaRN (factor 4 over 128 positions, no log multiplier): the
  KQ scale carries YaRN's mscale.
- `tiny-deepseek2-yarn.gguf`: low-rank Q, V2-Lite's router, YaRN with DeepSeek-V2-Lite's log multiplier (0.0707,
  mscale_all_dim 0.707 times the converter's 0.1): llama_context's deepseek2 case of yarn_attn_factor.
Matrices are Q8_0 (the per-head attn_k_b / attn_v_b too), routers and norms F32. The vocabulary is
make_tiny_models.py's.

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_deepseek2.py
Then llama.cpp's outputs: make_tiny_reference.py deepseek2 deepseek2-lite (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.tiny.make_tiny_models import N_EMBD, N_VOCAB, OUT, Weights, common, smollm2_vocab  # noqa: E402
from tests.gguf.tiny_model import finish  # noqa: E402

N_LAYER, N_DENSE, N_FF = 3, 1, 128
N_HEAD, Q_LORA, KV_LORA, N_NOPE, N_ROT, V_MLA = 4, 32, 64, 32, 16, 32
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_SHARED = 8, 2, 32, 1


def deepseek2(name: str = "deepseek2", seed: int = 31, q_lora: int = Q_LORA, v3_router: bool = True,
              yarn: bool = False, path: Path | None = None, kv_lora_meta: int | None = None,
              yarn_log_mul: float = 0.0) -> Path:
    """One tiny deepseek2. `kv_lora_meta`: the kv_lora_rank the metadata states, if not the tensors' (a
    malformed file the load refuses)."""
    v = smollm2_vocab()
    path = path or OUT / f"tiny-{name}.gguf"
    arch = "deepseek2"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, T.Q8_0)
    common(w, wt, v, N_LAYER, N_FF)
    kv_lora = KV_LORA if kv_lora_meta is None else kv_lora_meta
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(1)
    w.add_key_length(kv_lora + N_ROT)
    w.add_value_length(kv_lora)
    w.add_uint32(f"{arch}.attention.key_length_mla", N_NOPE + N_ROT)
    w.add_uint32(f"{arch}.attention.value_length_mla", V_MLA)
    w.add_uint32(f"{arch}.attention.q_lora_rank", q_lora)
    w.add_uint32(f"{arch}.attention.kv_lora_rank", kv_lora)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(N_ROT)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(128)
        if yarn_log_mul:  # as the converter writes it: 0.1 * mscale_all_dim
            w.add_float32(f"{arch}.rope.scaling.yarn_log_multiplier", yarn_log_mul)
    w.add_uint32(f"{arch}.leading_dense_block_count", N_DENSE)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_uint32(f"{arch}.expert_shared_count", N_SHARED)
    if v3_router:
        w.add_float32(f"{arch}.expert_weights_scale", 2.5)
        w.add_bool(f"{arch}.expert_weights_norm", True)
        w.add_uint32(f"{arch}.expert_gating_func", 2)  # sigmoid
        w.add_uint32(f"{arch}.expert_group_count", 4)
        w.add_uint32(f"{arch}.expert_group_used_count", 2)
    else:
        w.add_float32(f"{arch}.expert_weights_scale", 1.0)
        w.add_uint32(f"{arch}.expert_gating_func", 1)  # softmax
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il in range(N_LAYER):
        b = f"blk.{il}."
        wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
        if q_lora:
            wt.mat(b + "attn_q_a.weight", N_EMBD, q_lora)
            wt.vec(b + "attn_q_a_norm.weight", (q_lora,), 1.0)
            wt.mat(b + "attn_q_b.weight", q_lora, N_HEAD * (N_NOPE + N_ROT))
        else:
            wt.mat(b + "attn_q.weight", N_EMBD, N_HEAD * (N_NOPE + N_ROT))
        wt.mat(b + "attn_kv_a_mqa.weight", N_EMBD, KV_LORA + N_ROT)
        wt.vec(b + "attn_kv_a_norm.weight", (KV_LORA,), 1.0)
        heads(wt, b + "attn_k_b.weight", N_NOPE, KV_LORA)
        heads(wt, b + "attn_v_b.weight", KV_LORA, V_MLA)
        wt.mat(b + "attn_output.weight", N_HEAD * V_MLA, N_EMBD)
        wt.vec(b + "ffn_norm.weight", (N_EMBD,), 1.0)
        if il < N_DENSE:
            wt.mat(b + "ffn_gate.weight", N_EMBD, N_FF)
            wt.mat(b + "ffn_up.weight", N_EMBD, N_FF)
            wt.mat(b + "ffn_down.weight", N_FF, N_EMBD)
        else:
            experts(wt, b, probs_b=v3_router)
    return finish(w)


def heads(wt: Weights, name: str, ne0: int, ne1: int) -> None:
    """A per-head 3-D matrix, ggml shape (ne0, ne1, n_head)."""
    data = wt.rng.standard_normal((N_HEAD, ne1, ne0)) / np.sqrt(ne0)
    wt.put(name, data.astype(np.float32), T.Q8_0)


def experts(wt: Weights, b: str, probs_b: bool) -> None:
    """A layer's router (F32, scaled so that tokens prefer some experts), its experts, the selection bias and the
    shared expert."""
    wt.mat(b + "ffn_gate_inp.weight", N_EMBD, N_EXPERT, scale=4.0 / np.sqrt(N_EMBD), kind=T.F32)
    for part, ne0, ne1 in (("gate", N_EMBD, N_FF_EXP), ("up", N_EMBD, N_FF_EXP), ("down", N_FF_EXP, N_EMBD)):
        data = wt.rng.standard_normal((N_EXPERT, ne1, ne0)) / np.sqrt(ne0)  # ggml (ne0, ne1, n_expert)
        wt.put(f"{b}ffn_{part}_exps.weight", data.astype(np.float32), T.Q8_0)
    if probs_b:
        wt.vec(b + "exp_probs_b.bias", (N_EXPERT,), 0.0, 0.3)
    n_shexp = N_FF_EXP * N_SHARED
    wt.mat(b + "ffn_gate_shexp.weight", N_EMBD, n_shexp)
    wt.mat(b + "ffn_up_shexp.weight", N_EMBD, n_shexp)
    wt.mat(b + "ffn_down_shexp.weight", n_shexp, N_EMBD)


if __name__ == "__main__":
    print(deepseek2())
    print(deepseek2("deepseek2-lite", seed=32, q_lora=0, v3_router=False, yarn=True))
    print(deepseek2("deepseek2-yarn", seed=33, v3_router=False, yarn=True, yarn_log_mul=0.0707))

"""Write the tiny synthetic hybrids of issue 41 with gguf-py's GGUFWriter (random weights, fixed seeds), laid out
as convert_hf_to_gguf.py writes them; the vocabulary and the helpers are make_tiny_models.py's.

- `tiny-lfm2moe.gguf` (lfm2moe, src/models/lfm2moe.cpp): lfm2's layers (short convolution, attention, short
  convolution, attention; 4 heads of 16, 2 KV heads, a kernel of 3), layer 0's FFN dense (`leading_dense_block_count`
  1) and the others' 8 experts of 32, 2 routed per token by sigmoid gating (`expert_gating_func` 2) with a
  selection bias `exp_probs_b` as large as the router's probabilities, so that it changes some choices. F16
  matrices, the router F32.
- `tiny-granitehybrid.gguf` (granitehybrid, src/models/granite-hybrid.cpp; Granite 4.0 H Micro's layout): Mamba-2,
  attention, Mamba-2, Mamba-2 (d_inner 128 = 2 n_embd, 4 SSM heads of 32, 2 groups, d_state 16, a conv kernel of
  4), attention with 4 heads of 16 (2 KV heads) and RoPE, SwiGLU FFNs of 128, and granite's scales (embedding 12,
  residual 0.22, attention 0.3, logit 8). Q8_0 matrices, the SSM's vectors and conv kernel F32.
- `tiny-granitehybrid-moe.gguf` (Granite 4.0 H Tiny's layout): the same layers with 8 experts of 32 (2 routed, the
  softmax router scaled so that tokens clearly prefer some) and a shared SwiGLU expert of 64. F16.
- `tiny-nemotron_h.gguf` (nemotron_h, src/models/nemotron-h.cpp; the pattern "M*-M-"): Mamba-2 (make_tiny_models'
  mamba2 shapes: d_inner 128, 4 heads, 2 groups, d_state 16), attention-only (4 heads of 16, 2 KV heads, no RoPE),
  FFN-only (ReLU squared, 128 wide, with biases), Mamba-2, FFN-only; per-layer head_count_kv and
  feed_forward_length as convert_hf_to_gguf.py writes them. Q8_0 matrices.

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_hybrids.py [name ...]
Then make llama.cpp's outputs for them with make_tiny_reference.py <name> (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.tiny.make_tiny_models import (  # noqa: E402
    N_EMBD,
    N_VOCAB,
    OUT,
    Weights,
    attention_block,
    common,
    ffn_block,
    smollm2_vocab,
)
from tests.gguf.tiny_model import finish  # noqa: E402


def experts(wt: Weights, b: str, n_expert: int, n_ff_exp: int, kind: T) -> None:
    """A router (scaled so that tokens clearly prefer some experts) and the stacked gate / up / down experts."""
    wt.mat(b + "ffn_gate_inp.weight", N_EMBD, n_expert, scale=4.0 / np.sqrt(N_EMBD), kind=T.F32)
    for part, ne0, ne1 in (("gate", N_EMBD, n_ff_exp), ("up", N_EMBD, n_ff_exp), ("down", n_ff_exp, N_EMBD)):
        data = wt.rng.standard_normal((n_expert, ne1, ne0)) / np.sqrt(ne0)  # ggml (ne0, ne1, n_expert)
        wt.put(f"{b}ffn_{part}_exps.weight", data.astype(np.float32), kind)


def lfm2moe(seed: int = 41) -> Path:
    v = smollm2_vocab()
    path = OUT / "tiny-lfm2moe.gguf"
    w = gguf.GGUFWriter(str(path), "lfm2moe")
    w.add_name("tiny lfm2moe")
    wt = Weights(w, seed, T.F16)
    n_head, head_dim, n_ff, l_cache, n_expert, n_ff_exp = 4, 16, 128, 3, 8, 32
    kv = [0, 2, 0, 2]  # conv, attention, conv, attention
    common(w, wt, v, len(kv), n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(1000000.0)
    w.add_shortconv_l_cache(l_cache)
    w.add_leading_dense_block_count(1)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    wt.vec("token_embd_norm.weight", (N_EMBD,), 1.0)  # LFM2's output norm
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il, n_kv in enumerate(kv):
        b = f"blk.{il}."
        if n_kv:
            attention_block(wt, b, n_head, n_kv, head_dim, qk_norm=True)
        else:
            wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
            wt.vec(b + "shortconv.conv.weight", (l_cache, N_EMBD), 0.0, 0.5)
            wt.mat(b + "shortconv.in_proj.weight", N_EMBD, 3 * N_EMBD)
            wt.mat(b + "shortconv.out_proj.weight", N_EMBD, N_EMBD)
        if il == 0:
            ffn_block(wt, b, n_ff)
            continue
        wt.vec(b + "ffn_norm.weight", (N_EMBD,), 1.0)
        experts(wt, b, n_expert, n_ff_exp, T.F16)
        wt.vec(b + "exp_probs_b.bias", (n_expert,), 0.0, 0.3)
    return finish(w)


def mamba2_block(wt: Weights, b: str, d_inner: int, d_state: int, n_head: int, n_group: int, d_conv: int) -> None:
    """A Mamba-2 mixer (make_tiny_models.mamba2's tensors): in_proj to z | xBC | dt, the conv kernel and bias, dt
    bias, A < 0, D, the grouped norm and out_proj."""
    conv_dim = d_inner + 2 * n_group * d_state
    wt.mat(b + "ssm_in.weight", N_EMBD, d_inner + conv_dim + n_head)
    wt.vec(b + "ssm_conv1d.weight", (d_conv, conv_dim), 0.0, 0.5)
    wt.vec(b + "ssm_conv1d.bias", (conv_dim,))
    wt.vec(b + "ssm_dt.bias", (n_head,), -1.0, 0.5)
    wt.put(b + "ssm_a", -np.exp(wt.rng.uniform(0.0, 1.5, (n_head, 1))).astype(np.float32), T.F32)
    wt.vec(b + "ssm_d", (1, n_head), 1.0)
    wt.vec(b + "ssm_norm.weight", (d_inner // n_group, n_group), 1.0)
    wt.mat(b + "ssm_out.weight", d_inner, N_EMBD, scale=2.0 / np.sqrt(d_inner))


def granitehybrid(name: str = "granitehybrid", seed: int = 42, kind: T = T.Q8_0, n_expert: int = 0) -> Path:
    v = smollm2_vocab()
    path = OUT / f"tiny-{name}.gguf"
    w = gguf.GGUFWriter(str(path), "granitehybrid")
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, kind)
    n_head, head_dim, n_ff, n_ff_exp, n_ff_shexp = 4, 16, 128, 32, 64
    d_inner, d_state, n_ssm_head, n_group, d_conv = 2 * N_EMBD, 16, 4, 2, 4
    kv = [0, 2, 0, 0]  # mamba2, attention, mamba2, mamba2
    common(w, wt, v, len(kv), n_ff_exp if n_expert else n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_ssm_head)
    w.add_ssm_group_count(n_group)
    w.add_embedding_scale(12.0)
    w.add_residual_scale(0.22)
    w.add_attention_scale(0.3)
    w.add_logit_scale(8.0)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)
        w.add_expert_shared_feed_forward_length(n_ff_shexp)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il, n_kv in enumerate(kv):
        b = f"blk.{il}."
        if n_kv:
            attention_block(wt, b, n_head, n_kv, head_dim)
        else:
            wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
            mamba2_block(wt, b, d_inner, d_state, n_ssm_head, n_group, d_conv)
        if not n_expert:
            ffn_block(wt, b, n_ff)
            continue
        wt.vec(b + "ffn_norm.weight", (N_EMBD,), 1.0)
        experts(wt, b, n_expert, n_ff_exp, kind)
        wt.mat(b + "ffn_gate_shexp.weight", N_EMBD, n_ff_shexp)
        wt.mat(b + "ffn_up_shexp.weight", N_EMBD, n_ff_shexp)
        wt.mat(b + "ffn_down_shexp.weight", n_ff_shexp, N_EMBD)
    return finish(w)


def nemotron_h(seed: int = 44) -> Path:
    v = smollm2_vocab()
    path = OUT / "tiny-nemotron_h.gguf"
    w = gguf.GGUFWriter(str(path), "nemotron_h")
    w.add_name("tiny nemotron_h")
    wt = Weights(w, seed, T.Q8_0)
    n_head, head_dim, n_ff = 4, 16, 128
    d_inner, d_state, n_ssm_head, n_group, d_conv = 128, 16, 4, 2, 4
    pattern = "M*-M-"
    kv = [2 if c == "*" else 0 for c in pattern]
    ff = [n_ff if c == "-" else 0 for c in pattern]
    common(w, wt, v, len(pattern), 0)
    w.add_feed_forward_length(ff)  # replaces common's value, as the converter does
    w.add_head_count(n_head)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_eps(1e-5)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_ssm_head)
    w.add_ssm_group_count(n_group)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il, c in enumerate(pattern):
        b = f"blk.{il}."
        wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
        if c == "M":
            mamba2_block(wt, b, d_inner, d_state, n_ssm_head, n_group, d_conv)
        elif c == "*":
            for part, ne0, ne1 in (("q", N_EMBD, n_head * head_dim), ("k", N_EMBD, 2 * head_dim),
                                   ("v", N_EMBD, 2 * head_dim), ("output", n_head * head_dim, N_EMBD)):
                wt.mat(f"{b}attn_{part}.weight", ne0, ne1)
        else:  # ReLU^2 pushes half the units to 0: a wider scale keeps the layer's output comparable
            wt.mat(b + "ffn_up.weight", N_EMBD, n_ff, scale=2.0 / np.sqrt(N_EMBD))
            wt.vec(b + "ffn_up.bias", (n_ff,))
            wt.mat(b + "ffn_down.weight", n_ff, N_EMBD)
            wt.vec(b + "ffn_down.bias", (N_EMBD,))
    return finish(w)


MODELS = {
    "lfm2moe": lfm2moe,
    "granitehybrid": granitehybrid,
    "granitehybrid-moe": lambda: granitehybrid("granitehybrid-moe", 43, T.F16, n_expert=8),
    "nemotron_h": nemotron_h,
}

if __name__ == "__main__":
    for name in sys.argv[1:] or MODELS:
        print(MODELS[name]())

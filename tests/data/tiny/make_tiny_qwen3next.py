"""Write tests/data/tiny/tiny-qwen3next.gguf: a tiny synthetic Qwen3-Next (llama.cpp's LLM_ARCH_QWEN3NEXT,
src/models/qwen3next.cpp), laid out as convert_hf_to_gguf.py (conversion/qwen.py, Qwen3NextModel) writes one, with
random weights from a fixed seed.

4 layers, n_embd 64, `qwen3next.full_attention_interval` 2: layers 0 and 2 are Gated DeltaNet layers, 1 and 3 full
attention. The attention layers: 4 heads of 32 (2 KV heads), attn_q twice as wide (each head's query, then its
output gate), q/k RMS norms, NEOX RoPE over 8 of the 32 dimensions (partial_rotary_factor 0.25). The delta-net
layers: 2 key heads and 4 value heads of 64 (two value heads per key head: the repeat_interleave broadcast), the
converter's attn_qkv / attn_gate, the fused beta|alpha projection `ssm_ba` (F32, per key head its betas then its
alphas), a conv kernel of 4, decay rates `ssm_a` < 0 and dt biases, the gated output norm. Every FFN: 8 experts of
32 (2 routed per token, the router scaled so that tokens clearly prefer some) and a shared expert of 64 gated by a
sigmoid (make_tiny_qwen35.experts). Matrices are Q8_0, the router and ssm_ba F32; norms and vectors F32.

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_qwen3next.py
Then make llama.cpp's outputs with make_tiny_reference.py qwen3next (tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.tiny.make_tiny_models import N_EMBD, N_VOCAB, OUT, Weights, common, smollm2_vocab  # noqa: E402
from tests.data.tiny.make_tiny_qwen35 import (  # noqa: E402
    D_CONV,
    N_EXPERT,
    N_EXPERT_USED,
    N_FF,
    N_FF_EXP,
    N_FF_SHEXP,
    N_LAYER,
    experts,
)
from tests.gguf.tiny_model import finish  # noqa: E402

N_HEAD, N_HEAD_KV, HEAD_DIM, N_ROT = 4, 2, 32, 8
D_STATE, N_K_HEADS, N_V_HEADS = 64, 2, 4


def qwen3next(path: Path | None = None, seed: int = 31, interval: int = 2, drop: tuple[str, ...] = (),
              legacy_ssm_in: bool = False, meta_interval: int | None = None) -> Path:
    """The tiny model. `drop`: tensors left out (the load tests); `meta_interval`: the interval the metadata
    states, if not `interval`; `legacy_ssm_in`: an extra fused q|k|v|z `ssm_in`
    in layer 0, as the first converters wrote."""
    v = smollm2_vocab()
    path = path or OUT / "tiny-qwen3next.gguf"
    arch = "qwen3next"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny qwen3next")
    wt = Weights(w, seed, T.Q8_0)
    common(w, wt, v, N_LAYER, N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(N_ROT)
    w.add_full_attention_interval(interval if meta_interval is None else meta_interval)
    key_dim, d_inner = D_STATE * N_K_HEADS, D_STATE * N_V_HEADS
    conv_dim = 2 * key_dim + d_inner
    w.add_ssm_conv_kernel(D_CONV)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(D_STATE)
    w.add_ssm_time_step_rank(N_V_HEADS)
    w.add_ssm_group_count(N_K_HEADS)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_expert_shared_feed_forward_length(N_FF_SHEXP)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il in range(N_LAYER):
        b = f"blk.{il}."
        wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
        wt.vec(b + "post_attention_norm.weight", (N_EMBD,), 1.0)
        if (il + 1) % interval == 0:
            wt.mat(b + "attn_q.weight", N_EMBD, 2 * N_HEAD * HEAD_DIM)  # per head: its query, then its gate
            wt.mat(b + "attn_k.weight", N_EMBD, N_HEAD_KV * HEAD_DIM)
            wt.mat(b + "attn_v.weight", N_EMBD, N_HEAD_KV * HEAD_DIM)
            wt.mat(b + "attn_output.weight", N_HEAD * HEAD_DIM, N_EMBD)
            wt.vec(b + "attn_q_norm.weight", (HEAD_DIM,), 1.0)
            wt.vec(b + "attn_k_norm.weight", (HEAD_DIM,), 1.0)
        else:
            wt.mat(b + "attn_qkv.weight", N_EMBD, conv_dim)
            wt.mat(b + "attn_gate.weight", N_EMBD, d_inner)
            if legacy_ssm_in and il == 0:
                wt.mat(b + "ssm_in.weight", N_EMBD, conv_dim + d_inner)
            wt.vec(b + "ssm_conv1d.weight", (D_CONV, conv_dim), 0.0, 0.5)
            wt.vec(b + "ssm_dt.bias", (N_V_HEADS,), 1.0, 0.5)
            # -exp(A_log), as the converter stores it: per-token decays exp(softplus(.) * a) spread over (0, 1)
            wt.put(b + "ssm_a", -np.exp(wt.rng.uniform(-1.5, 0.5, N_V_HEADS)).astype(np.float32), T.F32)
            wt.mat(b + "ssm_ba.weight", N_EMBD, 2 * N_V_HEADS, scale=2.0 / np.sqrt(N_EMBD), kind=T.F32)
            wt.vec(b + "ssm_norm.weight", (D_STATE,), 1.0)
            wt.mat(b + "ssm_out.weight", d_inner, N_EMBD)
        experts(wt, b)
    if drop:
        w.tensors[-1] = {k: t for k, t in w.tensors[-1].items() if k not in drop}
    return finish(w)


if __name__ == "__main__":
    print(qwen3next())

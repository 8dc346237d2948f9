"""Write tests/data/tiny/tiny-qwen35.gguf: a tiny synthetic Qwen3.5 (llama.cpp's LLM_ARCH_QWEN35, src/models/
qwen35.cpp), laid out as convert_hf_to_gguf.py writes one, with random weights from a fixed seed.

4 layers, n_embd 64, `qwen35.full_attention_interval` 2: layers 0 and 2 are Gated DeltaNet layers, 1 and 3 full
attention. The attention layers: 4 heads of 32 (2 KV heads), attn_q twice as wide (each head's query, then its
output gate), q/k RMS norms, IMRoPE over 16 of the 32 dimensions with sections [3, 3, 1, 0] (7 sectors over 8
pairs: the eighth wraps to sector 0, and sector 5 falls to the unused fourth section, which a text token rotates
by angle 0). The delta-net layers: 2 key heads and 4 value heads of 64 (`ssm.group_count` 2, `ssm.time_step_rank`
4, `ssm.state_size` 64, `ssm.inner_size` 256), a conv kernel of 4 over the 512 q|k|v channels, decay rates
`ssm_a` < 0 and dt biases, the gated output norm; every layer has a post-attention norm and a SwiGLU FFN of 128.
`tiny-qwen35moe.gguf` (qwen35moe) is the same with a mixture of experts for each FFN: 8 experts of 32 (2 routed per
token, the router scaled so that tokens clearly prefer some) and a shared expert of 64 gated by a sigmoid.
`tiny-qwen35-s128.gguf` has the released models' head shapes (S128_SHAPE: attention heads of 256 rotating 64
dimensions with sections [11, 11, 10, 0], one KV head; delta-net heads of 128, 2 key and 4 value heads;
`full_attention_interval` 4). Matrices are Q8_0, except `ssm_alpha` / `ssm_beta` (F32) and the conv kernel (F32);
norms and vectors F32. The vocabulary is make_tiny_models.py's (SmolLM2's first 1024 tokens, its pre-tokenizer).

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_qwen35.py
Then make llama.cpp's outputs for them with make_tiny_reference.py qwen35 qwen35moe qwen35-fa qwen35-s128
(tests/data/REFERENCE.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from tests.data.tiny.make_tiny_models import N_EMBD, N_VOCAB, OUT, Weights, common, smollm2_vocab  # noqa: E402
from tests.gguf.tiny_model import finish  # noqa: E402

N_LAYER, INTERVAL, N_FF = 4, 2, 128
D_CONV = 4


@dataclass(frozen=True)
class Shape:
    """The attention heads (IMRoPE over n_rot of head_dim) and the delta-net heads (d_state wide)."""

    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_rot: int = 16
    sections: tuple[int, ...] = (3, 3, 1, 0)
    d_state: int = 64
    n_k_heads: int = 2
    n_v_heads: int = 4


TINY_SHAPE = Shape()
# tiny-qwen35-s128: the released models' head shapes (attention heads of 256, 64 rotated with sections
# [11, 11, 10, 0]; delta-net heads of 128, two value heads per key head), one KV head, interval 4
S128_SHAPE = Shape(n_head_kv=1, head_dim=256, n_rot=64, sections=(11, 11, 10, 0), d_state=128)
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 8, 2, 32, 64


def qwen35(name: str = "qwen35", seed: int = 21, path: Path | None = None, interval: int = INTERVAL,
           meta_interval: int | None = None, drop: tuple[str, ...] = (), moe: bool = False,
           recurrent_layers: list[bool] | None = None, drop_keys: tuple[str, ...] = (), nextn: int = 0,
           sh: Shape = TINY_SHAPE) -> Path:
    """The tiny model with a full-attention layer every `interval` layers. The malformed variants the load tests
    refuse: `meta_interval` (the interval the metadata states, if not `interval`), `drop` (tensors left out);
    `recurrent_layers`: the per-layer flags convert_hf_to_gguf.py writes from a config's layer_types; `drop_keys`:
    metadata keys left out; `nextn`: multi-token-prediction blocks after the layers, as convert_hf_to_gguf.py
    exports them (block_count counts them, nextn_predict_layers says how many; the main graph does not run them)."""
    v = smollm2_vocab()
    path = path or OUT / f"tiny-{name}.gguf"
    arch = "qwen35moe" if moe else "qwen35"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, T.Q8_0)
    common(w, wt, v, N_LAYER, N_FF)
    w.add_head_count(sh.n_head)
    w.add_head_count_kv(sh.n_head_kv)
    w.add_key_length(sh.head_dim)
    w.add_value_length(sh.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(sh.n_rot)
    w.add_rope_dimension_sections(list(sh.sections))
    w.add_uint32(f"{arch}.full_attention_interval", interval if meta_interval is None else meta_interval)
    if recurrent_layers is not None:
        w.add_array(f"{arch}.attention.recurrent_layers", recurrent_layers)
    key_dim, d_inner = sh.d_state * sh.n_k_heads, sh.d_state * sh.n_v_heads
    conv_dim = 2 * key_dim + d_inner
    w.add_ssm_conv_kernel(D_CONV)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(sh.d_state)
    w.add_ssm_time_step_rank(sh.n_v_heads)
    w.add_ssm_group_count(sh.n_k_heads)
    if moe:
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
            wt.mat(b + "attn_q.weight", N_EMBD, 2 * sh.n_head * sh.head_dim)  # per head: its query, then its gate
            wt.mat(b + "attn_k.weight", N_EMBD, sh.n_head_kv * sh.head_dim)
            wt.mat(b + "attn_v.weight", N_EMBD, sh.n_head_kv * sh.head_dim)
            wt.mat(b + "attn_output.weight", sh.n_head * sh.head_dim, N_EMBD)
            wt.vec(b + "attn_q_norm.weight", (sh.head_dim,), 1.0)
            wt.vec(b + "attn_k_norm.weight", (sh.head_dim,), 1.0)
        else:
            wt.mat(b + "attn_qkv.weight", N_EMBD, conv_dim)
            wt.mat(b + "attn_gate.weight", N_EMBD, d_inner)
            wt.vec(b + "ssm_conv1d.weight", (D_CONV, conv_dim), 0.0, 0.5)
            wt.vec(b + "ssm_dt.bias", (sh.n_v_heads,), 1.0, 0.5)
            # -exp(A_log), as the converter stores it: per-token decays exp(softplus(.) * a) spread over (0, 1)
            wt.put(b + "ssm_a", -np.exp(wt.rng.uniform(-1.5, 0.5, sh.n_v_heads)).astype(np.float32), T.F32)
            wt.mat(b + "ssm_alpha.weight", N_EMBD, sh.n_v_heads, kind=T.F32)
            wt.mat(b + "ssm_beta.weight", N_EMBD, sh.n_v_heads, scale=2.0 / np.sqrt(N_EMBD), kind=T.F32)
            wt.vec(b + "ssm_norm.weight", (sh.d_state,), 1.0)
            wt.mat(b + "ssm_out.weight", d_inner, N_EMBD)
        if moe:
            experts(wt, b)
        else:
            wt.mat(b + "ffn_gate.weight", N_EMBD, N_FF)
            wt.mat(b + "ffn_up.weight", N_EMBD, N_FF)
            wt.mat(b + "ffn_down.weight", N_FF, N_EMBD)
    if nextn:
        w.add_block_count(N_LAYER + nextn)  # replaces common()'s
        w.add_uint32(f"{arch}.nextn_predict_layers", nextn)
        for il in range(N_LAYER, N_LAYER + nextn):
            mtp_block(wt, f"blk.{il}.", sh)
    for kv in w.kv_data:
        for key in drop_keys:
            kv.pop(key, None)
    if drop:
        w.tensors[-1] = {k: t for k, t in w.tensors[-1].items() if k not in drop}
    return finish(w)


def mtp_block(wt: Weights, b: str, sh: Shape) -> None:
    """An MTP block (llama_model_qwen35::load_block_mtp): a full-attention decoder block and its nextn tensors."""
    wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
    wt.vec(b + "post_attention_norm.weight", (N_EMBD,), 1.0)
    wt.mat(b + "attn_q.weight", N_EMBD, 2 * sh.n_head * sh.head_dim)
    wt.mat(b + "attn_k.weight", N_EMBD, sh.n_head_kv * sh.head_dim)
    wt.mat(b + "attn_v.weight", N_EMBD, sh.n_head_kv * sh.head_dim)
    wt.mat(b + "attn_output.weight", sh.n_head * sh.head_dim, N_EMBD)
    wt.vec(b + "attn_q_norm.weight", (sh.head_dim,), 1.0)
    wt.vec(b + "attn_k_norm.weight", (sh.head_dim,), 1.0)
    wt.mat(b + "ffn_gate.weight", N_EMBD, N_FF)
    wt.mat(b + "ffn_up.weight", N_EMBD, N_FF)
    wt.mat(b + "ffn_down.weight", N_FF, N_EMBD)
    wt.mat(b + "nextn.eh_proj.weight", 2 * N_EMBD, N_EMBD)
    wt.vec(b + "nextn.enorm.weight", (N_EMBD,), 1.0)
    wt.vec(b + "nextn.hnorm.weight", (N_EMBD,), 1.0)


def experts(wt: Weights, b: str) -> None:
    """A layer's router (F32, scaled up), its experts and the shared expert with its gate vector."""
    wt.mat(b + "ffn_gate_inp.weight", N_EMBD, N_EXPERT, scale=4.0 / np.sqrt(N_EMBD), kind=T.F32)
    for part, ne0, ne1 in (("gate", N_EMBD, N_FF_EXP), ("up", N_EMBD, N_FF_EXP), ("down", N_FF_EXP, N_EMBD)):
        data = wt.rng.standard_normal((N_EXPERT, ne1, ne0)) / np.sqrt(ne0)  # ggml (ne0, ne1, n_expert)
        wt.put(f"{b}ffn_{part}_exps.weight", data.astype(np.float32), T.Q8_0)
    wt.vec(b + "ffn_gate_inp_shexp.weight", (N_EMBD,), 0.0, 2.0 / np.sqrt(N_EMBD))
    wt.mat(b + "ffn_gate_shexp.weight", N_EMBD, N_FF_SHEXP)
    wt.mat(b + "ffn_up_shexp.weight", N_EMBD, N_FF_SHEXP)
    wt.mat(b + "ffn_down_shexp.weight", N_FF_SHEXP, N_EMBD)


if __name__ == "__main__":
    print(qwen35())
    print(qwen35("qwen35moe", seed=22, moe=True))
    print(qwen35("qwen35-s128", seed=5, interval=4, sh=S128_SHAPE))

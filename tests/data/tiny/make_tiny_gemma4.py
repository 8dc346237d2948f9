"""Write tests/data/tiny/tiny-gemma4.gguf and tiny-gemma4-e.gguf: tiny synthetic Gemma 4 models (llama.cpp's
LLM_ARCH_GEMMA4, src/models/gemma4.cpp), laid out as convert_hf_to_gguf.py's Gemma4Model writes one, with random
weights from a fixed seed.

6 layers, n_embd 64, 4 query heads, `attention.sliding_window_pattern` [1, 1, 1, 0, 1, 0]: layers 3 and 5 are
global. The sliding-window layers have heads of 16 (2 KV heads, all 16 dimensions rotated, base 10000) and a window
of 4 tokens, so that every prompt goes past it; the global layers heads of 32 (1 KV head) with proportional RoPE:
`rope_freqs.weight` keeps the first 4 of 16 pairs (factor 1) and stops the rest (1e30), base 1e6.
`attention.shared_kv_layers` 2: layers 4 (sliding) and 5 (global) compute no K/V and read the KV of layers 2 and 3.
Layer 3 has no `attn_v` (V is its K projection, RMS-normed without the K norm). Every layer ends with a
`layer_output_scale`; the logits are soft-capped at 30. Q8_0 matrices (F16 where a row is too short for a block),
F32 norms; the output matrix is tied to the token embeddings. `tiny-gemma4-e.gguf` (seed 32) adds the E models'
per-layer embeddings: 16 per layer (`per_layer_token_embd` of 6 x 16 per token, `per_layer_model_proj`, each
layer's `inp_gate`, `proj` and `post_norm`). `tiny-gemma4-moe.gguf` (seed 33) is the 26B-A4B layout: every layer's
dense FFN beside 4 GELU experts of 32 (2 routed per token; gate and up fused in `ffn_gate_up_exps`, Q8_0), the F32
router scaled so that tokens clearly prefer some experts, its input scale `ffn_gate_inp.scale`, the per-expert
`ffn_down_exps.scale` and the two branches' norms. `tiny-gemma4-wide.gguf` (seed 34) has use_double_wide_mlp's
FFNs: feed_forward_length per layer, 256 in the two shared KV layers. The vocabulary is make_tiny_models.py's
(SmolLM2's first 1024 tokens).

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_gemma4.py
Then make llama.cpp's outputs with make_tiny_reference.py gemma4 gemma4-e gemma4-moe gemma4-fa
gemma4-wide (tests/data/REFERENCE.md), and the AVX2
build's with REFERENCE_VARIANT=avx2.
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

N_LAYER, N_FF, N_HEAD, N_SWA = 6, 128, 4, 4
SWA_LAYERS = [True, True, True, False, True, False]
HEAD_SWA, N_KV_SWA, HEAD_FULL, N_KV_FULL = 16, 2, 32, 1
N_SHARED = 2
N_ROTATED_PAIRS = 4  # of the global layers' 16: partial_rotary_factor 0.25
N_PER_LAYER = 16
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 4, 2, 32


def gemma4(name: str = "gemma4", seed: int = 31, path: Path | None = None, per_layer: int = 0,
           kv_heads: list[int] | None = None, drop: tuple[str, ...] = (), n_shared: int = N_SHARED,
           moe: bool = False, wide: bool = False) -> Path:
    """The tiny model; `per_layer`: the E models' per-layer embedding width (0: none); `moe`: the experts beside
    each layer's dense FFN; `wide`: the shared KV layers' FFNs twice as wide. The malformed variants the
    load tests refuse: `kv_heads` (head_count_kv per layer, if not the pattern's), `drop` (tensors left out),
    `n_shared` (attention.shared_kv_layers)."""
    v = smollm2_vocab()
    path = path or OUT / f"tiny-{name}.gguf"
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, T.Q8_0)
    n_kv_from = N_LAYER - n_shared
    n_ff = [N_FF if il < n_kv_from or not wide else 2 * N_FF for il in range(N_LAYER)]
    common(w, wt, v, N_LAYER, n_ff if wide else N_FF, embd_scale=0.5)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(kv_heads or [N_KV_SWA if swa else N_KV_FULL for swa in SWA_LAYERS])
    w.add_key_length(HEAD_FULL)
    w.add_value_length(HEAD_FULL)
    w.add_key_length_swa(HEAD_SWA)
    w.add_value_length_swa(HEAD_SWA)
    w.add_rope_dimension_count(HEAD_FULL)
    w.add_rope_dimension_count_swa(HEAD_SWA)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(10000.0)
    w.add_sliding_window(N_SWA)
    w.add_sliding_window_pattern(SWA_LAYERS)
    w.add_shared_kv_layers(n_shared)
    w.add_embedding_length_per_layer_input(per_layer)
    w.add_final_logit_softcapping(30.0)
    if moe:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
    pairs = HEAD_FULL // 2
    wt.put("rope_freqs.weight", np.array([1.0] * N_ROTATED_PAIRS + [1e30] * (pairs - N_ROTATED_PAIRS), np.float32),
           T.F32)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    if per_layer:
        wt.mat("per_layer_token_embd.weight", per_layer * N_LAYER, N_VOCAB, scale=0.5)
        wt.mat("per_layer_model_proj.weight", N_EMBD, per_layer * N_LAYER)
        wt.vec("per_layer_proj_norm.weight", (per_layer,), 1.0)
    for il, swa in enumerate(SWA_LAYERS):
        b = f"blk.{il}."
        head, n_kv = (HEAD_SWA, N_KV_SWA) if swa else (HEAD_FULL, N_KV_FULL)
        wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
        wt.mat(b + "attn_q.weight", N_EMBD, N_HEAD * head)
        if il < n_kv_from:
            wt.mat(b + "attn_k.weight", N_EMBD, n_kv * head)
            if il != 3:  # use_alternative_attention: V from the K projection
                wt.mat(b + "attn_v.weight", N_EMBD, n_kv * head)
            wt.vec(b + "attn_k_norm.weight", (head,), 1.0)
        wt.mat(b + "attn_output.weight", N_HEAD * head, N_EMBD)
        wt.vec(b + "attn_q_norm.weight", (head,), 1.0)
        wt.vec(b + "post_attention_norm.weight", (N_EMBD,), 1.0, 0.3)
        wt.vec(b + "ffn_norm.weight", (N_EMBD,), 1.0)
        wt.mat(b + "ffn_gate.weight", N_EMBD, n_ff[il])
        wt.mat(b + "ffn_up.weight", N_EMBD, n_ff[il])
        wt.mat(b + "ffn_down.weight", n_ff[il], N_EMBD)
        wt.vec(b + "post_ffw_norm.weight", (N_EMBD,), 1.0, 0.3)
        if moe:
            experts(wt, b)
        wt.put(b + "layer_output_scale.weight", np.array([0.6 + 0.15 * il], np.float32), T.F32)
        if per_layer:
            wt.mat(b + "inp_gate.weight", N_EMBD, per_layer)
            wt.mat(b + "proj.weight", per_layer, N_EMBD, kind=T.F16)  # rows of 16: no Q8_0 block
            wt.vec(b + "post_norm.weight", (N_EMBD,), 1.0, 0.3)
    if drop:
        w.tensors[-1] = {k: t for k, t in w.tensors[-1].items() if k not in drop}
    return finish(w)


def experts(wt: Weights, b: str) -> None:
    """A layer's router (F32, scaled up; its input scale), the experts (gate | up fused, down; Q8_0), the per-expert
    output scale and the two branches' norms."""
    wt.mat(b + "ffn_gate_inp.weight", N_EMBD, N_EXPERT, scale=4.0 / np.sqrt(N_EMBD), kind=T.F32)
    wt.vec(b + "ffn_gate_inp.scale", (N_EMBD,), 1.0, 0.3)
    for part, ne0, ne1 in (("gate_up", N_EMBD, 2 * N_FF_EXP), ("down", N_FF_EXP, N_EMBD)):
        data = wt.rng.standard_normal((N_EXPERT, ne1, ne0)) / np.sqrt(ne0)  # ggml (ne0, ne1, n_expert)
        wt.put(f"{b}ffn_{part}_exps.weight", data.astype(np.float32), T.Q8_0)
    wt.vec(b + "ffn_down_exps.scale", (N_EXPERT,), 1.0, 0.3)
    for norm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
        wt.vec(f"{b}{norm}.weight", (N_EMBD,), 1.0, 0.3)


if __name__ == "__main__":
    print(gemma4())
    print(gemma4("gemma4-e", seed=32, per_layer=N_PER_LAYER))
    print(gemma4("gemma4-moe", seed=33, moe=True))
    print(gemma4("gemma4-wide", seed=34, wide=True))

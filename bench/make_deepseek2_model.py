"""Write a synthetic DeepSeek-V2-Lite-shaped GGUF for speed benchmarks: deepseek2 (MLA + MoE) with random weights,
no download.

DeepSeek-V2-Lite's attention and router at a smaller width and depth: 16 heads, each query 192 wide (128 "nope" +
64 RoPE) from a plain attn_q (no q LoRA, as the Lite model), the KV latent 512 wide (kv_lora_rank) plus the shared
64-wide RoPE key, so the K-only cache row is 576 (f16: 1152 bytes per layer per token); values 128 per head
(attn_v_b); YaRN (factor 40 over 4096 positions, log multiplier 0.0707) as the Lite file has. One leading dense
SwiGLU layer, then MoE layers of 64 experts (6 routed per token, softmax gating, weights neither normalized nor
scaled) beside 2 shared experts. n_embd 1024, 12 layers, experts 1024 -> 512 -> 1024: about 1.35B parameters, ~0.3B
active per token; SmolLM2's 49152-token vocabulary, a separate output matrix. Matrices Q8_0 (`--type q4_0`: the
2-D ones and the experts Q4_0, the per-head attn_k_b / attn_v_b Q8_0 as llama-quantize keeps them), router and
norms F32.

Usage: python bench/make_deepseek2_model.py [OUT.gguf (default /tmp/deepseek2-lite-1b-q8_0.gguf)] [--type q8_0|q4_0]
Then: ~/.cache/llamactx-llamacpp/bin/llama-bench -m OUT.gguf -p 512 -n 128 -t 2, and llamactx bench on the same
file (bench/compare_llamacpp.py -m OUT.gguf).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[1]))
from llamactx.embedded import smollm2_path  # noqa: E402
from llamactx.gguf.reader import GGUFFile  # noqa: E402

ARCH = "deepseek2"
N_EMBD, N_LAYER, N_DENSE, N_FF = 1024, 12, 1, 4096
N_HEAD, KV_LORA, N_NOPE, N_ROT, V_MLA = 16, 512, 128, 64, 128
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_SHARED = 64, 6, 512, 2


def kv_bytes_per_token() -> int:
    """The f16 K-only cache's bytes per token: every layer's latent and RoPE key (llama_kv_cache with is_mla())."""
    return N_LAYER * (KV_LORA + N_ROT) * 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="/tmp/deepseek2-lite-1b-q8_0.gguf")
    ap.add_argument("--type", choices=("q8_0", "q4_0"), default="q8_0")
    args = ap.parse_args()
    kind = T.Q8_0 if args.type == "q8_0" else T.Q4_0
    meta = GGUFFile(smollm2_path()).meta
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(args.out, ARCH)
    w.add_name("synthetic deepseek2 (V2-Lite shapes) 1B")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    w.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    w.add_context_length(163840)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(1)
    w.add_key_length(KV_LORA + N_ROT)  # the cache's one KV head: latent + RoPE key
    w.add_value_length(KV_LORA)
    w.add_uint32(f"{ARCH}.attention.key_length_mla", N_NOPE + N_ROT)
    w.add_uint32(f"{ARCH}.attention.value_length_mla", V_MLA)
    w.add_uint32(f"{ARCH}.attention.q_lora_rank", 0)
    w.add_uint32(f"{ARCH}.attention.kv_lora_rank", KV_LORA)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(N_ROT)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(40.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_float32(f"{ARCH}.rope.scaling.yarn_log_multiplier", 0.0707)
    w.add_uint32(f"{ARCH}.leading_dense_block_count", N_DENSE)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_uint32(f"{ARCH}.expert_shared_count", N_SHARED)
    w.add_float32(f"{ARCH}.expert_weights_scale", 1.0)
    w.add_uint32(f"{ARCH}.expert_gating_func", 1)  # softmax
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if kind == T.Q8_0 else gguf.LlamaFileType.MOSTLY_Q4_0)

    def put(name: str, shape: tuple[int, ...], scale: float, qkind: T = kind) -> None:
        """A random tensor of numpy shape `shape` (ggml's reversed), quantized."""
        data = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        if qkind == T.F32:
            w.add_tensor(name, data)
            return
        q = gguf.quants.quantize(data, qkind)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qkind)

    put("token_embd.weight", (n_vocab, N_EMBD), 1.0)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    put("output.weight", (n_vocab, N_EMBD), N_EMBD ** -0.5)
    for il in range(N_LAYER):
        b = f"blk.{il}."
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(b + name + ".weight", np.ones(N_EMBD, np.float32))
        w.add_tensor(b + "attn_kv_a_norm.weight", np.ones(KV_LORA, np.float32))
        put(b + "attn_q.weight", (N_HEAD * (N_NOPE + N_ROT), N_EMBD), N_EMBD ** -0.5)
        put(b + "attn_kv_a_mqa.weight", (KV_LORA + N_ROT, N_EMBD), N_EMBD ** -0.5)
        put(b + "attn_k_b.weight", (N_HEAD, KV_LORA, N_NOPE), N_NOPE ** -0.5, T.Q8_0)  # ggml (nope, rank, head)
        put(b + "attn_v_b.weight", (N_HEAD, V_MLA, KV_LORA), KV_LORA ** -0.5, T.Q8_0)  # ggml (rank, v, head)
        put(b + "attn_output.weight", (N_EMBD, N_HEAD * V_MLA), (N_HEAD * V_MLA) ** -0.5)
        if il < N_DENSE:
            put(b + "ffn_gate.weight", (N_FF, N_EMBD), N_EMBD ** -0.5)
            put(b + "ffn_up.weight", (N_FF, N_EMBD), N_EMBD ** -0.5)
            put(b + "ffn_down.weight", (N_EMBD, N_FF), N_FF ** -0.5)
            continue
        put(b + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD), 2.0 * N_EMBD ** -0.5, T.F32)
        put(b + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), N_EMBD ** -0.5)
        put(b + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), N_EMBD ** -0.5)
        put(b + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF_EXP), N_FF_EXP ** -0.5)
        n_shexp = N_FF_EXP * N_SHARED
        put(b + "ffn_gate_shexp.weight", (n_shexp, N_EMBD), N_EMBD ** -0.5)
        put(b + "ffn_up_shexp.weight", (n_shexp, N_EMBD), N_EMBD ** -0.5)
        put(b + "ffn_down_shexp.weight", (N_EMBD, n_shexp), n_shexp ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    attn = N_EMBD * N_HEAD * (N_NOPE + N_ROT) + N_EMBD * (KV_LORA + N_ROT) + N_HEAD * KV_LORA * (N_NOPE + V_MLA) \
        + N_HEAD * V_MLA * N_EMBD
    dense = N_LAYER * attn + 2 * n_vocab * N_EMBD + N_DENSE * 3 * N_EMBD * N_FF \
        + (N_LAYER - N_DENSE) * 3 * N_EMBD * N_FF_EXP * N_SHARED
    n_total = dense + (N_LAYER - N_DENSE) * N_EXPERT * 3 * N_EMBD * N_FF_EXP
    n_active = dense + (N_LAYER - N_DENSE) * N_EXPERT_USED * 3 * N_EMBD * N_FF_EXP
    print(f"{args.out}: {n_total / 1e6:.0f}M parameters, {n_active / 1e6:.0f}M active per token, "
          f"KV cache {kv_bytes_per_token()} bytes per token (f16)")


if __name__ == "__main__":
    main()

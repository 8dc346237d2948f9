"""Write a synthetic mixture-of-experts GGUF for speed benchmarks: qwen3moe with random weights, no download.

About 1.0B parameters in all and ~150M active per token (8 layers of 80 experts, 6 routed per token, each expert a
1024 -> 512 -> 1024 SwiGLU; SmolLM2's 49152-token vocabulary, tied embeddings), Q8_0 matrices (or Q4_0 with
--type q4_0): big enough that reading the experts' weights dominates, as in real MoE models on CPUs. The router
is scaled so that tokens spread over the experts. --type iq2_xxs writes the attention and expert matrices as
random valid IQ2_XXS blocks (random grid indices, signs and 4-bit scales, d for the same spread; ggml-common.h
`block_iq2_xxs`) and keeps the embeddings Q8_0: the layout of a 2-bit MoE download, without a quantizer run.

Usage: python bench/make_moe_model.py [OUT.gguf (default /tmp/moe-1b-q8_0.gguf)] [--type q8_0|q4_0|iq2_xxs]
Then: python bench/compare_llamacpp.py -m OUT.gguf   (llama-bench and llamactx bench on the same file)
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

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 1024, 8, 16, 4, 64
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 80, 6, 512


def _iq2_xxs(shape: tuple[int, ...], scale: float, rng: np.random.Generator) -> np.ndarray:
    """Random valid IQ2_XXS blocks for a tensor of numpy shape `shape`: (..., rows, k / 256 * 66) uint8. Any bits
    are a valid block (every index is in the grid); d is set so that the weights' spread is about `scale` (an
    element is d * (2 ls + 1) / 8 * a grid value of 8, 25 or 43: rms about 53 d with uniform 4-bit ls)."""
    n_blocks = int(np.prod(shape)) // 256
    blocks = rng.integers(0, 256, (n_blocks, 66), dtype=np.uint8)
    d = np.full(n_blocks, scale / 53.0, np.float16)
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(*shape[:-1], shape[-1] // 256 * 66)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="/tmp/moe-1b-q8_0.gguf")
    ap.add_argument("--type", choices=("q8_0", "q4_0", "iq2_xxs"), default="q8_0")
    args = ap.parse_args()
    kind = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "iq2_xxs": T.IQ2_XXS}[args.type]
    meta = GGUFFile(smollm2_path()).meta
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(args.out, "qwen3moe")
    w.add_name("synthetic qwen3moe 1B")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    w.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF_EXP * N_EXPERT_USED)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_file_type({T.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, T.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
                     T.IQ2_XXS: gguf.LlamaFileType.MOSTLY_IQ2_XXS}[kind])

    def put(name: str, shape: tuple[int, ...], scale: float, qkind: T = kind) -> None:
        """A random tensor of numpy shape `shape` (ggml's reversed), quantized."""
        if qkind == T.IQ2_XXS:
            w.add_tensor(name, _iq2_xxs(shape, scale, rng), raw_dtype=qkind)
            return
        data = (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
        if qkind == T.F32:
            w.add_tensor(name, data)
            return
        q = gguf.quants.quantize(data, qkind)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qkind)

    put("token_embd.weight", (n_vocab, N_EMBD), 1.0, T.Q8_0 if kind == T.IQ2_XXS else kind)
    put("output_norm.weight", (N_EMBD,), 0.1, T.F32)
    for il in range(N_LAYER):
        b = f"blk.{il}."
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(b + name + ".weight", np.ones(N_EMBD, np.float32))
        for name in ("attn_q_norm", "attn_k_norm"):
            w.add_tensor(b + name + ".weight", np.ones(HEAD_DIM, np.float32))
        put(b + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD), N_EMBD ** -0.5)
        put(b + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), N_EMBD ** -0.5)
        put(b + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), N_EMBD ** -0.5)
        put(b + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), (N_HEAD * HEAD_DIM) ** -0.5)
        put(b + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD), 2.0 * N_EMBD ** -0.5, T.F32)
        put(b + "ffn_gate_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), N_EMBD ** -0.5)
        put(b + "ffn_up_exps.weight", (N_EXPERT, N_FF_EXP, N_EMBD), N_EMBD ** -0.5)
        put(b + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF_EXP), N_FF_EXP ** -0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    dense = N_LAYER * 2 * N_EMBD * HEAD_DIM * (N_HEAD + N_HEAD_KV) + n_vocab * N_EMBD  # attention, embeddings
    n_total = dense + N_LAYER * N_EXPERT * 3 * N_EMBD * N_FF_EXP
    n_active = dense + N_LAYER * N_EXPERT_USED * 3 * N_EMBD * N_FF_EXP
    print(f"{args.out}: {n_total / 1e6:.0f}M parameters, {n_active / 1e6:.0f}M active per token")


if __name__ == "__main__":
    main()

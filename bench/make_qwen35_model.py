"""Write a synthetic Qwen3.5-shaped GGUF for speed benchmarks: qwen35 or qwen35moe, random weights, no download.

Shapes (`--shape`), each with the released models' head shapes (delta-net heads of 128: 16 key and 16 value heads,
a conv kernel of 4; attention every 4th layer, 8 heads of 256 with 2 KV heads, IMRoPE over 64 dimensions with
sections [11, 11, 10, 0]) and Qwen3.5's vocabulary size (248320 tokens: SmolLM2's tokenizer padded with control
tokens; tied embeddings):
- qwen35-1b: between Qwen3.5-0.8B (n_embd 1024, n_ff 3584) and 2B (2048, 6144): 24 layers (18 delta-net, 6 full
  attention), n_embd 1280, n_ff 4608, about 1.03B parameters;
- qwen35moe-2b: Qwen3.5-35B-A3B's layer scaled down: 12 layers (9 delta-net, 3 attention), n_embd 1024, 64 experts
  of 512 with 8 routed per token, and a shared expert of 512 behind its sigmoid gate: about 1.6B parameters in all,
  ~0.5B read per token (the tied output head included).

`--type` picks the matrices' type: q4_k_m (Q4_K, with Q6_K for the tied embeddings and for attn_v / ffn_down on
the layers llama-quantize's use_more_bits picks, as make_dense_model.py), q4_k, q8_0. The small delta-net
projections ssm_alpha / ssm_beta (n_embd -> 16), the conv kernel, the router and the norms are F32, as
convert_hf_to_gguf.py writes them. Quantized blocks are random bytes with small scales (make_dense_model.py's
random_blocks); F32 tensors are drawn so the recurrence stays in range (decays in (0, 1), betas spread).

Usage: python bench/make_qwen35_model.py [--shape qwen35-1b|qwen35moe-2b] [--type q4_k_m|q4_k|q8_0] [OUT.gguf]
Then: python bench/compare_llamacpp.py -m OUT.gguf   (llama-bench and llamactx bench on the same file)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from make_dense_model import FILE_TYPES, random_blocks  # noqa: E402

from llamactx.embedded import smollm2_path  # noqa: E402
from llamactx.gguf.reader import GGUFFile  # noqa: E402


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_ff: int  # the dense FFN's width (qwen35), or the shared expert's (qwen35moe)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    interval: int = 4  # full_attention_interval
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 256
    n_rot: int = 64
    sections: tuple[int, ...] = (11, 11, 10, 0)
    d_state: int = 128
    n_k_heads: int = 16
    n_v_heads: int = 16
    d_conv: int = 4
    n_vocab: int = 248320


SHAPES = {
    "qwen35-1b": Shape(n_layer=24, n_embd=1280, n_ff=4608),
    "qwen35moe-2b": Shape(n_layer=12, n_embd=1024, n_ff=512, n_expert=64, n_expert_used=8, n_ff_exp=512),
}
TYPES = ("q4_k_m", "q4_k", "q8_0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=None, help="default /tmp/<shape>-<type>.gguf")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen35-1b")
    ap.add_argument("--type", choices=TYPES, default="q4_k_m")
    args = ap.parse_args()
    out = args.out or f"/tmp/{args.shape}-{args.type}.gguf"
    n_params = write(out, SHAPES[args.shape], args.type, args.shape)
    print(f"{out}: {args.shape} {args.type}, {n_params / 1e9:.2f}B parameters, {Path(out).stat().st_size / 1e9:.2f} GB")


def write(out: str, sh: Shape, type_name: str, name: str) -> int:
    """Write the GGUF; -> its parameter count."""
    kind, ftype = FILE_TYPES[type_name]
    mix = type_name == "q4_k_m"
    moe = sh.n_expert > 0
    arch = "qwen35moe" if moe else "qwen35"
    meta = GGUFFile(smollm2_path()).meta
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(out, arch)
    w.add_name(f"synthetic {name} {type_name}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    pad = sh.n_vocab - len(tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(tokens + [f"<|pad_{i}|>" for i in range(pad)])
    w.add_token_types(types + [int(gguf.TokenType.CONTROL)] * pad)
    w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_context_length(8192)
    w.add_embedding_length(sh.n_embd)
    w.add_block_count(sh.n_layer)
    w.add_feed_forward_length(sh.n_ff)
    w.add_head_count(sh.n_head)
    w.add_head_count_kv(sh.n_head_kv)
    w.add_key_length(sh.head_dim)
    w.add_value_length(sh.head_dim)
    w.add_rope_freq_base(10000000.0)
    w.add_rope_dimension_count(sh.n_rot)
    w.add_rope_dimension_sections(list(sh.sections))
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.full_attention_interval", sh.interval)
    key_dim, d_inner = sh.d_state * sh.n_k_heads, sh.d_state * sh.n_v_heads
    conv_dim = 2 * key_dim + d_inner
    w.add_ssm_conv_kernel(sh.d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(sh.d_state)
    w.add_ssm_time_step_rank(sh.n_v_heads)
    w.add_ssm_group_count(sh.n_k_heads)
    if moe:
        w.add_expert_count(sh.n_expert)
        w.add_expert_used_count(sh.n_expert_used)
        w.add_expert_feed_forward_length(sh.n_ff_exp)
        w.add_expert_shared_feed_forward_length(sh.n_ff)
    w.add_file_type(ftype)
    count = [0]

    def put(name: str, rows: int, cols: int, kind_: T) -> None:
        """A rows x cols quantized matrix (ggml ne = (cols, rows)) of random blocks."""
        data = random_blocks(rng, rows, cols, kind_, cols ** -0.5)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind_)
        count[0] += rows * cols

    def put_experts(name: str, rows: int, cols: int, kind_: T) -> None:
        """n_expert stacked rows x cols matrices (ggml ne = (cols, rows, n_expert))."""
        data = random_blocks(rng, sh.n_expert * rows, cols, kind_, cols ** -0.5)
        data = data.reshape(sh.n_expert, rows, -1)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind_)
        count[0] += sh.n_expert * rows * cols

    def put_f32(name: str, data: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(data, np.float32))
        count[0] += data.size

    def more_bits(il: int) -> bool:  # llama-quant.cpp's use_more_bits(i_layer, n_layers)
        return il < sh.n_layer // 8 or il >= 7 * sh.n_layer // 8 or (il - sh.n_layer // 8) % 3 == 2

    put("token_embd.weight", sh.n_vocab, sh.n_embd, T.Q6_K if mix else kind)
    put_f32("output_norm.weight", np.ones(sh.n_embd))
    for il in range(sh.n_layer):
        b = f"blk.{il}."
        bump = T.Q6_K if mix and more_bits(il) else kind
        put_f32(b + "attn_norm.weight", np.ones(sh.n_embd))
        put_f32(b + "post_attention_norm.weight", np.ones(sh.n_embd))
        if (il + 1) % sh.interval == 0:
            put(b + "attn_q.weight", 2 * sh.n_head * sh.head_dim, sh.n_embd, kind)  # per head: query, then gate
            put(b + "attn_k.weight", sh.n_head_kv * sh.head_dim, sh.n_embd, kind)
            put(b + "attn_v.weight", sh.n_head_kv * sh.head_dim, sh.n_embd, bump)
            put(b + "attn_output.weight", sh.n_embd, sh.n_head * sh.head_dim, kind)
            put_f32(b + "attn_q_norm.weight", np.ones(sh.head_dim))
            put_f32(b + "attn_k_norm.weight", np.ones(sh.head_dim))
        else:
            put(b + "attn_qkv.weight", conv_dim, sh.n_embd, kind)
            put(b + "attn_gate.weight", d_inner, sh.n_embd, kind)
            put_f32(b + "ssm_conv1d.weight", rng.standard_normal((conv_dim, sh.d_conv)) * 0.5)
            put_f32(b + "ssm_dt.bias", 1.0 + 0.5 * rng.standard_normal(sh.n_v_heads))
            put_f32(b + "ssm_a", -np.exp(rng.uniform(-1.5, 0.5, sh.n_v_heads)))  # -exp(A_log)
            put_f32(b + "ssm_alpha.weight", rng.standard_normal((sh.n_v_heads, sh.n_embd)) * sh.n_embd ** -0.5)
            put_f32(b + "ssm_beta.weight", rng.standard_normal((sh.n_v_heads, sh.n_embd)) * 2 * sh.n_embd ** -0.5)
            put_f32(b + "ssm_norm.weight", np.ones(sh.d_state))
            put(b + "ssm_out.weight", sh.n_embd, d_inner, bump)
        if moe:
            put_f32(b + "ffn_gate_inp.weight", rng.standard_normal((sh.n_expert, sh.n_embd)) * 4 * sh.n_embd ** -0.5)
            put_experts(b + "ffn_gate_exps.weight", sh.n_ff_exp, sh.n_embd, kind)
            put_experts(b + "ffn_up_exps.weight", sh.n_ff_exp, sh.n_embd, kind)
            put_experts(b + "ffn_down_exps.weight", sh.n_embd, sh.n_ff_exp, bump)
            put_f32(b + "ffn_gate_inp_shexp.weight", rng.standard_normal(sh.n_embd) * 2 * sh.n_embd ** -0.5)
            put(b + "ffn_gate_shexp.weight", sh.n_ff, sh.n_embd, kind)
            put(b + "ffn_up_shexp.weight", sh.n_ff, sh.n_embd, kind)
            put(b + "ffn_down_shexp.weight", sh.n_embd, sh.n_ff, bump)
        else:
            put(b + "ffn_gate.weight", sh.n_ff, sh.n_embd, kind)
            put(b + "ffn_up.weight", sh.n_ff, sh.n_embd, kind)
            put(b + "ffn_down.weight", sh.n_embd, sh.n_ff, bump)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return count[0]


if __name__ == "__main__":
    main()

"""Write the tiny synthetic GGUF models of tests/data/tiny/ with gguf-py's GGUFWriter (random weights, fixed seeds).

One model per architecture or memory variant that no installable package ships small: qwen2 (attention biases),
qwen3 (q/k RMSNorm), llama with Llama 3's RoPE frequency factors (rope_freqs.weight), llama with YaRN RoPE
scaling, qwen3moe / qwen2moe / mixtral (experts; qwen2moe's shared expert), mamba2 (recurrent memory), lfm2
(hybrid: short-convolution and attention layers) and gpt-oss (sinks, iSWA, biased experts; Q8_0 or MXFP4
experts). Each has 2-4 layers, n_embd 64, and a 1024-token vocabulary cut from SmolLM2's BPE tokenizer (the
first 1024 tokens and the merges among them). Matrices are F32, F16 or Q8_0, norms F32.

Usage (from the repository root, in the project's venv): python tests/data/tiny/make_tiny_models.py
Then make their reference outputs with llama.cpp: see make_tiny_reference.py and tests/data/REFERENCE.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[3]))
from llamactx.embedded import smollm2_path  # noqa: E402  (the repository root is on the path now)
from llamactx.gguf.reader import GGUFFile  # noqa: E402
from tests.gguf.tiny_model import finish  # noqa: E402

OUT = Path(__file__).parent
N_VOCAB = 1024
N_EMBD = 64


def smollm2_vocab() -> dict:
    """The first N_VOCAB tokens of SmolLM2's tokenizer and the merges among them."""
    meta = GGUFFile(smollm2_path()).meta
    tokens = list(meta["tokenizer.ggml.tokens"][:N_VOCAB])
    ids = {t: i for i, t in enumerate(tokens)}
    merges = [m for m in meta["tokenizer.ggml.merges"]
              if all(p in ids for p in m.split(" ")) and m.replace(" ", "") in ids]
    types = [int(t) for t in meta["tokenizer.ggml.token_type"][:N_VOCAB]]
    return {"tokens": tokens, "merges": merges, "types": types, "pre": meta["tokenizer.ggml.pre"]}


def add_vocab(w: gguf.GGUFWriter, v: dict) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v["pre"])
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)


class Weights:
    """Random tensors in GGUF (ggml) shape order, stored as `kind` (F32 / F16 / Q8_0)."""

    def __init__(self, w: gguf.GGUFWriter, seed: int, kind: T):
        self.w, self.rng, self.kind = w, np.random.default_rng(seed), kind

    def mat(self, name: str, ne0: int, ne1: int, scale: float | None = None, kind: T | None = None) -> None:
        """A matrix with ggml shape (ne0 = input, ne1 = output): numpy (ne1, ne0)."""
        scale = scale if scale is not None else 1.0 / np.sqrt(ne0)
        data = (self.rng.standard_normal((ne1, ne0)) * scale).astype(np.float32)
        self.put(name, data, kind or self.kind)

    def vec(self, name: str, shape: tuple[int, ...], center: float = 0.0, scale: float = 0.1) -> None:
        data = (center + self.rng.standard_normal(shape[::-1]) * scale).astype(np.float32)
        self.put(name, data, T.F32)

    def put(self, name: str, data: np.ndarray, kind: T) -> None:
        if kind == T.F32:
            self.w.add_tensor(name, data)
        elif kind == T.F16:
            self.w.add_tensor(name, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, kind)
            self.w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=kind)


def attention_block(wt: Weights, b: str, n_head: int, n_head_kv: int, head_dim: int, bias: bool = False,
                    qk_norm: bool = False) -> None:
    wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
    wt.mat(b + "attn_q.weight", N_EMBD, n_head * head_dim)
    wt.mat(b + "attn_k.weight", N_EMBD, n_head_kv * head_dim)
    wt.mat(b + "attn_v.weight", N_EMBD, n_head_kv * head_dim)
    wt.mat(b + "attn_output.weight", n_head * head_dim, N_EMBD)
    if bias:
        wt.vec(b + "attn_q.bias", (n_head * head_dim,))
        wt.vec(b + "attn_k.bias", (n_head_kv * head_dim,))
        wt.vec(b + "attn_v.bias", (n_head_kv * head_dim,))
    if qk_norm:
        wt.vec(b + "attn_q_norm.weight", (head_dim,), 1.0)
        wt.vec(b + "attn_k_norm.weight", (head_dim,), 1.0)


def ffn_block(wt: Weights, b: str, n_ff: int) -> None:
    wt.vec(b + "ffn_norm.weight", (N_EMBD,), 1.0)
    wt.mat(b + "ffn_gate.weight", N_EMBD, n_ff)
    wt.mat(b + "ffn_up.weight", N_EMBD, n_ff)
    wt.mat(b + "ffn_down.weight", n_ff, N_EMBD)


def common(w: gguf.GGUFWriter, wt: Weights, v: dict, n_layer: int, n_ff: int, n_ctx_train: int = 2048,
           embd_scale: float = 1.0) -> None:
    add_vocab(w, v)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    wt.mat("token_embd.weight", N_EMBD, N_VOCAB, scale=embd_scale)


def transformer(name: str, arch: str, seed: int, kind: T, bias: bool = False, qk_norm: bool = False,
                rope_freqs: bool = False, yarn: bool = False) -> Path:
    v = smollm2_vocab()
    path = OUT / f"tiny-{name}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, kind)
    n_layer, n_head, n_head_kv, head_dim, n_ff = 2, 4, 2, 16, 128
    common(w, wt, v, n_layer, n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(256)
    if rope_freqs:  # Llama 3.1's per-dimension frequency factors (n_rot / 2 of them)
        wt.put("rope_freqs.weight", np.linspace(1.0, 8.0, head_dim // 2).astype(np.float32), T.F32)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il in range(n_layer):
        b = f"blk.{il}."
        attention_block(wt, b, n_head, n_head_kv, head_dim, bias, qk_norm)
        ffn_block(wt, b, n_ff)
    return finish(w)


def moe(name: str, arch: str, seed: int, kind: T, n_expert: int, n_expert_used: int, n_ff_exp: int,
        n_ff_shexp: int = 0) -> Path:
    """A transformer whose FFNs are mixtures of experts (build_moe_ffn): qwen3moe (qwen3 with experts), llama
    with experts (Mixtral) or qwen2moe (qwen2's attention biases, and a shared expert of width n_ff_shexp beside
    the routed ones, gated per token by a sigmoid). The router's logits are scaled up so that the top experts are
    clearly chosen."""
    v = smollm2_vocab()
    path = OUT / f"tiny-{name}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, kind)
    n_layer, n_head, n_head_kv, head_dim = 2, 4, 2, 16
    common(w, wt, v, n_layer, n_ff_exp if arch == "llama" else n_ff_exp * n_expert_used)  # llama: n_ff is an expert's
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    if arch == "qwen3moe":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch in ("qwen3moe", "qwen2moe"):
        w.add_expert_feed_forward_length(n_ff_exp)
    if n_ff_shexp:
        w.add_expert_shared_feed_forward_length(n_ff_shexp)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il in range(n_layer):
        b = f"blk.{il}."
        attention_block(wt, b, n_head, n_head_kv, head_dim, bias=arch == "qwen2moe", qk_norm=arch == "qwen3moe")
        wt.vec(b + "ffn_norm.weight", (N_EMBD,), 1.0)
        wt.mat(b + "ffn_gate_inp.weight", N_EMBD, n_expert, scale=4.0 / np.sqrt(N_EMBD), kind=T.F32)
        for part, ne0, ne1 in (("gate", N_EMBD, n_ff_exp), ("up", N_EMBD, n_ff_exp), ("down", n_ff_exp, N_EMBD)):
            data = wt.rng.standard_normal((n_expert, ne1, ne0)) / np.sqrt(ne0)  # ggml (ne0, ne1, n_expert)
            wt.put(f"{b}ffn_{part}_exps.weight", data.astype(np.float32), kind)
        if n_ff_shexp:  # the shared expert's gate is a vector: one logit per token
            wt.vec(b + "ffn_gate_inp_shexp.weight", (N_EMBD,), 0.0, 2.0 / np.sqrt(N_EMBD))
            wt.mat(b + "ffn_gate_shexp.weight", N_EMBD, n_ff_shexp)
            wt.mat(b + "ffn_up_shexp.weight", N_EMBD, n_ff_shexp)
            wt.mat(b + "ffn_down_shexp.weight", n_ff_shexp, N_EMBD)
    return finish(w)


def mamba2(seed: int = 5, name: str = "mamba2", d_state: int = 16, n_group: int = 2) -> Path:
    """d_state 16 runs ggml_ssm_scan's scalar loop; 128 (mamba2-s128, as real Mamba-2 models) its SIMD lanes."""
    v = smollm2_vocab()
    path = OUT / f"tiny-{name}.gguf"
    w = gguf.GGUFWriter(str(path), "mamba2")
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, T.F32)
    n_layer, d_inner, head_dim, d_conv = 2, 128, 32, 4
    n_head = d_inner // head_dim  # = dt_rank
    common(w, wt, v, n_layer, 0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_head)
    w.add_ssm_group_count(n_group)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)  # untied: a tied output would favour repeating the input token
    conv_dim = d_inner + 2 * n_group * d_state
    for il in range(n_layer):
        b = f"blk.{il}."
        wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
        wt.mat(b + "ssm_in.weight", N_EMBD, d_inner + conv_dim + n_head)
        wt.vec(b + "ssm_conv1d.weight", (d_conv, conv_dim), 0.0, 0.5)
        wt.vec(b + "ssm_conv1d.bias", (conv_dim,))
        wt.vec(b + "ssm_dt.bias", (n_head,), -1.0, 0.5)
        wt.put(b + "ssm_a", -np.exp(wt.rng.uniform(0.0, 1.5, (n_head, 1))).astype(np.float32), T.F32)
        wt.vec(b + "ssm_d", (1, n_head), 1.0)
        wt.vec(b + "ssm_norm.weight", (d_inner // n_group, n_group), 1.0)
        wt.mat(b + "ssm_out.weight", d_inner, N_EMBD, scale=2.0 / np.sqrt(d_inner))
    return finish(w)


def lfm2(seed: int = 6) -> Path:
    v = smollm2_vocab()
    path = OUT / "tiny-lfm2.gguf"
    w = gguf.GGUFWriter(str(path), "lfm2")
    w.add_name("tiny lfm2")
    wt = Weights(w, seed, T.F16)
    n_head, head_dim, n_ff, l_cache = 4, 16, 128, 3
    kv = [0, 2, 0, 2]  # conv, attention, conv, attention
    common(w, wt, v, len(kv), n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(1000000.0)
    w.add_shortconv_l_cache(l_cache)
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
        ffn_block(wt, b, n_ff)
    return finish(w)


def dense_family(name: str, arch: str, seed: int, kind: T, n_layer: int) -> Path:
    """The llama-like families (llamactx/models/phi3.py, gemma2.py, smollm3.py, granite.py) at n_embd 64, 4 heads
    of 16 (2 KV heads): phi3 with fused attn_qkv and a gate+up ffn_up; gemma2 with a window of 8 tokens on its
    even layers, both soft-caps, post-norms and tied output; smollm3 with 4 layers (the fourth without RoPE);
    granite with its four scales."""
    v = smollm2_vocab()
    path = OUT / f"tiny-{name}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    # not "phi3" in the name: llama_vocab::load gives a "phi-3"/"phi3" model's special tokens Phi-3's strip flags
    # and looks up "</s>", which this vocabulary lacks
    w.add_name(f"tiny {name}".replace("phi3", "phi 3"))
    wt = Weights(w, seed, kind)
    n_head, n_head_kv, head_dim, n_ff = 4, 2, 16, 128
    common(w, wt, v, n_layer, n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    if arch == "gemma2":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_sliding_window(8)
        w.add_attn_logit_softcapping(10.0)  # Gemma 2's own are 50 and 30: a smaller cap bends more of the scores
        w.add_final_logit_softcapping(30.0)
    if arch == "granite":
        w.add_embedding_scale(12.0)
        w.add_residual_scale(0.22)
        w.add_attention_scale(0.3)
        w.add_logit_scale(8.0)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    if arch != "gemma2":
        wt.mat("output.weight", N_EMBD, N_VOCAB)
    n_kv = n_head_kv * head_dim
    for il in range(n_layer):
        b = f"blk.{il}."
        if arch == "phi3":
            wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
            wt.mat(b + "attn_qkv.weight", N_EMBD, n_head * head_dim + 2 * n_kv)
            wt.mat(b + "attn_output.weight", n_head * head_dim, N_EMBD)
            wt.vec(b + "ffn_norm.weight", (N_EMBD,), 1.0)
            wt.mat(b + "ffn_up.weight", N_EMBD, 2 * n_ff)  # gate rows, then up rows
            wt.mat(b + "ffn_down.weight", n_ff, N_EMBD)
            continue
        attention_block(wt, b, n_head, n_head_kv, head_dim)
        ffn_block(wt, b, n_ff)
        if arch == "gemma2":  # gains of 32: else the embeddings (times 8) outweigh the layers in the residual
            wt.vec(b + "post_attention_norm.weight", (N_EMBD,), 32.0)  # and the tied output repeats the last token
            wt.vec(b + "post_ffw_norm.weight", (N_EMBD,), 32.0)
    return finish(w)


def gpt_oss(name: str, seed: int, kind: T, expert_kind: T) -> Path:
    """gpt-oss (llamactx/models/gpt_oss.py) at n_embd 64: 4 layers (0 and 2 slide over a window of 8 tokens),
    4 heads of 32 (2 KV heads; q is 128 wide, not n_embd) with q/k/v/output biases and attention sinks, YaRN RoPE
    (factor 8 over 256 positions), 8 experts of 64 (2 used) with router and expert biases, and the "gpt-4o"
    pre-tokenizer over the SmolLM2 vocabulary. The experts' gate and up outputs spread past swiglu_oai's limit of 7;
    the sinks are about as large as the attention scores, so that both sides of each max are taken."""
    v = smollm2_vocab()
    path = OUT / f"tiny-{name}.gguf"
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_name(f"tiny {name}")
    wt = Weights(w, seed, kind)
    n_layer, n_head, n_head_kv, head_dim, n_expert, n_ff_exp = 4, 4, 2, 32, 8, 64
    common(w, wt, dict(v, pre="gpt-4o"), n_layer, n_ff_exp)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(150000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(8.0)
    w.add_rope_scaling_orig_ctx_len(256)
    w.add_sliding_window(8)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(n_ff_exp)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
    for il in range(n_layer):
        b = f"blk.{il}."
        wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
        for part, ne1 in (("q", n_q), ("k", n_kv), ("v", n_kv)):
            wt.mat(f"{b}attn_{part}.weight", N_EMBD, ne1)
            wt.vec(f"{b}attn_{part}.bias", (ne1,))
        wt.mat(b + "attn_output.weight", n_q, N_EMBD)
        wt.vec(b + "attn_output.bias", (N_EMBD,))
        wt.vec(b + "attn_sinks.weight", (n_head,), 0.5, 1.5)
        wt.vec(b + "post_attention_norm.weight", (N_EMBD,), 1.0)
        wt.mat(b + "ffn_gate_inp.weight", N_EMBD, n_expert, scale=4.0 / np.sqrt(N_EMBD), kind=T.F32)
        wt.vec(b + "ffn_gate_inp.bias", (n_expert,))
        for part, ne0, ne1, scale in (("gate", N_EMBD, n_ff_exp, 3.0), ("up", N_EMBD, n_ff_exp, 3.0),
                                      ("down", n_ff_exp, N_EMBD, 0.5)):
            data = wt.rng.standard_normal((n_expert, ne1, ne0)) * scale / np.sqrt(ne0)  # ggml (ne0, ne1, n_expert)
            wt.put(f"{b}ffn_{part}_exps.weight", data.astype(np.float32), expert_kind)
            wt.vec(f"{b}ffn_{part}_exps.bias", (ne1, n_expert), 0.0, 0.5)
    return finish(w)


def mistral3(seed: int = 17) -> Path:
    """mistral3 (Ministral 3; llamactx/models/llama.py) at n_embd 64, 4 heads of 16 (2 KV heads), Q8_0: YaRN
    (factor 4 over an original context of 8, betas 16 / 2 instead of 32 / 1, yarn_log_multiplier 1 as the
    converter writes mscale_all_dim) and an attention temperature scale of 0.5, whose floor scale is that original
    context: Q's factor 1 + 0.5 ln(floor(pos / 8) + 1) changes every 8 positions of the prompts and greedy steps."""
    v = smollm2_vocab()
    path = OUT / "tiny-mistral3.gguf"
    w = gguf.GGUFWriter(str(path), "mistral3")
    w.add_name("tiny mistral3")
    wt = Weights(w, seed, T.Q8_0)
    n_layer, n_head, n_head_kv, head_dim, n_ff = 2, 4, 2, 16, 128
    common(w, wt, v, n_layer, n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(8)
    w.add_rope_scaling_yarn_beta_fast(16.0)
    w.add_rope_scaling_yarn_beta_slow(2.0)
    w.add_rope_scaling_yarn_log_mul(1.0)
    w.add_attn_temperature_scale(0.5)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    wt.mat("output.weight", N_EMBD, N_VOCAB)
    for il in range(n_layer):
        b = f"blk.{il}."
        attention_block(wt, b, n_head, n_head_kv, head_dim)
        ffn_block(wt, b, n_ff)
    return finish(w)


def phi3_longrope(name: str, seed: int, n_head_kv: int, n_rot: int, tied: bool) -> Path:
    """phi3 with LongRoPE (llamactx/models/phi3.py) at n_embd 64, 4 heads of 16, Q8_0, fused attn_qkv: trained
    for 4096 positions from an original 512 (`rope.scaling.original_context_length`), so a context of more than
    512 tokens per sequence takes `rope_factors_long` (1 .. 16) and a smaller one `rope_factors_short` (1 .. 1.5),
    n_rot/2 each; `rope.scaling.attn_factor` is the converter's sqrt(1 + ln(4096 / 512) / ln(512)).
    phi3-longrope has Phi-3.5-mini-128k's layout (every head's dimensions rotated, one KV head per head, its own
    output matrix); phi4-mini Phi-4-mini's (a partial rotation of 12 of 16, 2 KV heads, output tied to the
    embeddings)."""
    v = smollm2_vocab()
    path = OUT / f"tiny-{name}.gguf"
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_name(f"tiny {name}".replace("phi3", "phi 3").replace("phi4", "phi 4"))  # see dense_family
    wt = Weights(w, seed, T.Q8_0)
    n_layer, n_head, head_dim, n_ff = 2, 4, 16, 128
    # tied: embeddings of norm 1, else the logits favour repeating the input token
    common(w, wt, v, n_layer, n_ff, n_ctx_train=4096, embd_scale=0.125 if tied else 1.0)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(n_rot)
    w.add_rope_scaling_orig_ctx_len(512)
    w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(4096 / 512) / np.log(512))))
    w.add_sliding_window(0)  # as the converter writes for Phi-4
    wt.put("rope_factors_long.weight", np.linspace(1.0, 16.0, n_rot // 2).astype(np.float32), T.F32)
    wt.put("rope_factors_short.weight", np.linspace(1.0, 1.5, n_rot // 2).astype(np.float32), T.F32)
    wt.vec("output_norm.weight", (N_EMBD,), 1.0)
    if not tied:
        wt.mat("output.weight", N_EMBD, N_VOCAB)
    n_kv = n_head_kv * head_dim
    for il in range(n_layer):
        b = f"blk.{il}."
        wt.vec(b + "attn_norm.weight", (N_EMBD,), 1.0)
        wt.mat(b + "attn_qkv.weight", N_EMBD, n_head * head_dim + 2 * n_kv)
        wt.mat(b + "attn_output.weight", n_head * head_dim, N_EMBD)
        wt.vec(b + "ffn_norm.weight", (N_EMBD,), 1.0)
        wt.mat(b + "ffn_up.weight", N_EMBD, 2 * n_ff)  # gate rows, then up rows
        wt.mat(b + "ffn_down.weight", n_ff, N_EMBD)
    return finish(w)


MODELS = {
    "qwen2": lambda: transformer("qwen2", "qwen2", 1, T.Q8_0, bias=True),
    "qwen3": lambda: transformer("qwen3", "qwen3", 2, T.F16, qk_norm=True),
    "llama3": lambda: transformer("llama3", "llama", 3, T.F32, rope_freqs=True),
    "yarn": lambda: transformer("yarn", "llama", 4, T.F16, yarn=True),
    "mamba2": mamba2,
    "mamba2-s128": lambda: mamba2(7, "mamba2-s128", d_state=128, n_group=1),
    "lfm2": lfm2,
    "qwen3moe": lambda: moe("qwen3moe", "qwen3moe", 8, T.Q8_0, n_expert=8, n_expert_used=2, n_ff_exp=32),
    "mixtral": lambda: moe("mixtral", "llama", 9, T.F16, n_expert=4, n_expert_used=2, n_ff_exp=64),
    "llama-q4_0": lambda: transformer("llama-q4_0", "llama", 11, T.Q4_0),  # repacked 8x8 by llama.cpp
    "qwen3moe-q4_0": lambda: moe("qwen3moe-q4_0", "qwen3moe", 12, T.Q4_0, n_expert=8, n_expert_used=2, n_ff_exp=32),
    "qwen2moe": lambda: moe("qwen2moe", "qwen2moe", 16, T.Q8_0, n_expert=8, n_expert_used=2, n_ff_exp=32,
                            n_ff_shexp=64),
    "phi3": lambda: dense_family("phi3", "phi3", 10, T.Q8_0, 2),
    "gemma2": lambda: dense_family("gemma2", "gemma2", 11, T.F16, 4),
    "smollm3": lambda: dense_family("smollm3", "smollm3", 12, T.F32, 4),
    "granite": lambda: dense_family("granite", "granite", 13, T.Q8_0, 2),
    "gpt-oss": lambda: gpt_oss("gpt-oss", 14, T.Q8_0, T.Q8_0),
    "gpt-oss-mxfp4": lambda: gpt_oss("gpt-oss-mxfp4", 15, T.F16, T.MXFP4),  # the released models' expert type
    "mistral3": mistral3,
    "phi3-longrope": lambda: phi3_longrope("phi3-longrope", 18, n_head_kv=4, n_rot=16, tied=False),
    "phi4-mini": lambda: phi3_longrope("phi4-mini", 19, n_head_kv=2, n_rot=12, tied=True),
}

if __name__ == "__main__":
    for name in sys.argv[1:] or MODELS:
        print(MODELS[name]())

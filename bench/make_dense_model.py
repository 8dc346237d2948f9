"""Write a synthetic dense GGUF of a real model's shape for speed benchmarks: random weights, no download.

Shapes (`--shape`): llama-1b (Llama-3.2-1B: 16 layers, n_embd 2048, n_ff 8192, 32/8 heads, tied embeddings),
llama-8b (Llama-3.1-8B: 32 layers, 4096, 14336, 32/8 heads, separate output head), qwen3-4b (Qwen3-4B: 36 layers,
2560, 9728, 32/8 heads of 128, Q/K norm, tied). The vocabulary has the real model's size (128256 / 151936 tokens):
SmolLM2's tokenizer padded with control tokens, so the output head reads what the real one reads.

`--type` picks the file type: q4_k_m (llama-quantize's mix: Q4_K, with Q6_K for the output / tied embeddings and
for attn_v / ffn_down on the layers `use_more_bits` picks), q4_k, q5_k, q6_k, q8_0, q4_0. The blocks are random bytes
with small, finite scales (random weights of a plausible size): only the bytes read per token matter for speed.

Usage: python bench/make_dense_model.py [--shape llama-1b] [--type q4_k_m] [OUT.gguf]
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

# name: (arch, n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, tied)
SHAPES = {
    "llama-1b": ("llama", 16, 2048, 8192, 32, 8, 64, 128256, True),
    "llama-8b": ("llama", 32, 4096, 14336, 32, 8, 128, 128256, False),
    "qwen3-4b": ("qwen3", 36, 2560, 9728, 32, 8, 128, 151936, True),
}
# block bytes / block elements, and the byte offsets of the fp16 scales inside a block
# and a typical |quant x sub-block scale| product, so that weights come out near 1/sqrt(n_in)
LAYOUT = {
    T.Q4_K: (144, 256, (0, 2), 200), T.Q5_K: (176, 256, (0, 2), 400), T.Q6_K: (210, 256, (208,), 1000),
    T.Q8_0: (34, 32, (0,), 64), T.Q4_0: (18, 32, (0,), 8),
}
FILE_TYPES = {
    "q4_k_m": (T.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M), "q4_k": (T.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    "q5_k": (T.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_S), "q6_k": (T.Q6_K, gguf.LlamaFileType.MOSTLY_Q6_K),
    "q8_0": (T.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0), "q4_0": (T.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}


def random_blocks(rng: np.random.Generator, rows: int, cols: int, kind: T, scale: float) -> np.ndarray:
    """`rows` x `cols` weights of type `kind` as random block bytes, each fp16 scale set to about `scale`."""
    nbytes, nel, scale_at, typical = LAYOUT[kind]
    scale /= typical
    nblk = cols // nel
    data = rng.integers(0, 256, size=(rows, nblk, nbytes), dtype=np.uint8)
    for off in scale_at:
        d = (rng.uniform(0.5, 1.5, size=(rows, nblk)) * scale).astype(np.float16)
        data[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, nblk, 2)
    return data.reshape(rows, nblk * nbytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=None, help="default /tmp/dense-<shape>-<type>.gguf")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    ap.add_argument("--type", choices=sorted(FILE_TYPES), default="q4_k_m")
    args = ap.parse_args()
    out = args.out or f"/tmp/dense-{args.shape}-{args.type}.gguf"
    arch, n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, tied = SHAPES[args.shape]
    kind, ftype = FILE_TYPES[args.type]
    mix = args.type == "q4_k_m"
    meta = GGUFFile(smollm2_path()).meta
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(out, arch)
    w.add_name(f"synthetic {args.shape} {args.type}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    pad = n_vocab - len(tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(tokens + [f"<|pad_{i}|>" for i in range(pad)])
    w.add_token_types(types + [int(gguf.TokenType.CONTROL)] * pad)
    w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_context_length(8192)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_file_type(ftype)

    def put(name: str, rows: int, cols: int, kind_: T) -> None:
        data = random_blocks(rng, rows, cols, kind_, cols ** -0.5)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind_)

    def more_bits(il: int) -> bool:  # llama-quant.cpp's use_more_bits(i_layer, n_layers)
        return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2

    head_kind = T.Q6_K if mix else kind
    put("token_embd.weight", n_vocab, n_embd, head_kind if tied else kind)
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    if not tied:
        put("output.weight", n_vocab, n_embd, head_kind)
    for il in range(n_layer):
        b = f"blk.{il}."
        bump = T.Q6_K if mix and more_bits(il) else kind
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(b + name + ".weight", np.ones(n_embd, np.float32))
        if arch == "qwen3":
            for name in ("attn_q_norm", "attn_k_norm"):
                w.add_tensor(b + name + ".weight", np.ones(head_dim, np.float32))
        put(b + "attn_q.weight", n_head * head_dim, n_embd, kind)
        put(b + "attn_k.weight", n_head_kv * head_dim, n_embd, kind)
        put(b + "attn_v.weight", n_head_kv * head_dim, n_embd, bump)
        put(b + "attn_output.weight", n_embd, n_head * head_dim, kind)
        put(b + "ffn_gate.weight", n_ff, n_embd, kind)
        put(b + "ffn_up.weight", n_ff, n_embd, kind)
        put(b + "ffn_down.weight", n_embd, n_ff, bump)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = Path(out).stat().st_size
    print(f"{out}: {args.shape} {args.type}, {size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()

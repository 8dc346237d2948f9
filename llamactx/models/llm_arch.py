"""Every architecture name llama.cpp knows (src/llama-arch.cpp, LLM_ARCH_NAMES), for `vocab_only` loading.

llama.cpp loads the vocabulary of any architecture it names without reading its hyperparameters
(llama_model::load_hparams returns before them when hparams.vocab_only), so a tokenizer-only GGUF of an
architecture whose graph llamactx lacks still loads with `vocab_only`. A full load of such a model fails with
"architecture 'x' is not supported" as before; a name llama.cpp does not know fails either way
(llm_arch_from_string: LLM_ARCH_UNKNOWN, "unknown model architecture").
"""

from __future__ import annotations

from llamactx.hparams import HParams, HParamsError
from llamactx.models import ARCHITECTURES, load_hparams

# LLM_ARCH_NAMES at 0c1e570, less "clip" (llama_model_load refuses it as a main model) and "(unknown)"
LLM_ARCH_NAMES = frozenset(
    """
    llama llama4 deci falcon grok gpt2 gptj gptneox mpt baichuan starcoder refact bert modern-bert nomic-bert
    nomic-bert-moe neo-bert jina-bert-v2 jina-bert-v3 eurobert bloom stablelm qwen qwen2 qwen2moe qwen2vl
    qwen3 qwen3moe qwen3next qwen3vl qwen3vlmoe qwen35 qwen35moe qwen4exp phi2 phi3 phimoe plamo plamo2
    plamo3 codeshell orion internlm2 minicpm minicpm3 gemma gemma2 gemma3 gemma3n gemma4 gemma4-assistant
    gemma-embedding starcoder2 mamba mamba2 maple jamba falcon-h1 xverse command-r cohere2 cohere2moe dbrx
    olmo olmo2 olmoe muse-glimmer openelm arctic deepseek deepseek2 deepseek2-ocr deepseek32 deepseek4 chatglm
    glm4 glm4moe glm-dsa bitnet t5 t5encoder jais jais2 nemotron nemotron_h nemotron_h_moe exaone exaone4
    exaone-moe rwkv6 rwkv6qwen2 rwkv7 arwkv7 granite granitemoe granitehybrid graniteswitch granite_swa
    chameleon wavtokenizer-dec plm bailingmoe bailingmoe2 bailingmoe3 dots1 dots3note arcee afmoe laguna
    ernie4_5 ernie4_5-moe hunyuan-moe hunyuan-dense hunyuan_vl hy_v3 hy_v4 smollm3 gpt-oss lfm2 lfm2moe
    dream smallthinker llada llada-moe seed_oss grovemoe apertus minimax-01 hrm_text minimax-m2 minimax-m3
    cogvlm rnd1 pangu-embedded mistral3 eagle3 dflash mistral4 paddleocr mimo2 step35 spark2_5 llama-embed
    maincoder kimi-linear kimi-k3 glm5-next talkie mellum nanbeige qwen3tts pockettts
    """.split()
)


def load_vocab_only_hparams(meta: dict[str, object], n_params: int = 0) -> HParams:
    """`load_hparams` for a `vocab_only` load: an architecture llamactx runs reads its hyperparameters as a full
    load does, unless they are missing or bad (a tokenizer-only file: llama.cpp reads none of them); any other
    that llama.cpp names, or those, get `vocab_only_hparams`."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return load_hparams(meta, n_params)  # the missing key's error
    if arch in ARCHITECTURES:
        try:
            return load_hparams(meta, n_params)
        except HParamsError:
            pass
    return vocab_only_hparams(meta, arch)


def vocab_only_hparams(meta: dict[str, object], arch: str) -> HParams:
    """The hyperparameters of a `vocab_only` model whose graph llamactx lacks: the architecture and the vocab size,
    every other count 0 (llama.cpp reads none of them for vocab_only). Raises HParamsError for a name llama.cpp
    does not know."""
    if arch not in LLM_ARCH_NAMES:
        raise HParamsError(f"GGUF metadata key 'general.architecture' = {arch!r} is not an architecture llama.cpp "
                           f"knows (unknown model architecture)")
    tokens = meta.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, list) else 0
    return HParams(
        arch=arch, n_vocab=n_vocab, n_ctx_train=0, n_embd=0, n_layer=0, n_head=0, n_head_kv=0, n_embd_head_k=0,
        n_embd_head_v=0, n_ff=0, n_rot=0, rope_type=-1, rope_freq_base=0.0, rope_freq_scale=1.0,
        rope_scaling_type="none", n_ctx_orig_yarn=0, rope_attn_factor=1.0, rope_yarn_log_mul=0.0,
        yarn_ext_factor=-1.0, yarn_attn_factor=1.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0, f_norm_rms_eps=0.0,
        n_swa=0, swa_layers=(), rope_freq_base_swa=0.0, rope_freq_scale_swa=1.0, f_attention_scale=0.0,
        f_final_logit_softcapping=0.0, embd_scale=1.0, size_label="0M",
    )

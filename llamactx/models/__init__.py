"""The architecture registry (llama.cpp's llm_arch and `llama_model`'s per-architecture switches, src/models/*.cpp).

Each architecture is declared once, by its module:
- `ARCHS`: the `general.architecture` names it runs, with their RoPE type (llama_model_rope_type);
- `MEMORY`: "kv", "recurrent", "hybrid" or "none" (an encoder) (what llama_model::create_memory makes for it);
- `arch_hparams(meta, fields)`: its own metadata keys and checks (load_arch_hparams);
- `tensor_shapes(hp)`: its tensors (load_arch_tensors);
- `build(ops, params)`: its graph (llm_build_*), one ubatch computed by `ops` from a GraphParams
  (llamactx/backend/ops.py); the context runs it as `ops.compute_graph(module.build, params)`.
Adding an architecture is one module and one entry in MODULES. `llm_arch` names every architecture llama.cpp
knows: those load with `vocab_only` whether or not a module here runs them.

    llm_arch.py     every architecture name llama.cpp knows (LLM_ARCH_NAMES), for vocab_only loading
    graph_inputs.py what a forward pass needs besides the weights (llm_graph_input_*): attention input, outputs
    moe.py          the mixture-of-experts FFN block (build_moe_ffn), shared by the MoE architectures
    llama.py        llama, and qwen2 / qwen3 / qwen3moe ... (src/models/llama.cpp): SmolLM2, Llama 2/3, Mistral
    mistral3.py     mistral3 (Ministral 3): llama's graph with its own hparams
    smollm3.py      smollm3: llama's graph without RoPE on every fourth layer
    granite.py      granite (Granite 3.x dense): llama's graph with four scalars
    phi3.py         phi3 (Phi-3 / 3.5 / 4 mini): fused qkv, LongRoPE
    gemma2.py       gemma2: the iSWA graph, logit soft-capping
    gemma3.py       gemma3: the iSWA graph, q / k norms
    gemma4.py       gemma4: per-layer head sizes, per-layer embeddings
    gpt_oss.py      gpt-oss (openai-moe): iSWA, attention sinks, experts
    deepseek2.py    deepseek2 (DeepSeek-V2 / V3, Kimi K2): multi-head latent attention (MLA), experts
    glm4moe.py      glm4moe (GLM-4.5 / 4.6 / 4.7): experts with a shared expert
    bert.py         bert, nomic-bert: encoders (embeddings only)
    mamba2.py       mamba2: state-space layers (recurrent memory)
    lfm2.py         lfm2, lfm2moe: short convolutions and attention (hybrid memory)
    granite_hybrid.py  granitehybrid (Granite 4.0 H): Mamba-2 and attention layers
    nemotron_h.py   nemotron_h (Nemotron-H, Nano 2): Mamba-2, attention and FFN layers
    qwen35.py       qwen35, qwen35moe (Qwen3.5): gated delta-net and gated attention layers
    qwen3next.py    qwen3next (Qwen3-Next): Qwen3.5's hybrid in its first arrangement
"""

from __future__ import annotations

import functools
from types import ModuleType

from llamactx.cparams import ContextParamsError, ResolvedParams
from llamactx.hparams import HParams, HParamsError, read_hparams
from llamactx.memory.base import Memory
from llamactx.memory.hybrid import HybridMemory
from llamactx.memory.kv_cache import KVCache, kv_row_nbytes
from llamactx.memory.kv_cache_iswa import KVCacheISWA
from llamactx.memory.recurrent import RecurrentMemory
from llamactx.models import (
    bert,
    deepseek2,
    gemma2,
    gemma3,
    gemma4,
    glm4moe,
    gpt_oss,
    granite,
    granite_hybrid,
    lfm2,
    llama,
    mamba2,
    mistral3,
    nemotron_h,
    phi3,
    qwen3next,
    qwen35,
    smollm3,
)

MODULES = (llama, gemma3, mamba2, lfm2, phi3, gemma2, smollm3, granite, bert, gpt_oss, qwen35, mistral3,
           gemma4, deepseek2, granite_hybrid, nemotron_h, glm4moe, qwen3next)
ARCHITECTURES: dict[str, ModuleType] = {name: module for module in MODULES for name in module.ARCHS}


def arch_module(arch: str) -> ModuleType:
    if arch not in ARCHITECTURES:
        raise HParamsError(f"architecture '{arch}' is not supported (supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch]


def load_hparams(meta: dict[str, object], n_params: int = 0) -> HParams:
    """llama_model::load_hparams: the common keys, then the architecture's own. HParamsError names the key."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise HParamsError("GGUF metadata key 'general.architecture' is missing")
    module = arch_module(arch)
    read_arch = module.arch_hparams
    if hasattr(module, "common_meta"):  # nemotron_h: per-layer values its arch_hparams reads from the file's keys
        meta, read_arch = module.common_meta(meta), functools.partial(module.arch_hparams, meta)
    return read_hparams(meta, arch, module.ARCHS[arch], module.MEMORY, read_arch, n_params,
                        per_layer_heads=getattr(module, "PER_LAYER_HEADS", False),
                        v_length_free=getattr(module, "V_LENGTH_FREE", False))


def expected_tensors(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Tensor name -> (ggml shape, required) for a model with these hparams."""
    return arch_module(hp.arch).tensor_shapes(hp)


def refused_tensors(hp: HParams) -> dict[str, str]:
    """Tensors that llama.cpp would use but llamactx does not compute for this architecture: name -> why
    (`Model.load` refuses a file holding one, rather than give other logits than llama.cpp)."""
    module = arch_module(hp.arch)
    return module.refused_tensors(hp) if hasattr(module, "refused_tensors") else {}


def memory_type(arch: str) -> str:
    """The memory a context of this architecture needs: "kv" (llama_kv_cache), "recurrent"
    (llama_memory_recurrent) or "hybrid" (llama_memory_hybrid)."""
    return arch_module(arch).MEMORY


def create_memory(hp: HParams, p: ResolvedParams) -> Memory | None:
    """llama_model::create_memory: a KV cache, an iSWA cache for a model with sliding-window layers (unless
    swa_full); for a recurrent model (mamba2) one state per sequence; for a hybrid (lfm2) a KV cache of the
    attention layers beside the recurrent states of the others."""
    kind = memory_type(hp.arch)
    if kind == "none":  # an encoder (bert): llama.cpp's create_memory returns nullptr
        return None
    recr = [il for il in range(hp.n_layer) if hp.is_recr(il)]
    attn = [il for il in range(hp.n_layer) if not hp.is_recr(il)]
    if kind == "recurrent":
        return RecurrentMemory(recr, p.n_seq_max, hp.n_embd_r, hp.n_embd_s)
    # per-layer K/V widths or shared KV layers (gemma4): always the two caches, swa_full sizing the SWA one
    per_layer = bool(hp.n_head_kv_arr or hp.n_embd_head_k_swa or hp.n_rot_swa) or hp.n_layer_kv_from_start >= 0
    if kind == "kv" and hp.n_swa > 0 and (not p.swa_full or per_layer) and any(hp.swa_layers):
        return KVCacheISWA(hp, p.n_ctx, p.n_seq_max, p.n_ubatch, p.type_k, p.type_v, n_ctx_seq=p.n_ctx_seq,
                           layout_exact=p.kv_layout_exact, swa_full=p.swa_full,
                           n_embd_gqa_swa=hp.layer_n_embd_gqa(hp.swa_layers.index(True)),
                           reuse={il: hp.kv_reuse(il) for il in range(hp.n_layer) if hp.kv_reuse(il) >= 0},
                           k_shift=not per_layer)
    if hp.n_embd_head_k_mla:  # MLA (deepseek2): K-only storage, V the latent part of each K row
        if p.type_k != p.type_v:  # llama_init_from_model refuses it
            raise ContextParamsError(f"type_k = {p.type_k!r} and type_v = {p.type_v!r}: {hp.arch} (MLA) needs the "
                                     f"same K and V cache types")
        return KVCache(len(attn), p.n_ctx, p.n_seq_max, hp.n_embd_k_gqa, 0, p.type_k, p.type_v, can_shift=True,
                       n_ctx_seq=p.n_ctx_seq, v_of_k=hp.n_embd_v_gqa)
    kv = KVCache(len(attn), p.n_ctx, p.n_seq_max, hp.n_embd_k_gqa, hp.n_embd_v_gqa, p.type_k, p.type_v,
                 can_shift=True, n_ctx_seq=p.n_ctx_seq)
    if kind == "hybrid":
        return HybridMemory(kv, RecurrentMemory(recr, p.n_seq_max, hp.n_embd_r, hp.n_embd_s), attn)
    return kv


def memory_description(hp: HParams, swa_full: bool = False) -> str:
    """What `create_memory` gives a model, in llama.cpp's class names (`llamactx info`)."""
    kind = memory_type(hp.arch)
    if kind == "none":
        return "none (an encoder: each batch is encoded whole, llama_encode)"
    if kind == "recurrent":
        return "recurrent states (llama_memory_recurrent)"
    if kind == "hybrid":
        return "KV cache + recurrent states (llama_memory_hybrid)"
    if hp.n_swa > 0 and any(hp.swa_layers):
        n_swa_layers = sum(hp.swa_layers)
        split = (f"{hp.n_layer - n_swa_layers} global layers, {n_swa_layers} sliding-window layers of "
                 f"{hp.n_swa} tokens")
        if hp.n_layer_kv_from_start >= 0:  # gemma4: the last layers read earlier layers' KV
            n_kv = hp.n_layer_kv_from_start
            split += (f"; layers {n_kv}-{hp.n_layer - 1} read the KV of layers {n_kv - 2} (sliding) and "
                      f"{n_kv - 1} (global)")
        if swa_full:
            return f"llama_kv_cache ({split}; swa_full: every layer keeps the whole context)"
        return f"llama_kv_cache_iswa ({split}; swa_full keeps a full-size SWA cache)"
    return f"llama_kv_cache ({hp.n_layer} layers)"


def kv_bytes_per_token(hp: HParams, type_k: str = "f16", type_v: str = "f16") -> int:
    """The K and V bytes one token takes in a KV cache holding every layer (llama_kv_cache's per-cell rows:
    n_embd_k_gqa + n_embd_v_gqa per layer; an MLA cache only its K row, the latent and the rope key), 0 for the
    memories whose size is not per token (recurrent, hybrid, iSWA, none)."""
    if memory_type(hp.arch) != "kv" or (hp.n_swa > 0 and any(hp.swa_layers)):
        return 0
    n_v = 0 if hp.n_embd_head_k_mla else hp.n_embd_v_gqa
    return hp.n_layer * (kv_row_nbytes(type_k, hp.n_embd_k_gqa) + (kv_row_nbytes(type_v, n_v) if n_v else 0))


def layer_kinds(hp: HParams) -> str:
    """Each layer's kind, grouped (`llamactx info`): "gated delta net x3 (0-2); full attention x1 (3)". The names
    are the architecture's LAYER_KINDS (recurrent, attention), else "recurrent" / "attention"."""
    module = arch_module(hp.arch)
    names = getattr(module, "LAYER_KINDS", ("recurrent", "attention"))
    groups: dict[str, list[int]] = {}
    for il in range(hp.n_layer):
        if hasattr(module, "layer_kind"):  # nemotron_h: three kinds
            groups.setdefault(module.layer_kind(hp, il), []).append(il)
        else:
            groups.setdefault(names[0] if hp.is_recr(il) else names[1], []).append(il)
    return "; ".join(f"{kind} x{len(layers)} ({_ranges(layers)})" for kind, layers in groups.items())


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 4] -> "0-2, 4"."""
    runs: list[list[int]] = []
    for il in layers:
        if runs and il == runs[-1][-1] + 1:
            runs[-1].append(il)
        else:
            runs.append([il])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)

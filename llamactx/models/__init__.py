"""One module per architecture family: its tensor table and its forward pass (src/models/*.cpp)."""

from __future__ import annotations

from types import ModuleType

from llamactx.hparams import HParams
from llamactx.models import gemma3, lfm2, llama, mamba2

ARCHITECTURES: dict[str, ModuleType] = {"llama": llama, "qwen2": llama, "qwen3": llama, "gemma3": gemma3,
                                        "mamba2": mamba2, "lfm2": lfm2}


def arch_module(arch: str) -> ModuleType:
    if arch not in ARCHITECTURES:
        raise ValueError(f"architecture '{arch}' is not supported (supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch]


def expected_tensors(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Tensor name -> (ggml shape, required) for a model with these hparams."""
    return arch_module(hp.arch).tensor_shapes(hp)


def memory_type(arch: str) -> str:
    """The memory a context of this architecture needs (llama_model::create_memory): "kv" (llama_kv_cache),
    "recurrent" (llama_memory_recurrent) or "hybrid" (llama_memory_hybrid)."""
    return getattr(arch_module(arch), "MEMORY", "kv")

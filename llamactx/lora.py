"""LoRA adapters in llama.cpp's GGUF format: loading (src/llama-adapter.cpp, `llama_adapter_lora_init`) and the
arithmetic the graph adds to each adapted matmul (src/llama-graph.cpp, `llm_graph_context::build_lora_mm`).

An adapter file has `general.type = "adapter"`, `adapter.type = "lora"`, `general.architecture` equal to the
model's, an optional `adapter.lora.alpha` and, for each adapted weight `W` (ggml shape (n_in, n_out)), a pair
`W.lora_a` (n_in, rank) and `W.lora_b` (rank, n_out). An adapter is loaded for one model and shared like the model
(its arrays are read-only views of the file); which adapters apply, at which scale, is a property of each context
(`Context.set_adapters_lora`, as llama_set_adapters_lora). The forward pass gets them through `AdaptedModel`, whose
`weight(name)` returns an `AdaptedWeight` for an adapted matrix; the ops layer's matmul then computes
(build_lora_mm: llamactx.backend.ops.lora_matmuls)
    res = W x;  for each adapter: res = res + scale * (B (A x)),  scale = user_scale * alpha / rank (alpha != 0)
with the same ops (and so the same rounding) as llama.cpp's ggml_mul_mat, ggml_scale and ggml_add.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType

from llamactx.backend.ops import LoraAdaptedWeight
from llamactx.errors import LlamactxError
from llamactx.gguf.reader import GGUFFile
from llamactx.model import Model, Weight

_TYPED = {int(T.F32): np.float32, int(T.F16): np.float16}  # the types convert_lora_to_gguf.py writes by default


class LoraError(LlamactxError, ValueError):
    """An adapter file that is not a LoRA adapter for this model: the message names the key or tensor, its value
    and what was expected."""


@dataclass(frozen=True, slots=True)
class LoraWeight:
    """One adapted weight's pair (llama_adapter_lora_weight): a (n_in, rank) and b (rank, n_out), ggml order."""

    a: Weight
    b: Weight

    @property
    def rank(self) -> int:
        return self.b.shape[0]

    def get_scale(self, alpha: float, adapter_scale: float) -> np.float32:
        """llama_adapter_lora_weight::get_scale, in float: adapter_scale * alpha / rank, or adapter_scale when the
        adapter has no alpha (0)."""
        s = np.float32(adapter_scale)
        return np.float32(s * np.float32(alpha) / np.float32(self.rank)) if alpha else s


class LoraAdapter:
    """A loaded adapter (llama_adapter_lora): `path`, `alpha`, `meta` (its non-array metadata as strings) and
    `weights` (adapted weight name -> LoraWeight). Build with `LoraAdapter.load(model, path)`."""

    def __init__(self, model: Model, path: Path, gguf: GGUFFile, alpha: float, weights: dict[str, LoraWeight]):
        self.model = model
        self.path = path
        self.alpha = alpha
        self.weights = weights
        self.meta = {k: str(v) for k, v in gguf.meta.items() if k not in gguf.meta_array_types}
        self._gguf = gguf

    @classmethod
    def load(cls, model: Model, path: str | os.PathLike) -> LoraAdapter:
        """Open `path` as a LoRA adapter for `model`. Raises `LoraError` for a file that is not a LoRA adapter, one
        for another architecture, a tensor without its pair or with an unexpected suffix, type or shape, or a
        weight the model lacks; `GGUFError` for a malformed GGUF file; OSError if it cannot be opened."""
        path = Path(path)
        gguf = GGUFFile(path)
        try:
            alpha = _check_meta(gguf, model, path.name)
            weights = _load_pairs(gguf, model, path.name)
        except BaseException:
            gguf.close()
            raise
        return cls(model, path, gguf, alpha, weights)

    def __repr__(self) -> str:
        return f"LoraAdapter({self.path.name!r}, alpha={self.alpha}, {len(self.weights)} weights)"

    def close(self) -> None:
        """Release the file map (views already handed out stay valid)."""
        self._gguf.close()


def _meta_value(gguf: GGUFFile, key: str, vtype: GGUFValueType, where: str):
    """The value of `key` if present (None if not); LoraError if it is not of type `vtype`."""
    if key not in gguf.meta:
        return None
    if gguf.meta_types[key] != vtype:
        raise LoraError(f"{where}: '{key}' has type {GGUFValueType(gguf.meta_types[key]).name}, expected {vtype.name}")
    return gguf.meta[key]


def _check_meta(gguf: GGUFFile, model: Model, where: str) -> float:
    """llama_adapter_lora_init_impl's metadata checks; returns alpha (0 when absent)."""
    s = GGUFValueType.STRING
    general_type = _meta_value(gguf, "general.type", s, where)
    if general_type != "adapter":
        raise LoraError(f"{where}: 'general.type' is {general_type!r}, expected 'adapter'")
    arch = _meta_value(gguf, "general.architecture", s, where)
    if arch != model.arch:
        raise LoraError(f"{where}: 'general.architecture' is {arch!r} but the model's is {model.arch!r}")
    adapter_type = _meta_value(gguf, "adapter.type", s, where)
    if adapter_type != "lora":
        raise LoraError(f"{where}: 'adapter.type' is {adapter_type!r}, expected 'lora'")
    if "adapter.alora.invocation_tokens" in gguf.meta:
        raise LoraError(f"{where}: 'adapter.alora.invocation_tokens': activated LoRA (aLoRA) is not supported")
    alpha = _meta_value(gguf, "adapter.lora.alpha", GGUFValueType.FLOAT32, where)
    alpha = 0.0 if alpha is None else float(alpha)
    if not np.isfinite(alpha):
        raise LoraError(f"{where}: 'adapter.lora.alpha' = {alpha} is not a finite number")
    return alpha


def _load_pairs(gguf: GGUFFile, model: Model, where: str) -> dict[str, LoraWeight]:
    """Bundle `<name>.lora_a` / `.lora_b` into pairs and check each against the model's weight (shapes as
    llama_adapter_lora_init_impl checks them). `_norm.weight` tensors are skipped, as llama.cpp does."""
    halves: dict[str, dict[str, Weight]] = {}
    for name, info in gguf.tensors.items():
        if name.endswith(".lora_a") or name.endswith(".lora_b"):
            base, half = name[:-7], name[-1]
        elif name.endswith("_norm.weight"):
            continue
        else:
            raise LoraError(f"{where}: tensor '{name}' has an unexpected suffix (expected .lora_a or .lora_b)")
        if info.ggml_type not in _TYPED or len(info.shape) != 2:
            raise LoraError(f"{where}: tensor '{name}' is {T(info.ggml_type).name} with {len(info.shape)} "
                            "dimensions; LoRA tensors must be 2-D F32 or F16")
        data = gguf.tensor_data(name).view(_TYPED[info.ggml_type]).reshape(info.shape[1], info.shape[0])
        halves.setdefault(base, {})[half] = Weight(name, info.ggml_type, info.shape, data)
    weights = {}
    for base, pair in halves.items():
        if len(pair) != 2:
            missing = f"{base}.lora_{'b' if 'a' in pair else 'a'}"
            raise LoraError(f"{where}: LoRA tensor pair for '{base}' is missing one component ('{missing}')")
        weights[base] = _check_pair(model, base, pair["a"], pair["b"], where)
    return weights


def _check_pair(model: Model, base: str, a: Weight, b: Weight, where: str) -> LoraWeight:
    if not model.has_tensor(base):
        raise LoraError(f"{where}: LoRA tensor '{base}' does not exist in the base model (wrong base model?)")
    if base == "token_embd.weight":
        raise LoraError(f"{where}: a LoRA on 'token_embd.weight' is not supported")
    shape = model.tensor_shape(base)
    if len(shape) != 2:
        raise LoraError(f"{where}: '{base}' is a {len(shape)}-D tensor of the model, not a matrix")
    if shape[0] != a.shape[0] or shape[1] != b.shape[1]:
        raise LoraError(f"{where}: '{base}' is {list(shape)} in the model but its LoRA pair is a {list(a.shape)}, "
                        f"b {list(b.shape)} (expected a [{shape[0]}, rank], b [rank, {shape[1]}]; wrong base model?)")
    if a.shape[1] != b.shape[0]:
        raise LoraError(f"{where}: '{base}': lora_a {list(a.shape)} and lora_b {list(b.shape)} have different ranks "
                        "(lora_a is not transposed?)")
    return LoraWeight(a, b)


# -- what the forward pass sees ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdaptedWeight(LoraAdaptedWeight):
    """A model weight and the LoRA pairs a context applies to it, each with its final scale (get_scale): the ops
    compute its matmul as build_lora_mm (llamactx.backend.ops.lora_matmuls)."""

    base: Weight
    loras: tuple[tuple[LoraWeight, np.float32], ...]

    @property
    def name(self) -> str:
        return self.base.name


class AdaptedModel:
    """The model as a context with adapters shows it to the forward pass: everything is the model's, except that
    `weight(name)` of an adapted matrix is an `AdaptedWeight`. Built by `Context.set_adapters_lora`."""

    def __init__(self, model: Model, adapters: tuple[tuple[LoraAdapter, float], ...]):
        self._model = model
        self._adapted: dict[str, AdaptedWeight] = {}
        for adapter, scale in adapters:  # in the order they were set (llama.cpp: its map's order)
            for name, lw in adapter.weights.items():
                prev = self._adapted.get(name)
                loras = (prev.loras if prev else ()) + ((lw, lw.get_scale(adapter.alpha, scale)),)
                self._adapted[name] = AdaptedWeight(model.weight(name), loras)

    def weight(self, name: str):
        adapted = self._adapted.get(name)
        return adapted if adapted is not None else self._model.weight(name)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


def load_adapters(model: Model, specs) -> tuple[tuple[LoraAdapter, float], ...]:
    """(adapter, scale) pairs from `specs`: each a path, a LoraAdapter, or a (path or LoraAdapter, scale) pair
    (common_init_from_params loads `--lora` / `--lora-scaled` so). Raises as `LoraAdapter.load`."""
    pairs = []
    for spec in specs:
        source, scale = spec if isinstance(spec, (tuple, list)) else (spec, 1.0)
        adapter = source if isinstance(source, LoraAdapter) else LoraAdapter.load(model, source)
        pairs.append((adapter, float(scale)))
    return tuple(pairs)

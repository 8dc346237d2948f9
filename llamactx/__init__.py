"""llamactx: llama.cpp's inference runtime, rebuilt in Python.

    from llamactx import Model, Context, ContextParams, Batch
    model = Model.load(path)
    ctx = Context(model, ContextParams(n_ctx=2048))
    ctx.decode(Batch.get_one(model.vocab.tokenize("Hello")))
    logits = ctx.get_logits_ith(-1)
"""

from __future__ import annotations

from llamactx.batch import Batch, DecodeError
from llamactx.context import Context, DecodeStatus
from llamactx.cparams import ContextParams, ContextParamsError
from llamactx.errors import LlamactxError
from llamactx.gguf.reader import GGUFError
from llamactx.lora import LoraAdapter, LoraError
from llamactx.memory.base import Memory
from llamactx.model import Model, ModelLoadError
from llamactx.state_io import StateError
from llamactx.version import __version__ as __version__  # re-exported

_LLAMA_CPP_PYTHON_NAMES = ("Llama", "LlamaGrammar", "LlamaPromptLookupDecoding", "LlamaState", "LogitsProcessorList",
                           "StoppingCriteriaList")


def __getattr__(name: str):
    """llama-cpp-python's names (`from llamactx import Llama`), imported on first use."""
    if name in _LLAMA_CPP_PYTHON_NAMES:
        from llamactx import llama_cpp_python

        return getattr(llama_cpp_python, name)
    raise AttributeError(f"module 'llamactx' has no attribute {name!r}")


__all__ = [
    "Batch",
    "Context",
    "ContextParams",
    "ContextParamsError",
    "DecodeError",
    "DecodeStatus",
    "GGUFError",
    "Llama",
    "LlamaGrammar",
    "LlamaPromptLookupDecoding",
    "LlamaState",
    "LlamactxError",
    "LoraAdapter",
    "LoraError",
    "Memory",
    "LogitsProcessorList",
    "Model",
    "ModelLoadError",
    "StateError",
    "StoppingCriteriaList",
]

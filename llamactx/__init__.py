"""llamactx: llama.cpp's inference runtime, rebuilt in Python.

    from llamactx import Model, Context, ContextParams, Batch
    model = Model.load(path)
    ctx = Context(model, ContextParams(n_ctx=2048))
    ctx.decode(Batch.get_one(model.vocab.tokenize("Hello")))
    logits = ctx.get_logits_ith(-1)
"""

from __future__ import annotations

from llamactx.batch import Batch, DecodeError
from llamactx.context import Context
from llamactx.cparams import ContextParams, ContextParamsError
from llamactx.gguf.reader import GGUFError
from llamactx.memory.base import Memory
from llamactx.model import Model, ModelLoadError
from llamactx.state import StateError

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "Context",
    "ContextParams",
    "ContextParamsError",
    "DecodeError",
    "GGUFError",
    "Memory",
    "Model",
    "ModelLoadError",
    "StateError",
]

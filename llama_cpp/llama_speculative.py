"""llama-cpp-python's llama_speculative: the draft model interface and prompt lookup decoding
(llamactx.llama_cpp_options.LlamaPromptLookupDecoding, which the engine runs as its ngram-simple drafter)."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from llamactx.llama_cpp_options import LlamaPromptLookupDecoding


class LlamaDraftModel(abc.ABC):
    """A draft model: input_ids -> draft tokens. Llama(draft_model=...) takes LlamaPromptLookupDecoding only."""

    @abc.abstractmethod
    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray: ...


LlamaDraftModel.register(LlamaPromptLookupDecoding)

__all__ = ["LlamaDraftModel", "LlamaPromptLookupDecoding"]

"""llama-cpp-python's llama_cpp.llama: the high-level `Llama` (llamactx.llama_cpp_python) and the objects it takes
and returns (llamactx.llama_cpp_options), with the caches, grammar, tokenizer and types modules' names as that
module re-exports them."""

from __future__ import annotations

import numpy as np

from llamactx.llama_cpp_options import LogitsProcessor, StoppingCriteria
from llamactx.llama_cpp_python import (
    Llama,
    LlamaGrammar,
    LlamaState,
    LogitsProcessorList,
    StoppingCriteriaList,
)

from .llama_cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache
from .llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
from .llama_tokenizer import BaseLlamaTokenizer, LlamaHFTokenizer, LlamaTokenizer
from .llama_types import *  # noqa: F403


class MinTokensLogitsProcessor:
    """Forbid the end-of-sequence token until `min_tokens` tokens were generated after the prompt."""

    def __init__(self, min_tokens: int, token_eos: int):
        self.min_tokens, self.token_eos = min_tokens, token_eos
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


__all__ = ["BaseLlamaCache", "BaseLlamaTokenizer", "Llama", "LlamaCache", "LlamaDiskCache", "LlamaDraftModel",
           "LlamaGrammar", "LlamaHFTokenizer", "LlamaPromptLookupDecoding", "LlamaRAMCache", "LlamaState",
           "LlamaTokenizer", "LogitsProcessor", "LogitsProcessorList", "MinTokensLogitsProcessor",
           "StoppingCriteria", "StoppingCriteriaList"]

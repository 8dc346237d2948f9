"""llama_cpp: llama-cpp-python 0.3.36's Python API on llamactx, so that `import llama_cpp` code runs unchanged
without a C library. Installed with llamactx; when the real llama-cpp-python is installed too, whichever comes
first on sys.path is imported (README: "llama-cpp-python code, unchanged").

    __init__.py          Llama and its objects, llama.h's functions and constants (as llama-cpp-python exports)
    llama.py             Llama, LlamaState, LogitsProcessorList, StoppingCriteriaList (llamactx.llama_cpp_python)
    llama_cpp.py         llama.h's functions on llamactx objects (llamactx.llama_h)
    _internals.py        LlamaModel, LlamaContext, LlamaBatch, LlamaSampler
    llama_types.py       the OpenAI shapes as TypedDicts
    llama_chat_format.py chat formatters (Jinja2ChatFormatter, format_*) and completion handlers
    llama_grammar.py     LlamaGrammar
    llama_speculative.py LlamaPromptLookupDecoding
    llama_cache.py       LlamaRAMCache, LlamaDiskCache
    llama_tokenizer.py   LlamaTokenizer, LlamaHFTokenizer
    server/              `python -m llama_cpp.server`: llamactx's server with llama-cpp-python's settings
"""

from .llama import *  # noqa: F403, I001 -- llama-cpp-python's order: the C names first
from .llama_cpp import *  # noqa: F403
from .llama_types import *  # noqa: F403

__version__ = "0.3.36"
__backend__ = "llamactx"


def __getattr__(name: str):
    """A llama.h name llamactx does not provide: an AttributeError naming it (llama_cpp.llama_cpp says which)."""
    from . import llama_cpp as _c

    return _c.__getattr__(name)

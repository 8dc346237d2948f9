"""llamactx: llama.cpp's inference runtime, rebuilt in Python.

    from llamactx import Model, Context, ContextParams, Batch
    model = Model.load(path)
    ctx = Context(model, ContextParams(n_ctx=2048))
    ctx.decode(Batch.get_one(model.vocab.tokenize("Hello")))
    logits = ctx.get_logits_ith(-1)

The package, bottom (the file format) to top (the front ends); imports run downward only (tests/test_layout.py):

    errors.py       LlamactxError, the base of every error raised for bad input or a failed operation
    version.py      the version and the llama.cpp build it reproduces (a leaf: nothing imports the root for it)
    gguf/           the GGUF file format (safe reader) and ggml's block formats
    ggml/           ggml-cpu's arithmetic, reproduced; kernels/ its numba kernels
    backend/        what runs a forward pass's ops: ReferenceOps (the oracle), FastOps, the ops interface
    hparams.py      HParams: the metadata keys every architecture has (llama_model::load_hparams)
    vocab/          tokenize / detokenize / token_to_piece (src/llama-vocab.*)
    model.py        Model: hparams + read-only weights + vocab (llama_model, llama_model_loader)
    models/         the architecture registry and one module per architecture family (src/models/*.cpp)
    lora.py         LoRA adapters: loading and the adapted matmul (llama-adapter.cpp, build_lora_mm)
    cparams.py      ContextParams (llama_context_params) and their resolution against a model
    batch.py        Batch (llama_batch), its validation and ubatch splitting (llama_batch_allocr)
    memory/         the Memory interface (llama_memory_i): KV cells, KV cache, iSWA, recurrent, hybrid
    state_io.py     bytes in and out of state blobs (llama_io_read_i / llama_io_write_i)
    state.py        saving and restoring a context's state (llama_state_*)
    context.py      Context: one session over a shared model; decode / encode (llama_context)
    sampling/       the sampler chain and its samplers (llama-sampler.cpp, common/sampling.cpp)
    chat_template.py  chat templates: the model's Jinja template or a named one (apply_chat_template)
    chat_builtin.py llama.cpp's built-in chat templates, rendered in code (llama-chat.cpp)
    chat_detect.py  which built-in template style a template is (llm_chat_detect_template)
    chat_format.py  llama-cpp-python's chat_format prompt formats
    chat_spans.py   where a chat prompt's user messages start, in tokens (common_chat_msg_delimiters)
    chat_parse/     a model's reply -> content, reasoning_content, tool_calls (common_chat_parse)
    chat_sampling.py  the samplers a chat request adds: the tool-call grammar, the reasoning budget
    chat_grammar.py  a chat format's tool-call grammar and its lazy triggers, as llama.cpp builds them
    chat_request.py  a chat turn prepared as llama-server does: prompt, reply parser, tool-call grammar
    tool_calls.py   tool calling: tools into the prompt, calls out parsed
    engine/         many sequences of one context, one batched decode per step (llama-server's update_slots)
    embedding.py    Embedder: pooled, normalised sentence embeddings
    embedded.py     the models shipped as PyPI packages, found on disk
    runtime.py      RuntimeParams + Runtime: the one place every front end builds its model, engine, samplers
    api/            the OpenAI / llama-server wire shapes, shared by the server and Llama
    llm.py          LLM: the high-level API (one model, one conversation)
    llama_cpp_options.py  llama-cpp-python's constructor options and small objects
    llama_cpp_completions.py  Llama's create_completion / create_chat_completion over the engine
    llama_cpp_python.py  Llama: llama-cpp-python 0.3.36's high-level class
    llama_h.py      llama.h's C API under its own names
    llama_h_sampler.py  llama.h's sampler chain under its own names
    server/         llama-server: the HTTP app over the engine
    cluster/        `llamactx serve --replicas N` on Ray Serve
    cli/            the `llamactx` command (llama.cpp's tools/)
    __main__.py     `python -m llamactx`
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

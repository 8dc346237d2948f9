"""llama.h's C API under its own names, on llamactx's objects (include/llama.h; llama-cpp-python's
llama_cpp/llama_cpp.py binds the same names with ctypes). No C library: a `llama_model *` is a llamactx Model,
a `llama_context *` a Context, a `llama_batch` a Batch (its numpy arrays token / pos / n_seq_id / seq_id / logits
are what C code writes), a `llama_memory_t` a Memory, a `llama_vocab *` a Vocab and a `llama_sampler *` a
SamplerChain or one sampler (the sampler functions: llamactx.llama_h_sampler, re-exported here).
Out-parameters of C (the buffers of llama_tokenize, llama_token_to_piece, llama_state_get_data) are filled in
place when given a bytearray, numpy array or ctypes array.

What has no meaning without a C library or a GPU (devices, backends' registries, mlock, callbacks into C)
raises a NotImplementedError naming the function (`unsupported`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamactx.batch import Batch
from llamactx.context import Context
from llamactx.cparams import ContextParams
from llamactx.llama_cpp_options import ATTENTION, GGML_TYPES, POOLING, ROPE_SCALING
from llamactx.llama_h_sampler import *  # noqa: F403 -- the sampler chain's half of llama.h
from llamactx.model import Model
from llamactx.models import memory_type
from llamactx.sampling.rng import LLAMA_DEFAULT_SEED

LLAMA_TOKEN_NULL = -1
LLAMA_SPLIT_MODE_NONE, LLAMA_SPLIT_MODE_LAYER, LLAMA_SPLIT_MODE_ROW, LLAMA_SPLIT_MODE_TENSOR = 0, 1, 2, 3
LLAMA_LOAD_MODE_AUTO, LLAMA_LOAD_MODE_NONE, LLAMA_LOAD_MODE_MMAP = -1, 0, 1
LLAMA_LOAD_MODE_MLOCK, LLAMA_LOAD_MODE_MMAP_MLOCK, LLAMA_LOAD_MODE_DIRECT_IO = 2, 3, 4
LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED = -1, 0, 1
LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED, LLAMA_ROPE_SCALING_TYPE_NONE = -1, 0
LLAMA_ROPE_SCALING_TYPE_LINEAR, LLAMA_ROPE_SCALING_TYPE_YARN, LLAMA_ROPE_SCALING_TYPE_LONGROPE = 1, 2, 3
LLAMA_POOLING_TYPE_UNSPECIFIED, LLAMA_POOLING_TYPE_NONE, LLAMA_POOLING_TYPE_MEAN = -1, 0, 1
LLAMA_POOLING_TYPE_CLS, LLAMA_POOLING_TYPE_LAST, LLAMA_POOLING_TYPE_RANK = 2, 3, 4
LLAMA_ATTENTION_TYPE_UNSPECIFIED, LLAMA_ATTENTION_TYPE_CAUSAL, LLAMA_ATTENTION_TYPE_NON_CAUSAL = -1, 0, 1
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0 = 0, 1, 2, 8
LLAMA_VOCAB_TYPE_NONE, LLAMA_VOCAB_TYPE_SPM, LLAMA_VOCAB_TYPE_BPE, LLAMA_VOCAB_TYPE_WPM = 0, 1, 2, 3
LLAMA_DEFAULT_SEED = LLAMA_DEFAULT_SEED
VOCAB_TYPES = {"none": 0, "spm": 1, "bpe": 2, "wpm": 3, "ugm": 4, "rwkv": 5, "plamo2": 6}


def unsupported(name: str, why: str = "llamactx has no C library, devices or backends"):
    """A function of llama.h that has no meaning here: calling it raises NotImplementedError naming it."""

    def refuse(*args: Any, **kwargs: Any):
        raise NotImplementedError(f"{name}: {why}")

    refuse.__name__ = name
    return refuse


@dataclass
class llama_model_params:  # noqa: N801 -- llama.h's struct name
    """llama_model_default_params(); attributes may be set freely, as on the ctypes struct."""

    n_gpu_layers: int = 0
    split_mode: int = LLAMA_SPLIT_MODE_LAYER
    load_mode: int = LLAMA_LOAD_MODE_MMAP
    main_gpu: int = 0
    tensor_split: Any = None
    progress_callback: Any = None
    kv_overrides: Any = None
    vocab_only: bool = False
    check_tensors: bool = False
    use_extra_bufts: bool = False
    no_host: bool = False
    no_alloc: bool = False


@dataclass
class llama_context_params:  # noqa: N801
    """llama_context_default_params()."""

    n_ctx: int = 512
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    n_threads: int = 4  # GGML_DEFAULT_N_THREADS
    n_threads_batch: int = 4
    rope_scaling_type: int = LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    pooling_type: int = LLAMA_POOLING_TYPE_UNSPECIFIED
    attention_type: int = LLAMA_ATTENTION_TYPE_UNSPECIFIED
    flash_attn_type: int = LLAMA_FLASH_ATTN_TYPE_AUTO
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_fast: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_orig_ctx: int = 0
    defrag_thold: float = -1.0
    type_k: int = GGML_TYPE_F16
    type_v: int = GGML_TYPE_F16
    abort_callback: Any = None
    embeddings: bool = False
    offload_kqv: bool = True
    no_perf: bool = True
    op_offload: bool = True
    swa_full: bool = True
    kv_unified: bool = False


def llama_model_default_params() -> llama_model_params:
    return llama_model_params()


def llama_context_default_params() -> llama_context_params:
    return llama_context_params()


def llama_backend_init() -> None:
    """Nothing to initialise: the kernels compile (or load from numba's cache) on first use."""


def llama_backend_free() -> None:
    """Nothing to free."""


def llama_supports_mmap() -> bool:
    return True


def llama_supports_mlock() -> bool:
    return False


def llama_supports_gpu_offload() -> bool:
    return False


def llama_supports_rpc() -> bool:
    return False


def llama_max_devices() -> int:
    return 1


def llama_time_us() -> int:
    return time.perf_counter_ns() // 1000


def llama_print_system_info() -> bytes:
    from llamactx.ggml.cpu import arithmetic

    return f"llamactx CPU : {arithmetic()['variant']}".encode()


# -- model ----------------------------------------------------------------------------------------------------


def llama_model_load_from_file(path_model: bytes | str, params: llama_model_params) -> Model:
    """Model.load; mlock and direct I/O load modes are refused (ValueError naming the mode)."""
    path = path_model.decode() if isinstance(path_model, bytes) else str(path_model)
    if params.load_mode in (LLAMA_LOAD_MODE_MLOCK, LLAMA_LOAD_MODE_MMAP_MLOCK, LLAMA_LOAD_MODE_DIRECT_IO):
        raise ValueError(f"llama_model_load_from_file: load_mode = {params.load_mode} (mlock / direct I/O) is not "
                         f"supported; use LLAMA_LOAD_MODE_MMAP or LLAMA_LOAD_MODE_NONE")
    if params.kv_overrides:
        raise ValueError("llama_model_load_from_file: kv_overrides are not supported")
    return Model.load(path, use_mmap=params.load_mode != LLAMA_LOAD_MODE_NONE, vocab_only=params.vocab_only)


llama_load_model_from_file = llama_model_load_from_file  # the deprecated name


def llama_model_free(model: Model) -> None:
    model.close()


llama_free_model = llama_model_free


def llama_model_get_vocab(model: Model):
    return model.vocab


def llama_model_n_ctx_train(model: Model) -> int:
    return model.hparams.n_ctx_train


def llama_model_n_embd(model: Model) -> int:
    return model.hparams.n_embd


def llama_model_n_layer(model: Model) -> int:
    return model.hparams.n_layer


def llama_model_n_head(model: Model) -> int:
    return model.hparams.n_head


def llama_model_size(model: Model) -> int:
    return int(model.size)


def llama_model_desc(model: Model, buf=None, buf_size: int = 0) -> int | bytes:
    return _out_bytes(model.desc().encode(), buf, buf_size)


def llama_model_is_recurrent(model: Model) -> bool:
    return memory_type(model.arch) == "recurrent"


def llama_model_is_hybrid(model: Model) -> bool:
    return memory_type(model.arch) == "hybrid"


def llama_model_has_encoder(model: Model) -> bool:
    return model.is_embedding_only


def llama_model_has_decoder(model: Model) -> bool:
    return not model.is_embedding_only


def llama_model_chat_template(model: Model, name: bytes | None = None) -> bytes | None:
    if name is not None:
        key = f"tokenizer.chat_template.{name.decode() if isinstance(name, bytes) else name}"
        value = model.meta.get(key)
        return value.encode() if isinstance(value, str) else None
    return model.chat_template.encode() if model.chat_template else None


def llama_model_meta_val_str(model: Model, key: bytes | str, buf=None, buf_size: int = 0) -> int | bytes:
    """The metadata value of `key` as text (-1 when absent)."""
    value = model.meta.get(key.decode() if isinstance(key, bytes) else key)
    return -1 if value is None else _out_bytes(str(value).encode(), buf, buf_size)


def llama_model_meta_count(model: Model) -> int:
    return len(model.meta)


# -- vocab ----------------------------------------------------------------------------------------------------


def _token(token: Any) -> int:
    """A token id passed as a Python int, a numpy integer or a ctypes llama_token (c_int32), as C takes any."""
    return int(token.value if hasattr(token, "value") else token)


def llama_vocab_n_tokens(vocab) -> int:
    return vocab.n_tokens


def llama_vocab_type(vocab) -> int:
    return VOCAB_TYPES.get(vocab.vocab_type, 0)


def llama_vocab_bos(vocab) -> int:
    return vocab.bos


def llama_vocab_eos(vocab) -> int:
    return vocab.eos


def llama_vocab_eot(vocab) -> int:
    return vocab.eot


def llama_vocab_sep(vocab) -> int:
    return vocab.sep


def llama_vocab_nl(vocab) -> int:
    return vocab.nl


def llama_vocab_pad(vocab) -> int:
    return vocab.pad


def llama_vocab_get_add_bos(vocab) -> bool:
    return bool(vocab.add_bos)


def llama_vocab_get_add_eos(vocab) -> bool:
    return bool(vocab.add_eos)


def llama_vocab_is_eog(vocab, token: int) -> bool:
    return vocab.is_eog(_token(token))


def llama_vocab_is_control(vocab, token: int) -> bool:
    return vocab.is_control(_token(token))


def llama_vocab_get_text(vocab, token: int) -> bytes:
    return vocab.token_get_text(_token(token)).encode()


def llama_vocab_get_score(vocab, token: int) -> float:
    return float(vocab.token_get_score(_token(token)))


def llama_vocab_get_attr(vocab, token: int) -> int:
    return int(vocab.token_get_attr(_token(token)))


def llama_tokenize(vocab, text: bytes, text_len: int, tokens, n_tokens_max: int, add_special: bool,
                   parse_special: bool) -> int:
    """Write the tokens of text[:text_len] into `tokens`; their number, or minus it when n_tokens_max is too
    small (nothing written), as llama.h's llama_tokenize."""
    out = vocab.tokenize(bytes(text[:text_len]).decode("utf-8", "replace"), add_special=bool(add_special),
                         parse_special=bool(parse_special))
    if len(out) > n_tokens_max:
        return -len(out)
    for i, t in enumerate(out):
        tokens[i] = t
    return len(out)


def llama_token_to_piece(vocab, token: int, buf, length: int, lstrip: int = 0, special: bool = False) -> int:
    """Write the token's text into `buf`; its length, or minus it when `length` is too small."""
    piece = vocab.token_to_piece(_token(token), special=bool(special))
    if lstrip:
        piece = piece[min(lstrip, len(piece) - len(piece.lstrip(b" "))):]
    return _write(piece, buf, length)


def llama_detokenize(vocab, tokens, n_tokens: int, text, text_len_max: int, remove_special: bool,
                     unparse_special: bool) -> int:
    data = vocab.detokenize([int(t) for t in tokens[:n_tokens]], remove_special=bool(remove_special),
                            unparse_special=bool(unparse_special))
    data = data if isinstance(data, bytes) else str(data).encode()
    return _write(data, text, text_len_max)


def _write(data: bytes, buf, size: int) -> int:
    if len(data) > size:
        return -len(data)
    if buf is not None:
        view = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf.view(np.uint8)
        view[: len(data)] = np.frombuffer(data, np.uint8)
    return len(data)


def _out_bytes(data: bytes, buf, size: int) -> int | bytes:
    """C's (buf, size) out-parameter: with a buffer, write and return the length; without, return the bytes."""
    return data if buf is None else _write(data[: max(0, size - 1)], buf, size)


# -- context --------------------------------------------------------------------------------------------------


def _enum_name(field: str, value: Any, table: dict[int, str]) -> str:
    if int(value) not in table:
        raise ValueError(f"{field} = {value!r} is not one of {sorted(table)}")
    return table[int(value)]


def context_params(p: llama_context_params) -> ContextParams:
    """llama_context_params -> ContextParams (ValueError naming a field outside llama.h's enum)."""
    flash = {LLAMA_FLASH_ATTN_TYPE_AUTO: "auto", LLAMA_FLASH_ATTN_TYPE_DISABLED: "disabled",
             LLAMA_FLASH_ATTN_TYPE_ENABLED: "enabled"}
    return ContextParams(
        n_ctx=int(p.n_ctx), n_batch=int(p.n_batch), n_ubatch=int(p.n_ubatch), n_seq_max=int(p.n_seq_max),
        n_threads=int(p.n_threads), n_threads_batch=int(p.n_threads_batch),
        rope_scaling_type=_enum_name("rope_scaling_type", p.rope_scaling_type, ROPE_SCALING),
        pooling_type=_enum_name("pooling_type", p.pooling_type, POOLING),
        attention_type=_enum_name("attention_type", p.attention_type, ATTENTION),
        flash_attn=_enum_name("flash_attn_type", p.flash_attn_type, flash),
        rope_freq_base=float(p.rope_freq_base), rope_freq_scale=float(p.rope_freq_scale),
        yarn_ext_factor=float(p.yarn_ext_factor), yarn_attn_factor=float(p.yarn_attn_factor),
        yarn_beta_fast=float(p.yarn_beta_fast), yarn_beta_slow=float(p.yarn_beta_slow),
        yarn_orig_ctx=int(p.yarn_orig_ctx), type_k=_enum_name("type_k", p.type_k, GGML_TYPES),
        type_v=_enum_name("type_v", p.type_v, GGML_TYPES), embeddings=bool(p.embeddings), no_perf=bool(p.no_perf),
        swa_full=bool(p.swa_full), kv_unified=bool(p.kv_unified), abort_callback=p.abort_callback)


def llama_init_from_model(model: Model, params: llama_context_params) -> Context:
    return Context(model, context_params(params))


llama_new_context_with_model = llama_init_from_model


def llama_free(ctx: Context) -> None:
    ctx.close()


def llama_get_model(ctx: Context) -> Model:
    return ctx.model


def llama_n_ctx(ctx: Context) -> int:
    return ctx.params.n_ctx


def llama_n_batch(ctx: Context) -> int:
    return ctx.params.n_batch


def llama_n_ubatch(ctx: Context) -> int:
    return ctx.params.n_ubatch


def llama_n_seq_max(ctx: Context) -> int:
    return ctx.params.n_seq_max


def llama_pooling_type(ctx: Context) -> int:
    return {v: k for k, v in POOLING.items()}.get(ctx.params.pooling_type, LLAMA_POOLING_TYPE_UNSPECIFIED)


def llama_get_memory(ctx: Context):
    return ctx.memory


# -- batch, decode, outputs -------------------------------------------------------------------------------------


def llama_batch_init(n_tokens: int, embd: int, n_seq_max: int) -> Batch:
    return Batch(n_tokens, embd, n_seq_max)


def llama_batch_get_one(tokens, n_tokens: int | None = None) -> Batch:
    arr = np.asarray(tokens if n_tokens is None else tokens[:n_tokens], np.int32)  # (n_tokens,)
    return Batch.get_one(arr)


def llama_batch_free(batch: Batch) -> None:
    """Nothing to free: the arrays go with the object."""


def llama_decode(ctx: Context, batch: Batch) -> int:
    return int(ctx.decode(batch))


def llama_encode(ctx: Context, batch: Batch) -> int:
    return int(ctx.encode(batch))


def llama_get_logits(ctx: Context) -> np.ndarray:
    """The outputs' logits, flat (n_outputs * n_vocab,) as the C float array."""
    return ctx.get_logits().reshape(-1)


def llama_get_logits_ith(ctx: Context, i: int) -> np.ndarray:
    return ctx.get_logits_ith(int(i))


def llama_get_embeddings(ctx: Context) -> np.ndarray:
    return ctx.get_embeddings().reshape(-1)


def llama_get_embeddings_ith(ctx: Context, i: int) -> np.ndarray:
    return ctx.get_embeddings_ith(int(i))


def llama_get_embeddings_seq(ctx: Context, seq_id: int) -> np.ndarray:
    return ctx.get_embeddings_seq(int(seq_id))


# -- memory -----------------------------------------------------------------------------------------------------


def llama_memory_clear(mem, data: bool) -> None:
    mem.clear(data=bool(data))


def llama_memory_seq_rm(mem, seq_id: int, p0: int, p1: int) -> bool:
    return mem.seq_rm(int(seq_id), int(p0), int(p1))


def llama_memory_seq_cp(mem, seq_id_src: int, seq_id_dst: int, p0: int, p1: int) -> None:
    mem.seq_cp(int(seq_id_src), int(seq_id_dst), int(p0), int(p1))


def llama_memory_seq_keep(mem, seq_id: int) -> None:
    mem.seq_keep(int(seq_id))


def llama_memory_seq_add(mem, seq_id: int, p0: int, p1: int, delta: int) -> None:
    mem.seq_add(int(seq_id), int(p0), int(p1), int(delta))


def llama_memory_seq_div(mem, seq_id: int, p0: int, p1: int, d: int) -> None:
    mem.seq_div(int(seq_id), int(p0), int(p1), int(d))


def llama_memory_seq_pos_min(mem, seq_id: int) -> int:
    return mem.seq_pos_min(int(seq_id))


def llama_memory_seq_pos_max(mem, seq_id: int) -> int:
    return mem.seq_pos_max(int(seq_id))


def llama_memory_can_shift(mem) -> bool:
    return bool(mem.can_shift)


# -- state ------------------------------------------------------------------------------------------------------


def llama_state_get_size(ctx: Context) -> int:
    return len(ctx.state_get_data())


def llama_state_get_data(ctx: Context, dst=None, size: int | None = None) -> int | bytes:
    """Write the state into `dst` and return its size; without `dst`, return the bytes."""
    data = ctx.state_get_data()
    return data if dst is None else _write(data, dst, len(data) if size is None else size)


def llama_state_set_data(ctx: Context, src, size: int | None = None) -> int:
    data = bytes(src) if size is None else bytes(src)[:size]
    ctx.state_set_data(data)
    return len(data)


def llama_state_save_file(ctx: Context, path_session: bytes | str, tokens, n_token_count: int) -> bool:
    path = path_session.decode() if isinstance(path_session, bytes) else path_session
    ctx.state_save_file(path, [int(t) for t in tokens[:n_token_count]])
    return True


def llama_state_load_file(ctx: Context, path_session: bytes | str, tokens_out=None, n_token_capacity: int = 0,
                          n_token_count_out=None) -> bool | list[int]:
    """Load a session file; the tokens go to tokens_out (and their count to n_token_count_out, a ctypes int or
    a one-item list) or, without them, are returned."""
    path = path_session.decode() if isinstance(path_session, bytes) else path_session
    tokens = ctx.state_load_file(path, n_token_capacity or None)
    if tokens_out is None:
        return tokens
    for i, t in enumerate(tokens):
        tokens_out[i] = t
    if isinstance(n_token_count_out, list):
        n_token_count_out[:] = [len(tokens)]
    elif hasattr(n_token_count_out, "value"):  # ctypes.c_size_t
        n_token_count_out.value = len(tokens)
    elif n_token_count_out is not None:  # a pointer or an array
        n_token_count_out[0] = len(tokens)
    return True


llama_numa_init = unsupported("llama_numa_init", "llamactx has no NUMA placement")
llama_attach_threadpool = unsupported("llama_attach_threadpool", "llamactx runs its own thread pool")
llama_set_abort_callback = unsupported("llama_set_abort_callback",
                                       "pass abort_callback in llama_context_params instead")
llama_model_load_from_splits = unsupported("llama_model_load_from_splits", "split GGUF files are not read")

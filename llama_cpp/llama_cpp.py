"""llama-cpp-python's llama_cpp.llama_cpp: llama.h's functions and constants, here llamactx's own objects behind
the same names (llamactx.llama_h; no ctypes, no C library). A llama.h name that llamactx does not provide raises
an AttributeError naming it, so `hasattr` answers honestly."""

from __future__ import annotations

import argparse
import ctypes
from dataclasses import dataclass

from gguf import LlamaFileType

from llamactx.llama_h import *  # noqa: F403

# llama.h's integer typedefs as llama-cpp-python binds them: callers size C-style out-buffers with them
# (`(llama_cpp.llama_token * n)()` for llama_tokenize), which llamactx.llama_h fills in place
llama_pos = llama_token = llama_seq_id = ctypes.c_int32
llama_token_p = ctypes.POINTER(llama_token)
# llama.h's llama_ftype (gguf-py's LlamaFileType has the same names and values, but for the newest)
globals().update({f"LLAMA_FTYPE_{ft.name}": int(ft) for ft in LlamaFileType})
LLAMA_FTYPE_MOSTLY_Q2_0 = 41


@dataclass
class llama_model_quantize_params:  # noqa: N801 -- llama.h's struct name
    """llama_model_quantize_default_params(); llama-quantize's options (tools/quantize)."""

    nthread: int = 0
    ftype: int = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    output_tensor_type: int = 43  # GGML_TYPE_COUNT: the file type's rule
    token_embedding_type: int = 43
    allow_requantize: bool = False
    quantize_output_tensor: bool = True
    only_copy: bool = False
    pure: bool = False
    keep_split: bool = False
    dry_run: bool = False
    imatrix: object = None
    kv_overrides: object = None
    tensor_types: object = None
    prune_layers: object = None


def llama_model_quantize_default_params() -> llama_model_quantize_params:
    return llama_model_quantize_params()


def llama_model_quantize(fname_inp: bytes | str, fname_out: bytes | str,
                         params: llama_model_quantize_params) -> int:
    """Quantize a GGUF model file with `llamactx quantize` (llamactx.cli.quantize, bit-exact with llama-quantize
    for the file types it writes); 0 on success, as llama.h. Another file type, or an option that command does
    not take from here (imatrix data, kv_overrides, tensor_types, ...), raises a ValueError naming it; a bad input
    file the command's error."""
    from gguf import GGMLQuantizationType

    from llamactx.cli.quantize import FILE_TYPES, add_parser, run_quantize

    names = {int(ftype): name for name, (ftype, _) in FILE_TYPES.items()}
    if int(params.ftype) not in names:
        raise ValueError(f"llama_model_quantize: ftype = {params.ftype} is not one llamactx writes "
                         f"({', '.join(f'{k} ({v})' for k, v in sorted(names.items()))})")
    default = llama_model_quantize_params()
    for field in ("only_copy", "keep_split", "dry_run", "imatrix", "kv_overrides", "tensor_types", "prune_layers"):
        if getattr(params, field) != getattr(default, field):
            raise ValueError(f"llama_model_quantize: {field} = {getattr(params, field)!r} is not supported")
    inp, out = (p.decode() if isinstance(p, bytes) else str(p) for p in (fname_inp, fname_out))
    parser = argparse.ArgumentParser(prog="llama_model_quantize")
    add_parser(parser.add_subparsers(dest="command"))
    argv = ["quantize", inp, out, names[int(params.ftype)]]
    argv += ["--allow-requantize"] * bool(params.allow_requantize) + ["--pure"] * bool(params.pure)
    argv += ["--leave-output-tensor"] * (not params.quantize_output_tensor)
    for flag, ggml_type in (("--output-tensor-type", params.output_tensor_type),
                            ("--token-embedding-type", params.token_embedding_type)):
        if int(ggml_type) != default.output_tensor_type:  # GGML_TYPE_COUNT: the file type's rule
            argv += [flag, GGMLQuantizationType(int(ggml_type)).name]
    return run_quantize(parser.parse_args(argv))


__all__ = sorted(n for n in globals() if n.startswith(("llama_", "LLAMA_", "GGML_")))


# names that llama.h dropped before 0c1e570 (llama-cpp-python 0.3.36 has none of them either), with what replaced them
_REMOVED = {"llama_eval": "llama_decode(ctx, llama_batch_get_one(tokens))",
            "llama_sample_": "a llama_sampler_chain_init chain and llama_sampler_sample",
            "llama_print_timings": "llama_perf_context_print", "llama_apply_lora_from_file": "llama_adapter_lora_init"}


def __getattr__(name: str):
    removed = next((new for old, new in _REMOVED.items() if name == old or old.endswith("_") and
                    name.startswith(old)), None)
    if removed is not None:
        raise AttributeError(f"llama_cpp.{name}: llama.h no longer has {name} (nor does llama-cpp-python 0.3.36); "
                             f"llama.h's replacement: {removed}")
    if name.startswith(("llama_", "LLAMA_", "ggml_", "GGML_")):
        raise AttributeError(f"llama_cpp.{name}: llama.h's {name} is not provided by llamactx (no C library); "
                             f"see llamactx.llama_h for the functions it implements")
    raise AttributeError(f"module 'llama_cpp.llama_cpp' has no attribute {name!r}")

"""llama-cpp-python's llama_cpp.llama_cpp: llama.h's functions and constants, here llamactx's own objects behind
the same names (llamactx.llama_h; no ctypes, no C library). A llama.h name that llamactx does not provide raises
an AttributeError naming it, so `hasattr` answers honestly."""

from __future__ import annotations

import argparse
import ctypes
from dataclasses import dataclass

from llamactx import llama_h
from llamactx.llama_h import *  # noqa: F403

# llama.h's integer typedefs as llama-cpp-python binds them: callers size C-style out-buffers with them
# (`(llama_cpp.llama_token * n)()` for llama_tokenize), which llamactx.llama_h fills in place
llama_pos = llama_token = llama_seq_id = ctypes.c_int32
llama_token_p = ctypes.POINTER(llama_token)
# llama_ftype: the file types llama_model_quantize writes here
LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_F16, LLAMA_FTYPE_MOSTLY_Q4_0, LLAMA_FTYPE_MOSTLY_Q4_1 = 0, 1, 2, 3
LLAMA_FTYPE_MOSTLY_Q8_0, LLAMA_FTYPE_MOSTLY_Q5_0, LLAMA_FTYPE_MOSTLY_Q5_1 = 7, 8, 9


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
    """Quantize a GGUF model file with `llamactx quantize` (llamactx.cli.quantize: F16, Q8_0, Q4_0, Q4_1, Q5_0 and
    Q5_1, bit-exact with llama-quantize); 0 on success, as llama.h. Another file type, or an option that command
    does not have, raises a ValueError naming it; a bad input file the command's error."""
    from llamactx.cli.quantize import FILE_TYPES, add_parser, run_quantize

    names = {int(ftype): name for name, (ftype, _) in FILE_TYPES.items()}
    if int(params.ftype) not in names:
        raise ValueError(f"llama_model_quantize: ftype = {params.ftype} is not one llamactx writes "
                         f"({', '.join(f'{k} ({v})' for k, v in sorted(names.items()))})")
    default = llama_model_quantize_params()
    for field in ("output_tensor_type", "token_embedding_type", "quantize_output_tensor", "only_copy", "keep_split",
                  "dry_run", "imatrix", "kv_overrides", "tensor_types", "prune_layers"):
        if getattr(params, field) != getattr(default, field):
            raise ValueError(f"llama_model_quantize: {field} = {getattr(params, field)!r} is not supported")
    inp, out = (p.decode() if isinstance(p, bytes) else str(p) for p in (fname_inp, fname_out))
    parser = argparse.ArgumentParser(prog="llama_model_quantize")
    add_parser(parser.add_subparsers(dest="command"))
    argv = ["quantize", inp, out, names[int(params.ftype)]]
    argv += ["--allow-requantize"] * bool(params.allow_requantize) + ["--pure"] * bool(params.pure)
    return run_quantize(parser.parse_args(argv))


_NAMES = [n for n in vars(llama_h) if n.startswith(("llama_", "LLAMA_", "GGML_"))]
__all__ = sorted({*_NAMES, "llama_pos", "llama_token", "llama_seq_id", "llama_token_p", "llama_model_quantize",
                  "llama_model_quantize_default_params", "llama_model_quantize_params"})


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

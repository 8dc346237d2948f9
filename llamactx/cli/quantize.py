"""`llamactx quantize IN.gguf [OUT.gguf] TYPE`: llama-quantize (tools/quantize, src/llama-quant.cpp) for the types
llamactx writes bit-exactly: F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.

Which tensors change type follows `llama_model_quantize_impl` without an imatrix: only 2-D and 3-D tensors whose
name ends in "weight" and is not one of the kinds llama.cpp keeps (norms, expert gates, position and token-type
embeddings, ... `tensor_allows_quantization`) are converted; the others are copied as they are. The type of each
follows `llama_tensor_get_type` for these file types: output.weight (token_embd.weight when there is no
output.weight: tied embeddings) gets Q6_K, or Q8_0 when its rows are not whole blocks; attn_v / attn_k of an
8-expert model get Q8_0; a row that Q6_K's 256-blocks do not divide falls back to Q8_0, one that 32-blocks do not
divide to F16 (`tensor_type_fallback`). The bytes are gguf-py's quantizers' (`gguf.quants.quantize`), which follow
ggml's reference quantizers (`quantize_row_*_ref`).

One difference: where llama-quantize would write Q6_K (the output tensor of a Q4_x / Q5_x file whose rows are
multiples of 256), which llamactx does not write bit-exactly, this writes Q8_0 and says so; the file is then what
`llama-quantize --output-tensor-type q8_0` writes. The metadata is copied with general.quantization_version and
general.file_type set and the split keys dropped, and the tensors are written in llama-quantize's order (by layer,
then by name). The output appears only when complete (a temporary file renamed), and never over the input.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf import quants as gguf_quants

from llamactx.cli.args import CommandError
from llamactx.gguf.quants import dequantize
from llamactx.gguf.reader import GGUFFile

T = GGMLQuantizationType
GGML_QNT_VERSION = 2  # ggml.h: the quantization format version llama-quantize records

# file type name -> (llama_ftype, its default tensor type): llama-quantize's QUANT_OPTIONS that we write exactly
FILE_TYPES = {
    "F16": (LlamaFileType.MOSTLY_F16, T.F16),
    "Q8_0": (LlamaFileType.MOSTLY_Q8_0, T.Q8_0),
    "Q4_0": (LlamaFileType.MOSTLY_Q4_0, T.Q4_0),
    "Q4_1": (LlamaFileType.MOSTLY_Q4_1, T.Q4_1),
    "Q5_0": (LlamaFileType.MOSTLY_Q5_0, T.Q5_0),
    "Q5_1": (LlamaFileType.MOSTLY_Q5_1, T.Q5_1),
}
# tools/quantize/quantize.cpp QUANT_OPTIONS: every name llama-quantize takes
LLAMA_QUANTIZE_TYPES = (
    "Q1_0", "Q2_0", "Q4_0", "Q4_1", "MXFP4_MOE", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S",
    "IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "Q3_K", "IQ3_XS", "Q3_K_S",
    "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K", "Q4_K_S", "Q4_K_M", "Q5_K", "Q5_K_S", "Q5_K_M", "Q6_K",
    "Q8_0", "F16", "BF16", "F32", "COPY",
)
_FLOAT_TYPES = (T.F32, T.F16, T.BF16)  # not "quantized" for ggml_is_quantized: converting them is not requantizing
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")

# llama-quant.cpp `tensor_allows_quantization`: name parts of the tensors kept as they are (the GLM5-next list,
# for an architecture llamactx does not run, is left out)
_KEEP_PARTS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    *(f"time_mix_{w}.weight" for w in ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2",
                                      "decay_w1", "decay_w2", "lerp_fused")),
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
    ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")


def is_type_name(name: str) -> bool:
    """True for any type llama-quantize's `try_parse_ftype` knows (by name, any case, or llama_ftype number),
    written here or not: what tells `IN TYPE` from `IN OUT TYPE`."""
    if name.isdigit():
        return int(name) in {int(f) for f in LlamaFileType}
    return name.upper() in LLAMA_QUANTIZE_TYPES


def parse_type(name: str, what: str = "type") -> str:
    """A file type named as llama-quantize names it (any case) or by its llama_ftype number -> "Q4_0" etc.
    Raises CommandError for one this command does not write."""
    for type_name, (ftype, _) in FILE_TYPES.items():
        if name.upper() == type_name or name == str(int(ftype)):
            return type_name
    raise CommandError(f"quantize: {what} '{name}' is not one that llamactx writes bit-exactly "
                       f"({', '.join(FILE_TYPES)})")


@dataclass(frozen=True, slots=True)
class QuantizeOptions:
    """llama_model_quantize_params, the part this command implements."""

    file_type: str  # a FILE_TYPES key
    allow_requantize: bool = False
    pure: bool = False  # every converted tensor gets the default type (no mixture rules)
    output_tensor_type: str | None = None  # a FILE_TYPES key
    token_embedding_type: str | None = None


@dataclass(frozen=True, slots=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # ggml ne order
    src_type: T
    dst_type: T
    note: str = ""  # why the type is not llama-quantize's (the Q6_K substitution), printed once


def n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: trailing dimensions of 1 do not count."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    """llama-quant.cpp `tensor_allows_quantization` (quantize_output_tensor on, not only_copy)."""
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    return name not in _KEEP_NAMES and not any(part in name for part in _KEEP_PARTS)


def _category(name: str) -> str:
    """llama-quant.cpp `tensor_get_category`, the categories that matter for these file types."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, category in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"),
                           ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k")):
        if part in name:
            return category
    return "other"


def _block(t: T) -> int:
    return GGML_QUANT_SIZES[t][0]


def target_type(name: str, shape: tuple[int, ...], src: T, opts: QuantizeOptions, tied: bool, arch: str,
                n_expert: int) -> T:
    """llama-quant.cpp `llama_tensor_get_type` + `llama_tensor_get_type_impl` + `tensor_type_fallback` for
    F16 / Q8_0 / Q4_x / Q5_x without an imatrix. May return Q6_K, which `plan` replaces."""
    if not allows_quantization(name, shape):
        return src
    category = _category(name)
    if opts.token_embedding_type and category == "token_embd":
        return FILE_TYPES[opts.token_embedding_type][1]
    if opts.output_tensor_type and category == "output":
        return FILE_TYPES[opts.output_tensor_type][1]
    new = FILE_TYPES[opts.file_type][1]
    if new == T.F16:  # not ggml_is_quantized: no mixture rules, no fallback
        return new
    if not opts.pure:
        if category == "output" or (tied and category == "token_embd"):
            if opts.output_tensor_type:
                new = FILE_TYPES[opts.output_tensor_type][1]
            elif arch == "falcon" or shape[0] % _block(new):
                new = T.Q8_0
            elif new != T.Q8_0:
                new = T.Q6_K
        elif category in ("attn_v", "attn_k") and n_expert == 8:
            new = T.Q8_0
    if shape[0] % _block(new):  # tensor_type_fallback
        new = T.Q8_0 if new == T.Q6_K else new
        if shape[0] % _block(new):
            new = T.F16
    return new


def plan(gguf: GGUFFile, opts: QuantizeOptions) -> list[TensorPlan]:
    """Each tensor's source and target type, in llama-quantize's order (llama_model_loader's weights_map: by
    layer number, tensors outside the layers first, then by name). Raises CommandError for a tensor that would
    need requantizing without --allow-requantize."""
    arch = str(gguf.meta.get("general.architecture", ""))
    n_expert = int(gguf.meta.get(f"{arch}.expert_count", 0) or 0)
    tied = "output.weight" not in gguf.tensors
    plans = []
    for name in sorted(gguf.tensors, key=_weight_order):
        info = gguf.tensors[name]
        src = T(info.ggml_type)
        dst = target_type(name, info.shape, src, opts, tied, arch, n_expert)
        note = ""
        if dst == T.Q6_K:
            dst, note = T.Q8_0, "Q8_0 where llama-quantize writes Q6_K (not written bit-exactly here)"
        if dst != src and src not in _FLOAT_TYPES and not opts.allow_requantize:
            raise CommandError(f"quantize: tensor '{name}' is {src.name}: requantizing from {src.name} is disabled "
                               "(--allow-requantize to convert it anyway, losing precision twice)")
        plans.append(TensorPlan(name, info.shape, src, dst, note))
    return plans


def _weight_order(name: str) -> tuple[int, str]:
    m = re.match(r"blk\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def convert(gguf: GGUFFile, p: TensorPlan) -> np.ndarray:
    """The tensor's bytes in its target type: copied, or decoded to float32 and quantized by gguf-py."""
    raw = gguf.tensor_data(p.name)  # (nbytes,) uint8
    if p.dst_type == p.src_type:
        return raw
    values = dequantize(raw, p.src_type, p.shape, p.name)  # (..., ne[0]) float32
    return np.ascontiguousarray(gguf_quants.quantize(values, p.dst_type)).view(np.uint8).reshape(-1)


def _metadata(gguf: GGUFFile, ftype: int) -> list[tuple[str, object, GGUFValueType, GGUFValueType | None]]:
    """The input's KV pairs as llama-quantize writes them: copied in order (general.architecture, which the writer
    puts first, aside), split keys dropped, then general.quantization_version and general.file_type last."""
    out = []
    drop = (*_SPLIT_KEYS, "general.architecture", "general.quantization_version", "general.file_type")
    for key, value in gguf.meta.items():
        if key in drop:
            continue
        vtype = GGUFValueType(gguf.meta_types[key])
        sub = gguf.meta_array_types.get(key)
        if vtype == GGUFValueType.ARRAY and len(value) == 0:  # type: ignore[arg-type]
            raise CommandError(f"quantize: metadata key '{key}' is an empty array, which gguf-py's writer cannot "
                               "write")
        out.append((key, _plain(value), vtype, None if sub is None else GGUFValueType(sub)))
    out.append(("general.quantization_version", GGML_QNT_VERSION, GGUFValueType.UINT32, None))
    out.append(("general.file_type", int(ftype), GGUFValueType.UINT32, None))
    return out


def _plain(value: object) -> object:
    """A metadata value in the form GGUFWriter packs: lists, not numpy arrays; strings as their exact bytes."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return value


def write(gguf: GGUFFile, plans: list[TensorPlan], ftype: int, out_path: Path, log=None) -> int:
    """Write the quantized model to `out_path` through a temporary file beside it, logging each tensor to `log`
    (default stderr); returns the file's size in bytes."""
    log = log or sys.stderr
    fd, tmp_name = tempfile.mkstemp(prefix=out_path.name + ".", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = GGUFWriter(tmp, str(gguf.meta["general.architecture"]))
        writer.data_alignment = gguf.alignment
        for key, value, vtype, sub in _metadata(gguf, ftype):
            writer.add_key_value(key, value, vtype, sub)
        for p in plans:
            nbytes = int(np.prod(p.shape)) // _block(p.dst_type) * GGML_QUANT_SIZES[p.dst_type][1]
            writer.add_tensor_info(p.name, p.shape[::-1], np.dtype(np.float32), nbytes, raw_dtype=p.dst_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, p in enumerate(plans):
            data = convert(gguf, p)
            writer.write_tensor_data(data)
            _log_tensor(log, i, len(plans), p, gguf.tensors[p.name].nbytes, data.nbytes)
        writer.close()
        os.replace(tmp, out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out_path.stat().st_size


def _log_tensor(log, i: int, n: int, p: TensorPlan, size_in: int, size_out: int) -> None:
    """llama_model_quantize_impl's line per tensor."""
    shape = ", ".join(f"{d:5d}" for d in (*p.shape, *([1] * (4 - len(p.shape)))))
    head = f"[{i + 1:4d}/{n:4d}] {p.name:<36} - [{shape}], type = {p.src_type.name.lower():>6}, "
    if p.dst_type == p.src_type:
        print(f"{head}size = {size_in / 2**20:8.3f} MiB", file=log)
    else:
        note = f" ({p.note})" if p.note else ""
        print(f"{head}converting to {p.dst_type.name.lower()} .. size = {size_in / 2**20:8.2f} MiB -> "
              f"{size_out / 2**20:8.2f} MiB{note}", file=log)


def parse_positionals(values: list[str]) -> tuple[str, str | None, str]:
    """llama-quantize's `IN [OUT] TYPE [NTHREADS]` -> (IN, OUT or None, TYPE); NTHREADS is accepted and unused
    (gguf-py's quantizers are numpy, one thread)."""
    usage = "quantize: usage: llamactx quantize IN.gguf [OUT.gguf] TYPE [NTHREADS]"
    if len(values) < 2:
        raise CommandError(usage)
    inp, rest = values[0], values[1:]
    if is_type_name(rest[0]):
        out, type_arg, extra = None, rest[0], rest[1:]
    elif len(rest) < 2:
        raise CommandError(f"quantize: missing the type after the output file '{rest[0]}'")
    else:
        out, type_arg, extra = rest[0], rest[1], rest[2:]
    if len(extra) > 1 or (extra and not extra[0].isdigit()):
        raise CommandError(f"{usage} (got {' '.join(values)!r})")
    return inp, out, parse_type(type_arg)


def add_parser(sub):
    p = sub.add_parser("quantize", help="llama-quantize for F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (bit-exact)")
    p.add_argument("files", nargs="+", metavar="IN [OUT] TYPE", help="input GGUF, output GGUF (default: "
                   "ggml-model-TYPE.gguf beside the input), file type")
    p.add_argument("--allow-requantize", action="store_true", help="convert tensors that are already quantized")
    p.add_argument("--pure", action="store_true", help="every converted tensor gets TYPE (no mixture rules)")
    p.add_argument("--output-tensor-type", default=None, metavar="TYPE", help="type of output.weight")
    p.add_argument("--token-embedding-type", default=None, metavar="TYPE", help="type of token_embd.weight")
    return p


def run_quantize(args) -> int:
    inp, out, type_name = parse_positionals(args.files)
    opts = QuantizeOptions(type_name, args.allow_requantize, args.pure,
                           args.output_tensor_type and parse_type(args.output_tensor_type, "--output-tensor-type"),
                           args.token_embedding_type and parse_type(args.token_embedding_type,
                                                                    "--token-embedding-type"))
    in_path = Path(inp)
    if not in_path.is_file():
        raise CommandError(f"quantize: input '{inp}' " + ("is a directory" if in_path.is_dir() else "does not exist"))
    out_path = Path(out) if out else in_path.with_name(f"ggml-model-{type_name}.gguf")
    if out_path.is_dir():
        raise CommandError(f"quantize: output '{out_path}' is a directory")
    if not out_path.parent.is_dir():
        raise CommandError(f"quantize: the output's directory '{out_path.parent}' does not exist")
    if out_path.exists() and os.path.samefile(in_path, out_path):
        raise CommandError(f"quantize: input and output files are the same: '{inp}'")
    ftype = FILE_TYPES[type_name][0]
    with GGUFFile(in_path) as gguf:
        if "general.architecture" not in gguf.meta:
            raise CommandError(f"quantize: '{inp}' has no general.architecture: not a model file")
        plans = plan(gguf, opts)
        print(f"llamactx quantize: quantizing '{in_path}' to '{out_path}' as {type_name}", file=sys.stderr)
        for note in sorted({f"{p.name}: {p.note}" for p in plans if p.note}):
            print(f"llamactx quantize: {note}; as llama-quantize --output-tensor-type q8_0", file=sys.stderr)
        size_in = sum(gguf.tensors[p.name].nbytes for p in plans)
        size_out = write(gguf, plans, ftype, out_path)
    print(f"llamactx quantize: model size = {size_in / 2**20:8.2f} MiB, quantized file = {size_out / 2**20:8.2f} MiB",
          file=sys.stderr)
    return 0

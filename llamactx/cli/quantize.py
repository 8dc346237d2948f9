"""`llamactx quantize IN.gguf [OUT.gguf] TYPE`: llama-quantize (tools/quantize, src/llama-quant.cpp
`llama_model_quantize_impl`) for F16, BF16, F32, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quant mixes Q2_K, Q2_K_S,
Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, Q6_K, the IQ mixes IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ3_XXS (these with an imatrix),
IQ3_XS, IQ3_S, IQ3_M, IQ1_S, IQ1_M (these with an imatrix), IQ4_NL, IQ4_XS, and the ternary TQ1_0 and TQ2_0, byte
for byte.

Which tensors change type, and to what, is cli/quantize_types.py (`llama_tensor_get_type`: the mixes, --pure,
--tensor-type, --output-tensor-type, --token-embedding-type, --leave-output-tensor, the fallbacks of rows that a
type's blocks do not divide). The bytes: the source tensor is decoded to float32 as ggml's `to_float` does, then
quantized as `ggml_quantize_chunk`: the K-quants and IQ types, and with an importance matrix (--imatrix,
llamactx.gguf.imatrix_file) the 32-block types too, by ggml's quantizers (llamactx.ggml.kernels.quantize_rows);
Q8_0, F16, BF16 and the 32-block types without an imatrix by gguf-py's (`gguf.quants.quantize`, which follows
ggml's `quantize_row_*_ref`). An imatrix adds llama-quantize's quantize.imatrix.* keys.

The metadata is copied with general.quantization_version and general.file_type set and the split keys dropped,
and the tensors are written in llama-quantize's order (by layer, then by name). The output appears only when
complete (a temporary file renamed), and never over the input.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf import quants as gguf_quants

from llamactx.cli.args import CommandError
from llamactx.cli.quantize_types import (
    FILE_TYPES,
    FLOAT_TYPES,
    ModelFacts,
    TypeChooser,
    category,
    parse_tensor_type,
    parse_tensor_type_option,
    requires_imatrix,
)
from llamactx.ggml.kernels.quantize_iq1 import quantize_rows_iq1m, quantize_rows_iq1s
from llamactx.ggml.kernels.quantize_iq2s import quantize_rows_iq2s
from llamactx.ggml.kernels.quantize_iq2xxs import quantize_rows_iq2xxs
from llamactx.ggml.kernels.quantize_iq3xxs import quantize_rows_iq3xxs
from llamactx.ggml.kernels.quantize_rows import K_TYPES, WEIGHTED_LEGACY_TYPES, quantize_chunk
from llamactx.ggml.kernels.quantize_tq import quantize_rows_tq
from llamactx.gguf import imatrix_file
from llamactx.gguf.quants import dequantize
from llamactx.gguf.reader import GGUFFile
from llamactx.gguf.row_data import check_row_data
from llamactx.gguf.values import GGUFError

T = GGMLQuantizationType
GGML_QNT_VERSION = 2  # ggml.h: the quantization format version llama-quantize records

# tools/quantize/quantize.cpp QUANT_OPTIONS: every name llama-quantize takes
LLAMA_QUANTIZE_TYPES = (
    "Q1_0", "Q2_0", "Q4_0", "Q4_1", "MXFP4_MOE", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S",
    "IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "Q3_K", "IQ3_XS", "Q3_K_S",
    "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K", "Q4_K_S", "Q4_K_M", "Q5_K", "Q5_K_S", "Q5_K_M", "Q6_K",
    "Q8_0", "F16", "BF16", "F32", "COPY",
)
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
# ggml_quantize_requires_imatrix: ggml's quantizer asserts without one, even for the tensors tensor_requires_imatrix
# lets through (output / token_embd given one of these types by an option)
_GGML_NEEDS_IMATRIX = (T.IQ2_XXS, T.IQ2_XS, T.IQ1_S)


def is_type_name(name: str) -> bool:
    """True for any type llama-quantize's `try_parse_ftype` knows (by name, any case, or llama_ftype number),
    written here or not: what tells `IN TYPE` from `IN OUT TYPE`."""
    from gguf import LlamaFileType

    if name.isdigit():
        return int(name) in {int(f) for f in LlamaFileType}
    return name.upper() in LLAMA_QUANTIZE_TYPES


def parse_type(name: str, what: str = "type") -> str:
    """A file type named as llama-quantize names it (any case) or by its llama_ftype number -> "Q4_K_M" etc.
    (the first QUANT_OPTIONS name of a number). Raises CommandError for one this command does not write."""
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
    output_tensor_type: T | None = None
    token_embedding_type: T | None = None
    leave_output_tensor: bool = False
    tensor_types: tuple = ()  # (compiled pattern, type) pairs of --tensor-type, first match wins
    imatrix: str | None = None  # the --imatrix path as given (recorded in quantize.imatrix.file)


@dataclass(slots=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # ggml ne order
    src_type: T
    dst_type: T
    imatrix: np.ndarray | None = field(default=None, repr=False)  # (n_mat * ne0,) column weights, or None


def _model_facts(gguf: GGUFFile) -> ModelFacts:
    meta = gguf.meta
    arch = str(meta.get("general.architecture", ""))
    n_head = _first(meta.get(f"{arch}.attention.head_count", 0))
    n_head_kv = _first(meta.get(f"{arch}.attention.head_count_kv", n_head))
    n_layer = int(meta.get(f"{arch}.block_count", 0) or 0)
    n_wv = sum(category(n) in ("attn_v", "attn_qkv", "attn_kv_b") for n in gguf.tensors)
    return ModelFacts(arch=arch, n_gqa=n_head // n_head_kv if n_head_kv else 0,
                      n_expert=int(meta.get(f"{arch}.expert_count", 0) or 0), n_layer=n_layer,
                      is_70b=arch == "llama" and n_layer == 80 and n_head != n_head_kv, n_attention_wv=n_wv,
                      tied="output.weight" not in gguf.tensors)


def _first(value) -> int:
    """hparams.n_head(0): a per-layer array's first value."""
    if isinstance(value, (list, np.ndarray)):
        return int(value[0]) if len(value) else 0
    return int(value or 0)


def plan(gguf: GGUFFile, opts: QuantizeOptions, weights: dict[str, np.ndarray] | None = None) -> list[TensorPlan]:
    """Each tensor's source and target type (and imatrix column weights), in llama-quantize's order
    (llama_model_loader's weights_map: by layer number, tensors outside the layers first, then by name). Raises
    CommandError for a tensor that would need requantizing without --allow-requantize, a Q2_K_S tensor without
    an imatrix, or an imatrix entry whose size is not the tensor's."""
    ftype, default_type = FILE_TYPES[opts.file_type]
    chooser = TypeChooser(_model_facts(gguf), ftype, default_type, has_imatrix=weights is not None, pure=opts.pure,
                          quantize_output_tensor=not opts.leave_output_tensor,
                          output_tensor_type=opts.output_tensor_type, token_embedding_type=opts.token_embedding_type,
                          overrides=list(opts.tensor_types))
    plans = []
    for name in sorted(gguf.tensors, key=_weight_order):
        info = gguf.tensors[name]
        src = T(info.ggml_type)
        dst = chooser.choose(name, info.shape, src)
        p = TensorPlan(name, info.shape, src, dst)
        if dst != src:
            p.imatrix = _tensor_imatrix(weights, opts.imatrix, p)
            if p.imatrix is None and requires_imatrix(name, dst, ftype):
                raise CommandError(f"quantize: tensor '{name}' ({dst.name} in a {opts.file_type} file) needs an "
                                   "importance matrix (--imatrix FILE)")
            if p.imatrix is None and dst in _GGML_NEEDS_IMATRIX:
                raise CommandError(f"quantize: tensor '{name}' ({dst.name}) has no importance matrix entry, which "
                                   f"ggml's {dst.name} quantizer requires (llama-quantize aborts): choose another type")
            if src not in FLOAT_TYPES and not opts.allow_requantize:
                raise CommandError(f"quantize: tensor '{name}' is {src.name}: requantizing from {src.name} is "
                                   "disabled (--allow-requantize to convert it anyway, losing precision twice)")
        plans.append(p)
    for line in chooser.fallbacks:
        print(f"llamactx quantize: warning: {line}", file=sys.stderr)
    return plans


def _tensor_imatrix(weights: dict[str, np.ndarray] | None, path: str | None, p: TensorPlan) -> np.ndarray | None:
    """The imatrix entry of a tensor being converted: None when there is none (llama-quantize quantizes it
    without one), refused when its size is not ne[0] * ne[2] (an imatrix of another model), except for
    token_embd as llama-quantize."""
    if weights is None or p.name not in weights:
        return None
    e = weights[p.name]
    n_mat = p.shape[2] if len(p.shape) > 2 else 1
    if len(e) != p.shape[0] * n_mat:
        if p.name in ("token_embd.weight", "per_layer_token_embd.weight"):
            return None
        raise CommandError(f"quantize: imatrix '{path}': its entry for '{p.name}' has {len(e)} values, the tensor "
                           f"has {p.shape[0] * n_mat} columns: an importance matrix of another model?")
    return e


def _block(t: T) -> int:
    return GGML_QUANT_SIZES[t][0]


def _weight_order(name: str) -> tuple[int, str]:
    m = re.match(r"blk\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def convert(gguf: GGUFFile, p: TensorPlan) -> np.ndarray:
    """The tensor's bytes in its target type: copied, or decoded to float32 and quantized as ggml_quantize_chunk
    (one call per expert matrix, each with its own imatrix slice). Raises CommandError for a tensor whose data
    ggml_validate_row_data refuses (a NaN or infinite value or block scale), as llama-quantize's loader does."""
    raw = gguf.tensor_data(p.name)  # (nbytes,) uint8
    try:
        check_row_data(p.src_type, raw, p.name)
    except GGUFError as e:
        raise CommandError(f"quantize: {e}") from None
    if p.dst_type == p.src_type:
        return raw
    values = dequantize(raw, p.src_type, p.shape, p.name).reshape(-1, p.shape[1], p.shape[0])  # (n_mat, ne1, ne0)
    if p.dst_type in (T.TQ1_0, T.TQ2_0):  # quantize_tq*_0: the imatrix is ignored
        return quantize_rows_tq(values.reshape(-1, p.shape[0]), p.dst_type == T.TQ1_0).reshape(-1)
    if p.dst_type == T.IQ2_XXS:  # tensor_requires_imatrix: plan() made sure there is one
        ne0 = p.shape[0]
        return np.concatenate([quantize_rows_iq2xxs(m, p.imatrix[i * ne0:(i + 1) * ne0]).reshape(-1)
                               for i, m in enumerate(values)])
    if p.dst_type in (T.IQ2_S, T.IQ3_XXS, T.IQ1_S, T.IQ1_M):  # without an imatrix only for token_embd / output
        ne0 = p.shape[0]
        quantize_rows = {T.IQ2_S: quantize_rows_iq2s, T.IQ3_XXS: quantize_rows_iq3xxs, T.IQ1_S: quantize_rows_iq1s,
                         T.IQ1_M: quantize_rows_iq1m}[p.dst_type]
        return np.concatenate([quantize_rows(m, None if p.imatrix is None else p.imatrix[i * ne0:(i + 1) * ne0])
                               .reshape(-1) for i, m in enumerate(values)])
    if p.dst_type in K_TYPES or (p.imatrix is not None and p.dst_type in WEIGHTED_LEGACY_TYPES):
        ne0 = p.shape[0]
        parts = [quantize_chunk(p.dst_type, m, None if p.imatrix is None else p.imatrix[i * ne0:(i + 1) * ne0])
                 for i, m in enumerate(values)]
        return np.concatenate([q.reshape(-1) for q in parts])
    return np.ascontiguousarray(gguf_quants.quantize(values, p.dst_type)).view(np.uint8).reshape(-1)


def _metadata(gguf: GGUFFile, ftype: int, imatrix_keys=()) -> list[tuple[str, object, GGUFValueType,
                                                                       GGUFValueType | None]]:
    """The input's KV pairs as llama-quantize writes them: copied in order (general.architecture, which the writer
    puts first, aside), split keys dropped, then general.quantization_version and general.file_type, then the
    --imatrix keys (llama-quantize's kv overrides)."""
    out = []
    drop = (*_SPLIT_KEYS, "general.architecture", "general.quantization_version", "general.file_type",
            *(key[0] for key in imatrix_keys))  # gguf_set_val_*: an existing key is removed, then appended
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
    out += list(imatrix_keys)
    return out


def imatrix_keys(path: str, im: imatrix_file.IMatrix) -> list[tuple[str, object, GGUFValueType, None]]:
    """quantize.cpp's overrides for an imatrix: its path as given and first dataset (each cut to 127 bytes, as
    the override's val_str), its entry count and chunk count."""
    keys = [("quantize.imatrix.file", _cut(path), GGUFValueType.STRING, None)]
    if im.datasets:
        keys.append(("quantize.imatrix.dataset", _cut(im.datasets[0]), GGUFValueType.STRING, None))
    keys.append(("quantize.imatrix.entries_count", len(im.entries), GGUFValueType.UINT32, None))
    if im.chunk_count > 0:
        keys.append(("quantize.imatrix.chunks_count", im.chunk_count, GGUFValueType.UINT32, None))
    return keys


def _cut(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")[:127]
    return raw.split(b"\0")[0]


def _plain(value: object) -> object:
    """A metadata value in the form GGUFWriter packs: lists, not numpy arrays; strings as their exact bytes."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return value


def write(gguf: GGUFFile, plans: list[TensorPlan], ftype: int, out_path: Path, log=None, extra_keys=()) -> int:
    """Write the quantized model to `out_path` through a temporary file beside it, logging each tensor to `log`
    (default stderr); returns the file's size in bytes."""
    log = log or sys.stderr
    fd, tmp_name = tempfile.mkstemp(prefix=out_path.name + ".", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = GGUFWriter(tmp, str(gguf.meta["general.architecture"]))
        writer.data_alignment = gguf.alignment
        for key, value, vtype, sub in _metadata(gguf, ftype, extra_keys):
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
        print(f"{head}converting to {p.dst_type.name.lower()} .. size = {size_in / 2**20:8.2f} MiB -> "
              f"{size_out / 2**20:8.2f} MiB", file=log)


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
    p = sub.add_parser("quantize", help="llama-quantize: F16/BF16/F32, Q8_0, Q4_x/Q5_x, the K-quant mixes, IQ1-IQ3 "
                                        "mixes, IQ4_NL/XS, TQ1_0/TQ2_0 (bit-exact)")
    p.add_argument("files", nargs="+", metavar="IN [OUT] TYPE", help="input GGUF, output GGUF (default: "
                   "ggml-model-TYPE.gguf beside the input), file type")
    p.add_argument("--allow-requantize", action="store_true", help="convert tensors that are already quantized")
    p.add_argument("--leave-output-tensor", action="store_true", help="keep output.weight as it is")
    p.add_argument("--pure", action="store_true", help="every converted tensor gets TYPE (no mixture rules)")
    p.add_argument("--imatrix", default=None, metavar="FILE", help="importance matrix (llamactx / llama-imatrix)")
    p.add_argument("--output-tensor-type", default=None, metavar="TYPE", help="type of output.weight")
    p.add_argument("--token-embedding-type", default=None, metavar="TYPE", help="type of token_embd.weight")
    p.add_argument("--tensor-type", action="append", default=[], metavar="NAME=TYPE",
                   help="type of the tensors whose name matches NAME (a regex), e.g. attn_q=q8_0; repeatable")
    return p


def _options(args, type_name: str) -> QuantizeOptions:
    def tensor_type(value, what):
        return None if value is None else parse_tensor_type(value, what)

    return QuantizeOptions(type_name, args.allow_requantize, args.pure,
                           tensor_type(args.output_tensor_type, "--output-tensor-type"),
                           tensor_type(args.token_embedding_type, "--token-embedding-type"),
                           args.leave_output_tensor, tuple(parse_tensor_type_option(v) for v in args.tensor_type),
                           args.imatrix)


def _load_imatrix(path: str, gguf: GGUFFile) -> imatrix_file.IMatrix:
    """The --imatrix file, refused when unreadable, without llama-imatrix's metadata, or naming no tensor of
    this model."""
    if not Path(path).is_file():
        raise CommandError(f"quantize: imatrix '{path}' does not exist")
    try:
        im = imatrix_file.load(path)
    except GGUFError as e:
        raise CommandError(f"quantize: {e}") from None
    if not im.is_legacy and not im.has_metadata:
        raise CommandError(f"quantize: imatrix '{path}': missing imatrix metadata (imatrix.datasets, "
                           "imatrix.chunk_count, imatrix.chunk_size)")
    if not any(name in gguf.tensors for name in im.entries):
        raise CommandError(f"quantize: imatrix '{path}' has no entry for any tensor of this model (its first: "
                           f"'{next(iter(im.entries))}'): an importance matrix of another model?")
    return im


def run_quantize(args) -> int:
    inp, out, type_name = parse_positionals(args.files)
    opts = _options(args, type_name)
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
        im = _load_imatrix(opts.imatrix, gguf) if opts.imatrix else None
        plans = plan(gguf, opts, None if im is None else im.weights())
        print(f"llamactx quantize: quantizing '{in_path}' to '{out_path}' as {type_name}", file=sys.stderr)
        size_in = sum(gguf.tensors[p.name].nbytes for p in plans)
        keys = imatrix_keys(opts.imatrix, im) if im is not None else ()
        size_out = write(gguf, plans, ftype, out_path, extra_keys=keys)
    print(f"llamactx quantize: model size = {size_in / 2**20:8.2f} MiB, quantized file = {size_out / 2**20:8.2f} MiB",
          file=sys.stderr)
    return 0

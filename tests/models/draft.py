"""Test draft models: a GGUF made of a model's own first layers (the token embedding, the first `n_layers` blocks,
the output norm and head), with the same vocabulary, so a draft-simple speculator can run beside the full model
without downloading a second one (issue #25). Its drafts are weak but real: what the first layers predict.

    write_draft(smollm2_path(), tmp_path / "smollm2-2l.gguf", n_layers=2)
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def write_draft(src: str | Path, dst: str | Path, n_layers: int | None = None, layers=None) -> Path:
    """Write to `dst` the model `src` cut to its first `n_layers` blocks, or to the blocks `layers` (source
    indices, renumbered 0..): every metadata key copied (with `<arch>.block_count` the number kept and per-layer
    arrays cut alike), the other tensors copied raw (quantized bytes unchanged). Raises ValueError for a layer
    outside the model's block_count."""
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    block_count_key = f"{arch}.block_count"
    n_block = int(reader.fields[block_count_key].contents())
    layers = list(range(n_layers or 0)) if layers is None else list(layers)
    if not layers or any(not 0 <= i < n_block for i in layers):
        raise ValueError(f"layers {layers} must be non-empty, each in [0, {n_block}) (the block_count of {src})")
    new_index = {src_i: dst_i for dst_i, src_i in enumerate(layers)}
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # virtual fields, and the one GGUFWriter writes itself
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == block_count_key:
            value = len(layers)
        elif field.name.startswith(f"{arch}.") and isinstance(value, list) and len(value) == n_block:
            value = [value[i] for i in layers]  # per-layer values (head counts, sliding-window pattern...)
        writer.add_key_value(field.name, value, vtype, sub_type=sub_type)
    kept = []  # (new name, tensor)
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        if m is None:
            kept.append((t.name, t))
        elif int(m.group(1)) in new_index:
            kept.append((f"blk.{new_index[int(m.group(1))]}.{t.name[m.end():]}", t))
    for name, t in kept:
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return Path(dst)

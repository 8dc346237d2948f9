"""Fast CPU kernels (numba): quantized matmul with ggml's precision, embedding lookup, CPU/thread control.

    pw = pack_weight(weight)              # once per model: repack to the kernels' layout (repack.py)
    pw = pack_weights([wq, wk, wv])       # or several (same type and k) as one matrix: one call, rows stacked
    y = matmul(x, pw, n_threads)          # (n, k) float32 -> (n, n_rows), as ggml_mul_mat
    e = get_rows(weight, ids)             # (n, k) float32, as ggml_get_rows
    cpu_features(), active_path()         # the target's {"vnni": True, ...}, "vnni" | "portable" (LLAMACTX_NO_VNNI=1)
    arithmetic(), check_target()          # which llama.cpp build's bits; TargetError for a bad NUMBA_CPU_NAME
    set_threads(n)                        # numba + BLAS thread counts

attention.py runs attention over the f16 KV cache, flash.py flash attention over it (the tiled kernel's
arithmetic), compute.py a recorded forward graph (llamactx.ggml.graph) in one compiled call; llamactx.backend.fast
(FastOps) uses all of them. The modules:

    matmul.py       matmul: y = x @ W^T for a packed weight, dispatching to the type's kernel and path
    repack.py       PackedWeight: weights repacked once into the kernels' layouts (pack_weight, pack_weights)
    legacy.py       the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), as x86 vec_dot computes them
    experts.py      a decoded token's experts (Q4_0 / Q5_0 / Q8_0, one row each) as one prefetched weight stream
    wide.py         the same types four rows to a 512-bit register (repack.cpp's interleaved rows)
    legacy_x2.py    the same types two rows to a 256-bit register, four activation rows at a time (AVX2)
    kgemv.py        Q4_K decode near the memory roof (eight interleaved rows at a time, exact integers)
    kblocks.py      Q4_K rows eight to a group (block_q4_Kx8), Q6_K rows as ggml stores them: fields, scales
    q6k_gemv.py     Q6_K decode near the memory roof (ggml_vec_dot_q6_K_q8_K's lanes, 64 elements a vector)
    kquants.py      Q4_K, Q5_K, Q6_K rows (Q8_K activations)
    ktile.py        Q4_K / Q6_K for prompt-sized batches, 16 rows per tile (ggml_gemm_q4_K_8x8_q8_K's order)
    kxquants.py     Q3_K, IQ4_XS, Q5_K in the tiled order, and the repacked IQ4_NL / MXFP4
    kxtile.py       Q3_K, IQ4_XS and Q5_K for prompt-sized batches
    klowbit.py      IQ1_S .. IQ3_S from their packed blocks (vec_dot order below 8 rows, tiled from 8)
    kiqcodes.py     the IQ types' codes of one 32-element group as a vector (klowbit's decode)
    kiqtile.py      IQ2_XXS super-blocks straight into klowbit's tile rows (the MoE experts' prompt decode)
    kiqrow.py       the IQ2 / IQ3 types and IQ1_M for one activation row, decoded in registers (a token's decode)
    bf16.py         BF16 weights (tinyBLAS's order)
    tinyblas.py     F32 weights in tinyBLAS's order, its lanes in register tiles (routers, delta-net gates)
    q8.py           the activation quantizers (float32 rows -> Q8_0 / Q8_1 / Q8_K)
    quant_search.py the scale searches of ggml's quantizers (make_qx_quants ...), fp32 -> fp16 rounding
    quantize_rows.py  ggml_quantize_chunk's row quantizers (K-quants; legacy types with an importance matrix)
    quantize_iq4.py   IQ4_NL / IQ4_XS quantizers (quantize_row_iq4_nl_impl)
    quantize_iq3s.py  the IQ3_S quantizer: iq3xs grid map and neighbours, quantize_row_iq3_s_impl
    quantize_iq2xs.py the IQ2_XS quantizer: iq2xs grid map and neighbours, quantize_row_iq2_xs_impl
    quantize_iq2xxs.py the IQ2_XXS quantizer: quantize_row_iq2_xxs_impl (quant_search's IQ2 grid tables)
    quantize_iq2s.py  the IQ2_S quantizer: quantize_row_iq2_s_impl (IQ2_XS's scale search, 1024-point grid)
    quantize_iq3xxs.py the IQ3_XXS quantizer: quantize_row_iq3_xxs_impl (256-point grid)
    quantize_iq1.py   the IQ1_S / IQ1_M quantizers: quantize_row_iq1_s_impl / iq1_m_impl (exact 3-level splits)
    quantize_tq.py    the TQ1_0 / TQ2_0 quantizers (quantize_row_tq1_0_ref / tq2_0_ref)
    get_rows.py     get_rows: the selected rows of a stored weight, dequantized (embedding lookup)
    attention.py    attention over the f16 KV cache (the non-flash path)
    attention8.py   the same for a target with 8-lane float vectors (AVX2: tinyBLAS<8, __m256>'s sums)
    flash.py        flash attention over it (flash_attn_ext's tiled arithmetic)
    delta_rule.py   the Gated DeltaNet's delta rule, its state updated in place, and ssm_conv (Qwen3.5)
    ssm_scan.py     Mamba-2's selective scan (ggml_ssm_scan), heads in parallel, the state in place
    compute.py      plan_graph / GraphPlan: a recorded graph run in one compiled call (ggml_graph_compute)
    simd.py         vector types and loads as llvmlite intrinsics (numba has none)
    vnni.py         the integer dot product (vpdpbusd) and the int32 lane arithmetic around it

Results are bit-identical to ggml-cpu's x86 vec_dot for every quantized type (matmul.py). The first matmul of a
process compiles the kernel of its path (seconds), later processes load numba's on-disk cache. That cache
only tracks the file of each entry point: after editing a module under kernels/, delete
kernels/__pycache__/*.nbi and *.nbc.
"""

from llamactx.ggml.cpu import (
    TargetError,
    active_path,
    arithmetic,
    cache_is_warm,
    check_target,
    cpu_features,
    path_for,
    set_threads,
)
from llamactx.ggml.kernels.get_rows import get_rows
from llamactx.ggml.kernels.matmul import matmul
from llamactx.ggml.kernels.repack import PACKABLE_TYPES, PackedWeight, can_pack, pack_weight, pack_weights

__all__ = [
    "PACKABLE_TYPES",
    "PackedWeight",
    "TargetError",
    "active_path",
    "arithmetic",
    "cache_is_warm",
    "can_pack",
    "check_target",
    "cpu_features",
    "get_rows",
    "matmul",
    "pack_weight",
    "pack_weights",
    "path_for",
    "set_threads",
]

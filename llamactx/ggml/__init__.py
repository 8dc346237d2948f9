"""ggml-cpu's arithmetic, reproduced: what llama.cpp computes on an x86 CPU, operation for operation.

    vec.py          ggml_vec: softmax's expf, SwiGLU, the GELU table, RMSNorm, RoPE (ggml-cpu/vec.h, ops.cpp)
    vecdot.py       quantized and float dot products of the 32-block types (arch/x86/quants.c, tinyBLAS)
    vecdot_k.py     K-quant matmuls in llama.cpp's repacked / tiled orders (arch/x86/repack.cpp)
    vecdot_kx.py    Q2_K, Q3_K, Q5_K, IQ4_XS (and Q4_K unrepacked) matmuls in llama.cpp's tiled orders
    vecdot_nl.py    IQ4_NL and MXFP4 matmuls (codebook blocks, Q8_0 activations)
    vecdot_bf16.py  BF16 matmuls (activations rounded to bf16; tinyBLAS's order)
    vecdot_lowbit.py  IQ1-IQ3 / TQ1_0 / TQ2_0 matmuls: vec_dot (arch/x86/quants.c) and tiled orders
    lowbit_decode.py  the IQ2 / IQ3 super-blocks unpacked to integer codes and scales, compiled
    attention.py    non-flash attention over an f16 cache (mul_mat + soft_max + mul_mat)
    flash_attn.py   flash attention over an f16 cache (flash_attn_ext: tiled, one chunk, split KV)
    moe.py          the ops of mixture-of-experts routing (build_moe_ffn's soft_max, top-k, weights)
    ssm.py          ssm_conv / ssm_scan (Mamba-2, and the short convolutions of lfm2), ggml_silu
    delta_net.py    gated_delta_net (Qwen3.5's delta rule), softplus, the L2 norm of its q / k
    mrope.py        IMRoPE's sections for text tokens (ggml_rope_multi, Qwen3.5)
    quants_cpu.py   the activation / KV-cache quantizers (`from_float`) as built for x86
    quants_kv.py    every KV cache type's `from_float` (bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)
    graph.py        Graph: the nodes a forward pass records, for kernels/compute.py to plan and run (ggml.c)
    inputs.py       RopeParams, VisibleCells: the plain-data inputs the graph builds (numpy only)
    cpu.py          the target CPU numba compiles for (NUMBA_CPU_NAME), its features, kernel path and arithmetic
                    variant, and the thread counts
    intrinsics.py   the scalar LLVM intrinsics the numba code shares (fma, f16 <-> f32, bit casts)
    libm.py         libm's logf / fmaf for the scalars computed outside kernels (YaRN factors)
    kernels/        the fast numba kernels (what FastOps runs): the same bits, much faster

The backend that calls these (ReferenceOps, FastOps) is llamactx.backend. ggml imports nothing above it: only
llamactx.gguf (block formats) and llamactx.errors.

Nothing here is imported by `import llamactx`; the kernels compile (or load numba's cache) on first use.
"""

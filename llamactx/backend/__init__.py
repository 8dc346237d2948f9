"""The compute backend (llama.cpp's ggml-backend and its scheduler): what runs a forward pass's ops.

    ops.py          the ops interface (a Protocol: every op a model builder calls), GraphParams (llm_graph_params),
                    and the small interfaces through which the backend sees a KV cache view, a compiled attention
                    input and a LoRA-adapted weight; lora_matmuls (build_lora_mm)
    reference.py    ReferenceOps: each op computed as it is called, numpy plus the scalar numba routines of
                    llamactx.ggml: the oracle, bit for bit llama.cpp's x86 kernels
    fast.py         FastOps (the default): the same ops and bits on the numba kernels (llamactx.ggml.kernels),
                    a forward recorded once per ubatch shape and run in one compiled call

The model code (llamactx/models) calls only these ops; the ops import only llamactx.ggml (arithmetic), llamactx.gguf
and llamactx.errors, and know the model side only through the objects they are handed (backend/ops.py).
`import llamactx` loads ops.py and reference.py (nothing compiles); fast.py is imported when a context is made.
"""

"""The compute backend (llama.cpp's ggml-backend and its scheduler): what runs a forward pass's ops.

    reference.py    ReferenceOps: each op computed as it is called, numpy plus the scalar numba routines of
                    llamactx.ggml: the oracle, bit for bit llama.cpp's x86 kernels
    fast.py         FastOps (the default): the same ops and bits on the numba kernels (llamactx.ggml.kernels),
                    a forward recorded once per ubatch shape and run in one compiled call

The model code (llamactx/models) calls only these ops; the ops call only llamactx.ggml (arithmetic) and the few
model-side objects a backend must understand (LoRA-adapted weights, the KV cache's views, graph inputs).
Nothing here is imported by `import llamactx` until a context is made.
"""

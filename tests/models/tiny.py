"""The tiny synthetic models and llama.cpp's outputs for them (tests/data/tiny, REFERENCE.md), shared by the
architecture tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from llamactx import Batch, Context, ContextParams, Model
from llamactx.backend.reference import ReferenceOps
from tests.conftest import VARIANT_DIR

TINY = Path(__file__).parent.parent / "data" / "tiny"
TINY_REF = TINY / VARIANT_DIR  # llama.cpp's outputs for the arithmetic this run computes (avx2/: its AVX2 build)


def load_tiny(name: str) -> tuple[str, Model, dict, dict[str, np.ndarray]]:
    """(name, the model, its <name>.json reference, its <name>.npz logits)."""
    ref = json.loads((TINY_REF / f"{name}.json").read_text())
    with np.load(TINY_REF / f"{name}.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    return name, Model.load(TINY / f"tiny-{name}.gguf"), ref, arrays


def encoder_context(model: Model, pooling: str, flash_attn: str = "disabled", n_seq_max: int = 1) -> Context:
    """An embeddings context for the tiny encoders (bert, nomic-bert, the rerankers): one 512-token ubatch."""
    return Context(model, ContextParams(n_ctx=512, n_batch=512, n_ubatch=512, n_seq_max=n_seq_max, embeddings=True,
                                        pooling_type=pooling, flash_attn=flash_attn))


def sequences_batch(token_lists: list[list[int]]) -> Batch:
    """Token list s as sequence s from position 0, every token an output."""
    batch = Batch(sum(len(t) for t in token_lists))
    for s, tokens in enumerate(token_lists):
        for p, t in enumerate(tokens):
            batch.add(t, p, (s,), True)
    return batch


def interleaved_logits(ctx: Context, a: list[int], b: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Sequences 0 and 1 (tokens a and b from position 0) interleaved by position in one batch, every token an
    output: the logits rows of each, (len(a), n_vocab) and (len(b), n_vocab)."""
    order = sorted([(i, 0, t) for i, t in enumerate(a)] + [(i, 1, t) for i, t in enumerate(b)])
    batch = Batch(len(order))
    for i, seq, t in order:
        batch.add(t, i, [seq], logits=True)
    assert ctx.decode(batch) == 0
    both = ctx.get_logits()
    return tuple(both[[k for k, (_, seq, _) in enumerate(order) if seq == s]] for s in (0, 1))


def compiled_ops(ctx: Context) -> set[str]:
    """The node kinds of the compiled programs FastOps planned for the context's ubatches (empty: op by op)."""
    from llamactx.ggml.kernels import compute

    names = {code: name for name, code in compute._OPS.items()}
    plans = [entry[0] for entry in ctx.ops._plans.values() if entry is not None]
    return {names[int(code)] for plan in plans for code in plan.prog[:, compute.OP]}


def new_ctx(model: Model, ops=None, flash_attn: str = "disabled", **kw) -> Context:
    """A 512-token context for a tiny model; the references were made with flash attention off (the -fa
    variants: on)."""
    return Context(model, ContextParams(n_ctx=512, n_batch=512, n_threads=2, flash_attn=flash_attn, **kw), ops=ops)


def decode_all(ctx: Context, tokens, seq: int = 0, pos0: int = 0) -> np.ndarray:
    """Decode `tokens` as sequence `seq` from position pos0, every token an output: the logits (n, n_vocab)."""
    batch = Batch(len(tokens))
    for i, t in enumerate(tokens):
        batch.add(t, pos0 + i, [seq], logits=True)
    assert ctx.decode(batch) == 0
    return ctx.get_logits().copy()  # (n, n_vocab)


def assert_flash_single_row(model: Model, ref: dict, arrays: dict[str, np.ndarray]) -> None:
    """With flash attention under ggml_single_row: every prompt, then the greedy steps after prompt 0, equal
    llama.cpp's logits bit for bit."""
    for i, prompt in enumerate(ref["prompts"]):
        ctx = new_ctx(model, ReferenceOps(ggml_single_row=True), flash_attn="enabled")
        np.testing.assert_array_equal(decode_all(ctx, prompt["tokens"]), arrays[f"prompt_{i}"], err_msg=f"{i}")
    ctx = new_ctx(model, ReferenceOps(ggml_single_row=True), flash_attn="enabled")
    toks = ref["prompts"][0]["tokens"]
    row = decode_all(ctx, toks)[-1]
    for step, tok in enumerate(ref["greedy"]):
        np.testing.assert_array_equal(row, arrays["greedy"][step], err_msg=f"step {step}")
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]

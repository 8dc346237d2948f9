"""Mixtures of experts (models/moe.py, ggml/moe.py) beyond the logits that tests/models/test_tiny_llama_family.py
checks against llama.cpp's: the router's argsort is libstdc++'s std::sort (ties included), each expert's weights
are read once per ubatch, the engine serves a MoE model, and files whose expert hparams disagree with their
tensors are refused naming the field."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamactx import Batch, Context, ContextParams, Model
from llamactx.backend.fast import FastOps
from llamactx.backend.reference import ReferenceOps
from llamactx.engine import Engine, Limits
from llamactx.ggml.kernels.matmul import matmul_id as kernels_matmul_id
from llamactx.ggml.kernels.repack import pack_weight
from llamactx.ggml.moe import argsort_desc, norm_weights, soft_max_rows
from llamactx.hparams import HParamsError
from llamactx.model import ModelLoadError, Weight
from llamactx.sampling import SamplerChain, SamplingParams
from tests.ggml.test_kernels import random_weight
from tests.gguf.tiny_model import rewrite_gguf
from tests.models.tiny import TINY, decode_all, load_tiny, new_ctx

STD_SORT = r"""
#include <algorithm>
#include <cstdio>
#include <vector>
int main() {  // rows of floats in, std::sort(indices, data[a] > data[b]) out: ggml_argsort's descending order
    int rows, n;
    if (scanf("%d %d", &rows, &n) != 2) return 1;
    std::vector<float> d(n);
    std::vector<int> v(n);
    for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < n; ++j) { if (scanf("%f", &d[j]) != 1) return 1; v[j] = j; }
        std::sort(v.begin(), v.end(), [&](int a, int b) { return d[a] > d[b]; });
        for (int j = 0; j < n; ++j) printf("%d ", v[j]);
        printf("\n");
    }
}
"""


@pytest.fixture(scope="module")
def std_sort(tmp_path_factory):
    """g++'s std::sort as a program (the machine's libstdc++, as ggml's is: GCC 12 on Debian 12)."""
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed to compare the router's argsort with libstdc++'s std::sort")
    d = tmp_path_factory.mktemp("std_sort")
    (d / "s.cpp").write_text(STD_SORT)
    subprocess.run(["g++", "-O2", "-o", str(d / "s"), str(d / "s.cpp")], check=True, timeout=120)
    return d / "s"


def run_std_sort(exe, x: np.ndarray) -> np.ndarray:
    text = f"{x.shape[0]} {x.shape[1]}\n" + "\n".join(" ".join(repr(float(v)) for v in row) for row in x)
    out = subprocess.run([str(exe)], input=text.encode(), capture_output=True, check=True, timeout=60).stdout
    return np.array([[int(t) for t in line.split()] for line in out.decode().strip().split("\n")])


@pytest.mark.parametrize("n", [3, 8, 16, 17, 32, 60, 128, 256, 1000])
def test_argsort_is_std_sort_ties_included(std_sort, n):
    """Few distinct values (ties everywhere), sorted, reversed and constant rows: the same permutation as
    std::sort, so tied experts are chosen and summed in llama.cpp's order."""
    rng = np.random.default_rng(n)
    x = rng.integers(0, 5, size=(40, n)).astype(np.float32)
    x[1] = np.sort(x[1])
    x[2] = np.sort(x[2])[::-1]
    x[3] = 1.0
    x[4] = np.arange(n) % 7  # sawtooth
    np.testing.assert_array_equal(argsort_desc(x), run_std_sort(std_sort, x))
    np.testing.assert_array_equal(argsort_desc(x, 2), run_std_sort(std_sort, x)[:, :2])


def test_router_softmax_and_norm():
    """The softmax sums to one within float rounding, keeps the order, and the normalized weights sum to one;
    a row of zeros normalizes to zeros (the clamp), not NaN."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 128)).astype(np.float32) * 4
    p = soft_max_rows(logits)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(np.argsort(-p, kind="stable"), np.argsort(-logits, kind="stable"))
    w = norm_weights(np.take_along_axis(p, argsort_desc(p, 8), axis=1))
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(norm_weights(np.zeros((1, 4), np.float32)), np.zeros((1, 4), np.float32))


def test_each_expert_is_read_once_per_ubatch(monkeypatch):
    """Eight sequences decoding one token each: every matmul_id is one kernel launch over the rows grouped by
    expert (ggml_mul_mat_id's matrix_row_counts), so each selected expert's weights are read once for all the
    rows routed to it, never once per token. Counted on FastOps' op-by-op path (its compiled graph's MUL_MAT_ID
    node groups the same way, kernels/compute.py `_mul_mat_id_node`)."""
    name, model, ref, _ = load_tiny("qwen3moe")
    calls = []
    import llamactx.backend.fast as fast

    monkeypatch.setattr(FastOps, "_plan", lambda self, *a: None)  # op by op: the launches are Python calls
    real = fast.matmul_id

    def counting(x, pw, starts, *a, **kw):
        calls.append((pw.name, x.shape[0], starts.copy()))
        return real(x, pw, starts, *a, **kw)

    monkeypatch.setattr(fast, "matmul_id", counting)
    ctx = Context(model, ContextParams(n_ctx=512, n_seq_max=8, n_threads=2, flash_attn="disabled"))
    assert isinstance(ctx.ops, FastOps)
    prompts = [ref["prompts"][i % 3]["tokens"][: 4 + i] for i in range(8)]
    batch = Batch(sum(len(p) for p in prompts))
    for s, p in enumerate(prompts):
        for i, t in enumerate(p):
            batch.add(t, i, [s], logits=i == len(p) - 1)
    assert ctx.decode(batch) == 0
    calls.clear()
    step = Batch(8)
    for s, p in enumerate(prompts):
        step.add(ref["greedy"][s], len(p), [s], logits=True)
    assert ctx.decode(step) == 0
    # 2 layers x (up, gate, down): one launch each, over the 8 tokens x 2 slots routed
    assert [c[0].split(".")[1:3] for c in calls] == [["0", "ffn_up_exps"], ["0", "ffn_gate_exps"],
                                                     ["0", "ffn_down_exps"], ["1", "ffn_up_exps"],
                                                     ["1", "ffn_gate_exps"], ["1", "ffn_down_exps"]]
    for _, rows, starts in calls:
        assert rows == 16 and starts[0] == 0 and starts[-1] == 16 and (np.diff(starts) >= 0).all()
        assert (np.diff(starts) > 0).sum() >= 2  # the tokens went to several experts, each run once


@pytest.mark.parametrize("name", ["qwen3moe", "qwen2moe"])
def test_engine_serves_moe_greedy(name):
    """Two requests at once through the engine: each gets llama.cpp's greedy continuation (qwen2moe: with its
    shared expert)."""
    name, model, ref, _ = load_tiny(name)
    engine = Engine(model, n_slots=2, n_ctx=512, n_batch=64, n_threads=2, flash_attn="disabled")
    prompt = ref["prompts"][0]["tokens"]
    chain = lambda: SamplerChain.default(SamplingParams(temperature=0.0), model.hparams.n_vocab, model.vocab,  # noqa: E731
                                         n_ctx=512)
    seqs = [engine.add_request(list(prompt), chain(), Limits(max_tokens=16)) for _ in range(2)]
    for _ in range(200):
        if not engine.has_work:
            break
        engine.step()
    for seq in seqs:
        assert seq.is_finished
        assert seq.output[:16] == ref["greedy"][:16]


def _rewrite(tmp_path, src_name: str, meta: dict | None = None, drop: str | None = None):
    """A copy of a tiny GGUF with some metadata values replaced and a tensor dropped."""
    return rewrite_gguf(TINY / f"tiny-{src_name}.gguf", tmp_path / "bad.gguf", meta, {drop: None} if drop else None)


@pytest.mark.parametrize("meta,message", [
    ({"qwen3moe.expert_used_count": 9}, r"qwen3moe.expert_used_count' = 9 is outside \[1, 8\]"),
    ({"qwen3moe.expert_used_count": 0}, r"qwen3moe.expert_used_count' = 0 is outside \[1, 8\]"),
    ({"qwen3moe.expert_count": 6}, r"ffn_gate_inp.weight' has shape \[64, 8\], expected \[64, 6\]"),
    ({"qwen3moe.expert_count": 2000}, r"qwen3moe.expert_count' = 2000 is outside \[0, 1024\]"),
    ({"qwen3moe.expert_feed_forward_length": 48}, r"ffn_gate_exps.weight' has shape \[64, 32, 8\], expected "
                                                  r"\[64, 48, 8\]"),
])
def test_moe_hparams_that_disagree_are_refused(tmp_path, meta, message):
    path = _rewrite(tmp_path, "qwen3moe", meta)
    with pytest.raises(ModelLoadError, match=message):
        Model.load(path)


def test_moe_without_router_or_experts_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="blk.1.ffn_gate_inp.weight' is missing"):
        Model.load(_rewrite(tmp_path, "qwen3moe", drop="blk.1.ffn_gate_inp.weight"))
    with pytest.raises(ModelLoadError, match="blk.0.ffn_gate_exps.weight' is missing"):
        Model.load(_rewrite(tmp_path, "qwen3moe", drop="blk.0.ffn_gate_exps.weight"))


def test_qwen2moe_runs_as_a_compiled_graph():
    """The shared expert's gate (a 1-row F32 matmul, silu, a division, a per-row product) has executor nodes: the
    prompt and the decode steps are planned whole, with llama.cpp's logits."""
    name, model, ref, arrays = load_tiny("qwen2moe")
    ctx = new_ctx(model)
    toks = ref["prompts"][0]["tokens"]
    np.testing.assert_array_equal(decode_all(ctx, toks), arrays["prompt_0"])
    for step, tok in enumerate(ref["greedy"][:4]):
        row = decode_all(ctx, [tok], pos0=len(toks) + step)[-1]
        np.testing.assert_allclose(row, arrays["greedy"][step + 1], rtol=0, atol=1e-2)  # ggml_single_row: exact
    assert ctx.ops._plans and all(entry is not None for entry in ctx.ops._plans.values())


def test_qwen2moe_shared_expert_must_agree(tmp_path):
    """qwen2moe's shared expert is required, and its width is expert_shared_feed_forward_length (`llamactx info`
    says it)."""
    assert "a shared expert of n_ff 64" in load_tiny("qwen2moe")[1].card()
    with pytest.raises(ModelLoadError, match="blk.1.ffn_gate_inp_shexp.weight' is missing"):
        Model.load(_rewrite(tmp_path, "qwen2moe", drop="blk.1.ffn_gate_inp_shexp.weight"))
    with pytest.raises(ModelLoadError, match=r"ffn_gate_shexp.weight' has shape \[64, 64\], expected \[64, 96\]"):
        Model.load(_rewrite(tmp_path, "qwen2moe", {"qwen2moe.expert_shared_feed_forward_length": 96}))
    with pytest.raises(HParamsError, match="qwen2moe.expert_count"):
        Model.load(_rewrite(tmp_path, "qwen2moe", {"qwen2moe.expert_count": 0, "qwen2moe.expert_used_count": 0}))


def test_qwen3moe_without_experts_is_refused(tmp_path):
    """A qwen3moe file with expert_count 0 (or none): HParamsError naming the key, as llama.cpp refuses it."""
    path = _rewrite(tmp_path, "qwen3moe", {"qwen3moe.expert_count": 0, "qwen3moe.expert_used_count": 0})
    with pytest.raises(HParamsError, match="qwen3moe.expert_count"):
        Model.load(path)


@pytest.mark.parametrize("t,n_ff", [(T.Q8_0, 32), (T.Q5_0, 32), (T.Q4_0, 36), (T.Q4_0, 32), (T.Q4_K, 32),
                                    (T.Q4_K, 12), (T.Q5_K, 16), (T.Q6_K, 16)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_expert_kernel_equals_reference_rows_alone(t, n_ff):
    """kernels.matmul.matmul_id (one launch for all experts) gives ReferenceOps.matmul_id's bits: every row as
    ggml_mul_mat_id computes it alone (a repacked Q4_K expert's gemv, else ggml_vec_dot), for up to 12 rows per
    expert. Q4_0 with ne1 % 8 == 0 is repacked: its gemv's one FMA per block, on the kernels too."""
    rng = np.random.default_rng(int(t) * 100 + n_ff)
    k, n_expert, n, n_used = (256 if int(t) >= int(T.Q2_K) else 64), 6, 9, 3
    w2 = random_weight(t, k, n_ff * n_expert, rng)
    w3 = Weight("blk.0.ffn_up_exps.weight", int(t), (k, n_ff, n_expert), w2.data)
    x = rng.standard_normal((n, k)).astype(np.float32)
    selected = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n)]).astype(np.int32)  # (n, k)
    ref = ReferenceOps().matmul_id(x, w3, selected)  # (n, n_used, n_ff)
    flat = np.argsort(selected, axis=None, kind="stable")
    tok, slot = np.divmod(flat, n_used)
    starts = np.searchsorted(selected.reshape(-1)[flat], np.arange(n_expert + 1))
    got = np.empty_like(ref)
    got[tok, slot] = kernels_matmul_id(x[tok], pack_weight(w2), starts.astype(np.int64), n_ff, 2)
    np.testing.assert_array_equal(got, ref)

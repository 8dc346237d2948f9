"""The `mamba2` architecture (Mamba-2 state-space models): src/models/mamba2.cpp (tensors), src/models/mamba.cpp
(the layer loop) and src/models/mamba-base.cpp (`build_mamba2_layer`).

No attention and no positions: each layer is RMS norm, then the SSM block, then the residual. The block projects
to z | xBC | dt, runs a causal depthwise convolution over xBC continuing the sequence's conv state
(ggml_ssm_conv), SiLU, then the selective scan over the sequence's SSM state (ggml_ssm_scan), adds x * D, gates
with SiLU(z), RMS-norms each group and projects back. The states live in the recurrent memory
(llamactx.memory.recurrent); the forward reads and writes them through the ubatch's `RecurrentView` (its
ssm_conv / ssm_scan loop over the sequence sets as ggml's ops loop over the ubatch's sequences), so FastOps records
the forward as one compiled program (SSM_CONV_RS, SSM_SCAN_RS: llamactx.ggml.kernels.ssm_scan) that updates the
states in place; granitehybrid and nemotron_h run these layers (`mamba2_layer`) beside their others.
"""

from __future__ import annotations

import numpy as np

from llamactx.backend.ops import GraphParams
from llamactx.ggml.inputs import ROPE_TYPE_NORM
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models.graph_inputs import ForwardResult, RecurrentInput
from llamactx.models.llama import output_weight_name

ARCHS = {"mamba2": ROPE_TYPE_NORM}  # no RoPE at all (LLAMA_ROPE_TYPE_NONE): the type is never used
MEMORY = "recurrent"  # llama_model::create_memory: llama_memory_recurrent


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_mamba2::load_arch_hparams: the ssm.* keys, with the divisibility build_mamba2_layer and
    ggml_ssm_scan assert."""
    out = {"ssm_d_conv": m.count("ssm.conv_kernel", lo=2), "ssm_d_inner": m.count("ssm.inner_size"),
           "ssm_d_state": m.count("ssm.state_size"), "ssm_dt_rank": m.count("ssm.time_step_rank"),
           "ssm_n_group": m.count("ssm.group_count")}
    checks = (("ssm.time_step_rank", out["ssm_dt_rank"], "ssm.inner_size", out["ssm_d_inner"]),
              ("ssm.group_count", out["ssm_n_group"], "ssm.inner_size", out["ssm_d_inner"]),
              ("ssm.group_count", out["ssm_n_group"], "ssm.time_step_rank", out["ssm_dt_rank"]))
    for name, divisor, of_name, of in checks:
        if of % divisor:
            raise HParamsError(f"'{m.arch}.{name}' = {divisor} does not divide '{m.arch}.{of_name}' = {of}")
    return out


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_mamba2::load_arch_tensors: name -> (ggml shape, required)."""
    d_inner, n_head, n_group = hp.ssm_d_inner, hp.ssm_dt_rank, hp.ssm_n_group
    conv_dim = d_inner + 2 * n_group * hp.ssm_d_state
    shapes: dict[str, tuple[tuple[int, ...], bool]] = {
        "token_embd.weight": ((hp.n_embd, hp.n_vocab), True),
        "output_norm.weight": ((hp.n_embd,), True),
        "output.weight": ((hp.n_embd, hp.n_vocab), False),
    }
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": ((hp.n_embd,), True),
            b + "ssm_in.weight": ((hp.n_embd, d_inner + conv_dim + n_head), True),
            b + "ssm_conv1d.weight": ((hp.ssm_d_conv, conv_dim), True),
            b + "ssm_conv1d.bias": ((conv_dim,), True),
            b + "ssm_dt.bias": ((n_head,), True),
            b + "ssm_a": ((1, n_head), True),
            b + "ssm_d": ((1, n_head), True),
            b + "ssm_norm.weight": ((d_inner // n_group, n_group), True),
            b + "ssm_out.weight": ((d_inner, hp.n_embd), True),
        })
    return shapes


def build(ops, params: GraphParams) -> ForwardResult:
    """One ubatch through the network (llama_model_mamba::graph). token (n,) or embd (n, n_embd); pos is not
    used; rs: the ubatch's view of the recurrent memory."""
    model, token, embd = params.model, params.token, params.embd
    rs, out_ids, want_logits = params.inp.rs, params.out_ids, params.want_logits
    hp = model.hparams
    w, t = model.weight, model.tensors
    eps = hp.f_norm_rms_eps
    x = ops.get_rows(w("token_embd.weight"), token) if token is not None else embd  # (n, n_embd)
    for il in range(hp.n_layer):
        cur = ops.rms_norm(x, t[f"blk.{il}.attn_norm.weight"], eps)  # (n, n_embd)
        cur = mamba2_layer(model, ops, rs, cur, il)  # (n, n_embd)
        if il == hp.n_layer - 1:
            cur, x = cur[out_ids], x[out_ids]
        x = cur + x
    x = ops.rms_norm(x, t["output_norm.weight"], eps)  # (n_out, n_embd)
    logits = ops.matmul(x, w(output_weight_name(model))) if want_logits else None  # (n_out, n_vocab)
    return ForwardResult(logits=logits, embd=x)


def mamba2_layer(model, ops, rs: RecurrentInput, cur: np.ndarray, il: int) -> np.ndarray:
    """build_mamba2_layer: (n, n_embd) -> (n, n_embd), updating layer `il`'s states of every sequence set."""
    hp = model.hparams
    w, t = model.weight, model.tensors
    b = f"blk.{il}."
    n = cur.shape[0]
    d_inner, d_state, n_head, n_group = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_n_group
    head_dim = d_inner // n_head
    conv_dim = d_inner + 2 * n_group * d_state
    zxbcdt = ops.matmul(cur, w(b + "ssm_in.weight"))  # (n, d_inner + conv_dim + n_head)
    z = zxbcdt[:, :d_inner].reshape(n, n_head, head_dim)
    xbc = zxbcdt[:, d_inner : d_inner + conv_dim]  # (n, conv_dim)
    dt = zxbcdt[:, d_inner + conv_dim :] + t[b + "ssm_dt.bias"]  # (n, n_head)

    conv = rs.ssm_conv(ops, il, xbc, t[b + "ssm_conv1d.weight"])  # (n, conv_dim), conv states updated
    xbc = ops.silu(conv + t[b + "ssm_conv1d.bias"])  # (n, conv_dim)
    xs = xbc[:, :d_inner].reshape(n, n_head, head_dim)
    bs = xbc[:, d_inner : d_inner + n_group * d_state].reshape(n, n_group, d_state)
    cs = xbc[:, d_inner + n_group * d_state :].reshape(n, n_group, d_state)

    y = rs.ssm_scan(ops, il, xs, dt, t[b + "ssm_a"].reshape(n_head), bs, cs)  # (n, n_head, head_dim), states updated
    d = np.repeat(t[b + "ssm_d"].reshape(n_head), head_dim)  # (d_inner,): D of each head, along its values
    y = y + (xbc[:, :d_inner] * d).reshape(n, n_head, head_dim)  # y + x * D
    y = ops.swiglu(z, y)  # silu(z) * y, rows of head_dim as ggml's 4-D tensor
    group = d_inner // n_group
    y = ops.rms_norm(y.reshape(n, n_group, group), np.ones(group, np.float32), hp.f_norm_rms_eps)
    y = y.reshape(n, d_inner) * t[b + "ssm_norm.weight"].reshape(d_inner)  # (n, d_inner): build_norm's ggml_mul
    return ops.matmul(y, w(b + "ssm_out.weight"))  # (n, n_embd)

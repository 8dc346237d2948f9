"""The ops layer: the few tensor operations a forward pass calls, with llama.cpp's precision choices.

`ReferenceOps` is plain numpy and is the oracle the fast kernels are tested against. The model code
(`llamactx/models/*.py`) only calls these methods, so a faster backend replaces them without touching it.
Where the numbers depend on how ggml computes, the method says which ggml function it follows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from llamactx.gguf.quants import dequantize, fake_quant, vec_dot_type
from llamactx.hparams import ROPE_TYPE_NEOX
from llamactx.vecdot import EXACT_TYPES, matmul_exact


@dataclass(frozen=True, slots=True)
class RopeParams:
    """Arguments of ggml_rope_ext for one layer."""

    n_rot: int
    mode: int
    freq_base: float
    freq_scale: float
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0


def _gelu_table() -> np.ndarray:
    """ggml's GELU lookup table: gelu(tanh approx) of every f16 value, rounded to f16 (ggml_table_gelu_f16)."""
    x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        inner = np.float32(0.7978845608028654) * x * (np.float32(1.0) + np.float32(0.044715) * x * x)
        y = np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))
    return y.astype(np.float16).astype(np.float32)


class ReferenceOps:
    """Numpy ops that follow ggml-cpu's arithmetic closely enough to reproduce llama.cpp's logits."""

    name = "reference"

    def __init__(self) -> None:
        self._gelu = _gelu_table()  # (65536,) float32

    # -- weights ------------------------------------------------------------------------------------------------

    def get_rows(self, weight, ids: np.ndarray) -> np.ndarray:
        """Embedding lookup (ggml_get_rows): the selected rows dequantized to f32. -> (n, ne0)"""
        rows = weight.data[ids]  # (n, row_bytes) or typed (n, ne0)
        return dequantize(rows.reshape(-1), weight.ggml_type, (weight.shape[0], len(ids)))

    def matmul(self, x: np.ndarray, weight) -> np.ndarray:
        """y = x @ W^T (ggml_mul_mat(W, x)). Activations are first converted to the weight's vec_dot_type
        (Q8_0 / Q8_1 / Q8_K, or f16), as ggml-cpu does before its integer dot products. 32-block types follow
        ggml's x86 dot product exactly (llamactx.vecdot); the others multiply in float64 and round, so a row's
        result never depends on the other rows of the batch. (n, ne0) -> (n, ne1)"""
        if x.shape[0] == 0:  # an ubatch without outputs reaches the last FFN with no rows
            return np.zeros((0, weight.n_rows), np.float32)
        if weight.ggml_type in EXACT_TYPES:
            return matmul_exact(x, weight)
        w = dequantize(weight.data.reshape(-1), weight.ggml_type, weight.shape)  # (ne1, ne0)
        xq = self.activations_for(x, weight.ggml_type)
        return (xq.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)

    @staticmethod
    def activations_for(x: np.ndarray, weight_type: int) -> np.ndarray:
        """x as the weight's vec_dot kernel sees it. (n, k) float32 -> (n, k) float32"""
        vdt = vec_dot_type(weight_type)
        if vdt == T.F32:
            return np.ascontiguousarray(x, np.float32)
        if vdt in (T.F16, T.BF16):
            return x.astype(np.float16).astype(np.float32) if vdt == T.F16 else _round_bf16(x)
        return fake_quant(np.ascontiguousarray(x, np.float32), vdt)

    # -- elementwise --------------------------------------------------------------------------------------------

    @staticmethod
    def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """ggml_rms_norm then ggml_mul: squares summed in double, mean and scale in float. (..., n) -> (..., n)"""
        sq = (x * x).astype(np.float64).sum(axis=-1, keepdims=True)  # (..., 1)
        mean = (sq / x.shape[-1]).astype(np.float32)
        scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
        return (x * scale) * weight

    @staticmethod
    def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """silu(gate) * up (ggml_swiglu_split)."""
        return gate / (np.float32(1.0) + np.exp(-gate)) * up

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """gelu(gate) * up with ggml's f16 GELU table (ggml_vec_geglu_f32 under GGML_GELU_FP16)."""
        g16 = gate.astype(np.float16).view(np.uint16)
        y = self._gelu[g16]
        y = np.where(gate <= -10.0, np.float32(0.0), np.where(gate >= 10.0, gate, y))
        return (y * up).astype(np.float32)

    # -- rope ---------------------------------------------------------------------------------------------------

    @staticmethod
    def rope_cache(pos: np.ndarray, rp: RopeParams) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin of every (position, pair) as ggml_rope_cache_init: theta multiplied by theta_scale one pair at a
        time in float32. -> two (n, n_rot/2) float32 arrays"""
        theta_scale = np.float32(rp.freq_base) ** np.float32(-2.0 / rp.n_rot)
        steps = np.full((len(pos), rp.n_rot // 2), theta_scale, np.float32)  # (n, n_rot/2)
        steps[:, 0] = pos.astype(np.float32)
        theta = np.cumprod(steps, axis=1, dtype=np.float32) * np.float32(rp.freq_scale)
        mscale = np.float32(rp.attn_factor)
        if rp.ext_factor != 0.0:
            raise NotImplementedError("YaRN (ext_factor != 0) is not implemented")
        return np.cos(theta) * mscale, np.sin(theta) * mscale

    def rope(self, x: np.ndarray, pos: np.ndarray, rp: RopeParams) -> np.ndarray:
        """ggml_rope_ext on (n, n_head, head_dim) float32. NORM rotates adjacent pairs (x[2i], x[2i+1]); NEOX
        rotates (x[i], x[i + n_rot/2]). Dimensions past n_rot pass through."""
        cos, sin = self.rope_cache(pos, rp)  # (n, n_rot/2)
        cos, sin = cos[:, None, :], sin[:, None, :]
        out = x.copy()
        half = rp.n_rot // 2
        if rp.mode == ROPE_TYPE_NEOX:
            x0, x1 = x[..., :half], x[..., half : rp.n_rot]
            out[..., :half] = x0 * cos - x1 * sin
            out[..., half : rp.n_rot] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., 0 : rp.n_rot : 2], x[..., 1 : rp.n_rot : 2]
            out[..., 0 : rp.n_rot : 2] = x0 * cos - x1 * sin
            out[..., 1 : rp.n_rot : 2] = x0 * sin + x1 * cos
        return out

    # -- attention ----------------------------------------------------------------------------------------------

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, kq_scale: float,
                  flash: bool, k_type: str = "f16") -> np.ndarray:
        """Multi-head attention with grouped KV heads (build_attn_mha).

        q: (n, n_head, d_k) float32; k: (n_kv, n_head_kv, d_k) and v: (n_kv, n_head_kv, d_v) as read from the cache
        (already f32); mask: (n, n_kv) float32 of 0 / -inf. Without flash attention ggml multiplies the f16 cache
        with f16-rounded q, and the softmax probabilities are rounded to f16 before P*V. With flash attention q is
        rounded like the K cache's vec_dot_type and P*V stays in f32. The products are summed in float64 and
        rounded, so a token's result does not depend on the other tokens and cells. -> (n, n_head * d_v)"""
        n, n_head, _ = q.shape
        n_head_kv = k.shape[1]
        qc = self.activations_for(q.reshape(n * n_head, -1), _KV_TYPE_IDS[k_type]).reshape(q.shape)
        qg = qc.reshape(n, n_head_kv, n_head // n_head_kv, -1).transpose(1, 0, 2, 3)  # (n_head_kv, n, gqa, d_k)
        kt = k.transpose(1, 2, 0).astype(np.float64)  # (n_head_kv, d_k, n_kv)
        scores = np.matmul(qg.reshape(n_head_kv, -1, qg.shape[-1]).astype(np.float64), kt).astype(np.float32)
        scores = scores.reshape(n_head_kv, n, -1, k.shape[0]) * np.float32(kq_scale) + mask[None, :, None, :]
        probs = _softmax(scores)  # (n_head_kv, n, gqa, n_kv)
        if not flash:
            probs = probs.astype(np.float16).astype(np.float32)
        out = np.matmul(probs.reshape(n_head_kv, -1, k.shape[0]).astype(np.float64),
                        v.transpose(1, 0, 2).astype(np.float64)).astype(np.float32)  # (n_head_kv, n*gqa, d_v)
        out = out.reshape(n_head_kv, n, n_head // n_head_kv, -1).transpose(1, 0, 2, 3)  # (n, n_head_kv, gqa, d_v)
        return np.ascontiguousarray(out.reshape(n, -1), np.float32)


_KV_TYPE_IDS = {"f32": T.F32, "f16": T.F16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}


def _softmax(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max over the last axis: exp(x - max), the sum accumulated in double."""
    m = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)  # masked entries: exp(-inf) = 0
    s = e.astype(np.float64).sum(axis=-1, keepdims=True)
    return (e * (1.0 / s).astype(np.float32)).astype(np.float32)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)

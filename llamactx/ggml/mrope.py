"""Multi-section RoPE of text tokens: `ggml_rope_multi` in GGML_ROPE_TYPE_IMROPE mode (ggml/src/ggml-cpu/ops.cpp,
ggml_mrope_cache_init and rotate_pairs), as Qwen3-VL and Qwen3.5 apply it.

Each rotated pair i takes its angle from one of four position streams (t, h, w, e), chosen by its sector
(i % sum(sections)) interleaved: sector % 3 == 1 below 3 * sections[1] is h, == 2 below 3 * sections[2] is w,
== 0 below 3 * sections[0] is t, anything else e. For a text token llama.cpp sets t = h = w = its position and
e = 0 (llm_graph_input_pos::set_input), and every stream starts from its own position and is multiplied by the
same theta_scale pair after pair, so a t / h / w pair has the angle ggml_rope_cache_init gives the position and an
e pair the angle of position 0 (cos = attn_factor, sin = 0 without YaRN). The rotation is NEOX's (x[i],
x[i + n_rot / 2]). A KV shift (llama_kv_cache::build_rope_shift) rotates M-RoPE models with plain NEOX.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llamactx.ggml import vec as ggml_vec
from llamactx.ggml.inputs import ROPE_TYPE_NEOX, RopeParams


def imrope_fourth_section(n_rot: int, sections: tuple[int, ...]) -> np.ndarray:
    """Which of the n_rot / 2 pairs take the fourth ("e") stream under IMRoPE. -> (n_rot / 2,) bool"""
    s = (tuple(sections) + (0, 0, 0, 0))[:4]
    sector = np.arange(n_rot // 2) % sum(s)
    t = (sector % 3 == 0) & (sector < 3 * s[0])
    h = (sector % 3 == 1) & (sector < 3 * s[1])
    w = (sector % 3 == 2) & (sector < 3 * s[2])
    return ~(t | h | w)


def imrope_text_cache(cos: np.ndarray, sin: np.ndarray, cos0: np.ndarray, sin0: np.ndarray, n_rot: int,
                      sections: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The IMRoPE cache of text tokens from the plain cache of their positions (cos, sin (n, n_rot / 2)) and of
    position 0 (cos0, sin0 (1, n_rot / 2)): the fourth section's pairs take position 0's. -> cos, sin"""
    e = imrope_fourth_section(n_rot, sections)  # (n_rot / 2,)
    if not e.any():
        return cos, sin
    cos, sin = cos.copy(), sin.copy()
    cos[:, e] = cos0[0, e]
    sin[:, e] = sin0[0, e]
    return cos, sin


@dataclass(frozen=True, slots=True, eq=False)
class ImropeTable:
    """The RoPE table of IMRoPE over text positions, for a compiled graph's rope node: the plain parameters `rp`
    and the four `sections`; `cache(pos)` the (cos, sin) rows the reference's rope_imrope rotates with."""

    rp: RopeParams
    sections: tuple[int, ...]

    @property
    def n_rot(self) -> int:
        return self.rp.n_rot

    @property
    def mode(self) -> int:
        """The rotation: NEOX's pairs (x[i], x[i + n_rot / 2])."""
        return ROPE_TYPE_NEOX

    def cache(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """-> cos, sin (n, n_rot / 2) float32, the fourth section's pairs at position 0's angle."""
        cos, sin = ggml_vec.rope_cache(pos, self.rp)
        cos0, sin0 = ggml_vec.rope_cache(np.zeros(1, np.int64), self.rp)
        return imrope_text_cache(cos, sin, cos0, sin0, self.rp.n_rot, self.sections)

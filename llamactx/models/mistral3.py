"""The `mistral3` architecture (Ministral 3 3B / 8B / 14B): src/models/mistral3.cpp.

Its graph is llama's (models/llama.py `build`: separate q/k/v, RMS norms, SwiGLU FFN or Mixtral-style experts,
RoPE of adjacent pairs over the whole head) plus Llama 4's attention temperature: with
`attention.temperature_scale` (the converter's llama_4_scaling_beta), Q after RoPE is multiplied by
1 + scale * ln(floor(pos / n_floor) + 1), one factor per token (llm_graph_input_attn_temp,
graph_inputs.attn_temp_scale), whose floor scale is the model's `rope.scaling.original_context_length`. Its
YaRN reads betas and the log multiplier from the file (`rope.scaling.yarn_beta_fast` / `_slow`,
`yarn_log_multiplier`, which llama_context turns into yarn_attn_factor). A file whose rope scaling type is
longrope takes `rope_factors_long` / `rope_factors_short` instead of `rope_freqs` (load_arch_tensors).
"""

from __future__ import annotations

from llamactx.ggml.inputs import ROPE_TYPE_NORM
from llamactx.hparams import HParams, HParamsError, Meta
from llamactx.models import llama

ARCHS = {"mistral3": ROPE_TYPE_NORM}  # llama_model_rope_type
MEMORY = "kv"  # llama_model::create_memory: llama_kv_cache

build = llama.build


def arch_hparams(m: Meta, hp: dict) -> dict:
    """llama_model_mistral3::load_arch_hparams: the YaRN betas, the attention temperature scale and its floor
    scale n_ctx_orig_yarn (which must then not be 0); the graph asserts n_rot == the head size; experts as
    Mixtral's (an expert's width is n_ff)."""
    if hp["n_rot"] != hp["n_embd_head_k"]:
        raise HParamsError(f"'{m.arch}.rope.dimension_count' = {hp['n_rot']}: expected the head size "
                           f"{hp['n_embd_head_k']}")
    fields = {"n_ff_exp": hp["n_ff"] if hp["n_expert"] else 0,
              "yarn_beta_fast": m.real("rope.scaling.yarn_beta_fast", hp["yarn_beta_fast"], zero_ok=True),
              "yarn_beta_slow": m.real("rope.scaling.yarn_beta_slow", hp["yarn_beta_slow"], zero_ok=True),
              "f_attn_temp_scale": m.real("attention.temperature_scale", 0.0, zero_ok=True),
              "f_attn_temp_offset": 0.0}
    if fields["f_attn_temp_scale"]:
        if hp["n_ctx_orig_yarn"] == 0:
            raise HParamsError(f"'{m.arch}.rope.scaling.original_context_length' = 0: invalid n_ctx_orig_yarn for "
                               f"attention temperature scaling ('{m.arch}.attention.temperature_scale' = "
                               f"{fields['f_attn_temp_scale']})")
        fields["n_attn_temp_floor_scale"] = hp["n_ctx_orig_yarn"]
    return fields


def tensor_shapes(hp: HParams) -> dict[str, tuple[tuple[int, ...], bool]]:
    """llama_model_mistral3::load_arch_tensors: llama's tensors, with LongRoPE's factor pair in place of
    rope_freqs when the file's rope scaling type is longrope."""
    shapes = llama.tensor_shapes(hp)
    if hp.rope_scaling_type == "longrope":
        del shapes["rope_freqs.weight"]
        shapes["rope_factors_long.weight"] = ((hp.n_rot // 2,), False)
        shapes["rope_factors_short.weight"] = ((hp.n_rot // 2,), False)
    return shapes

"""Which type each tensor gets in `llamactx quantize`: src/llama-quant.cpp `llama_tensor_get_type`,
`llama_tensor_get_type_impl` (the file-type mixes: Q4_K_M's Q6_K attn_v / ffn_down in the layers `use_more_bits`
picks, Q2_K's Q3_K / Q4_K bumps, the output / token_embd rules, ...), `tensor_type_fallback` and
`tensor_allows_quantization`, for the file types llamactx writes (cli/quantize.py): F16, BF16, F32, Q8_0, the
legacy 32-blocks, the K-quant mixes, the IQ1 / IQ2 / IQ3 / IQ4 mixes, TQ1_0 and TQ2_0. The branches of llama.cpp for
MXFP4 are left out with its type.

`TypeChooser` holds llama-quant.cpp's `quantize_state_impl` counters (i_attention_wv, i_ffn_down, ...): it must see
the tensors in llama-quantize's order, each once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from llamactx.cli.args import CommandError

T = GGMLQuantizationType
F = LlamaFileType

# file type name -> (llama_ftype, its default tensor type): llama-quantize's QUANT_OPTIONS that llamactx writes
FILE_TYPES = {
    "Q4_0": (F.MOSTLY_Q4_0, T.Q4_0), "Q4_1": (F.MOSTLY_Q4_1, T.Q4_1), "Q5_0": (F.MOSTLY_Q5_0, T.Q5_0),
    "Q5_1": (F.MOSTLY_Q5_1, T.Q5_1), "Q2_K": (F.MOSTLY_Q2_K, T.Q2_K), "Q2_K_S": (F.MOSTLY_Q2_K_S, T.Q2_K),
    "Q3_K": (F.MOSTLY_Q3_K_M, T.Q3_K), "Q3_K_S": (F.MOSTLY_Q3_K_S, T.Q3_K), "Q3_K_M": (F.MOSTLY_Q3_K_M, T.Q3_K),
    "Q3_K_L": (F.MOSTLY_Q3_K_L, T.Q3_K), "Q4_K": (F.MOSTLY_Q4_K_M, T.Q4_K), "Q4_K_S": (F.MOSTLY_Q4_K_S, T.Q4_K),
    "Q4_K_M": (F.MOSTLY_Q4_K_M, T.Q4_K), "Q5_K": (F.MOSTLY_Q5_K_M, T.Q5_K), "Q5_K_S": (F.MOSTLY_Q5_K_S, T.Q5_K),
    "Q5_K_M": (F.MOSTLY_Q5_K_M, T.Q5_K), "Q6_K": (F.MOSTLY_Q6_K, T.Q6_K), "Q8_0": (F.MOSTLY_Q8_0, T.Q8_0),
    "IQ2_XS": (F.MOSTLY_IQ2_XS, T.IQ2_XS), "IQ3_S": (F.MOSTLY_IQ3_S, T.IQ3_S), "IQ4_NL": (F.MOSTLY_IQ4_NL, T.IQ4_NL),
    "IQ4_XS": (F.MOSTLY_IQ4_XS, T.IQ4_XS), "TQ1_0": (F.MOSTLY_TQ1_0, T.TQ1_0), "TQ2_0": (F.MOSTLY_TQ2_0, T.TQ2_0),
    "IQ2_XXS": (F.MOSTLY_IQ2_XXS, T.IQ2_XXS), "IQ2_S": (F.MOSTLY_IQ2_S, T.IQ2_XS), "IQ2_M": (F.MOSTLY_IQ2_M, T.IQ2_S),
    "IQ3_XXS": (F.MOSTLY_IQ3_XXS, T.IQ3_XXS), "IQ3_XS": (F.MOSTLY_IQ3_XS, T.IQ3_S), "IQ3_M": (F.MOSTLY_IQ3_M, T.IQ3_S),
    "IQ1_S": (F.MOSTLY_IQ1_S, T.IQ1_S), "IQ1_M": (F.MOSTLY_IQ1_M, T.IQ1_M),
    "F16": (F.MOSTLY_F16, T.F16), "BF16": (F.MOSTLY_BF16, T.BF16),
    "F32": (F.ALL_F32, T.F32),
}
# ggml type names (ggml_type_name) a --tensor-type / --output-tensor-type / --token-embedding-type may name
TENSOR_TYPES = {t.name.lower() if t.name[-2:] != "_K" else t.name[:-1].lower() + "K": t for t in
                (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
                 T.Q6_K, T.IQ2_XS, T.IQ3_S, T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.IQ2_XXS, T.IQ2_S, T.IQ3_XXS,
                 T.IQ1_S, T.IQ1_M)}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)  # ggml_is_quantized is false for them

# llama-quant.cpp `tensor_allows_quantization`: name parts of the tensors kept as they are (the GLM5-next list,
# for an architecture llamactx does not run, is left out)
_KEEP_PARTS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    *(f"time_mix_{w}.weight" for w in ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2",
                                      "decay_w1", "decay_w2", "lerp_fused")),
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
    ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")
_IQ2_FILES = (F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M, F.MOSTLY_IQ1_S, F.MOSTLY_IQ1_M)
# tensor_type_fallback: a 256-block type whose rows it does not divide -> a 32-block type
_FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ2_XS: T.IQ4_NL,
             T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL, T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
             T.IQ2_XXS: T.IQ4_NL, T.IQ2_S: T.IQ4_NL, T.IQ3_XXS: T.IQ4_NL, T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL}


def parse_tensor_type(name: str, what: str) -> T:
    """parse_ggml_type: a ggml type name, any case. Raises CommandError listing the known ones."""
    for type_name, t in TENSOR_TYPES.items():
        if name.lower() == type_name.lower():
            return t
    raise CommandError(f"quantize: {what}: unknown type '{name}' (known: {', '.join(TENSOR_TYPES)})")


def parse_tensor_type_option(value: str) -> tuple[re.Pattern, T]:
    """--tensor-type NAME=TYPE (quantize.cpp `parse_tensor_type`): NAME, lowercased, is a regex searched in each
    tensor name."""
    name, sep, type_name = value.partition("=")
    if not sep or not name or not type_name:
        raise CommandError(f"quantize: --tensor-type '{value}': expected TENSOR_NAME=TYPE, e.g. attn_q=q8_0")
    try:
        pattern = re.compile(name.lower())
    except re.error as e:
        raise CommandError(f"quantize: --tensor-type '{value}': bad pattern: {e}") from None
    return pattern, parse_tensor_type(type_name, f"--tensor-type {value}")


def n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: trailing dimensions of 1 do not count."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def allows_quantization(name: str, shape: tuple[int, ...], quantize_output_tensor: bool = True) -> bool:
    """llama-quant.cpp `tensor_allows_quantization` (not only_copy)."""
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    if not quantize_output_tensor and name == "output.weight":
        return False
    return name not in _KEEP_NAMES and not any(part in name for part in _KEEP_PARTS)


def category(name: str) -> str:
    """llama-quant.cpp `tensor_get_category`."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"),
                      ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                      ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                      ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


@dataclass(slots=True)
class ModelFacts:
    """What llama_tensor_get_type reads of the model: arch, hparams.n_gqa() / n_expert / n_layer_all, LLM_TYPE_70B,
    and whether output.weight exists (has_tied_embeddings false)."""

    arch: str
    n_gqa: int
    n_expert: int
    n_layer: int
    is_70b: bool
    n_attention_wv: int
    tied: bool


@dataclass(slots=True)
class TypeChooser:
    """quantize_state_impl plus llama_model_quantize_params' type options; `choose` is llama_tensor_get_type."""

    model: ModelFacts
    ftype: F
    default_type: T
    has_imatrix: bool = False
    pure: bool = False
    quantize_output_tensor: bool = True
    output_tensor_type: T | None = None
    token_embedding_type: T | None = None
    overrides: list[tuple[re.Pattern, T]] = field(default_factory=list)
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    fallbacks: list[str] = field(default_factory=list)

    def choose(self, name: str, shape: tuple[int, ...], src: T) -> T:
        if not allows_quantization(name, shape, self.quantize_output_tensor):
            return src
        cat = category(name)
        if self.token_embedding_type is not None and cat == "token_embd":
            named = name == "per_layer_token_embd.weight" and any(p.search(name) for p, _ in self.overrides)
            if not named:
                return self.token_embedding_type
        if self.output_tensor_type is not None and cat == "output":
            return self.output_tensor_type
        new = self.default_type
        if new in FLOAT_TYPES:
            return new
        manual = False
        for pattern, qtype in self.overrides:
            if pattern.search(name):
                new, manual = qtype, True
                break
        if not manual and not self.pure:
            new = self._mix(new, name, shape, cat)
        return self._fallback(name, shape, new)

    def _fallback(self, name: str, shape: tuple[int, ...], new: T) -> T:
        """tensor_type_fallback."""
        block = GGML_QUANT_SIZES[new][0]
        if shape[0] % block == 0:
            return new
        ret = _FALLBACK.get(new, new)
        if shape[0] % GGML_QUANT_SIZES[ret][0]:
            ret = T.F16
        self.fallbacks.append(f"{name}: ncols {shape[0]} not divisible by {block} (required for type "
                              f"{new.name.lower()}) -> falling back to {ret.name.lower()}")
        return ret

    def _mix(self, new: T, name: str, shape: tuple[int, ...], cat: str) -> T:
        """llama_tensor_get_type_impl for the non-IQ file types."""
        m, ft, F_ = self.model, self.ftype, LlamaFileType
        if cat == "output" or (m.tied and cat == "token_embd"):
            if self.output_tensor_type is not None:
                return self.output_tensor_type
            if m.arch == "falcon" or shape[0] % GGML_QUANT_SIZES[new][0]:
                return T.Q8_0
            if ft in _IQ2_FILES or ft == F_.MOSTLY_IQ3_XXS:
                return T.Q5_K
            return new if new == T.Q8_0 else T.Q6_K
        if cat == "token_embd":
            if self.token_embedding_type is not None:
                return self.token_embedding_type
            if ft in (F_.MOSTLY_TQ1_0, F_.MOSTLY_TQ2_0):
                return T.Q4_K
            if ft in (F_.MOSTLY_IQ2_XXS, F_.MOSTLY_IQ2_XS, F_.MOSTLY_IQ1_S, F_.MOSTLY_IQ1_M):
                return T.Q2_K
            return T.IQ3_S if ft in (F_.MOSTLY_IQ2_S, F_.MOSTLY_IQ2_M, F_.MOSTLY_IQ3_XXS) else new
        if ft in _IQ2_FILES:
            return self._iq2(new, cat)
        if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            if ft == F_.MOSTLY_Q2_K:
                new = T.Q4_K if m.n_gqa >= 4 else T.Q3_K
            elif ft == F_.MOSTLY_Q2_K_S and m.n_gqa >= 4:
                new = T.Q4_K
            elif ft == F_.MOSTLY_IQ3_XXS:
                new = T.Q4_K if m.n_gqa >= 4 else T.IQ3_S if not self.has_imatrix else T.IQ3_XXS
            elif ft in (F_.MOSTLY_IQ3_XS, F_.MOSTLY_IQ3_S) and m.n_gqa >= 4:
                new = T.Q4_K
            elif ft == F_.MOSTLY_IQ3_M:
                new = T.Q4_K
            elif ft == F_.MOSTLY_Q3_K_M:
                new = T.Q5_K if self.i_attention_wv < 2 else T.Q4_K
            elif ft == F_.MOSTLY_Q3_K_L:
                new = T.Q5_K
            elif ft in (F_.MOSTLY_IQ4_NL, F_.MOSTLY_IQ4_XS) and m.n_gqa >= 4:
                new = T.Q5_K
            elif ft in (F_.MOSTLY_Q4_K_M, F_.MOSTLY_Q5_K_M) and _use_more_bits(self.i_attention_wv,
                                                                                m.n_attention_wv):
                new = T.Q6_K
            elif ft == F_.MOSTLY_Q4_K_S and self.i_attention_wv < 4:
                new = T.Q5_K
            if m.is_70b and new in (T.Q3_K, T.Q4_K):
                new = T.Q5_K
            if m.n_expert == 8:
                new = T.Q8_0
            self.i_attention_wv += 1
        elif cat in ("attn_k", "attn_q"):
            if m.n_expert == 8 and cat == "attn_k":
                new = T.Q8_0
            elif ft == F_.MOSTLY_IQ3_XS:
                new = T.IQ3_XXS
            elif ft == F_.MOSTLY_IQ3_XXS:
                new = T.IQ2_S
        elif cat == "ffn_down":
            new = self._ffn_down(new, name)
        elif cat == "attn_output":
            if m.arch != "falcon":
                if m.n_expert == 8:
                    if ft in (F_.MOSTLY_Q2_K, F_.MOSTLY_Q3_K_S, F_.MOSTLY_Q3_K_M, F_.MOSTLY_Q4_K_S, F_.MOSTLY_Q4_K_M,
                              F_.MOSTLY_IQ4_NL, F_.MOSTLY_IQ4_XS, F_.MOSTLY_IQ3_S, F_.MOSTLY_IQ3_XS,
                              F_.MOSTLY_IQ3_XXS, F_.MOSTLY_IQ3_M):
                        new = T.Q5_K
                else:
                    new = {F_.MOSTLY_Q2_K: T.Q3_K, F_.MOSTLY_IQ3_XXS: T.IQ3_S, F_.MOSTLY_Q3_K_M: T.Q4_K,
                           F_.MOSTLY_Q3_K_L: T.Q5_K, F_.MOSTLY_IQ3_M: T.Q4_K}.get(ft, new)
            elif ft == F_.MOSTLY_Q3_K_L:
                new = T.Q4_K
        elif cat == "ffn_gate":
            new = self._iq3_xs_middle(new, self.i_ffn_gate, name)
            self.i_ffn_gate += 1
        elif cat == "ffn_up":
            new = self._iq3_xs_middle(new, self.i_ffn_up, name)
            self.i_ffn_up += 1
        return new

    def _iq3_xs_middle(self, new: T, i_counter: int, name: str) -> T:
        """ffn_gate / ffn_up of an IQ3_XS file: IQ3_XXS in the middle three quarters of the layers."""
        i_layer, n_layer = self._layer(i_counter, name)
        if self.ftype == LlamaFileType.MOSTLY_IQ3_XS and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            return T.IQ3_XXS
        return new

    def _iq2(self, new: T, cat: str) -> T:
        """llama_tensor_get_type_impl's branch of the IQ1 / IQ2 file types (IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ1_S,
        IQ1_M): IQ2_S and IQ2_M bump to IQ3_S where the others bump to Q2_K; IQ1 attn_output is IQ2_XXS."""
        m = self.model
        bump = T.IQ3_S if self.ftype in (LlamaFileType.MOSTLY_IQ2_S, LlamaFileType.MOSTLY_IQ2_M) else T.Q2_K
        if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            new = T.Q4_K if m.n_gqa >= 4 or m.n_expert >= 4 else bump
            self.i_attention_wv += 1
        elif m.n_expert == 8 and cat == "attn_k":
            new = T.Q4_K
        elif cat == "ffn_down":
            if self.i_ffn_down < m.n_layer // 8:
                new = bump
            self.i_ffn_down += 1
        elif cat == "attn_output":
            if m.n_expert == 8:
                new = T.Q5_K
            elif self.ftype in (LlamaFileType.MOSTLY_IQ1_S, LlamaFileType.MOSTLY_IQ1_M):
                new = T.IQ2_XXS
            elif bump == T.IQ3_S:
                new = T.IQ3_S
        return new

    def _ffn_down(self, new: T, name: str) -> T:
        m, ft, F_ = self.model, self.ftype, LlamaFileType
        i_layer, n_layer = self._layer(self.i_ffn_down, name)
        if ft == F_.MOSTLY_Q2_K:
            new = T.Q3_K
        elif ft == F_.MOSTLY_Q2_K_S:
            if i_layer < n_layer // 8:
                new = T.Q4_K
        elif ft == F_.MOSTLY_IQ3_XXS and not self.has_imatrix:
            new = T.Q4_K if i_layer < n_layer // 8 else T.Q3_K
        elif ft == F_.MOSTLY_Q3_K_M:
            new = (T.Q5_K if i_layer < n_layer // 16
                   else T.Q4_K if m.arch != "falcon" or _use_more_bits(i_layer, n_layer) else T.Q3_K)
        elif ft == F_.MOSTLY_IQ3_M and (i_layer < n_layer // 8 or (m.n_expert == 8 and
                                                                   _use_more_bits(i_layer, n_layer))):
            new = T.Q4_K
        elif ft == F_.MOSTLY_Q3_K_L:
            new = T.Q4_K if m.arch == "falcon" else T.Q5_K
        elif ft == F_.MOSTLY_Q4_K_M:
            if m.arch == "falcon":
                new = (T.Q6_K if i_layer < n_layer // 16 else T.Q5_K if _use_more_bits(i_layer, n_layer)
                       else T.Q4_K)
            elif _use_more_bits(i_layer, n_layer):
                new = T.Q6_K
        elif (i_layer < n_layer // 8 and ft in (F_.MOSTLY_IQ4_NL, F_.MOSTLY_IQ4_XS)
              and not self.has_imatrix):
            new = T.Q5_K
        elif ft == F_.MOSTLY_Q5_K_M and _use_more_bits(i_layer, n_layer):
            new = T.Q6_K
        elif ft == F_.MOSTLY_Q4_K_S and m.arch != "falcon" and i_layer < n_layer // 8:
            new = T.Q5_K
        elif ft in (F_.MOSTLY_Q4_0, F_.MOSTLY_Q5_0) and self.has_imatrix and i_layer < n_layer // 8:
            new = T.Q4_1 if ft == F_.MOSTLY_Q4_0 else T.Q5_1
        self.i_ffn_down += 1
        return new

    def _layer(self, i_counter: int, name: str) -> tuple[int, int]:
        """layer_info: the counter, or with experts the layer parsed from the name."""
        n_layer = self.model.n_layer
        if self.model.n_expert <= 1:
            return i_counter, n_layer
        hit = re.match(r"blk\.(\d+)\.", name)
        if hit is None:
            raise CommandError(f"quantize: failed to determine the layer of tensor '{name}'")
        i_layer = int(hit.group(1))
        if i_layer >= n_layer:
            raise CommandError(f"quantize: bad layer {i_layer} for tensor '{name}': must be in [0, {n_layer})")
        return i_layer, n_layer


def requires_imatrix(name: str, dst: T, ftype: F) -> bool:
    """tensor_requires_imatrix, for the types written here: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, Q2_K of a
    Q2_K_S file."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return dst in (T.IQ2_XS, T.IQ2_XXS, T.IQ2_S, T.IQ3_XXS, T.IQ1_S, T.IQ1_M) or (
        dst == T.Q2_K and ftype == LlamaFileType.MOSTLY_Q2_K_S)

"""llama-cpp-python 0.3.36's constructor options and the small objects its `Llama` takes and returns
(llama_cpp/llama.py's __init__, LlamaState, LogitsProcessorList, StoppingCriteriaList; llama_grammar.py's
LlamaGrammar; llama_speculative.py's LlamaPromptLookupDecoding; llama_tokenizer.py's LlamaTokenizer), for
llamactx.llama_cpp_python.

`runtime_params` turns Llama's keyword arguments into a RuntimeParams: each one either reaches llamactx with
llama-cpp-python's meaning (and its default: n_ctx 512, flash attention off, the full-size SWA cache of
llama_context_default_params) or is refused with a ValueError naming it; an unknown keyword is a TypeError.
"""

from __future__ import annotations

import abc
import inspect
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamactx.engine.speculative import NgramParams, SpecParams
from llamactx.runtime import RuntimeParams
from llamactx.sampling.rng import LLAMA_DEFAULT_SEED

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]
StoppingCriteria = Callable[[np.ndarray, np.ndarray], bool]

# llama.h's enums as llama-cpp-python passes them (ints), to llamactx's names
ROPE_SCALING = {-1: "unspecified", 0: "none", 1: "linear", 2: "yarn"}
POOLING = {-1: "unspecified", 0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
ATTENTION = {-1: "unspecified", 0: "causal", 1: "non_causal"}
GGML_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 20: "iq4_nl",
              30: "bf16"}  # ggml_type ids of the KV cache types llamactx stores


class LogitsProcessorList(list):
    """Callables (input_ids, scores) -> scores applied to the logits before sampling, in order."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Callables (input_ids, logits) -> bool; generation stops ("stop") when any says True."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any(criterion(input_ids, logits) for criterion in self)


class LlamaGrammar:
    """A grammar for `grammar=`: GBNF text (`from_string`, `from_file`) or a JSON schema (`from_json_schema`).
    The text is compiled when made (llguidance's GBNF reader), so a malformed grammar raises GrammarError (a
    ValueError) here, not at the first completion."""

    def __init__(self, *args: Any, _grammar: str, _kind: str = "gbnf", **kwargs: Any):
        # the sampler's own reader (llamactx.sampling.grammar), run once here only to refuse bad text early
        from llamactx.sampling.grammar import _compile

        self._grammar, self._kind = _grammar, _kind
        self._root = "root"
        _compile(_kind, _grammar)  # type: ignore[arg-type]

    @property
    def kind(self) -> str:
        return self._kind

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike, verbose: bool = True) -> LlamaGrammar:
        with open(file, encoding="utf-8") as f:
            text = f.read()
        if not text:
            raise ValueError(f"from_file: grammar file {os.fspath(file)!r} is empty")
        return cls.from_string(text)

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> LlamaGrammar:
        """Output that is one JSON value valid under the schema (its JSON text); llguidance compiles the schema
        itself instead of going through GBNF."""
        return cls(_grammar=json_schema if isinstance(json_schema, str) else json.dumps(json_schema),
                   _kind="json_schema")

    def grammar_args(self) -> dict[str, Any]:
        """Runtime.grammar's keywords."""
        return {"grammar": self._grammar} if self._kind == "gbnf" else {"json_schema": json.loads(self._grammar)}

    def request_fields(self) -> dict[str, Any]:
        """The request body's fields (grammar / json_schema) for this grammar."""
        return self.grammar_args()


class LlamaPromptLookupDecoding:
    """Prompt lookup decoding (llama_speculative.py), for `Llama(draft_model=...)`: drafts of `num_pred_tokens`
    tokens found after an earlier occurrence of the last `max_ngram_size` tokens. `generate` calls it directly;
    the completions run it as the engine's ngram-simple drafter (llamactx.engine.speculative): outputs are those
    without it."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        if max_ngram_size < 1 or num_pred_tokens < 1:
            raise ValueError(f"LlamaPromptLookupDecoding: max_ngram_size = {max_ngram_size} and num_pred_tokens = "
                             f"{num_pred_tokens} must be >= 1")
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens

    @staticmethod
    def find_candidate_pred_tokens(input_ids: np.ndarray, max_ngram_size: int, num_pred_tokens: int) -> np.ndarray:
        """The tokens after the first earlier occurrence of the longest trailing n-gram (n from max_ngram_size
        down to 1) of `input_ids`; an empty array when none recurs."""
        ids = np.asarray(input_ids)
        n_ids = len(ids)
        for n in range(min(max_ngram_size, n_ids - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ids, n)  # (n_ids - n + 1, n)
            hits = np.flatnonzero((windows[:-1] == ids[-n:]).all(axis=1))  # earlier occurrences only
            for start in hits + n:
                if start < n_ids:
                    return ids[start: min(start + num_pred_tokens, n_ids)]
        return np.array([], dtype=ids.dtype)

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)

    def spec_params(self) -> SpecParams:
        return SpecParams(types=("ngram-simple",), ngram_simple=NgramParams(size_n=self.max_ngram_size,
                                                                            size_m=self.num_pred_tokens))


@dataclass
class LlamaState:
    """What `save_state` keeps: the tokens evaluated, their scores (rows kept with logits_all), the context's
    state blob and the seed."""

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int


class BaseLlamaTokenizer(abc.ABC):
    """What `Llama(tokenizer=...)` takes (llama_tokenizer.py)."""

    @abc.abstractmethod
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]: ...

    @abc.abstractmethod
    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None,
                   special: bool = False) -> bytes: ...


class LlamaTokenizer(BaseLlamaTokenizer):
    """The model's own vocabulary (llamactx.vocab) behind llama-cpp-python's tokenizer interface."""

    def __init__(self, llama: Any):
        self._vocab = llama._model.vocab

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._vocab.tokenize(text.decode("utf-8", "replace"), add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """Each token's piece; a leading space after a BOS is dropped (llama-cpp-python's LlamaModel.detokenize:
        Llama 1 vocabularies put one before the first word)."""
        tokens = [int(t) for t in tokens]
        out = b"".join(self._vocab.token_to_piece(t, special=special) for t in tokens)
        if tokens and tokens[0] == self._vocab.bos and out[:1] == b" ":
            out = out[1:]
        if prev_tokens:  # the text of `tokens` after that of prev_tokens
            prev = self.detokenize(list(prev_tokens), special=special)
            whole = self.detokenize([*prev_tokens, *tokens], special=special)
            out = whole[len(prev):]
        return out

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: list[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str) -> LlamaTokenizer:
        """The vocabulary of a GGUF file (loaded vocab-only)."""
        from llamactx.model import Model

        out = cls.__new__(cls)
        out._vocab = Model.load(path, vocab_only=True).vocab
        return out


# llama-cpp-python 0.3.36's Llama keywords and their defaults
DEFAULTS: dict[str, Any] = dict(
    n_gpu_layers=0, split_mode=1, main_gpu=0, tensor_split=None, vocab_only=False, use_mmap=True, use_mlock=False,
    kv_overrides=None, seed=LLAMA_DEFAULT_SEED, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=None,
    n_threads_batch=None, rope_scaling_type=-1, pooling_type=-1, attention_type=-1, rope_freq_base=0.0,
    rope_freq_scale=0.0, yarn_ext_factor=-1.0, yarn_attn_factor=1.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0,
    yarn_orig_ctx=0, logits_all=False, embedding=False, offload_kqv=True, flash_attn=False, op_offload=None,
    swa_full=None, no_perf=False, last_n_tokens_size=64, lora_base=None, lora_scale=1.0, lora_path=None,
    numa=False, chat_format=None, chat_handler=None, draft_model=None, tokenizer=None, type_k=None, type_v=None,
    spm_infill=False, verbose=True,
)




def init_signature() -> inspect.Signature:
    """`Llama.__init__`'s signature as llama-cpp-python 0.3.36 declares it (model_path, then its keywords with
    their defaults), for help() and inspect. Its trailing **kwargs, which llama-cpp-python ignores, is left out:
    an unknown keyword is a TypeError here."""
    kw = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                              inspect.Parameter("model_path", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                              *(inspect.Parameter(name, kw, default=value) for name, value in DEFAULTS.items())])


# llama-cpp-python chat formats that are a template plus a tool-call handler: here the template, with llamactx's
# tool calls (llamactx.tool_calls: tools described in a system message, calls parsed, "required" constrained)
CHAT_FORMAT_TEMPLATES = {"chatml-function-calling": "chatml"}


def _enum(name: str, value: Any, table: Mapping[int, str]) -> str:
    if isinstance(value, str) and value in table.values():
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) in table:
        return table[int(value)]
    raise ValueError(f"{name} = {value!r} is not one of {sorted(table)} ({', '.join(table.values())})")


def _refuse(name: str, value: Any, why: str) -> None:
    raise ValueError(f"{name} = {value!r}: {why}")


def _check_refused(o: Mapping[str, Any]) -> None:
    """The options that ask for something llamactx does not do."""
    if o["use_mlock"]:
        _refuse("use_mlock", True, "llamactx cannot lock the model's pages in RAM; pass use_mlock=False")
    if o["kv_overrides"]:
        _refuse("kv_overrides", o["kv_overrides"], "llamactx reads GGUF metadata as stored; no overrides")
    if o["split_mode"] not in (0, 1) or o["main_gpu"] != 0 or o["tensor_split"]:
        _refuse("split_mode/main_gpu/tensor_split", (o["split_mode"], o["main_gpu"], o["tensor_split"]),
                "llamactx runs on the CPU only: there is no GPU to split over")
    if o["numa"]:
        _refuse("numa", o["numa"], "llamactx has no NUMA placement; pass numa=False")
    if o["lora_base"] is not None:
        _refuse("lora_base", o["lora_base"], "a GGUF LoRA adapter applies to this model's own weights")
    if o["draft_model"] is not None and not isinstance(o["draft_model"], LlamaPromptLookupDecoding):
        _refuse("draft_model", o["draft_model"], "only LlamaPromptLookupDecoding drafts here")
    if o["tokenizer"] is not None and not isinstance(o["tokenizer"], BaseLlamaTokenizer):
        _refuse("tokenizer", o["tokenizer"], "expected a BaseLlamaTokenizer")
    if o["chat_handler"] is not None and not callable(o["chat_handler"]):
        _refuse("chat_handler", o["chat_handler"], "expected a callable (LlamaChatCompletionHandler)")
    if isinstance(o["chat_format"], str) and o["chat_format"].startswith("functionary"):
        _refuse("chat_format", o["chat_format"], "llama-cpp-python's functionary handlers need functionary's HF "
                "tokenizer; a functionary GGUF's own template (v3.x) is read and its calls parsed when chat_format "
                "is left unset")
    if o["rope_scaling_type"] == 3:
        _refuse("rope_scaling_type", 3, "LongRoPE scaling is not implemented")


def _kv_type(name: str, value: Any) -> str:
    return "f16" if value is None else _enum(name, value, GGML_TYPES)


def runtime_params(model_path: Any, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], RuntimeParams]:
    """(every option with its default filled in, the RuntimeParams they make). Raises TypeError for an unknown
    keyword, ValueError for a refused or invalid value (naming it)."""
    unknown = sorted(set(kwargs) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"Llama() got unexpected keyword arguments: {', '.join(unknown)}")
    o = {**DEFAULTS, **kwargs}
    _check_refused(o)
    if isinstance(o["n_gpu_layers"], bool) or not isinstance(o["n_gpu_layers"], int):
        raise ValueError(f"n_gpu_layers = {o['n_gpu_layers']!r} must be an int (every layer runs on the CPU)")
    pooling = _enum("pooling_type", o["pooling_type"], POOLING)
    # llama-cpp-python's: half the cores for generation, all of them for prompts; n_batch at most n_ctx and
    # n_ubatch at most n_batch
    n_threads = o["n_threads"] or max((os.cpu_count() or 1) // 2, 1)
    n_threads_batch = o["n_threads_batch"] or os.cpu_count() or 1
    n_batch = min(int(o["n_ctx"]), int(o["n_batch"])) if int(o["n_ctx"]) > 0 else int(o["n_batch"])
    o["n_batch"] = n_batch
    context = dict(rope_scaling_type=_enum("rope_scaling_type", o["rope_scaling_type"], ROPE_SCALING),
                   attention_type=_enum("attention_type", o["attention_type"], ATTENTION),
                   rope_freq_base=float(o["rope_freq_base"]), rope_freq_scale=float(o["rope_freq_scale"]),
                   yarn_ext_factor=float(o["yarn_ext_factor"]), yarn_attn_factor=float(o["yarn_attn_factor"]),
                   yarn_beta_fast=float(o["yarn_beta_fast"]), yarn_beta_slow=float(o["yarn_beta_slow"]),
                   yarn_orig_ctx=int(o["yarn_orig_ctx"]), no_perf=bool(o["no_perf"]))
    draft = o["draft_model"]
    params = RuntimeParams(
        model=model_path, vocab_only=bool(o["vocab_only"]), n_ctx=int(o["n_ctx"]), n_batch=n_batch,
        n_ubatch=min(n_batch, int(o["n_ubatch"])), n_threads=n_threads, n_threads_batch=n_threads_batch,
        type_k=_kv_type("type_k", o["type_k"]), type_v=_kv_type("type_v", o["type_v"]),
        flash_attn=bool(o["flash_attn"]),
        # swa_full=None: llama_context_default_params' full-size SWA cache, which llama-cpp-python leaves on
        swa_full=True if o["swa_full"] is None else bool(o["swa_full"]),
        lora=((o["lora_path"], o["lora_scale"]),) if o["lora_path"] else (),
        chat_template=CHAT_FORMAT_TEMPLATES.get(o["chat_format"], o["chat_format"]),
        pooling=None if pooling == "unspecified" else pooling,
        embd_n_ctx=int(o["n_ctx"]) or None, context=context,
        spec=draft.spec_params() if draft is not None else None)
    o["seed"] = int(o["seed"])
    o["pooling"] = params.pooling
    o["use_mmap"] = bool(o["use_mmap"])
    return o, params

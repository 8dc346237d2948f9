"""The request and response shapes of the OpenAI API and llama-server's own endpoints (tools/server:
server-common.cpp, server-task.cpp `params_from_json_cmpl`, `to_json_oaicompat*`), with validation.

Requests are pydantic models: a wrong type, NaN, an out-of-range value or an unknown token id becomes a
`ProtocolError` naming the field (HTTP 400 `invalid_request_error`). `GenerationRequest` turns a validated request
into what the engine takes (a sampler chain and `Limits`); the `*_response` / `*_chunk` functions turn a finished
or streaming `Sequence` back into JSON.
"""

from __future__ import annotations

import base64
import json
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llamactx.engine import Chunk, Limits, RequestOptions
from llamactx.engine import Sequence as EngineSequence
from llamactx.errors import LlamactxError
from llamactx.sampling import SamplingParams

MAX_N = 16  # choices per request
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20


class ProtocolError(LlamactxError, ValueError):
    """A request that cannot be served as asked; `status` and `type` follow llama-server's error types."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(message)
        self.status, self.type, self.extra = status, type, extra
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": str(self), "type": self.type, **self.extra}}


def parse_json(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; NaN / Infinity literals are refused (json.loads would take them)."""

    def no_constant(name: str) -> None:
        raise ProtocolError(f"request body: {name} is not valid JSON")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError:
        raise ProtocolError("request body is not UTF-8") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise ProtocolError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def validate(model: type[BaseModel], body: Mapping[str, Any]) -> Any:
    """`model` from `body`, or ProtocolError naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        value = err.get("input")
        shown = repr(value) if isinstance(value, (int, float, str, bool)) or value is None else type(value).__name__
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise ProtocolError(f"{field}: {err['msg']} (got {shown})") from None


# -- requests ---------------------------------------------------------------------------------------------------

Finite = Field(allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class SamplingFields(BaseModel):
    """What /v1/completions, /v1/chat/completions and /completion share: OpenAI's options and llama-server's
    extensions, with llama-server's defaults."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=-1)
    max_completion_tokens: int | None = Field(default=None, ge=-1)
    n_predict: int | None = Field(default=None, ge=-1)
    temperature: float = Field(default=0.8, ge=0.0, le=100.0, allow_inf_nan=False)
    top_p: float = Field(default=0.95, ge=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=40, ge=-1)
    min_p: float = Field(default=0.05, ge=0.0, le=1.0, allow_inf_nan=False)
    typical_p: float = Field(default=1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    repeat_penalty: float = Field(default=1.0, gt=0.0, le=100.0, allow_inf_nan=False)
    repeat_last_n: int = Field(default=64, ge=-1)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    mirostat: int = Field(default=0, ge=0, le=2)
    mirostat_tau: float = Field(default=5.0, ge=0.0, allow_inf_nan=False)
    mirostat_eta: float = Field(default=0.1, ge=0.0, allow_inf_nan=False)
    # llama-server's other samplers (ranges are SamplingParams' checks, named in the 400)
    dry_multiplier: float = Field(default=0.0, allow_inf_nan=False)
    dry_base: float = Field(default=1.75, allow_inf_nan=False)
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] | None = Field(default=None, max_length=MAX_STOP)
    xtc_probability: float = Field(default=0.0, allow_inf_nan=False)
    xtc_threshold: float = Field(default=0.1, allow_inf_nan=False)
    top_n_sigma: float = Field(default=-1.0, allow_inf_nan=False)
    dynatemp_range: float = Field(default=0.0, allow_inf_nan=False)
    dynatemp_exponent: float = Field(default=1.0, allow_inf_nan=False)
    min_keep: int = 0
    samplers: list[str] | str | None = Field(default=None, max_length=64)
    seed: int | None = Field(default=None, ge=-1, le=2**32 - 1)
    logit_bias: dict[str, float | bool] | list[list[Any]] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n_probs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    grammar: str | None = Field(default=None, max_length=1 << 20)
    json_schema: dict[str, Any] | None = None
    ignore_eos: bool = False
    timings_per_token: bool = False
    return_progress: bool = False  # a stream reports the prompt's progress (prompt_progress) while it is decoded
    verbose: bool = False  # the response carries "__verbose": {"prompt": ...}
    cache_prompt: bool = True
    id_slot: int = Field(default=-1, ge=-1)
    n_keep: int = Field(default=0, ge=-1)
    n_discard: int = Field(default=0, ge=0)  # a context shift drops this many (0: half)
    t_max_predict_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    return_tokens: bool = False  # /completion: the generated token ids in "tokens"

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_values(cls, v):
        items = v.items() if isinstance(v, dict) else v or []
        for item in items:
            if isinstance(v, list) and (not isinstance(item, list) or len(item) != 2):
                raise ValueError("expected [token, bias] pairs")
            bias = item[1]
            if isinstance(bias, float) and math.isnan(bias):
                raise ValueError("a bias must be a number, not NaN")
        return v


# llama-server's extensions that /v1/messages and /v1/responses carry over to the chat they run as
LLAMA_SERVER_FIELDS = ("grammar", "json_schema", "seed", "min_p", "logit_bias", "reasoning_format",
                       "chat_template_kwargs", "parallel_tool_calls", "n_probs", "cache_prompt", "id_slot",
                       "reasoning_budget_tokens", "thinking_budget_tokens", "reasoning_budget_message")


class CompletionRequest(SamplingFields):
    """POST /v1/completions (and llama-server's /completion, which also takes `n_predict`)."""

    # a prompt is text, tokens, or llama-server's {"prompt_string": text, "multimodal_data": [...]} (no media here);
    # a list of them is several prompts
    # (a flat list mixing token ids and texts is one prompt, llama-server's tokenize_mixed)
    prompt: str | dict[str, Any] | list[int | str | list[int] | dict[str, Any]] = Field(min_length=1)
    echo: bool = False
    response_fields: list[str] | None = Field(default=None, max_length=64)  # /completion: only these (a/b paths)
    post_sampling_probs: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None  # llama-server's: none, auto, deepseek, deepseek-legacy (None: the server's)
    parallel_tool_calls: bool = False
    add_generation_prompt: bool | None = None  # None: true, unless the last message is continued
    continue_final_message: bool = False
    # llama-server's thinking budget for this request (-1: the server's --reasoning-budget) and the text forced
    # before the end-of-thinking tag when it runs out
    reasoning_budget_tokens: int | None = Field(default=None, ge=-1)
    thinking_budget_tokens: int | None = Field(default=None, ge=-1)
    reasoning_budget_message: str | None = Field(default=None, max_length=4096)


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # text, tokens, or llama-server's {"content": [{"type": "text", "text": ...}, ...]} object; or a list of them
    input: str | list[int] | dict[str, Any] | list[str | list[int] | dict[str, Any]] = Field(min_length=1)
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[int]


class ApplyTemplateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class SlotFileRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    filename: str = Field(min_length=1, max_length=255)


# -- request -> engine -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class GenerationRequest:
    """A validated generation request in engine terms, built once per HTTP request (its chains are cloned per
    choice)."""

    sampling: SamplingParams
    limits: Limits
    grammar: tuple[str, Any] | None  # ("gbnf" | "json_schema", source)
    n: int
    options: RequestOptions  # what each choice's engine sequence is added with
    stream: bool
    include_usage: bool
    timings_per_token: bool = False
    verbose: bool = False
    return_tokens: bool = False

    @property
    def n_probs(self) -> int:
        """-1: no logprobs; >= 0: each token's logprob and the top n_probs."""
        return self.options.n_probs

    @property
    def post_sampling_probs(self) -> bool:
        return self.options.post_sampling_probs

    @classmethod
    def from_fields(cls, req: SamplingFields, vocab, n_probs: int, context_shift: bool = False) -> GenerationRequest:
        bias = _logit_bias(req.logit_bias, vocab)
        if req.ignore_eos:
            bias += [(t, -math.inf) for t in sorted(vocab.eog_ids)]
        max_tokens = next((v for v in (req.max_completion_tokens, req.max_tokens, req.n_predict) if v is not None), -1)
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        try:
            sampling = SamplingParams(
                seed=-1 if req.seed is None else req.seed, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                typical_p=req.typical_p, temperature=req.temperature, repeat_penalty=req.repeat_penalty,
                penalty_last_n=req.repeat_last_n, presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty, mirostat=req.mirostat, mirostat_tau=req.mirostat_tau,
                mirostat_eta=req.mirostat_eta, logit_bias=tuple(bias), dry_multiplier=req.dry_multiplier,
                dry_base=req.dry_base, dry_allowed_length=req.dry_allowed_length,
                dry_penalty_last_n=req.dry_penalty_last_n, xtc_probability=req.xtc_probability,
                xtc_threshold=req.xtc_threshold, top_n_sigma=req.top_n_sigma, dynatemp_range=req.dynatemp_range,
                dynatemp_exponent=req.dynatemp_exponent, min_keep=req.min_keep,
                **({} if req.dry_sequence_breakers is None else {"dry_sequence_breakers":
                                                                  tuple(req.dry_sequence_breakers)}),
                **({} if req.samplers is None else {"samplers": req.samplers if isinstance(req.samplers, str)
                                                    else tuple(req.samplers)}))
        except ValueError as e:
            raise ProtocolError(str(e)) from None
        limits = Limits(max_tokens, tuple(stops), req.ignore_eos, context_shift, max(req.n_keep, 0), req.n_discard,
                        req.t_max_predict_ms)
        options = RequestOptions(id_slot=req.id_slot, cache_prompt=req.cache_prompt, n_probs=n_probs,
                                 post_sampling_probs=bool(getattr(req, "post_sampling_probs", False)),
                                 return_progress=req.return_progress and req.stream)
        return cls(sampling, limits, _grammar_of(req), req.n, options, req.stream,
                   bool(req.stream_options and req.stream_options.include_usage), req.timings_per_token, req.verbose,
                   req.return_tokens)

    def grammar_args(self) -> dict[str, Any]:
        """The request's constraint as Runtime.grammar's keywords ({} for none)."""
        if self.grammar is None:
            return {}
        kind, source = self.grammar
        return {"grammar" if kind == "gbnf" else "json_schema": source}

    def sampling_for(self, choice: int = 0) -> SamplingParams:
        """The sampling of choice `choice`: choices get consecutive seeds, so that they differ."""
        params = self.sampling
        if choice and params.seed != -1 and params.seed < 2**32 - 1:
            params = replace(params, seed=params.seed + choice)
        return params


def _logit_bias(raw, vocab) -> list[tuple[int, float]]:
    """OpenAI's {"token id": bias} or llama-server's [[token, bias]] pairs; false (or -inf) bans a token. A key
    that is text rather than a token id biases each of its tokens (llama-server's params_from_json)."""
    if not raw:
        return []
    n_vocab = vocab.n_tokens
    items = raw.items() if isinstance(raw, dict) else raw
    out = []
    for key, bias in items:
        if isinstance(key, str) and not key.lstrip("-").isdigit():
            if len(key) > 4096:
                raise ProtocolError(f"logit_bias: a text key has {len(key)} characters, more than 4096")
            toks = vocab.tokenize(key, add_special=False, parse_special=False)
        elif isinstance(key, bool) or not isinstance(key, (int, str)):
            raise ProtocolError(f"logit_bias: key {key!r} is not a token id or text")
        else:
            toks = [int(key)]
        for tok in toks:
            if not 0 <= tok < n_vocab:
                raise ProtocolError(f"logit_bias: token {key!r} is outside the vocab [0, {n_vocab})")
            if bias is False:
                bias = -math.inf
            if isinstance(bias, bool) or not isinstance(bias, (int, float)):
                raise ProtocolError(f"logit_bias[{tok}]: bias {bias!r} must be a number or false")
            if bias == math.inf or (not math.isinf(bias) and abs(bias) > 100):
                raise ProtocolError(f"logit_bias[{tok}]: bias {bias} is outside [-100, 100] (or -inf / false to "
                                    "ban)")
            out.append((tok, float(bias)))
    return out


def _grammar_of(req: SamplingFields) -> tuple[str, Any] | None:
    fmt = req.response_format
    given = [g for g in (req.grammar is not None, req.json_schema is not None,
                         fmt is not None and fmt.type != "text") if g]
    if len(given) > 1:
        raise ProtocolError("give one of grammar, json_schema and response_format, not several")
    if req.grammar is not None:
        return ("gbnf", req.grammar)
    if req.json_schema is not None:
        return ("json_schema", req.json_schema)
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ("json_schema", fmt.schema_ or {"type": "object"})
    spec = fmt.json_schema or {}
    schema = spec.get("schema", spec) if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise ProtocolError("response_format.json_schema.schema: expected an object")
    return ("json_schema", schema)


def check_tokens(tokens: Sequence[int], n_vocab: int, field: str) -> list[int]:
    bad = [t for t in tokens if not 0 <= t < n_vocab]
    if bad:
        raise ProtocolError(f"{field}: token id {bad[0]} is outside the vocab [0, {n_vocab})")
    return list(tokens)


# -- responses ----------------------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def progress(chunk: Chunk) -> dict[str, dict[str, float]]:
    """llama-server's prompt_progress report, and the timings so far (nothing generated yet)."""
    total, cache, processed, ms = chunk.progress
    n = processed - cache
    return {"prompt_progress": {"total": total, "cache": cache, "processed": processed, "time_ms": ms},
            "timings": {"cache_n": cache, "prompt_n": n, "prompt_ms": ms if n else 0.0,
                        "prompt_per_token_ms": ms / n if n else 0.0,
                        "prompt_per_second": 1e3 * n / ms if n and ms > 0 else 0.0,
                        "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0,
                        "predicted_per_second": 0.0}}


def timings(seq: EngineSequence) -> dict[str, float]:
    """llama-server's `timings` (server_slot_stats::to_json): the generation rate counts the decode steps after
    the first token, which came from the prompt's logits."""
    t = seq.timings
    n_gen_steps = max(t.predicted_n - 1, 0)
    drafts = {"draft_n": t.draft_n, "draft_n_accepted": t.draft_n_accepted} if t.draft_n else {}
    return {
        "cache_n": t.cached_n,
        "prompt_n": t.prompt_n, "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": t.prompt_ms / t.prompt_n if t.prompt_n else 0.0,
        "prompt_per_second": 1e3 * t.prompt_n / t.prompt_ms if t.prompt_ms > 0 else 0.0,
        "predicted_n": t.predicted_n, "predicted_ms": t.predicted_ms,
        "predicted_per_token_ms": t.predicted_ms / n_gen_steps if n_gen_steps else 0.0,
        "predicted_per_second": 1e3 * n_gen_steps / t.predicted_ms if n_gen_steps and t.predicted_ms > 0 else 0.0,
        **drafts,  # speculative decoding: draft tokens verified and accepted (llama-server's, when drafting)
    }


def usage(seqs: Sequence[EngineSequence]) -> dict[str, Any]:
    prompt = seqs[0].n_prompt
    completion = sum(s.n_output for s in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": seqs[0].n_cached}}


def finish_reason(seq: EngineSequence) -> str:
    return {"stop": "stop", "length": "length"}.get(seq.finish_reason or "", "stop")


def completion_logprobs(vocab, chunks: Sequence[Chunk], offset0: int) -> dict[str, Any]:
    """OpenAI's legacy completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    toks, lps, tops, offsets = [], [], [], []
    offset = offset0
    for c in chunks:
        if c.token is None:
            continue
        piece = _piece(vocab, c.token)
        toks.append(piece)
        lps.append(c.logprob)
        tops.append({_piece(vocab, t): lp for t, lp in c.top_logprobs})
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(vocab, chunks: Sequence[Chunk]) -> dict[str, Any]:
    """OpenAI's chat `logprobs.content`: token, logprob, bytes, top_logprobs per sampled token."""
    content = []
    for c in chunks:
        if c.token is None:
            continue
        piece = vocab.token_to_piece(c.token)
        content.append({"token": piece.decode("utf-8", "replace"), "logprob": c.logprob, "bytes": list(piece),
                        "top_logprobs": [{"token": _piece(vocab, t), "logprob": lp,
                                          "bytes": list(vocab.token_to_piece(t))} for t, lp in c.top_logprobs]})
    return {"content": content}


def _piece(vocab, token: int) -> str:
    return vocab.token_to_piece(token).decode("utf-8", "replace")


def embedding_item(index: int, vec: np.ndarray, encoding: str) -> dict[str, Any]:
    if encoding == "base64":
        data: Any = base64.b64encode(np.asarray(vec, "<f4").tobytes()).decode("ascii")
    else:
        data = [float(x) for x in vec]
    return {"object": "embedding", "index": index, "embedding": data}


def now() -> int:
    return int(time.time())

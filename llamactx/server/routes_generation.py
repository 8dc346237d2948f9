"""The generation routes: POST /v1/completions, /completion, /infill, /v1/chat/completions, /v1/messages,
/v1/responses and the token counts of a chat (tools/server: server-context.cpp's `handle_completions_impl` callers
`post_completions`, `post_completions_oai`, `post_chat_completions`, `post_anthropic_messages`,
`post_responses_oai`, `handle_infill`, and the count_tokens routes).

Each reads its body into a validated request, its prompt into tokens (prompts.py) and a `GenerationRequest`, and
hands them with the endpoint's renderer to completions.serve, which runs them on the engine. `completion` and
`chat` are the two pipelines every generation route shares, Ollama's too (ollama_routes.py). Each handler is
`handler(state, request)`: app.py binds the state when it registers the routes.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx import chat_grammar, tool_calls
from llamactx.api import anthropic, infill, oai_responses
from llamactx.api import protocol as P
from llamactx.api.responses import ChatRenderer, NativeRenderer, Renderer
from llamactx.server.completions import chat_parse_params, serve, with_reasoning
from llamactx.server.config import ServerState
from llamactx.server.prompts import PromptFit, completion_prompts, fit_prompt, prompt_tokens, render_chat


def prompt_fit(state: ServerState) -> PromptFit:
    """What a generation prompt must fit now: the model's vocabulary, a slot's context, --context-shift."""
    return PromptFit(state.model.vocab, state.n_ctx_slot(), state.config.context_shift)


async def completions_oai(state: ServerState, request: HttpRequest) -> Response:
    return await completion(state, request, Renderer)


async def completion_native(state: ServerState, request: HttpRequest) -> Response:
    return await completion(state, request, NativeRenderer)


async def infill_route(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    cfg = state.config
    body = P.parse_json(await request.body())
    infill.check_supported(state.model.vocab)
    prefix, suffix, extra, prompt = infill.parse(body)
    rest = {k: v for k, v in body.items() if k not in ("input_prefix", "input_suffix", "input_extra", "prompt")}
    given = (rest.get("n_predict"), rest.get("max_tokens"), cfg.request_defaults.get("n_predict"))
    n_predict = next((v for v in given if isinstance(v, int) and not isinstance(v, bool)), -1)

    def tokens() -> list[int]:
        vocab = state.model.vocab
        prompt_ids = vocab.tokenize(prompt, add_special=False, parse_special=True)
        return infill.format_infill(vocab, prefix, suffix, extra, cfg.runtime.n_batch, n_predict,
                                    state.n_ctx_slot(), prompt_ids)

    return await completion(state, request, NativeRenderer, {**rest, "prompt": await asyncio.to_thread(tokens)})


async def completion(state: ServerState, request: HttpRequest, renderer_cls, body: dict | None = None) -> Response:
    """The completion pipeline: `body` (read from the request when None) -> prompts -> the engine -> the
    renderer's JSON or SSE."""
    state.check_ready()
    cfg = state.config
    body = P.parse_json(await request.body()) if body is None else body
    state.check_request_lora(body)
    req = P.validate(P.CompletionRequest, {**cfg.request_defaults, **body})
    if req.n > 1 and renderer_cls is NativeRenderer:
        raise P.ProtocolError(f"n: /completion returns one completion (got n = {req.n}); "
                              "/v1/completions returns n choices")
    if req.suffix:
        raise P.ProtocolError("suffix: fill-in-the-middle is POST /infill (input_prefix, input_suffix) here", 400)
    if req.post_sampling_probs and renderer_cls is not NativeRenderer:
        raise P.ProtocolError("post_sampling_probs: only /completion reports probabilities after the sampler "
                              "chain; here logprobs are the model's own")
    prompts, text = await asyncio.to_thread(completion_prompts, prompt_fit(state), req.prompt, req.n_keep)
    n_probs = req.logprobs if req.logprobs is not None else (req.n_probs or -1)
    gen = P.GenerationRequest.from_fields(req, state.model.vocab, n_probs, cfg.context_shift)
    extra = {"response_fields": req.response_fields} if renderer_cls is NativeRenderer else {}
    renderer = renderer_cls(state.alias, state.model.vocab, text, gen, echo=req.echo, **extra)
    return await serve(state, request, prompts, gen, renderer)


async def chat_completions(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    return await chat(state, request, P.parse_json(await request.body()), ChatRenderer)


async def messages(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    return await chat(state, request, anthropic.to_chat(P.parse_json(await request.body())),
                      anthropic.MessagesRenderer)


async def responses(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    return await chat(state, request, oai_responses.to_chat(P.parse_json(await request.body())),
                      oai_responses.ResponsesRenderer)


async def count_tokens(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    body, path = P.parse_json(await request.body()), request.url.path
    chat_body = oai_responses.to_chat(body) if path.endswith("/responses/input_tokens") else body \
        if path.endswith("/input_tokens") else anthropic.count_tokens_body(body)
    req = P.validate(P.ChatCompletionRequest, chat_body)
    prompt_text, _ = await asyncio.to_thread(render_chat, state.template, req)
    tokens = await asyncio.to_thread(prompt_tokens, prompt_fit(state), prompt_text, True)
    return JSONResponse({"input_tokens": len(tokens)})


async def chat(state: ServerState, request: HttpRequest, body: dict, renderer_cls) -> Response:
    """The chat pipeline: `body` (an OpenAI chat request) -> the rendered prompt, its reply parser and tool
    grammar -> the engine -> the renderer's JSON or SSE."""
    cfg = state.config
    state.check_request_lora(body)
    req = with_reasoning(state, P.validate(P.ChatCompletionRequest, {**cfg.request_defaults, **body}))
    fit = prompt_fit(state)
    prompt_text, fns = await asyncio.to_thread(render_chat, state.template, req)
    parse = await asyncio.to_thread(chat_parse_params, state, req, fns)
    tokens = await asyncio.to_thread(prompt_tokens, fit, prompt_text, True)
    tokens = fit_prompt(fit, tokens, req.n_keep)
    n_probs = (req.top_logprobs or 0) if req.logprobs else -1
    gen = P.GenerationRequest.from_fields(req, state.model.vocab, n_probs, cfg.context_shift)
    calls = chat_grammar.call_grammar(fns, parse, req.tool_choice, req.parallel_tool_calls)
    if calls is not None and gen.grammar is None:  # keeps the calls valid JSON for their tools (lazy: "auto")
        gen.grammar = ("tool_calls", (calls, parse))
    elif calls is not None and tool_calls.required_function(req.tool_choice, fns):
        raise P.ProtocolError("tool_choice: a required tool call cannot be combined with grammar / "
                              "json_schema / response_format")
    extra = {"n_prompt": len(tokens)} if renderer_cls in (anthropic.MessagesRenderer,
                                                           oai_responses.ResponsesRenderer) else {}
    renderer = renderer_cls(state.alias, state.model.vocab, prompt_text, gen, tools=bool(fns), parse=parse,
                            **extra)
    budget = next(n for n in (req.reasoning_budget_tokens, req.thinking_budget_tokens, -1) if n is not None)
    if budget == -1:  # server-common.cpp: reasoning_budget_tokens, else thinking_budget_tokens, else the server's
        budget = cfg.runtime.reasoning_budget
    return await serve(state, request, [tokens], gen, renderer, (budget, req.reasoning_budget_message or ""))

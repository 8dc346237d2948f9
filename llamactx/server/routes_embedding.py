"""The embedding routes: POST /v1/embeddings and /rerank (tools/server: server-context.cpp's `handle_embeddings_impl`
and `post_rerank`).

Their inputs are tokenized and length-checked here (prompts.py), then embedded on the engine thread as a sliced
`Job` that shares it with generation (worker.py); a client that goes away drops its job. `embed` is the pipeline
Ollama's /api/embed shares (ollama_routes.py). Each handler is `handler(state, request)`: app.py binds the state.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from llamactx.api import protocol as P
from llamactx.api import rerank as rerank_api
from llamactx.server.completions import DISCONNECT_POLL_S
from llamactx.server.config import ServerState
from llamactx.server.prompts import content_text, embedding_tokens, rerank_prompts
from llamactx.server.worker import Job


async def embed(state: ServerState, request: HttpRequest, inputs: list) -> tuple[list, int] | None:
    """The vectors of `inputs` (texts or token lists) from the embedder on the engine thread, and their number of
    tokens; None if the client went away first."""
    cfg = state.config
    if len(inputs) > cfg.embd_max_inputs:
        raise P.ProtocolError(f"input holds {len(inputs)} inputs, more than --embd-max-inputs = "
                              f"{cfg.embd_max_inputs}")
    token_lists = await asyncio.to_thread(embedding_tokens, state.model.vocab, state.embedder.n_ctx, inputs)
    state.embedder.check(token_lists)
    job = state.worker.run(Job(lambda _engine: state.embedder.steps(token_lists)))
    vecs = await wait_job(request, job)
    return None if vecs is None else (vecs, sum(len(t) for t in token_lists))


async def embeddings(state: ServerState, request: HttpRequest) -> Response:
    state.check_ready()
    if state.config.runtime.pooling == "none":
        raise P.ProtocolError("Pooling type 'none' is not OAI compatible: token-level embeddings are not served "
                              "here; start the server with --pooling mean, last or cls")
    req = P.validate(P.EmbeddingRequest, P.parse_json(await request.body()))
    inputs = req.input if isinstance(req.input, list) else [req.input]
    if inputs and isinstance(inputs[0], int):
        inputs = [inputs]
    inputs = [content_text(x, f"input[{i}]") if isinstance(x, dict) else x for i, x in enumerate(inputs)]
    embedded = await embed(state, request, inputs)
    if embedded is None:
        return Response(status_code=499)
    vecs, n_tokens = embedded
    return JSONResponse({"object": "list", "model": state.alias,
                         "data": [P.embedding_item(i, v, req.encoding_format) for i, v in enumerate(vecs)],
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


async def rerank(state: ServerState, request: HttpRequest) -> Response:
    """llama-server's post_rerank: each (query, document) pair is scored by the reranker (pooling rank: the last
    token's hidden state, element 0, for a model without a classifier head) on the engine thread."""
    state.check_ready()
    if state.reranker is None:
        raise P.ProtocolError("This server does not support reranking. Start it with `--reranking`", 501,
                              "not_supported_error")
    req = rerank_api.parse(P.parse_json(await request.body()), state.config.embd_max_inputs)
    prompts = await asyncio.to_thread(rerank_prompts, state.model, state.reranker.n_ctx, req)
    job = state.worker.run(Job(lambda _engine: state.reranker.steps(prompts)))
    scores = await wait_job(request, job)
    if scores is None:
        return Response(status_code=499)
    return JSONResponse(rerank_api.format_response(req, state.alias, scores[:, 0], [len(p) for p in prompts]))


async def wait_job(http: HttpRequest, job: Job):
    """The job's result; None (and the job dropped) if the client goes away first."""
    fut = asyncio.wrap_future(job.future)
    while True:
        done, _ = await asyncio.wait({fut}, timeout=DISCONNECT_POLL_S)
        if done:
            return fut.result()
        if await http.is_disconnected():
            job.cancel()
            return None

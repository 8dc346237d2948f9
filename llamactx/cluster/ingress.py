"""The cluster's front door: the deployment behind Ray Serve's HTTP proxy. It reads a request, renders its prompt
to route it (the chat template applied, as the engine will: affinity.py), and forwards it whole to an engine
replica (replica.py) through a DeploymentHandle whose request router (router.py) picks the replica; the replica's
response comes back message by message, SSE streams included (Ray Serve LLM's OpenAiIngress -> LLMServer split).

    GET /health, /v1/health    every replica's /health: 200 while one is ready, with each replica's status
    GET /metrics               every replica's /metrics: each llama-server series summed over the replicas, then
                               one series per replica (label replica="<id>")
    GET /slots                 every replica's slots, each with its "replica"
    POST /slots/{id}?replica=  the slot action on that replica (the query parameter may be left out while one
                               replica runs)
    POST /lora-adapters        the new scales on every running replica (one that starts later, by autoscaling
                               or after a failure, starts with the flags' scales)
    anything else              forwarded to one replica: the single-process server's routes, answers and errors

Failures: a replica that dies before a request's response started (queued in it, or prefilling) costs nothing:
the request goes to another replica (up to MAX_ATTEMPTS). One that dies mid-stream ends that stream with an SSE
error event (`data: {"error": {"code": 503, ...}}`, llama-server's mid-stream error shape) and a clean end of the
response; nothing else sees a 5xx. Ray's controller starts a replacement replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import DeploymentUnavailableError
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llamactx.api import anthropic, oai_responses
from llamactx.api import protocol as P
from llamactx.cluster.affinity import history_bytes, prefix_keys
from llamactx.cluster.forward import ForwardedRequest
from llamactx.cluster.loopback import keep_replica_grpc_on_loopback
from llamactx.errors import LlamactxError
from llamactx.server.metrics import CONTENT_TYPE as METRICS_TYPE
from llamactx.server.metrics import sample

log = logging.getLogger("llamactx.cluster")

MAX_ATTEMPTS = 3  # replicas tried for a request whose response has not started
FANOUT_TIMEOUT_S = 10.0  # /health and /metrics wait this long for the replicas' answers
REPLICA_GONE = (RayActorError, DeploymentUnavailableError)
CHAT_ROUTES = {"/v1/chat/completions": None, "/chat/completions": None, "/v1/messages": anthropic.to_chat,
               "/v1/responses": oai_responses.to_chat, "/responses": oai_responses.to_chat}
COMPLETION_ROUTES = ("/v1/completions", "/completion", "/completions")
MAX_OF = {"n_tokens_max"}  # /metrics' cluster value: the largest replica's
MEAN_OF = {"kv_cache_usage_ratio", "n_busy_slots_per_decode"}  # the replicas' mean; every other series: the sum
ALL_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]


class PromptRenderer:
    """A request body's prompt as the engine will see it, before tokenizing: the chat template applied to its
    messages (server/prompts.render_chat), or a completion's prompt text (token ids as the text they stand for:
    affinity.history_bytes). Needs only the vocabulary and template (a vocab-only model: no weights), and hands
    render_chat the template alone."""

    def __init__(self, config):
        from llamactx.runtime import Runtime

        self.config = config
        runtime = Runtime(replace(config.runtime, vocab_only=True))
        self.template, self.vocab = runtime.template, runtime.model.vocab

    def render(self, path: str, body: bytes) -> bytes | None:
        """The prompt's bytes, or None for a route without one or a body the replica will refuse (it answers)."""
        from llamactx.server.prompts import render_chat

        try:
            data = P.parse_json(body)
            if path in CHAT_ROUTES:
                to_chat = CHAT_ROUTES[path]
                req = P.validate(P.ChatCompletionRequest,
                                 {**self.config.request_defaults, **(to_chat(data) if to_chat else data)})
                return render_chat(self.template, req)[0].encode("utf-8")
            if path in COMPLETION_ROUTES:
                return self._prompt_bytes(data.get("prompt"))
        except Exception:  # noqa: BLE001 - the replica gives the request its answer (a 400)
            return None
        return None

    def _prompt_bytes(self, prompt) -> bytes | None:
        if isinstance(prompt, str):
            return prompt.encode("utf-8")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return history_bytes(self.vocab, prompt)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            return prompt[0].encode("utf-8")  # several prompts: the first decides
        return None


class Forwarder:
    """The ASGI app that forwards one request to a replica and relays its response (see the module's docstring)."""

    def __init__(self, engine, renderer: PromptRenderer):
        self.engine, self.renderer = engine, renderer

    async def __call__(self, scope, receive, send) -> None:
        body = await _read_body(receive, self.renderer.config.max_body_bytes)
        if body is None:
            err = P.ProtocolError("request body exceeds the size limit", 413)
            return await JSONResponse(err.body(), err.status)(scope, receive, send)
        prompt = None
        if scope["method"] == "POST":
            prompt = await asyncio.to_thread(self.renderer.render, scope["path"], body)  # Jinja: off the loop
        req = ForwardedRequest.of(scope, body, prefix_keys(prompt) if prompt else ())
        error: Exception | None = None
        for _ in range(MAX_ATTEMPTS):
            try:
                return await self._relay(req, send)
            except _NotStarted as e:
                error = e.__cause__
                log.warning("replica gone before answering %s %s (%s): trying another", req.method, req.path, error)
        err = P.ProtocolError(f"no engine replica could serve the request: {error}", 503, "unavailable_error",
                              headers={"Retry-After": "1"})
        await JSONResponse(err.body(), err.status, headers=err.headers)(scope, receive, send)

    async def _relay(self, req: ForwardedRequest, send) -> None:
        """Send the replica's response; _NotStarted if the replica died before its first message, an SSE error
        event (or a cut body) if it died after."""
        stream = self.engine.options(stream=True).forward.remote(req)
        started = sse = done = False
        try:
            async for kind, *fields in stream:
                if kind == "start":
                    status, headers = fields
                    sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
                    await send({"type": "http.response.start", "status": status, "headers": headers})
                    started = True
                else:
                    data, more = fields
                    await send({"type": "http.response.body", "body": data, "more_body": more})
            done = True
        except REPLICA_GONE as e:
            done = True
            if not started:
                raise _NotStarted() from e
            log.warning("replica died during the response to %s %s: %s", req.method, req.path, e)
            err = P.ProtocolError("the engine replica serving this stream stopped; send the request again", 503,
                                  "unavailable_error")
            tail = b"data: " + json.dumps(err.body()).encode() + b"\n\n" if sse else b""
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            if not done:  # the client went away: the replica's generator stops, and its app sees the disconnect
                stream.cancel()


class _NotStarted(LlamactxError):
    """The replica died before sending any of the response: the request can go elsewhere (never reaches a
    client: the ingress retries on another replica)."""


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole request body, or None past `limit` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def ingress_app(engine, renderer: PromptRenderer) -> Starlette:
    """The ingress's routes: /health and /metrics over every replica, everything else forwarded."""
    config = renderer.config

    async def health(request: HttpRequest) -> Response:
        answers = await _broadcast(engine, "health")
        replicas = [a if isinstance(a, dict) else {"status": "error", "error": str(a)} for a in answers]
        if any(r["status"] == "ok" for r in replicas):
            return JSONResponse({"status": "ok", "replicas": replicas})
        return _error(P.ProtocolError("no engine replica is ready", 503, "unavailable_error",
                                      headers={"Retry-After": "1"}, replicas=replicas))

    async def metrics(request: HttpRequest) -> Response:
        if not config.metrics:
            return _error(P.ProtocolError("This server does not support metrics endpoint. Start it with `--metrics`",
                                          501, "not_supported_error"))
        answers = [a for a in await _broadcast(engine, "metrics_rows") if isinstance(a, tuple) and a[1]]
        if not answers:
            return _error(P.ProtocolError("no engine replica is ready", 503, "unavailable_error",
                                          headers={"Retry-After": "1"}))
        return Response(render_metrics(answers), media_type=METRICS_TYPE)

    async def slots(request: HttpRequest) -> Response:
        answers, failed = await _calls(engine, request, config.max_body_bytes)
        if not answers:
            return _unavailable(failed)
        refused = [a for a in answers if a[1] != 200]
        if refused:  # every replica has the same flags: --no-slots answers 501 on all of them
            return _relayed(refused[0])
        return JSONResponse([{**slot, "replica": rid} for rid, _, body in sorted(answers) for slot in json.loads(body)])

    async def slot_action(request: HttpRequest) -> Response:
        rid = request.query_params.get("replica")
        if rid is None:
            running = [a["replica"] for a in await _broadcast(engine, "health") if isinstance(a, dict)]
            if len(running) != 1:
                return _error(P.ProtocolError(f"replica: required while {len(running)} replicas run (GET /slots "
                                              "gives each slot's replica)"))
            rid = running[0]
        answers, failed = await _calls(engine, request, config.max_body_bytes, only=rid)
        if not answers:
            if failed:
                return _unavailable(failed)
            return _error(P.ProtocolError(f"replica: {rid!r} is not running (GET /slots gives each slot's "
                                          "replica)", 404, "not_found_error"))
        response = _relayed(answers[0])
        response.headers["X-Llamactx-Replica"] = rid
        return response

    async def lora_adapters(request: HttpRequest) -> Response:
        answers, failed = await _calls(engine, request, config.max_body_bytes)
        refused = [a for a in answers if a[1] != 200]
        if refused:  # the body is checked before anything changes, the same way on every replica
            return _relayed(refused[0])
        if failed or not answers:
            return _error(P.ProtocolError(f"the scales reached {len(answers)} of {len(answers) + failed} replicas; "
                                          "send the request again", 503, "unavailable_error",
                                          headers={"Retry-After": "1"}))
        return _relayed(answers[0])

    forward = Forwarder(engine, renderer)
    return Starlette(routes=[Route("/health", health), Route("/v1/health", health), Route("/metrics", metrics),
                             Route("/slots", slots), Route("/slots/{id_slot}", slot_action, methods=["POST"]),
                             Route("/lora-adapters", lora_adapters, methods=["POST"]),
                             Route("/{path:path}", forward, methods=ALL_METHODS)])


async def _calls(engine, request: HttpRequest, limit: int, only: str | None = None) -> tuple[list, int]:
    """The request run on every replica (or on `only`) to its end: ([(replica id, status, body)], how many
    replicas failed to answer); a body over `limit` bytes gets one 413 answer."""
    body = await _read_body(request.receive, limit)
    if body is None:
        err = P.ProtocolError("request body exceeds the size limit", 413)
        return [("", err.status, json.dumps(err.body()).encode())], 0
    answers = await _broadcast(engine, "call", ForwardedRequest.of(request.scope, body), only)
    return [a for a in answers if isinstance(a, tuple)], sum(isinstance(a, BaseException) for a in answers)


def _error(err: P.ProtocolError) -> Response:
    """llama-server's error shape, with the error's headers."""
    return JSONResponse(err.body(), err.status, headers=err.headers)


def _unavailable(failed: int) -> Response:
    return _error(P.ProtocolError(f"no engine replica answered ({failed} failed)", 503, "unavailable_error",
                                  headers={"Retry-After": "1"}))


def _relayed(answer: tuple[str, int, bytes]) -> Response:
    """A replica's answer (replica id, status, JSON body) as the response."""
    return Response(answer[2], answer[1], media_type="application/json")


async def _broadcast(engine, method: str, *args) -> list:
    """Every running replica's answer to `method` (an exception for one that failed); [] with none running."""
    try:
        response = engine.broadcast(method, *args)
        return await asyncio.wait_for(response.results_async(timeout_s=FANOUT_TIMEOUT_S, return_exceptions=True),
                                      FANOUT_TIMEOUT_S)
    except (asyncio.TimeoutError, *REPLICA_GONE) as e:
        log.warning("%s: no answer from the replicas: %s", method, e)
        return []


def render_metrics(answers: list[tuple[str, list[tuple[str, str, str, float]]]]) -> bytes:
    """Prometheus text: each of llama-server's series as the cluster's value (sum, or mean / max: MEAN_OF,
    MAX_OF), then one sample per replica labelled replica="<id>"."""
    answers = sorted(answers)
    lines = []
    for i, (name, kind, doc, _) in enumerate(answers[0][1]):
        values = [rows[i][3] for _, rows in answers]
        total = max(values) if name in MAX_OF else sum(values) / len(values) if name in MEAN_OF else sum(values)
        lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", sample(name, total)]
        lines += [sample(name, v, f'replica="{rid}"') for (rid, _), v in zip(answers, values, strict=True)]
    return ("\n".join(lines) + "\n").encode()


@serve.ingress()
class Ingress:
    """The ingress deployment: `engine` is the engine deployment's handle, `config` the ServerConfig the replicas
    run (its chat template and request defaults render prompts here)."""

    def __init__(self, engine, config):
        keep_replica_grpc_on_loopback()
        self.engine = engine
        self.renderer = PromptRenderer(config)

    def __serve_build_asgi_app__(self):
        return ingress_app(self.engine, self.renderer)

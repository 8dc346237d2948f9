"""What `llamactx serve` was asked for (ServerConfig: llama-server's command line, common/arg.cpp) and what the
server holds once its model is loaded (ServerState: server_context's model, slots and queue, tools/server/
server-context.cpp), with the model's lifecycle (load, sleep, wake: lifecycle.py).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llamactx.api import protocol as P
from llamactx.runtime import Runtime, RuntimeParams
from llamactx.server.lifecycle import Lifecycle
from llamactx.server.metrics import Metrics
from llamactx.server.prompt_cache import PromptCache
from llamactx.server.streams import StreamSessions
from llamactx.server.tools.toolbox import AgentConfig, Toolbox
from llamactx.server.worker import EngineWorker

log = logging.getLogger("llamactx.server")

N_SLOTS_DEFAULT = 4  # -np's default: llama-server's n_parallel when left to it (the one place it is written)


@dataclass
class ServerConfig:
    """What `llamactx serve` was asked for: the runtime (model, adapters, context, slots: RuntimeParams) and the
    HTTP server's own settings (llama-server's flag names in comments)."""

    # -m, --lora, -c, -np, -kvu, -b, -ub, -t, -ctk, -ctv, -fa, --swa-full, --chat-template, --pooling
    runtime: RuntimeParams = field(default_factory=lambda: RuntimeParams(n_slots=N_SLOTS_DEFAULT))
    alias: str | None = None  # -a
    tags: list[str] = field(default_factory=list)  # --tags: shown by /v1/models
    request_defaults: dict[str, Any] = field(default_factory=dict)  # --temp, --seed, -n ...: request fields' defaults
    api_keys: list[str] = field(default_factory=list)  # --api-key / --api-key-file
    # --cors-origins: the browser origins answered with CORS headers: "localhost" (any port of localhost,
    # 127.0.0.1, [::1]; the default here, for an app built in Python), "*" (any), or exact origins. `serve`'s
    # default is llama-server's: "*", or "localhost" when tools or MCP servers are enabled
    cors_origins: list[str] = field(default_factory=lambda: ["localhost"])
    metrics: bool = False  # --metrics
    slots: bool = True  # --slots / --no-slots
    webui: bool = True  # --no-webui
    context_shift: bool = False  # --context-shift
    slot_save_path: str | None = None  # --slot-save-path
    timeout: float = 600.0  # --timeout: a request's deadline in seconds
    max_queue: int = 64  # --max-queue: requests waiting beyond the slots
    max_body_bytes: int = 8 << 20
    read_timeout: float = 30.0  # --read-timeout: a request's headers and body must arrive within it (server/http.py)
    max_connections: int = 256  # --max-connections: open connections past it are answered 503
    embd_max_inputs: int = 8192  # --embd-max-inputs: inputs per embeddings request (and documents per rerank)
    reranking: bool = False  # --reranking: serve /rerank (a reranker context beside the engine and the embedder)
    sleep_idle_seconds: float = -1  # --sleep-idle-seconds: unload the model after this long idle (< 0: never)
    cache_ram: float = 0  # --cache-ram: MiB of prompts kept in RAM beyond the slots (0: off, -1: no limit)
    cache_idle_slots: bool = True  # --cache-idle-slots / --no-cache-idle-slots (with --cache-ram)
    # Vertex AI's prediction protocol (llama-server's GCP compat, on when AIP_MODE=PREDICTION): the route of
    # POST {"instances": [...]} and an extra health route
    gcp_predict_route: str | None = None
    gcp_health_route: str | None = None
    agent: AgentConfig = field(default_factory=AgentConfig)  # --tools, --mcp-servers-*, --ui-mcp-proxy: all off
    url: str = ""  # where it listens, for the start-up message
    # router mode (server/model_router.py): the Model of a path, shared by every model entry naming that file
    model_source: Callable[[str | None], Any] | None = None

    def __post_init__(self):
        # an embedding input is at most one ubatch (llama-server's limit), so one slice of embedding work between
        # two generation steps is at most one ubatch's decode
        rt = self.runtime
        if rt.embd_n_ctx is None:
            self.runtime = replace(rt, embd_n_ctx=min(rt.n_ctx, rt.n_ubatch))

    @classmethod
    def of(cls, **fields: Any) -> ServerConfig:
        """A config from flat keywords: RuntimeParams' names go to `runtime` (n_slots defaults to N_SLOTS_DEFAULT)."""
        runtime = {k: fields.pop(k) for k in list(fields) if k in RuntimeParams.__dataclass_fields__}
        return cls(runtime=RuntimeParams(**{"n_slots": N_SLOTS_DEFAULT, **runtime}), **fields)


class ServerState:
    """The model, engine and worker once loaded; what every handler reads."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.runtime = self.model = self.engine = self.worker = self.template = self.embedder = None
        self.reranker = None  # with --reranking: an Embedder with pooling "rank"
        self.loras: list = []  # the LoraAdapters of --lora / --lora-scaled; their index is the API's id
        self.lora_scales: list[float] = []  # the scales every request gets (POST /lora-adapters)
        # -a may list several names (comma-separated): the API's id is the first in sorted order (llama-server's
        # std::set), and /v1/models lists them all
        self.aliases = sorted({a.strip() for a in (config.alias or "").split(",") if a.strip()})
        self.alias = self.aliases[0] if self.aliases else "llamactx"
        self.t_start = time.time()
        self.toolbox = Toolbox(config.agent)  # /tools and /cors-proxy (server/tools/toolbox.py)
        # loading, ready, asleep (--sleep-idle-seconds): server/lifecycle.py
        self.lifecycle = Lifecycle(self._load_model, self._unload_model, self._busy, config.sleep_idle_seconds)
        self.metrics = Metrics()  # /metrics' throughput window, which outlives a sleep
        self.streams = StreamSessions()  # resumable streams by X-Conversation-Id (server/streams.py)
        self._stats = None  # the engine's counters kept while it sleeps, handed to the next engine

    def load(self) -> None:
        """Load the model (the start-up thread); with --sleep-idle-seconds, the idle clock starts then."""
        self.lifecycle.start()

    def _load_model(self) -> bool:
        """Build the model, engine, embedder(s) and the engine thread; False (and `load_error`) if that failed.
        Waking from sleep builds them again, with the counters and adapter scales they had."""
        c, rt = self.config, self.config.runtime
        waking, scales = self._stats is not None, self.lora_scales
        try:
            self.runtime = Runtime(rt, model=c.model_source(rt.model) if c.model_source else None)
            self.model, self.engine = self.runtime.model, self.runtime.engine
            self.alias = self.aliases[0] if self.aliases else Path(self.model.path).name
            self.loras, self.lora_scales = [a for a, _ in self.runtime.lora], [s for _, s in self.runtime.lora]
            self.template = self.runtime.template
            if self.template.is_fallback and not rt.chat_template:
                log.info(self.template.message)
            self.embedder = self.runtime.embedder
            self.engine.warmup()
            self.embedder.embed([[0]])  # its context and kernels too, so a first embeddings request stalls nobody
            if c.reranking:
                self.reranker = self.runtime.reranker
                self.reranker.embed([[0]])
            if waking:
                self.engine.stats, self._stats = self._stats, None
                if self.loras:
                    self.set_lora_scales(self.engine, scales)  # the engine thread has not started yet
            prompt_cache = PromptCache(c.cache_ram, c.cache_idle_slots, rt.kv_unified) if c.cache_ram else None
            if rt.session is not None and self.engine.session is not None:
                s = rt.session
                log.info("session tier: %s MiB in RAM%s, states of %d+ tokens", s.ram_bytes >> 20,
                         f", {s.disk_bytes >> 20} MiB in {s.disk_dir}" if s.disk_dir else "", s.min_tokens)
            self.worker = EngineWorker(self.engine, rt.n_slots + c.max_queue, c.timeout, prompt_cache)
            self.worker.start()
            self.ready.set()
            log.info("ready: %s on %d slots sharing %d KV cells%s", self.alias, rt.n_slots, rt.n_ctx,
                     f"; chat page and API at {c.url}" if c.url else "")
            return True
        except Exception as e:  # reported by /health and every endpoint; the process stays up
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("could not load the model: %s", self.load_error)
            return False

    def _unload_model(self) -> None:
        """Entering sleep: stop the engine thread and drop the model, engine and embedders (their KV cells and
        the weights' mapping go with them); the chat template and the counters stay."""
        self.worker.stop()
        self._stats = self.engine.stats
        self.runtime = self.model = self.engine = self.worker = self.embedder = self.reranker = None
        gc.collect()

    def _busy(self) -> bool:
        worker = self.worker
        return worker is not None and worker.busy

    def check_ready(self) -> None:
        if self.load_error:
            raise P.ProtocolError(f"the model could not be loaded: {self.load_error}", 503, "unavailable_error")
        if not self.ready.is_set():
            raise P.ProtocolError("Loading model", 503, "unavailable_error", headers={"Retry-After": "1"})

    def n_ctx_slot(self) -> int:
        return self.engine.n_ctx_slot

    def lora_scales_from(self, entries, field: str) -> list[float]:
        """llama-server's parse_lora_request + construct_lora_list: [{"id", "scale"}, ...] -> a scale for every
        adapter, 0 for those not listed. ProtocolError (400) for an unknown id or a scale that is not a number."""
        if not isinstance(entries, list):
            raise P.ProtocolError(f"{field} must be an array of objects with 'id' and 'scale' fields")
        scales = [0.0] * len(self.loras)
        for i, entry in enumerate(entries):
            lora_id = entry.get("id") if isinstance(entry, dict) else None
            scale = entry.get("scale", 0.0) if isinstance(entry, dict) else None
            if not isinstance(lora_id, int) or isinstance(lora_id, bool) or not 0 <= lora_id < len(self.loras):
                raise P.ProtocolError(f"{field}[{i}].id = {lora_id!r} is not an adapter id in [0, "
                                      f"{len(self.loras)})")
            if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
                raise P.ProtocolError(f"{field}[{i}].scale = {scale!r} is not a finite number")
            scales[lora_id] = float(scale)
        return scales

    def set_lora_scales(self, engine, scales: list[float]) -> None:
        """On the engine thread: every following step (and embedding) uses these scales."""
        pairs = list(zip(self.loras, scales, strict=True))
        engine.set_adapters_lora(pairs)
        self.embedder.lora = tuple((a, s) for a, s in pairs if s != 0.0)
        if self.reranker is not None:
            self.reranker.lora = self.embedder.lora
        self.lora_scales = scales

    def check_request_lora(self, body: dict) -> None:
        """A request's own "lora" field: accepted when it asks for the scales in effect; per-request scales
        are not supported (one context serves every slot), so a different set is a 400."""
        if "lora" in body and self.lora_scales_from(body["lora"], "lora") != self.lora_scales:
            raise P.ProtocolError("lora: per-request adapter scales are not supported by this server; set them "
                                  "for every request with POST /lora-adapters")

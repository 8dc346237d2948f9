"""GET /metrics: Prometheus text with llama-server's `llamacpp:` names (tools/server: `get_metrics`,
server_task_result_metrics::to_metrics, server-common.h `server_metrics`).

The values are read from the engine's counters when scraped (a `Snapshot`); nothing is recorded per request here.
The counters are cumulative; the two throughput gauges (prompt_tokens_seconds, predicted_tokens_seconds) cover the
window since the previous scrape, as llama-server's prompt / predict buckets, which each scrape resets. While the
server sleeps (--sleep-idle-seconds) the engine is gone: scrapes render the snapshot taken on entering sleep, and
still reset the window, so only the first of them reports the last generation's throughput.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from llamactx.engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The engine's counters and load at one moment."""

    stats: EngineStats  # a copy
    load: tuple[int, int, int]  # running, waiting, preempted
    kv_used: int
    kv_size: int

    @classmethod
    def of(cls, engine) -> Snapshot:
        mem = engine.ctx.memory
        return cls(replace(engine.stats), tuple(engine.load), mem.used, mem.size)


class Metrics:
    """The scrape side: renders a Snapshot, the throughput gauges over the window since the last render."""

    def __init__(self):
        self._window_start = EngineStats()  # the counters at the previous scrape (llama-server's bucket reset)
        self._lock = threading.Lock()

    def render(self, snap: Snapshot) -> bytes:
        """Prometheus' text exposition, written as llama-server writes it (its names kept as they are: a counter
        such as n_tokens_max has no _total); starts the next throughput window."""
        lines = []
        for name, kind, doc, value in self.rows(snap):
            lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", sample(name, value)]
        return ("\n".join(lines) + "\n").encode()

    def rows(self, snap: Snapshot) -> list[tuple[str, str, str, float]]:
        """`collect`'s rows, the throughput gauges over the window since the previous call (which this starts)."""
        with self._lock:
            start, self._window_start = self._window_start, snap.stats
        return collect(snap, start)


def sample(name: str, value: float, labels: str = "") -> str:
    """One sample line: `llamacpp:<name>{labels} <value>` (labels: "" or 'key="value",...')."""
    shown = repr(float(value)) if isinstance(value, float) else str(int(value))
    return f"llamacpp:{name}{{{labels}}} {shown}" if labels else f"llamacpp:{name} {shown}"


def _rate(n: float, t_ms: float) -> float:
    return 1e3 * n / t_ms if t_ms > 0 else 0.0


def collect(snap: Snapshot, window_start: EngineStats) -> list[tuple[str, str, str, float]]:
    """(name, type, help, value) of every metric; the throughput gauges over the counters since `window_start`."""
    st, w = snap.stats, window_start
    n_running, n_waiting, n_preempted = snap.load
    c, g = "counter", "gauge"
    return [
        ("prompt_tokens_total", c, "Number of prompt tokens processed.", st.n_prompt_tokens),
        ("prompt_tokens_cached_total", c, "Number of prompt tokens reused from the cache.", st.n_prompt_cached),
        ("prompt_seconds_total", c, "Prompt process time", st.t_prompt_ms / 1e3),
        ("tokens_predicted_total", c, "Number of generation tokens processed.", st.n_tokens_predicted),
        ("tokens_predicted_seconds_total", c, "Predict process time", st.t_predicted_ms / 1e3),
        ("n_decode_total", c, "Total number of llama_decode() calls", st.n_decode),
        ("n_tokens_max", c, "Largest observed n_tokens.", st.n_tokens_max),
        ("spec_decode_num_draft_tokens_total", c, "Number of draft tokens generated.", st.n_draft_tokens),
        ("spec_decode_num_accepted_tokens_total", c, "Number of draft tokens accepted.", st.n_draft_accepted),
        ("spec_decode_num_drafts_total", c, "Number of drafts generated.", st.n_draft_verif_steps),
        ("n_busy_slots_per_decode", g, "Average number of busy slots per llama_decode() call",
         st.n_busy_slots / st.n_decode if st.n_decode else 0.0),
        ("prompt_tokens_seconds", g, "Average prompt throughput in tokens/s.",
         _rate(st.n_prompt_tokens - w.n_prompt_tokens, st.t_prompt_ms - w.t_prompt_ms)),
        ("predicted_tokens_seconds", g, "Average generation throughput in tokens/s.",
         _rate(st.n_tokens_predicted - w.n_tokens_predicted, st.t_predicted_ms - w.t_predicted_ms)),
        ("kv_cache_usage_ratio", g, "KV-cache usage. 1 means 100 percent usage.", snap.kv_used / snap.kv_size),
        ("kv_cache_tokens", g, "KV-cache tokens.", snap.kv_used),
        ("requests_processing", g, "Number of requests processing.", n_running),
        ("requests_deferred", g, "Number of requests deferred.", n_waiting),
        ("preemptions_total", c, "Requests preempted and recomputed because the KV cells ran out.", n_preempted),
    ]


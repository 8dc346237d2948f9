"""GET /metrics: Prometheus text with llama-server's `llamacpp:` names (tools/server, `handle_metrics`).

The values are read from the engine's counters when scraped; nothing is recorded per request here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector:
    """A prometheus-client collector over a `ServerState` (engine stats, its load, KV usage)."""

    def __init__(self, state):
        self.state = state

    def collect(self):
        engine = self.state.engine
        st = engine.stats
        n_running, n_waiting, n_preempted = engine.load

        def counter(name: str, doc: str, value: float):
            # prometheus-client appends _total to counters; llama-server's names already carry it
            fam = CounterMetricFamily(f"llamacpp:{name.removesuffix('_total')}", doc)
            fam.add_metric([], value)
            return fam

        def gauge(name: str, doc: str, value: float):
            fam = GaugeMetricFamily(f"llamacpp:{name}", doc)
            fam.add_metric([], value)
            return fam

        mem = engine.ctx.memory
        yield counter("prompt_tokens_total", "Number of prompt tokens processed.", st.n_prompt_tokens)
        yield counter("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache.",
                      st.n_prompt_cached)
        yield counter("prompt_seconds_total", "Prompt process time", st.t_prompt_ms / 1e3)
        yield counter("tokens_predicted_total", "Number of generation tokens processed.", st.n_tokens_predicted)
        yield counter("tokens_predicted_seconds_total", "Predict process time", st.t_predicted_ms / 1e3)
        yield counter("n_decode_total", "Total number of llama_decode() calls", st.n_decode)
        yield counter("n_tokens_max", "Largest observed n_tokens.", st.n_tokens_max)
        yield gauge("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
                    st.n_busy_slots / st.n_decode if st.n_decode else 0.0)
        yield gauge("prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                    1e3 * st.n_prompt_tokens / st.t_prompt_ms if st.t_prompt_ms else 0.0)
        yield gauge("predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                    1e3 * st.n_tokens_predicted / st.t_predicted_ms if st.t_predicted_ms else 0.0)
        yield gauge("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", mem.used / mem.size)
        yield gauge("kv_cache_tokens", "KV-cache tokens.", mem.used)
        yield gauge("requests_processing", "Number of requests processing.", n_running)
        yield gauge("requests_deferred", "Number of requests deferred.", n_waiting)
        yield counter("preemptions_total", "Requests preempted and recomputed because the KV cells ran out.",
                      n_preempted)


def render(state) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(state))
    return generate_latest(registry)

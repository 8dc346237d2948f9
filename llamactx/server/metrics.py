"""GET /metrics: Prometheus text with llama-server's `llamacpp:` names (tools/server, `handle_metrics`).

The values are read from the engine's counters when scraped; nothing is recorded per request here.
"""

from __future__ import annotations

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def collect(state) -> list[tuple[str, str, str, float]]:
    """(name, type, help, value) of every metric, from a `ServerState`'s engine (stats, load, KV usage)."""
    engine = state.engine
    st = engine.stats
    n_running, n_waiting, n_preempted = engine.load
    mem = engine.ctx.memory
    c, g = "counter", "gauge"
    return [
        ("prompt_tokens_total", c, "Number of prompt tokens processed.", st.n_prompt_tokens),
        ("prompt_tokens_cached_total", c, "Number of prompt tokens reused from the cache.", st.n_prompt_cached),
        ("prompt_seconds_total", c, "Prompt process time", st.t_prompt_ms / 1e3),
        ("tokens_predicted_total", c, "Number of generation tokens processed.", st.n_tokens_predicted),
        ("tokens_predicted_seconds_total", c, "Predict process time", st.t_predicted_ms / 1e3),
        ("n_decode_total", c, "Total number of llama_decode() calls", st.n_decode),
        ("n_tokens_max", c, "Largest observed n_tokens.", st.n_tokens_max),
        # no speculative decoding yet: llama-server's counters, at zero
        ("spec_decode_num_draft_tokens_total", c, "Number of draft tokens generated.", 0),
        ("spec_decode_num_accepted_tokens_total", c, "Number of draft tokens accepted.", 0),
        ("spec_decode_num_drafts_total", c, "Number of drafts generated.", 0),
        ("n_busy_slots_per_decode", g, "Average number of busy slots per llama_decode() call",
         st.n_busy_slots / st.n_decode if st.n_decode else 0.0),
        ("prompt_tokens_seconds", g, "Average prompt throughput in tokens/s.",
         1e3 * st.n_prompt_tokens / st.t_prompt_ms if st.t_prompt_ms else 0.0),
        ("predicted_tokens_seconds", g, "Average generation throughput in tokens/s.",
         1e3 * st.n_tokens_predicted / st.t_predicted_ms if st.t_predicted_ms else 0.0),
        ("kv_cache_usage_ratio", g, "KV-cache usage. 1 means 100 percent usage.", mem.used / mem.size),
        ("kv_cache_tokens", g, "KV-cache tokens.", mem.used),
        ("requests_processing", g, "Number of requests processing.", n_running),
        ("requests_deferred", g, "Number of requests deferred.", n_waiting),
        ("preemptions_total", c, "Requests preempted and recomputed because the KV cells ran out.", n_preempted),
    ]


def render(state) -> bytes:
    """Prometheus' text exposition, written as llama-server writes it (its names kept as they are: a counter
    such as n_tokens_max has no _total)."""
    lines = []
    for name, kind, doc, value in collect(state):
        shown = repr(float(value)) if isinstance(value, float) else str(int(value))
        lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {shown}"]
    return ("\n".join(lines) + "\n").encode()

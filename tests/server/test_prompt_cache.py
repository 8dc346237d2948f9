"""--cache-ram from a client's view: launching a request saves the idle slots to RAM and clears them (unified KV),
and a later request with the same prompt is restored from RAM, with the same greedy answer."""

from __future__ import annotations

from tests.server.conftest import running_server

LONG = ("Once upon a time in a land far away, there lived a brave knight who traveled across mountains and rivers "
        "to find the legendary golden sword hidden deep within the enchanted forest.")


def _ask(http, prompt: str, **extra) -> dict:
    res = http.post("/completion", json={"prompt": prompt, "n_predict": 6, "temperature": 0, **extra})
    assert res.status_code == 200, res.text
    return res.json()


def _slot_tokens(http) -> list[int]:
    return [s["n_tokens"] for s in http.get("/slots").json()]


def test_idle_slots_go_to_ram_and_come_back():
    with running_server(model="smollm2", n_slots=2, n_ctx=1024, kv_unified=True, cache_ram=100) as srv, \
            srv.client() as http:
        first = _ask(http, LONG, id_slot=0)
        assert _slot_tokens(http)[0] > 0
        _ask(http, "The quick brown fox", id_slot=1)
        assert _slot_tokens(http)[0] == 0  # slot 0 was saved to RAM and cleared when slot 1 started
        again = _ask(http, LONG)  # the least recently used slot, restored from RAM
        assert again["timings"]["cache_n"] > 0
        assert again["timings"]["prompt_n"] < first["timings"]["prompt_n"]
        assert again["content"] == first["content"]
        assert _slot_tokens(http)[1] == 0  # and the fox went to RAM in its turn


def test_without_cache_ram_idle_slots_keep_their_cells():
    with running_server(model="smollm2", n_slots=2, n_ctx=1024, kv_unified=True) as srv, srv.client() as http:
        _ask(http, LONG, id_slot=0)
        _ask(http, "The quick brown fox", id_slot=1)
        assert all(n > 0 for n in _slot_tokens(http))
